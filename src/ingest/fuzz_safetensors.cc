// libFuzzer target: ParseSafetensorsHeader must return a value or an Error for
// any bytes, never crash, hang or read out of bounds. The input is a file
// image; its length is the file size. Build with -DVRAMSCOPE_FUZZ=ON (clang):
//   build-fuzz/src/ingest/fuzz_safetensors -max_total_time=60
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto r = vramscope::ingest::ParseSafetensorsHeader(bytes, size, "fuzz.safetensors");
  if (r.ok()) {
    for (const auto& t : *r) {
      if (t.data_end > size) __builtin_trap();  // offsets were validated
    }
  }
  return 0;
}
