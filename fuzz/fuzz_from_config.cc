// libFuzzer target for `--from FILE` in every format, JSON and YAML: DeepSpeed
// and TrainingArguments JSON, accelerate, Axolotl, TRL (JSON or YAML),
// torchtune and LitGPT YAML (cli/from_config.cc, from_trl.cc,
// from_torchtune.cc, from_litgpt.cc over cli/yaml_json.cc), and then what the
// CLI does with the knobs read: applied to the flags (KnobArgs::WithConfig,
// typed values, never parsed back from text) and converted into a setup.
//
// The first byte picks the file's name (.json, .yaml, .yml or no extension:
// the format then follows the content); the rest is the file. A nested
// DeepSpeed path is served the same bytes.
//
// Checks, beyond "no crash, no hang, no sanitizer report":
//  - an error is one line that starts with the name of a file read;
//  - every numeric knob carries its number (FileKnob::count / fraction);
//  - a setup that cannot be made is an Error naming a file, a key or a flag.
//
//   scripts/fuzz.sh fuzz_from_config
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "from_config.h"
#include "knobs.h"
#include "output.h"

namespace {

void Die(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_from_config: %s\n%s\n", what, detail.c_str());
  std::abort();
}

constexpr std::string_view kNumeric[] = {"--gpus",
                                         "--gpus-per-node",
                                         "--fsdp-version",
                                         "--ddp-bucket-cap-mb",
                                         "--batch",
                                         "--grad-accum",
                                         "--seq",
                                         "--lora-rank",
                                         "--zero-sub-group-size",
                                         "--zero-reduce-bucket-size",
                                         "--zero-prefetch-bucket-size",
                                         "--zero-max-live-parameters",
                                         "--zero-max-reuse-distance",
                                         "--zero-persistence-threshold"};

constexpr const char* kNames[] = {"fuzz.json", "fuzz.yaml", "fuzz.yml", "fuzz_config"};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace vramscope;
  if (size == 0) return 0;
  const std::string file = kNames[data[0] % 4];
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  std::vector<std::string> files = {file};
  const cli::ConfigFileReader read = [&](const std::string& path) -> Result<std::string> {
    if (path.find("missing") != std::string::npos) return MakeError(path + ": no such file");
    files.push_back(path);
    return text;
  };
  cli::FromConfig config;
  const Status st = cli::ParseConfigText(file, text, 5, read, &config);
  if (!st.ok()) {
    const std::string& m = st.error().message;
    bool named = false;
    for (const std::string& f : files) named = named || m.rfind(f + ": ", 0) == 0;
    if (!named) Die("error does not start with the name of a file read", m);
    if (m.find('\n') != std::string::npos) Die("error is more than one line", m);
    return 0;
  }
  for (const cli::FileKnob& k : config.knobs) {
    for (std::string_view f : kNumeric) {
      if (k.flag == f && !k.count) Die("a numeric knob without its number", k.flag);
    }
    if (k.flag == "--lora-dropout" && !k.fraction) Die("a dropout without its number", k.key);
  }
  cli::KnobArgs knobs;
  const cli::KnobArgs merged = knobs.WithConfig(std::move(config), nullptr);
  cli::TakeWarnings();
  auto setup = merged.ToSetup();
  if (!setup.ok() && setup.error().message.find('\n') != std::string::npos)
    Die("setup error is more than one line", setup.error().message);
  return 0;
}
