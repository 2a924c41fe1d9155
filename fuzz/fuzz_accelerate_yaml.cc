// libFuzzer target for `--from FILE` with accelerate's, Axolotl's and TRL's config
// YAML (cli/yaml_json.cc over libyaml, then the accelerate / Axolotl /
// DeepSpeed / HF mappings of cli/from_config.cc), on the same input read as a .yaml file and
// as a file without an extension (the format then follows the content).
// A deepspeed_config_file or deepspeed path names a file the injected reader
// serves from the input itself, so the DeepSpeed reader is reached too.
//
// Checks, beyond "no crash, no hang, no sanitizer report":
//  - an error is one line that starts with the name of the file read or of
//    the DeepSpeed file it names (docs/configs.md's "FILE: KEY: why");
//  - every knob names a flag the CLI applies, with a value and a key (the
//    flags KnobArgs::SetFromFile in cli/knobs.cc takes; keep the two lists
//    equal: this one once lacked three flags added to the readers).
//
//   scripts/fuzz.sh fuzz_accelerate_yaml      (or, by hand:)
//   build-fuzz/fuzz/fuzz_accelerate_yaml -max_len=16384 -max_total_time=60 CORPUS_COPY
// where CORPUS_COPY is a copy of fuzz/corpus/accelerate_yaml.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "from_config.h"
#include "yaml_json.h"

namespace {

void Die(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_accelerate_yaml: %s\n%s\n", what, detail.c_str());
  std::abort();
}

constexpr std::string_view kFlags[] = {"--precision",
                                       "--optimizer",
                                       "--grad-ckpt",
                                       "--loss",
                                       "--zero",
                                       "--fsdp",
                                       "--offload",
                                       "--zero-buckets",
                                       "--gpus",
                                       "--gpus-per-node",
                                       "--fsdp-version",
                                       "--fsdp-backward-prefetch",
                                       "--fsdp-wrap",
                                       "--zero-overlap-comm",
                                       "--ddp-bucket-cap-mb",
                                       "--ddp",
                                       "--batch",
                                       "--grad-accum",
                                       "--zero-sub-group-size",
                                       "--zero-reduce-bucket-size",
                                       "--zero-prefetch-bucket-size",
                                       "--zero-max-live-parameters",
                                       "--zero-max-reuse-distance",
                                       "--zero-persistence-threshold",
                                       "--seq",
                                       "--finetune",
                                       "--lora-rank",
                                       "--lora-targets",
                                       "--lora-dropout",
                                       "--attn",
                                       "--dpo",
                                       "--dpo-precompute-ref",
                                       "--packing",
                                       "--liger",
                                       "--optimizer-in-backward",
                                       "--lora-dtype",
                                       "--impl",
                                       "--activation-offload"};

void ParseAs(const std::string& file, const std::string& text) {
  using namespace vramscope;
  std::vector<std::string> files = {file};  // the input, and the nested files it names
  const cli::ConfigFileReader read = [&](const std::string& path) -> Result<std::string> {
    if (path.find("missing") != std::string::npos) return MakeError(path + ": no such file");
    files.push_back(path);
    return text;  // a nested DeepSpeed file: the same bytes
  };
  cli::FromConfig out;
  const Status st = cli::ParseConfigText(file, text, 5, read, &out);
  if (!st.ok()) {
    const std::string& m = st.error().message;
    bool named = false;
    for (const std::string& f : files) named = named || m.rfind(f + ": ", 0) == 0;
    if (!named) Die("error does not start with the name of a file read", m);
    if (m.find('\n') != std::string::npos) Die("error is more than one line", m);
    return;
  }
  for (const cli::FileKnob& k : out.knobs) {
    bool known = false;
    for (std::string_view f : kFlags) known = known || k.flag == f;
    if (!known) Die("unknown flag", k.flag);
    if (k.value.empty() || k.key.empty()) Die("knob without a value or key", k.flag);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  if (text.find('\0') == std::string::npos) (void)vramscope::cli::YamlToJson(text, 64);
  ParseAs("fuzz.yaml", text);
  ParseAs("fuzz_config", text);
  return 0;
}
