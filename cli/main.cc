// vramscope: where will my GPU memory go? A thin shell over the core library:
// parse flags, call the library, print, map errors to exit codes.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>

#include "command.h"
#include "output.h"

namespace vramscope::cli {

// Declares every subcommand of Commands() on `app`; parsing then stores the
// chosen subcommand's run step in *chosen (nothing runs during parsing).
// Also called by fuzz/fuzz_cli_flags.cc, which parses and never runs.
void BuildApp(CLI::App& app, RunFn* chosen) {
  app.require_subcommand(1);
  app.set_version_flag("--version", "vramscope 0.1.0");
  for (const CommandSpec& spec : Commands()) {
    CLI::App* sub = app.add_subcommand(spec.name, spec.summary);
    RunFn run = spec.setup(sub);
    CheckNumericFlags(sub);  // output.h: no negative integer, no nan or inf
    sub->callback([run, chosen] { *chosen = run; });
  }
}

}  // namespace vramscope::cli

// The fuzz target brings libFuzzer's main instead.
#ifndef VRAMSCOPE_CLI_NO_MAIN
int main(int argc, char** argv) {
  using namespace vramscope::cli;
  CLI::App app{"vramscope: predict and explain GPU memory of neural-network training"};
  RunFn chosen;
  BuildApp(app, &chosen);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "vramscope: error: %s (see --help)\n", OneLine(e.what()).c_str());
    return kExitBadInput;
  }
  try {
    return FlushWarnings(chosen ? chosen() : kExitBadInput);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "vramscope: internal error: %s\n", OneLine(e.what()).c_str());
    return kExitInternal;
  }
}
#endif
