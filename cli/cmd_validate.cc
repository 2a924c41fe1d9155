// vramscope validate RESULTS.jsonl...: measured (tools/groundtruth) vs
// predicted, with the accuracy gate of --thresholds.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "command.h"
#include "output.h"
#include "vramscope/validate.h"

namespace vramscope::cli {
namespace {

// Limits on what validate reads (README "Limits").
constexpr uint64_t kMaxResultsFileBytes = 256ull << 20;
constexpr uint64_t kMaxThresholdsFileBytes = 1ull << 20;

struct ValidateArgs {
  std::vector<std::string> files;
  std::string gpu;
  std::string thresholds_path;
  bool json = false;
  bool markdown = false;
  uint64_t max_events = kDefaultMaxEvents;
};

// A directory stands for the *.jsonl files directly in it, in name order.
std::vector<std::string> ExpandPaths(const std::vector<std::string>& args) {
  std::vector<std::string> paths;
  for (const std::string& arg : args) {
    std::error_code ec;
    if (!std::filesystem::is_directory(arg, ec)) {
      paths.push_back(arg);
      continue;
    }
    std::vector<std::string> found;
    for (const auto& entry : std::filesystem::directory_iterator(arg, ec)) {
      if (entry.path().extension() == ".jsonl") found.push_back(entry.path().string());
    }
    std::sort(found.begin(), found.end());
    paths.insert(paths.end(), found.begin(), found.end());
  }
  return paths;
}

int RunValidate(const ValidateArgs& args) {
  std::vector<MeasuredFile> files;
  for (const std::string& path : ExpandPaths(args.files)) {
    auto text = ReadTextFile(path, kMaxResultsFileBytes);
    if (!text.ok()) return FailBadInput(text.error());
    auto parsed = ParseGroundTruth(*text, path, args.gpu);
    if (!parsed.ok()) return FailBadInput(parsed.error());
    files.push_back(std::move(*parsed));
  }
  std::optional<Thresholds> thresholds;
  if (!args.thresholds_path.empty()) {
    auto text = ReadTextFile(args.thresholds_path, kMaxThresholdsFileBytes);
    if (!text.ok()) return FailBadInput(text.error());
    auto t = ParseThresholds(*text, args.thresholds_path);
    if (!t.ok()) return FailBadInput(t.error());
    thresholds = *t;
  }
  auto validated = Validate(std::move(files), LocalModelIo(), args.max_events);
  if (!validated.ok()) return FailBadInput(validated.error());
  const Validation& v = *validated;
  std::vector<std::string> failures;
  if (thresholds) failures = CheckThresholds(v, *thresholds);
  if (args.json) {
    std::fputs(RenderValidationJson(v, failures, thresholds.has_value()).c_str(), stdout);
  } else if (args.markdown) {
    std::fputs(RenderValidationMarkdown(v).c_str(), stdout);
  } else {
    std::fputs(RenderValidationText(v).c_str(), stdout);
    if (thresholds && v.rows.empty()) {
      std::fputs("\nAccuracy gate: nothing to check (no measurements)\n", stdout);
    } else if (thresholds) {
      std::fputs(failures.empty() ? "\nAccuracy gate: passed\n" : "\nAccuracy gate: FAILED\n",
                 stdout);
      for (const std::string& f : failures) std::fprintf(stdout, "  %s\n", f.c_str());
      for (const auto& gap : thresholds->known_gaps) {
        const std::string& id = gap.first;  // not a structured binding: clang 14's lambdas
        const bool here = std::any_of(v.rows.begin(), v.rows.end(),
                                      [&id](const ValidationRow& r) { return r.run.id == id; });
        if (here) {
          std::fprintf(stdout, "  outside the gate (a known gap): %s: %s\n", id.c_str(),
                       gap.second.c_str());
        }
      }
    }
  }
  return failures.empty() ? kExitOk : kExitAccuracy;
}

RunFn SetupValidate(CLI::App* sub) {
  auto args = std::make_shared<ValidateArgs>();
  sub->add_option(
         "RESULTS", args->files,
         "Result files written by tools/groundtruth/measure.py (JSON Lines), or folders of *.jsonl")
      ->required();
  sub->add_option("--gpu", args->gpu,
                  "GPU catalog name to assume instead of each record's env.gpu.name");
  sub->add_option("--thresholds", args->thresholds_path,
                  "Accuracy gate (JSON, e.g. data/groundtruth/thresholds.json): exit 3 when a "
                  "limit is exceeded");
  sub->add_option("--max-events", args->max_events,
                  "Work budget: the most events one record's estimate may take (default 2^24; "
                  "all records together: 4 times it)");
  sub->add_flag("--json", args->json, "Machine-readable output (integer bytes, error fractions)");
  sub->add_flag("--markdown", args->markdown,
                "The summary table as Markdown (README's accuracy section)");
  return [args] { return RunValidate(*args); };
}

}  // namespace

extern const CommandSpec kValidateCommand = {
    "validate", "Compare real measurements (tools/groundtruth results) with predictions",
    &SetupValidate};

}  // namespace vramscope::cli
