// When cached memory goes back to the device, the OOM report, and ideal mode.
// torch 2.4-2.11 DeviceCachingAllocator (c10/cuda/CUDACachingAllocator.cpp).
#include <fmt/format.h>

#include <algorithm>

#include "allocator_impl.h"
#include "sizing.h"

namespace vramscope {

using alloc::Block;
using alloc::kNil;

// torch: release_cached_blocks (empty_cache(), and the last OOM retry):
// free every cached block that is a whole segment, and unmap every page of
// an expandable segment that lies inside a free block. Free blocks of a
// partially used segment cannot be returned.
bool CachingAllocator::Impl::ReleaseCachedBlocks() {
  // torch: release_cached_blocks first waits for every outstanding event,
  // so blocks pending on other streams are cached (and can go back) too.
  SynchronizeAndFreeEvents();
  // torch releases large_blocks, then small_blocks; the result does not
  // depend on the order.
  for (alloc::Pool& pool : pools) ReleaseBlocks(pool);
  return true;
}

// torch: release_blocks.
void CachingAllocator::Impl::ReleaseBlocks(alloc::Pool& pool) {
  scratch.clear();
  for (const alloc::FreeKey& key : pool.blocks) {
    if (IsExpandable(key.block) || !IsSplit(key.block)) scratch.push_back(key.block);
  }
  for (uint32_t b : scratch) {
    if (!IsExpandable(b)) {
      ReleaseBlock(b);
      continue;
    }
    UnmapBlock(b);
    if (!blocks[b].mapped && !IsSplit(b)) ReleaseExpandableSegment(b);
  }
}

// torch: release_block: cudaFree of a whole (unsplit) segment.
void CachingAllocator::Impl::ReleaseBlock(uint32_t b) {
  VS_CHECK(!IsExpandable(b) && !IsSplit(b) && !blocks[b].allocated);
  EraseFree(b);
  const Block& block = blocks[b];
  SubReserved(block.pool, block.size_bytes);
  --stats.num_segments;
  ++stats.num_device_free;
  address_space.Release(block.address, block.size_bytes);
  segments.Delete(block.segment);
  blocks.Delete(b);
}

// torch: release_available_cached_blocks (OOM path, only with
// max_split_size_mb set). Frees one cached block of at least
// max(size, max_split_size), else oversize blocks from the largest down
// until that many bytes were freed. torch >= 2.5 skips expandable blocks
// (PR #134338); earlier versions would fail an assertion on them.
bool CachingAllocator::Impl::ReleaseAvailableCachedBlocks(const Request& r) {
  const uint64_t max_split = config.max_split_size_bytes;
  if (max_split == kUnlimited) return false;
  alloc::Pool& pool = pools[r.pool];
  const uint64_t key_bytes = std::max(r.size_bytes, max_split);
  auto it = pool.blocks.lower_bound({key_bytes, 0, kNil});
  if (it != pool.blocks.end() && !IsExpandable(it->block)) {
    ReleaseBlock(it->block);
    return true;
  }
  // No single block is large enough: free oversize blocks, largest first.
  if (it == pool.blocks.begin()) return false;
  uint64_t released_bytes = 0;
  --it;
  while (released_bytes < key_bytes && it->size_bytes >= max_split) {
    const auto current = it;
    const bool is_first = current == pool.blocks.begin();
    if (!is_first) --it;
    if (!IsExpandable(current->block)) {
      released_bytes += current->size_bytes;
      ReleaseBlock(current->block);  // erases `current` only; `it` stays valid
    }
    if (is_first) break;
  }
  // Blocks already freed stay freed even when this reports failure.
  return released_bytes >= key_bytes;
}

// torch: garbage_collect_cached_blocks (runs before alloc_block when a
// memory fraction is set and garbage_collection_threshold > 0). Frees
// unsplit large-pool segments whose age (get_free_block calls on the large
// pool since the block was cached) is at least the average, repeating until
// reserved memory is below threshold * allowed maximum. No synchronization,
// small pool untouched; torch >= 2.5 skips expandable blocks when freeing.
void CachingAllocator::Impl::GarbageCollectCachedBlocks() {
  const auto gc_threshold_bytes = static_cast<uint64_t>(config.garbage_collection_threshold *
                                                        static_cast<double>(*allowed_max_bytes));
  if (stats.reserved_bytes <= gc_threshold_bytes) return;
  const uint64_t target_bytes = stats.reserved_bytes - gc_threshold_bytes;
  const uint64_t clock = free_block_calls[0];
  auto age = [&](uint32_t b) { return clock - blocks[b].gc_count_base; };

  uint64_t total_age = 0;
  int64_t freeable_count = 0;
  for (const alloc::Pool& pool : pools) {
    if (pool.is_small) continue;
    for (const alloc::FreeKey& key : pool.blocks) {
      if (!IsSplit(key.block)) {
        total_age += age(key.block);
        ++freeable_count;
      }
    }
  }
  if (freeable_count == 0) return;

  uint64_t reclaimed_bytes = 0;
  bool block_freed = true;
  while (reclaimed_bytes < target_bytes && block_freed && freeable_count > 0) {
    // The threshold is fixed for one pass; every old-enough block is freed
    // in the pass even after the target is met (torch: "we don't want this
    // GC to be triggered frequently").
    const double age_threshold =
        static_cast<double>(total_age) / static_cast<double>(freeable_count);
    block_freed = false;
    scratch.clear();
    for (const alloc::Pool& pool : pools) {
      if (pool.is_small) continue;
      for (const alloc::FreeKey& key : pool.blocks) {
        if (!IsSplit(key.block) && !IsExpandable(key.block) &&
            static_cast<double>(age(key.block)) >= age_threshold) {
          scratch.push_back(key.block);
        }
      }
    }
    for (uint32_t b : scratch) {
      block_freed = true;
      reclaimed_bytes += blocks[b].size_bytes;
      total_age -= age(b);
      --freeable_count;
      ReleaseBlock(b);
    }
  }
}

// torch: the OutOfMemoryError raised at the end of malloc. "Tried to
// allocate" prints alloc_size (the segment size), as PyTorch does. The
// model's device limit stands for the GPU's total capacity; the per-process
// part ("Process N has X memory in use") needs NVML and is left out.
void CachingAllocator::Impl::RecordOom(uint64_t orig_bytes, uint64_t alloc_bytes) {
  ++stats.num_ooms;
  const uint64_t free_bytes =
      device_limit_bytes - std::min(device_limit_bytes, stats.reserved_bytes);
  std::string allowed_info;
  if (allowed_max_bytes) allowed_info = alloc::FormatSize(*allowed_max_bytes) + " allowed; ";
  OomInfo oom;
  oom.requested_bytes = orig_bytes;
  oom.alloc_size_bytes = alloc_bytes;
  oom.device_limit_bytes = device_limit_bytes;
  oom.allocated_bytes = stats.allocated_bytes;
  oom.reserved_bytes = stats.reserved_bytes;
  oom.free_device_bytes = free_bytes;
  oom.message = fmt::format(
      "CUDA out of memory. Tried to allocate {}. GPU 0 has a total capacity of {} of which {} "
      "is free. {}Of the allocated memory {} is allocated by PyTorch, and {} is reserved by "
      "PyTorch but unallocated. If reserved but unallocated memory is large try setting "
      "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
      "documentation for Memory Management  "
      "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
      alloc::FormatSize(alloc_bytes), alloc::FormatSize(device_limit_bytes),
      alloc::FormatSize(free_bytes), allowed_info, alloc::FormatSize(stats.allocated_bytes),
      alloc::FormatSize(stats.reserved_bytes - stats.allocated_bytes));
  last_oom = std::move(oom);
}

// torch: NativeCachingAllocator::allocate checks size < 1 EB (2^60) before
// calling the device allocator and raises OutOfMemoryError with its own
// message; num_ooms is not incremented.
void CachingAllocator::Impl::RecordOversizeRequest(uint64_t orig_bytes) {
  OomInfo oom;
  oom.requested_bytes = orig_bytes;
  oom.alloc_size_bytes = orig_bytes;
  oom.device_limit_bytes = device_limit_bytes;
  oom.allocated_bytes = stats.allocated_bytes;
  oom.reserved_bytes = stats.reserved_bytes;
  oom.free_device_bytes = device_limit_bytes - std::min(device_limit_bytes, stats.reserved_bytes);
  oom.message = "CUDA out of memory. Tried to allocate more than 1EB memory.";
  last_oom = std::move(oom);
}

// vramscope's ideal mode: every request is its own exactly-sized segment,
// released at free, so reserved == allocated == requested at all times.
std::optional<BlockHandle> CachingAllocator::Impl::IdealMalloc(uint64_t size_bytes,
                                                               uint32_t stream) {
  const uint32_t pool = PoolFor(stream, size_bytes <= alloc::kSmallSizeBytes);
  const bool fits = alloc::FitsUnder(stats.reserved_bytes, size_bytes, device_limit_bytes) &&
                    (!allowed_max_bytes ||
                     alloc::FitsUnder(stats.reserved_bytes, size_bytes, *allowed_max_bytes));
  const std::optional<uint64_t> address = fits ? address_space.Reserve(size_bytes) : std::nullopt;
  if (!address) {
    RecordOom(size_bytes, size_bytes);
    return std::nullopt;
  }
  const uint32_t s = segments.New();
  segments[s].address = *address;
  segments[s].size_bytes = size_bytes;
  segments[s].pool = pool;
  const uint32_t b = blocks.New();
  Block& block = blocks[b];
  block.address = *address;
  block.size_bytes = size_bytes;
  block.requested_bytes = size_bytes;
  block.segment = s;
  block.pool = pool;
  block.allocated = true;
  AddReserved(pool, size_bytes);
  ++stats.num_segments;
  ++stats.num_device_alloc;
  CountAllocated(size_bytes, size_bytes);
  return b;
}

void CachingAllocator::Impl::IdealFree(uint32_t b) {
  const Block block = blocks[b];
  stats.allocated_bytes -= block.size_bytes;
  stats.active_bytes -= block.size_bytes;
  stats.requested_bytes -= block.size_bytes;
  SubReserved(block.pool, block.size_bytes);
  --stats.num_segments;
  ++stats.num_device_free;
  address_space.Release(block.address, block.size_bytes);
  segments.Delete(block.segment);
  blocks.Delete(b);
}

}  // namespace vramscope
