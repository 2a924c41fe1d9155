// libFuzzer target for the command line: the whole subcommand table of
// cli/commands.cc, declared exactly as main() declares it (BuildApp in
// cli/run_cli.cc), parsed from fuzzed argv. No subcommand runs.
//
// The input is the argument list, one argument per line ('\n'; a NUL ends an
// argument early, as it would in a real argv). Checks, beyond "no crash, no
// hang, no sanitizer report":
//  - parsing either succeeds or throws a CLI::ParseError, which main()
//    reports as one line and exit 2 (help and --version: exit 0); any other
//    exception would escape main() and abort the process;
//  - a successful parse has chosen a subcommand to run (main() would
//    otherwise exit 2 without saying why).
//
//   scripts/fuzz.sh fuzz_cli_flags      (or, by hand:)
//   build-fuzz/fuzz/fuzz_cli_flags -max_len=512 -max_total_time=60 CORPUS_COPY
// where CORPUS_COPY is a copy of fuzz/corpus/cli_flags (libFuzzer adds to it).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "command.h"

namespace {

constexpr size_t kMaxArgs = 64;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> args = {"vramscope"};
  size_t pos = 0;
  while (pos <= text.size() && args.size() <= kMaxArgs) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    args.emplace_back(text.substr(pos, end - pos));
    pos = end + 1;
  }
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());

  CLI::App app{"vramscope (fuzz)"};
  vramscope::cli::RunFn chosen;
  vramscope::cli::BuildApp(app, &chosen);
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError&) {
    // Help and version are ParseErrors too: main() catches exactly these.
    return 0;
  }
  if (!chosen) {
    std::fprintf(stderr, "fuzz_cli_flags: parse succeeded without choosing a subcommand\n");
    std::abort();
  }
  return 0;
}
