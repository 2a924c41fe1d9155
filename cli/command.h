// The CLI's table of subcommands. Each subcommand lives in its own cmd_*.cc:
// its setup function declares its flags on a CLI11 subcommand and returns the
// function that runs it (returning the process exit code).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace vramscope::cli {

using RunFn = std::function<int()>;

struct CommandSpec {
  const char* name;
  const char* summary;
  RunFn (*setup)(CLI::App* sub);
};

// Defined in commands.cc: the one table main() dispatches from.
const std::vector<CommandSpec>& Commands();

// Exit codes (README.md "Exit codes").
inline constexpr int kExitOk = 0;
inline constexpr int kExitInternal = 1;
inline constexpr int kExitBadInput = 2;
// validate --thresholds: the measurements and predictions disagree by more
// than the accuracy gate allows.
inline constexpr int kExitAccuracy = 3;

}  // namespace vramscope::cli
