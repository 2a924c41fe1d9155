#include "output.h"

#include "command.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include <fmt/format.h>

namespace vramscope::cli {

void AddOutputFlags(CLI::App* sub, OutputOptions* out) {
  sub->add_flag("--json", out->json, "Print the report as JSON (integer bytes)");
  sub->add_option("--html", out->html_path, "Also write a self-contained HTML report to FILE");
  sub->add_option("--svg", out->svg_path, "Also write the memory timeline chart (SVG) to FILE");
  sub->add_option("--csv", out->csv_path, "Also write the timeline as CSV to FILE");
}

Status WriteTextFile(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return MakeError(fmt::format("{}: cannot open for writing", path));
  f.write(text.data(), static_cast<std::streamsize>(text.size()));
  if (!f) return MakeError(fmt::format("{}: write failed", path));
  return Ok{};
}

Result<std::string> ReadTextFile(const std::string& path, uint64_t max_bytes) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(status)) {
    return MakeError(fmt::format("{}: no such file", path));
  }
  if (std::filesystem::is_directory(status)) {
    return MakeError(fmt::format("{}: is a directory, expected a file", path));
  }
  std::ifstream f(path, std::ios::binary);
  if (!f) return MakeError(fmt::format("{}: cannot open for reading", path));
  std::string text;
  char buffer[1 << 16];
  while (f.read(buffer, sizeof buffer) || f.gcount() > 0) {
    text.append(buffer, static_cast<size_t>(f.gcount()));
    if (text.size() > max_bytes) {
      return MakeError(fmt::format("{}: larger than the {} byte limit", path, max_bytes));
    }
  }
  return text;
}

int FailBadInput(const Error& error) {
  std::string line = error.message;
  for (char& c : line) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  std::fprintf(stderr, "vramscope: error: %s\n", line.c_str());
  return kExitBadInput;
}

int EmitReport(const Report& report, const OutputOptions& out) {
  const std::string main_text = out.json ? RenderJson(report) : RenderText(report);
  std::fwrite(main_text.data(), 1, main_text.size(), stdout);
  if (!main_text.empty() && main_text.back() != '\n') std::fputc('\n', stdout);
  struct FileOut {
    const std::string& path;
    std::string (*render)(const Report&);
  };
  const FileOut files[] = {{out.html_path, &RenderHtml},
                           {out.svg_path, &RenderSvg},
                           {out.csv_path, &RenderTimelineCsv}};
  for (const FileOut& f : files) {
    if (f.path.empty()) continue;
    Status s = WriteTextFile(f.path, f.render(report));
    if (!s.ok()) return FailBadInput(s.error());
  }
  return kExitOk;
}

}  // namespace vramscope::cli
