// One call of the engine as the Python module makes it, without Python: the
// command's flags parsed with the CLI's own declarations, then run over a
// file system that shows in-memory files on top of the disk. module.cc
// wraps it (the GIL released) and the fuzz target fuzz_python_api drives it
// with arbitrary arguments, so both exercise the same entry point.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "command.h"

namespace vramscope::python {

// In-memory files: path -> (bytes held, the file's size).
using MemoryFiles = std::map<std::string, std::pair<std::string, uint64_t>>;

// What a call gave. Exactly one of: `value` (success), `input_error` (the
// arguments or the input were refused: the CLI's one-line message, exit 2 on
// the command line), `internal_error` (an exception escaped the engine: a
// defect, the CLI's exit 1). Never throws.
struct EngineCall {
  std::optional<cli::CommandValue> value;
  std::optional<std::string> input_error;
  std::optional<std::string> internal_error;
  std::vector<std::string> warnings;  // the deferred warning lines, on success
};

// Runs command `name` with `args` (the flags after the command name). An
// argument, name or file path with a NUL byte is refused (C++ would read the
// text only up to it); so is an unknown command.
EngineCall CallEngine(const std::string& name, const std::vector<std::string>& args,
                      const MemoryFiles& files);

}  // namespace vramscope::python
