// Shared plumbing of the commands: --json, --html, --svg, --csv of the
// report-producing ones, the one-line error path (stderr, exit 2), reading an
// input file within a size limit, and the checks of numeric flag values.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "vramscope/model_io.h"
#include "vramscope/report.h"
#include "vramscope/result.h"

namespace vramscope::cli {

// The disk, the environment and the Hub (libcurl), for ResolveModel: made on
// first use, then shared (cli/model_io.cc).
const ModelIo& LocalModelIo();

struct OutputOptions {
  bool json = false;
  std::string html_path;
  std::string svg_path;
  std::string csv_path;
};

// Declares --json, --html FILE, --svg FILE, --csv FILE on `sub`.
void AddOutputFlags(CLI::App* sub, OutputOptions* out);

// A CLI11 check for an option naming a file to write: "" when the file can be
// written (an existing writable file, or a new one in an existing writable
// directory), else why not. Checked when the flags are parsed, so a bad path
// fails (exit 2) before any work or output.
std::string CheckWritableFile(const std::string& path);
// Declares an option naming a file to write, checked with CheckWritableFile.
CLI::Option* AddOutputFileOption(CLI::App* sub, const std::string& flag, std::string* path,
                                 const std::string& help);

// Prints the report (text or JSON) to stdout and writes the requested files
// (WriteReportFiles). Returns the exit code.
int EmitReport(const Report& report, const OutputOptions& out);

// One file a command may write besides stdout: the path its flag named ("" when
// the flag was not given) and how to render the contents, called only when the
// path is set (a chart or page is not rendered for nothing).
struct OutputFile {
  const std::string& path;
  std::function<std::string()> render;
};
// Writes each requested file, in order. The first that cannot be written ends
// it with "vramscope: error: PATH: ..." (FailBadInput, exit 2); else kExitOk.
// The one loop behind every --html, --svg, --csv and --events.
int WriteOutputFiles(std::initializer_list<OutputFile> files);
// The report's files: --html (RenderHtml), --svg (RenderSvg), --csv
// (RenderTimelineCsv), for commands that print a report of their own shape
// (explain and replay with --json). Returns the exit code.
int WriteReportFiles(const Report& report, const OutputOptions& out);

// `text` made safe for one terminal line: control characters (newlines, ESC,
// BEL, DEL, ...) become '?', and it stops after 1000 bytes with "...". Every
// error and warning line goes through it (no terminal injection from input).
std::string OneLine(std::string text);

// A "vramscope: warning: LINE" for stderr, printed by FlushWarnings once the
// command has succeeded (a failing command prints its one error line only).
void DeferWarning(std::string line);
// Prints the deferred warnings when `exit_code` is 0; returns `exit_code`.
int FlushWarnings(int exit_code);
// The deferred warnings of this thread, taken away (the Python module turns
// them into Python warnings instead of printing them).
std::vector<std::string> TakeWarnings();

// A progress line on stderr for a long search: shown only when stderr is a
// terminal and the work has run for more than a second, rewritten in place at
// most ten times a second, erased when the object goes.
class ProgressLine {
 public:
  explicit ProgressLine(std::string what);  // "sweep: points", "plan: knob sets"
  ~ProgressLine();
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;
  void Update(size_t done, size_t total);
  void Done();  // erases the line (before the command prints its result)

 private:
  std::string what_;
  bool terminal_;
  bool shown_ = false;
  std::chrono::steady_clock::time_point start_, last_;
  std::chrono::milliseconds delay_{1000};
};

// Prints "vramscope: error: MESSAGE" on one line to stderr; returns 2.
int FailBadInput(const Error& error);

// Writes `text` to `path`; an Error names the path on failure.
Status WriteTextFile(const std::string& path, const std::string& text);

// Reads a whole regular file of at most `max_bytes` (the size is checked
// before reading). Never blocks on a FIFO: a pipe, device or socket is an
// Error, except /dev/stdin, /dev/fd/N and /proc/self/fd/N, which are read to
// their end with the limit checked while reading (unless `allow_own_streams`
// is false: a path read from a file, which is not the caller's to hand over).
// An Error names the path (missing, directory, not a regular file, too big,
// unreadable).
Result<std::string> ReadTextFile(const std::string& path, uint64_t max_bytes,
                                 bool allow_own_streams = true);

// Makes every integer option of `sub` declared so far refuse what CLI11 2.1
// would silently wrap, saturate or take as "the default": a negative value
// ("--top -1" would become 2^64-1, "--device -5" the default device; no flag
// takes a negative number) and one beyond 2^64-1; and every floating-point
// option refuse nan and inf. The error (exit 2) names the flag. A value that
// fits 64 bits but not the option's type is CLI11's own conversion error.
// Called once per subcommand, after its flags are declared (BuildApp), so a
// new flag is covered without a line of its own.
void CheckNumericFlags(CLI::App* sub);

// The one-line message of a parse error of `app` (after app.parse threw):
// CLI11's own text, except for leftover arguments: an unknown flag is named
// as one, with the nearest known flag ("unknown flag --lora-rnk (did you mean
// --lora-rank?)"), where CLI11 2.1 lists its leftovers reversed ("The
// following arguments were not expected: 8 --lora-rnk").
std::string ParseErrorMessage(const CLI::App& app, const CLI::ParseError& error);

}  // namespace vramscope::cli
