// Size rounding rules of PyTorch's CUDACachingAllocator.
#include "sizing.h"

#include <fmt/format.h>

#include <algorithm>

#include "vramscope/allocator.h"

namespace vramscope {
namespace alloc {

uint64_t RoundUpSaturating(uint64_t x, uint64_t multiple) {
  return common::CheckedRoundUp(x, multiple).value_or(kUnlimited);
}

uint32_t DivisionsFor(uint64_t size_bytes, const AllocatorConfig& config) {
  // torch 2.4-2.11 CUDAAllocatorConfig::roundup_power2_divisions: intervals
  // start at 1 MiB (2^20) and the last one covers everything from 32 GiB.
  const int index = std::clamp(Log2Floor(size_bytes) - 20, 0,
                               static_cast<int>(config.roundup_power2_divisions.size()) - 1);
  return config.roundup_power2_divisions[static_cast<size_t>(index)];
}

std::string FormatSize(uint64_t size_bytes) {
  // torch format_size: the thresholds are inclusive ("<= 1024" prints bytes).
  const double size = static_cast<double>(size_bytes);
  if (size_bytes <= 1024) return fmt::format("{} bytes", size_bytes);
  if (size_bytes <= kMiB) return fmt::format("{:.2f} KiB", size / 1024.0);
  if (size_bytes <= kGiB) return fmt::format("{:.2f} MiB", size / 1048576.0);
  return fmt::format("{:.2f} GiB", size / 1073741824.0);
}

namespace {

// torch: roundup_power2_next_division(size, divisions), size > 512 * divisions
// and divisions >= 2. Example from PyTorch's comment: 1200 is between 1024
// and 2048; with 4 divisions the steps are 1024, 1280, 1536, 1792 -> 1280
// (but round_size only calls this above 512 * divisions, see RoundSize).
uint64_t RoundUpPower2NextDivision(uint64_t size_bytes, uint64_t divisions) {
  if (IsPowerOfTwo(size_bytes)) return size_bytes;
  const uint64_t power2_floor = uint64_t{1} << Log2Floor(size_bytes);
  const uint64_t step = power2_floor >> Log2Floor(divisions);
  if (step == 0) {
    return power2_floor == (uint64_t{1} << 63) ? kUnlimited : power2_floor << 1;
  }
  const uint64_t floor_bytes = size_bytes & ~(step - 1);
  if (floor_bytes == size_bytes) return size_bytes;
  return AddSaturating(floor_bytes, step);
}

}  // namespace
}  // namespace alloc

// torch 2.4-2.11 DeviceCachingAllocator::round_size.
uint64_t RoundSize(uint64_t size_bytes, const AllocatorConfig& config) {
  using namespace alloc;
  if (size_bytes < kMinBlockBytes) return kMinBlockBytes;
  const uint32_t divisions = DivisionsFor(size_bytes, config);
  // The power-of-two rounding only applies above 512 * divisions: below that
  // a division step would be finer than 512 bytes, so plain 512-byte
  // rounding is used (1200 B with 4 divisions -> 1536, not 1280).
  if (divisions > 1 && size_bytes > kMinBlockBytes * divisions) {
    return RoundUpPower2NextDivision(size_bytes, divisions);
  }
  return RoundUpSaturating(size_bytes, kMinBlockBytes);
}

// torch 2.4-2.11 DeviceCachingAllocator::get_allocation_size.
uint64_t SegmentSizeFor(uint64_t rounded_bytes) {
  using namespace alloc;
  if (rounded_bytes <= kSmallSizeBytes) return kSmallBufferBytes;
  if (rounded_bytes < kMinLargeAllocBytes) return kLargeBufferBytes;
  return RoundUpSaturating(rounded_bytes, kRoundLargeBytes);
}

}  // namespace vramscope
