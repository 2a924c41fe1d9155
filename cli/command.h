// The CLI's table of subcommands. Each subcommand lives in its own cmd_*.cc:
// its setup function declares its flags on a CLI11 subcommand and returns the
// function that runs it (returning the process exit code).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

#include "vramscope/model_io.h"
#include "vramscope/report.h"
#include "vramscope/result.h"

namespace vramscope::cli {

using RunFn = std::function<int()>;

// What a command computes, as a value instead of printed output: how the
// Python module (python/core/) runs a command, with the same flags, the same
// checks and the same messages as the CLI, and nothing parsed back from text.
struct CommandValue {
  std::string json;                      // what the command prints with --json
  std::shared_ptr<const Report> report;  // estimate, simulate, explain: the report itself
  std::function<std::string()> text;     // what it prints without --json
  std::function<std::string()> html;     // its --html page; empty when it has none
};
// Runs the command whose flags were parsed, resolving models through `io`.
// Errors are what the CLI prints after "vramscope: error: " (exit 2).
using ValueFn = std::function<Result<CommandValue>(const ModelIo& io)>;

struct CommandSpec {
  const char* name;
  const char* summary;
  RunFn (*setup)(CLI::App* sub);
  // Declares the same flags as `setup`; parsing then leaves the command ready
  // to run as a value. nullptr: the command has no value form.
  ValueFn (*setup_value)(CLI::App* sub) = nullptr;
};

// Defined in commands.cc: the one table main() dispatches from.
const std::vector<CommandSpec>& Commands();
// The entry of Commands() named `name`; nullptr when none is.
const CommandSpec* FindCommand(std::string_view name);

// Declares every subcommand of Commands() on `app`; parsing then stores the
// chosen subcommand's run step in *chosen (nothing runs during parsing).
// Also called by fuzz/fuzz_cli_flags.cc, which parses and never runs.
void BuildApp(CLI::App& app, RunFn* chosen);
// The whole command line: parse argv, run the chosen command, print, and
// return the process exit code (main(), and the Python package's `vramscope`
// console script through vramscope._core).
int RunCli(int argc, const char* const* argv);

// A report as a command value: its JSON (RenderJson), text and HTML page.
CommandValue ReportValue(Report report);

// Exit codes (README.md "Exit codes").
inline constexpr int kExitOk = 0;
inline constexpr int kExitInternal = 1;
inline constexpr int kExitBadInput = 2;
// validate --thresholds: the measurements and predictions disagree by more
// than the accuracy gate allows.
inline constexpr int kExitAccuracy = 3;

}  // namespace vramscope::cli
