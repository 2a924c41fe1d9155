// Size constants and sizing helpers of the allocator model (internal).
//
// Every constant below is the value PyTorch's CUDACachingAllocator uses in
// torch 2.4-2.11 (c10/cuda/CUDACachingAllocator.cpp, namespace Native; on
// torch >= 2.9 some moved to c10/core/AllocatorConfig.h with equal values).
#pragma once

#include <cstdint>
#include <string>

#include "vramscope/alloc_config.h"
#include "vramscope/common/checked.h"

namespace vramscope::alloc {

// kMinBlockSize: every request is rounded up to a multiple of 512 bytes.
inline constexpr uint64_t kMinBlockBytes = 512;
// kSmallSize: rounded requests up to 1 MiB (inclusive) use the small pool.
inline constexpr uint64_t kSmallSizeBytes = 1 * kMiB;
// kSmallBuffer: small-pool segments, and the small pool's expandable page.
inline constexpr uint64_t kSmallBufferBytes = 2 * kMiB;
// kMinLargeAlloc: requests in (1 MiB, 10 MiB) get a kLargeBuffer segment.
inline constexpr uint64_t kMinLargeAllocBytes = 10 * kMiB;
// kLargeBuffer: 20 MiB segments; also the large pool's expandable page.
inline constexpr uint64_t kLargeBufferBytes = 20 * kMiB;
// kRoundLarge: requests >= 10 MiB get a segment rounded up to 2 MiB.
inline constexpr uint64_t kRoundLargeBytes = 2 * kMiB;
// NativeCachingAllocator::allocate rejects size >= 1 EB ("one_exa_bytes",
// 2^60) before the device allocator is called.
inline constexpr uint64_t kOneExaBytes = uint64_t{1} << 60;

// x rounded up to a multiple of `multiple`; kUnlimited when that overflows.
uint64_t RoundUpSaturating(uint64_t x, uint64_t multiple);

// a + b, saturating at kUnlimited.
inline uint64_t AddSaturating(uint64_t a, uint64_t b) { return common::SaturatingAdd(a, b); }

// True when `need` more bytes fit under `limit` given `used` (no overflow).
inline bool FitsUnder(uint64_t used, uint64_t need, uint64_t limit) {
  return used <= limit && need <= limit - used;
}

inline bool IsPowerOfTwo(uint64_t x) { return x != 0 && (x & (x - 1)) == 0; }

// floor(log2(x)) for x > 0.
inline int Log2Floor(uint64_t x) { return 63 - __builtin_clzll(x); }

// torch: CUDAAllocatorConfig::roundup_power2_divisions(size): the entry for
// the power-of-two interval of `size_bytes` (index log2(size) - 20, clamped
// to [0, 15], so index 0 covers everything below 2 MiB).
uint32_t DivisionsFor(uint64_t size_bytes, const AllocatorConfig& config);

// torch: format_size() (c10/cuda/CUDACachingAllocator.cpp), as used in the
// OOM message: "N bytes", then KiB / MiB / GiB with two decimals.
std::string FormatSize(uint64_t size_bytes);

}  // namespace vramscope::alloc
