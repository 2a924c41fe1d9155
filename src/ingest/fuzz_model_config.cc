// libFuzzer target: ParseModelConfig must return a ModelSpec or a one-line
// Error for any text. Build with -DVRAMSCOPE_FUZZ=ON (clang):
//   build-fuzz/src/ingest/fuzz_model_config -max_total_time=60 -max_len=4096
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "vramscope/model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto r = vramscope::ParseModelConfig(text, "fuzz/config.json");
  if (!r.ok() && r.error().message.find('\n') != std::string::npos) __builtin_trap();
  if (r.ok()) {
    uint64_t total = 0;
    for (const auto& p : r->params) total += p.numel;
    if (total != r->ParameterCount()) __builtin_trap();
  }
  return 0;
}
