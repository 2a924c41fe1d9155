// Shared output plumbing of report-producing commands: --json, --html, --svg,
// --csv, and the one-line error path (stderr, exit 2).
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "vramscope/report.h"
#include "vramscope/result.h"

namespace vramscope::cli {

struct OutputOptions {
  bool json = false;
  std::string html_path;
  std::string svg_path;
  std::string csv_path;
};

// Declares --json, --html FILE, --svg FILE, --csv FILE on `sub`.
void AddOutputFlags(CLI::App* sub, OutputOptions* out);

// Prints the report (text or JSON) to stdout and writes the requested files.
// Returns the exit code.
int EmitReport(const Report& report, const OutputOptions& out);

// Prints "vramscope: error: MESSAGE" on one line to stderr; returns 2.
int FailBadInput(const Error& error);

// Writes `text` to `path`; an Error names the path on failure.
Status WriteTextFile(const std::string& path, const std::string& text);

// Reads a whole file; an Error names the path (missing, directory, too big).
Result<std::string> ReadTextFile(const std::string& path, uint64_t max_bytes);

}  // namespace vramscope::cli
