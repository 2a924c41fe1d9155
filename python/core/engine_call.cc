#include "engine_call.h"

#include <algorithm>
#include <exception>

#include <fmt/format.h>

#include "output.h"
#include "overlay_files.h"
#include "vramscope/common/quote.h"

namespace vramscope::python {
namespace {

// Text handed to C++ as a path or flag: a NUL byte would end it early (a path
// "a.json\0b" opened a.json), so it is refused.
std::optional<std::string> NulProblem(const std::string& text, const char* what) {
  if (text.find('\0') == std::string::npos) return std::nullopt;
  return fmt::format("{} {}: contains a NUL byte", what,
                     common::QuoteForMessage(text, common::kQuotedBytes, '\''));
}

OverlayFileSystem MakeOverlay(const MemoryFiles& files) {
  std::map<std::string, MemoryFile> memory;
  for (const auto& [path, file] : files) {
    // A file is at least as long as the bytes held of it.
    memory[path] = MemoryFile{file.first, std::max<uint64_t>(file.second, file.first.size())};
  }
  return OverlayFileSystem(std::move(memory), *cli::LocalModelIo().files);
}

// Parses `args` with the command's own flag declarations into its runner;
// nullopt with *problem set when they do not parse.
std::optional<cli::ValueFn> ParseCommand(CLI::App& app, const std::string& name,
                                         const std::vector<std::string>& args,
                                         std::string* problem) {
  const cli::CommandSpec* spec = cli::FindCommand(name);
  if (!spec || !spec->setup_value) {
    *problem = fmt::format("vramscope: no command {}",
                           common::QuoteForMessage(name, common::kQuotedBytes, '\''));
    return std::nullopt;
  }
  CLI::App* sub = app.add_subcommand(spec->name, spec->summary);
  cli::ValueFn run = spec->setup_value(sub);
  cli::CheckNumericFlags(sub);
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes them reversed
  reversed.push_back(name);
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    *problem = cli::ParseErrorMessage(app, e);
    return std::nullopt;
  }
  return run;
}

EngineCall Run(const std::string& name, const std::vector<std::string>& args,
               const MemoryFiles& files) {
  EngineCall call;
  std::optional<std::string> nul = NulProblem(name, "command");
  for (size_t i = 0; i < args.size() && !nul; ++i) nul = NulProblem(args[i], "argument");
  for (auto it = files.begin(); it != files.end() && !nul; ++it)
    nul = NulProblem(it->first, "in-memory file");
  if (nul) {
    call.input_error = std::move(*nul);
    return call;
  }
  CLI::App app{"vramscope"};
  app.require_subcommand(1);
  std::string problem;
  std::optional<cli::ValueFn> run = ParseCommand(app, name, args, &problem);
  if (!run) {
    call.input_error = cli::OneLine(problem);
    return call;
  }
  const OverlayFileSystem overlay = MakeOverlay(files);
  ModelIo io = cli::LocalModelIo();
  io.files = &overlay;
  cli::TakeWarnings();  // none left from an earlier call on this thread
  Result<cli::CommandValue> value = (*run)(io);
  std::vector<std::string> warnings = cli::TakeWarnings();
  if (!value.ok()) {
    call.input_error = cli::OneLine(value.error().message);
    return call;
  }
  call.value = std::move(value.value());
  call.warnings = std::move(warnings);
  return call;
}

}  // namespace

EngineCall CallEngine(const std::string& name, const std::vector<std::string>& args,
                      const MemoryFiles& files) {
  // Whatever escapes is a defect, reported as such: never an exception of a
  // type that would read as the caller's mistake (std::out_of_range is
  // Python's IndexError), never the end of the interpreter.
  try {
    return Run(name, args, files);
  } catch (const std::exception& e) {
    EngineCall call;
    call.internal_error = cli::OneLine(e.what());
    cli::TakeWarnings();
    return call;
  } catch (...) {
    EngineCall call;
    call.internal_error = "an exception of unknown type";
    cli::TakeWarnings();
    return call;
  }
}

}  // namespace vramscope::python
