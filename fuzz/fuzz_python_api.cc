// libFuzzer target for the Python API's argument handling: the C++ entry
// point every function of the vramscope package calls (python/core/
// engine_call.h, CallEngine: the command's flags parsed with the CLI's
// declarations and run over in-memory files on top of the disk), with the
// arguments the Python side could hand it (any bytes, NUL included: a Python
// str holds NUL, and os.fsencode gives any bytes). An Atheris harness would
// drive the same function through Python; this drives it directly.
//
// Input: the command name on the first line, then one argument per line. An
// in-memory model directory "<python>/config/fuzz" (a small GPT-2
// config.json, as vramscope.estimate(config) passes a PretrainedConfig)
// exists besides the disk. Commands run with a small work budget; the Hub is
// offline.
//
// Checks, beyond "no crash, no hang, no sanitizer report": every call ends
// with a value or a one-line input error, never an internal error (an
// exception escaping the engine: the CLI's exit 1, Python's InternalError).
//
//   scripts/fuzz.sh fuzz_python_api
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "engine_call.h"

namespace {

constexpr size_t kMaxArgs = 32;

const char kConfig[] =
    R"({"model_type": "gpt2", "n_embd": 64, "n_head": 2, "n_layer": 2, "vocab_size": 128,
        "n_positions": 256})";

// Flags that would make one input run for long: the fuzzer's own values of
// them are dropped, and a small budget is given instead.
bool Costly(const std::string& arg) {
  return arg.rfind("--max-events", 0) == 0 || arg.rfind("--max-gpus", 0) == 0;
}

// Paths into /dev, /proc and /sys name streams a caller may hand the
// commands on purpose (`simulate /dev/stdin`, read to its end); the terminal
// is not for the fuzzer to wait on. The CLI's tests cover those paths.
bool Device(const std::string& arg) {
  for (const char* dir : {"dev/", "proc/", "sys/"}) {
    if (arg.find(dir) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("HF_HUB_OFFLINE", "1", 1);  // a Hub-like name must not reach the network
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace vramscope::python;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> lines;
  for (size_t pos = 0; pos <= text.size() && lines.size() <= kMaxArgs;) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    lines.emplace_back(text.substr(pos, end - pos));
    pos = end + 1;
  }
  const std::string name = Device(lines.front()) ? std::string("x") : lines.front();
  std::vector<std::string> args;
  for (size_t i = 1; i < lines.size(); ++i) {
    if (Costly(lines[i])) {
      ++i;  // and its value
      continue;
    }
    args.push_back(Device(lines[i]) ? std::string("x") : lines[i]);
  }
  for (const char* command : {"estimate", "fit", "sweep", "plan"}) {
    if (name == command) args.insert(args.end(), {"--max-events", "65536"});
  }
  MemoryFiles files;
  files["<python>/config/fuzz/config.json"] = {kConfig, sizeof kConfig - 1};
  const EngineCall call = CallEngine(name, args, files);
  const int outcomes =
      call.value.has_value() + call.input_error.has_value() + call.internal_error.has_value();
  if (outcomes != 1) __builtin_trap();
  if (call.internal_error) {
    std::fprintf(stderr, "fuzz_python_api: internal error: %s\n", call.internal_error->c_str());
    std::abort();
  }
  if (call.input_error && call.input_error->find('\n') != std::string::npos) {
    std::fprintf(stderr, "fuzz_python_api: error of several lines:\n%s\n",
                 call.input_error->c_str());
    std::abort();
  }
  return 0;
}
