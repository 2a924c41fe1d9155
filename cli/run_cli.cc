// The command line as a function: parse, run the chosen command, map errors to
// exit codes. main() (cli/main.cc) and the Python package's console script
// (vramscope._core._cli_main) both call RunCli, so they behave alike.
#include <cstdio>
#include <exception>

#include "command.h"
#include "output.h"

namespace vramscope::cli {

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

int RunCli(int argc, const char* const* argv) {
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
    std::fprintf(stderr, "vramscope: error: %s (see --help)\n", ParseErrorMessage(app, e).c_str());
    return kExitBadInput;
  }
  try {
    return FlushWarnings(chosen ? chosen() : kExitBadInput);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "vramscope: internal error: %s\n", OneLine(e.what()).c_str());
    return kExitInternal;
  }
}

CommandValue ReportValue(Report report) {
  auto shared = std::make_shared<const Report>(std::move(report));
  CommandValue value;
  value.json = RenderJson(*shared);
  value.report = shared;
  value.text = [shared] { return RenderText(*shared); };
  value.html = [shared] { return RenderHtml(*shared); };
  return value;
}

}  // namespace vramscope::cli
