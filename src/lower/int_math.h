// Integer arithmetic shared by the lowering files (private to src/lower).
#pragma once

#include <cstdint>

namespace vramscope::lower {

// ceil(a / b) for b > 0: shard and bucket counts round up (a rank holds the
// padded remainder). Exact for every a (no a + b - 1 to wrap near 2^64).
constexpr uint64_t CeilDiv(uint64_t a, uint64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

}  // namespace vramscope::lower
