// Integer arithmetic shared by the lowering files (private to src/lower).
#pragma once

#include <cstdint>

namespace vramscope::lower {

// ceil(a / b) for b > 0: shard and bucket counts round up (a rank holds the
// padded remainder).
inline uint64_t CeilDiv(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

}  // namespace vramscope::lower
