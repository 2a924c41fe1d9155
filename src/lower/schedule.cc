#include "schedule.h"

#include <algorithm>

namespace vramscope::lower {

std::vector<Pass> PipelineSchedule(uint64_t micro_batches, uint64_t chunks, uint64_t warmup,
                                   uint32_t pp) {
  const uint64_t v = std::max<uint64_t>(1, chunks);
  const uint64_t units = micro_batches * v;
  const uint64_t warm = std::min<uint64_t>(warmup, units);
  const uint64_t group = uint64_t{std::max<uint32_t>(1, pp)} * v;
  auto chunk_of = [&](uint64_t k, bool forward) -> size_t {
    const uint64_t c = v == 1 ? 0 : (k % group) / std::max<uint32_t>(1, pp);
    return static_cast<size_t>(forward ? c : v - 1 - c);
  };
  std::vector<Pass> passes;
  passes.reserve(2 * units);
  uint64_t forwards = 0, backwards = 0;
  for (uint64_t i = 0; i < warm; ++i) passes.push_back({true, chunk_of(forwards++, true)});
  for (uint64_t i = warm; i < units; ++i) {
    passes.push_back({true, chunk_of(forwards++, true)});
    passes.push_back({false, chunk_of(backwards++, false)});
  }
  for (uint64_t i = 0; i < warm; ++i) passes.push_back({false, chunk_of(backwards++, false)});
  return passes;
}

}  // namespace vramscope::lower
