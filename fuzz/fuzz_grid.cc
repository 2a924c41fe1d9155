// libFuzzer target for the planner's flag-value readers: sweep grids
// (`--seq 1:2048:200`, `--batch 1,2,4`; ParseGrid) and `fit --margin`
// (ParseMargin), which take text from the command line and scripts.
//
// Checks, beyond "no crash, no hang, no sanitizer report":
//  - a grid is 1..kMaxSweepPoints values, ascending, distinct, each in 1..2^32
//    (the promise of include/vramscope/plan.h);
//  - a margin is below the GPU's usable bytes;
//  - every error names the flag it is about.
//
//   scripts/fuzz.sh fuzz_grid      (or, by hand:)
//   build-fuzz/fuzz/fuzz_grid -max_len=256 -max_total_time=60 CORPUS_COPY
// where CORPUS_COPY is a copy of fuzz/corpus/grid (libFuzzer adds to it).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "vramscope/plan.h"

namespace {

void Die(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_grid: %s\n%s\n", what, detail.c_str());
  std::abort();
}

void CheckError(const vramscope::Error& error, std::string_view flag) {
  if (error.message.rfind(flag, 0) != 0) Die("error does not start with the flag", error.message);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  auto grid = vramscope::ParseGrid(text, "--seq");
  if (grid.ok()) {
    const std::vector<uint64_t>& values = *grid;
    if (values.empty() || values.size() > vramscope::kMaxSweepPoints)
      Die("grid size out of range", std::string(text));
    for (size_t i = 0; i < values.size(); ++i) {
      if (values[i] < 1 || values[i] > (uint64_t{1} << 32))
        Die("grid value out of 1..2^32", std::string(text));
      if (i > 0 && values[i] <= values[i - 1])
        Die("grid not ascending and distinct", std::string(text));
    }
  } else {
    CheckError(grid.error(), "--seq");
  }

  // An H100's usable bytes, and a small GPU where percentages round.
  for (const uint64_t usable : {uint64_t{85'000'000'000}, uint64_t{1} << 20}) {
    auto margin = vramscope::ParseMargin(text, usable);
    if (margin.ok()) {
      if (*margin >= usable) Die("margin not below the usable bytes", std::string(text));
    } else {
      CheckError(margin.error(), "--margin");
    }
  }
  return 0;
}
