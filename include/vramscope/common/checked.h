// Overflow-checked arithmetic on byte counts, element counts and other sizes.
//
// Sizes read from input (tensor shapes, data offsets, event sizes) are
// multiplied and summed; a wrapped uint64_t would turn a hostile input into a
// small, plausible number. These helpers say when the true result does not
// fit instead. Header-only, constexpr, thread-safe.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>

namespace vramscope::common {

// a + b, or nullopt when the sum does not fit in 64 bits.
constexpr std::optional<uint64_t> CheckedAdd(uint64_t a, uint64_t b) {
  uint64_t sum = 0;
  if (__builtin_add_overflow(a, b, &sum)) return std::nullopt;
  return sum;
}

// a * b, or nullopt when the product does not fit in 64 bits.
constexpr std::optional<uint64_t> CheckedMul(uint64_t a, uint64_t b) {
  uint64_t product = 0;
  if (__builtin_mul_overflow(a, b, &product)) return std::nullopt;
  return product;
}

// a + b, or 2^64 - 1 when the sum does not fit (for limits meaning
// "unlimited" at the top of the range).
constexpr uint64_t SaturatingAdd(uint64_t a, uint64_t b) {
  return CheckedAdd(a, b).value_or(std::numeric_limits<uint64_t>::max());
}

// `x` rounded up to a multiple of `multiple` (> 0), or nullopt when that does
// not fit in 64 bits.
constexpr std::optional<uint64_t> CheckedRoundUp(uint64_t x, uint64_t multiple) {
  const uint64_t remainder = x % multiple;
  if (remainder == 0) return x;
  return CheckedAdd(x, multiple - remainder);
}

}  // namespace vramscope::common
