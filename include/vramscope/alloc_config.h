// Allocator settings in PYTORCH_CUDA_ALLOC_CONF syntax.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include "vramscope/result.h"

namespace vramscope {

inline constexpr uint64_t kMiB = uint64_t{1} << 20;
inline constexpr uint64_t kGiB = uint64_t{1} << 30;
inline constexpr uint64_t kUnlimited = std::numeric_limits<uint64_t>::max();

// Settings of the simulated PyTorch CUDACachingAllocator (torch 2.4-2.11).
// Defaults are PyTorch's defaults.
struct AllocatorConfig {
  // "ideal" mode: no rounding, no caching; reserved == allocated. Not a
  // PyTorch setting: a yardstick for what caching costs.
  bool ideal = false;
  // expandable_segments:True (c10/cuda/CUDACachingAllocator.cpp, ExpandableSegment).
  bool expandable_segments = false;
  // max_split_size_mb: blocks >= this are never split; default unlimited.
  uint64_t max_split_size_bytes = kUnlimited;
  // max_non_split_rounding_mb (torch >= 2.6; hard-coded 20 MiB before):
  // an oversize cached block may serve a request at most this much smaller.
  uint64_t max_non_split_rounding_bytes = 20 * kMiB;
  // garbage_collection_threshold in (0, 1); only acts together with a
  // per-process memory fraction, as in PyTorch.
  double garbage_collection_threshold = 0.0;
  // torch.cuda.set_per_process_memory_fraction(f) (or per_process_memory_fraction
  // in the conf string on torch >= 2.9). Unset = no fraction.
  std::optional<double> per_process_memory_fraction;
  // roundup_power2_divisions: one entry per power-of-two interval starting at
  // 1 MiB (index = floor(log2(size)) - 20, clamped to [0, 15]); 0 = off.
  std::array<uint32_t, 16> roundup_power2_divisions{};
  // The string this was parsed from, for reports.
  std::string text;
};

// Parses "key:value,key:value" as PYTORCH_CUDA_ALLOC_CONF does. Keys:
// expandable_segments, max_split_size_mb, max_non_split_rounding_mb,
// garbage_collection_threshold, roundup_power2_divisions (N or [a:b,...,>:c]),
// per_process_memory_fraction, backend (native only), release_lock_on_cudamalloc,
// pinned_use_cuda_host_register, pinned_num_register_threads (accepted, no
// effect on device memory), and vramscope's own "ideal:True".
// Unknown keys and bad values are an Error naming the key.
Result<AllocatorConfig> ParseAllocConf(std::string_view text);

// Checks a programmatically built config against the ranges ParseAllocConf
// enforces (max_split_size >= 20 MiB or unlimited, thresholds in range,
// divisions 0 or powers of two). CachingAllocator requires a valid config.
Status ValidateAllocConfig(const AllocatorConfig& config);

}  // namespace vramscope
