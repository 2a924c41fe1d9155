// vramscope: where will my GPU memory go? A thin shell over the core library:
// parse flags, call the library, print, map errors to exit codes.
#include <cstdio>
#include <exception>

#include "command.h"

int main(int argc, char** argv) {
  using namespace vramscope::cli;
  CLI::App app{"vramscope: predict and explain GPU memory of neural-network training"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "vramscope 0.1.0");
  RunFn chosen;
  for (const CommandSpec& spec : Commands()) {
    CLI::App* sub = app.add_subcommand(spec.name, spec.summary);
    RunFn run = spec.setup(sub);
    sub->callback([run, &chosen] { chosen = run; });
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string what = e.what();
    for (char& c : what) {
      if (c == '\n') c = ' ';
    }
    std::fprintf(stderr, "vramscope: error: %s (see --help)\n", what.c_str());
    return kExitBadInput;
  }
  try {
    return chosen ? chosen() : kExitBadInput;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "vramscope: internal error: %s\n", e.what());
    return kExitInternal;
  }
}
