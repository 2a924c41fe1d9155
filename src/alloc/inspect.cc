// Segments() (torch.cuda.memory_snapshot()) and CheckInvariants().
#include <fmt/format.h>

#include <algorithm>

#include "allocator_impl.h"
#include "sizing.h"

namespace vramscope {

using alloc::Block;
using alloc::kNil;

// torch: DeviceCachingAllocator::snapshot: one entry per cudaMalloc segment;
// an expandable segment shows one entry per contiguous mapped range.
std::vector<SegmentView> CachingAllocator::Impl::Segments() const {
  std::vector<SegmentView> out;
  for (uint32_t b = 0; b < blocks.capacity(); ++b) {
    const Block& head = blocks[b];
    if (!head.live || head.zero_size || !head.mapped) continue;
    if (head.prev != kNil && blocks[head.prev].mapped) continue;  // not a range start
    SegmentView view;
    view.address = head.address;
    view.stream = pools[head.pool].stream;
    view.small_pool = pools[head.pool].is_small;
    view.expandable = segments[head.segment].expandable();
    for (uint32_t c = b; c != kNil && blocks[c].mapped; c = blocks[c].next) {
      const Block& block = blocks[c];
      view.blocks.push_back({block.address, block.size_bytes,
                             block.allocated ? block.requested_bytes : 0, block.allocated});
      view.total_bytes += block.size_bytes;
    }
    out.push_back(std::move(view));
  }
  std::sort(out.begin(), out.end(),
            [](const SegmentView& a, const SegmentView& b) { return a.address < b.address; });
  return out;
}

namespace {

Error Violation(const std::string& what) {
  return MakeError("allocator invariant violated: " + what);
}

}  // namespace

Status CachingAllocator::Impl::CheckInvariants() const {
  // 1. Walk every segment from its first block: blocks tile it exactly.
  std::vector<uint32_t> head_of(segments.capacity(), kNil);
  uint64_t segment_blocks = 0;
  for (uint32_t b = 0; b < blocks.capacity(); ++b) {
    const Block& block = blocks[b];
    if (!block.live || block.zero_size) continue;
    ++segment_blocks;
    if (!segments.IsLive(block.segment)) {
      return Violation(fmt::format("block {} belongs to no live segment", b));
    }
    if (block.pool != segments[block.segment].pool) {
      return Violation(fmt::format("block {} is in another pool than its segment", b));
    }
    if (block.prev != kNil) continue;
    if (head_of[block.segment] != kNil) {
      return Violation(fmt::format("segment {} has two first blocks", block.segment));
    }
    head_of[block.segment] = b;
  }
  uint64_t visited = 0, allocated = 0, requested = 0, reserved = 0, ranges = 0;
  uint64_t free_mapped = 0, unmapped = 0;
  std::vector<std::pair<uint64_t, uint64_t>> extents;
  for (uint32_t s = 0; s < segments.capacity(); ++s) {
    if (!segments.IsLive(s)) continue;
    const alloc::Segment& segment = segments[s];
    extents.emplace_back(segment.address, segment.size_bytes);
    if (head_of[s] == kNil) return Violation(fmt::format("segment {} has no blocks", s));
    uint64_t address = segment.address;
    uint32_t prev = kNil;
    for (uint32_t b = head_of[s]; b != kNil; prev = b, b = blocks[b].next) {
      const Block& block = blocks[b];
      if (++visited > segment_blocks) return Violation("a block list has a cycle");
      if (block.segment != s || block.prev != prev) {
        return Violation(fmt::format("block {} has broken neighbour links", b));
      }
      if (block.address != address || block.size_bytes == 0) {
        return Violation(fmt::format("block {} at {:#x} leaves a gap or overlaps", b, block.address));
      }
      address += block.size_bytes;
      if (!segment.expandable() && !block.mapped) {
        return Violation(fmt::format("block {} of a cudaMalloc segment is unmapped", b));
      }
      if (!block.mapped && ((block.address - segment.address) % segment.page_bytes != 0 ||
                            block.size_bytes % segment.page_bytes != 0)) {
        return Violation(fmt::format("unmapped block {} is not page aligned", b));
      }
      if (block.allocated && !block.mapped) return Violation(fmt::format("block {} allocated but unmapped", b));
      if (block.mapped && (prev == kNil || !blocks[prev].mapped)) ++ranges;
      if (block.mapped) reserved += block.size_bytes;
      if (block.allocated) {
        if (block.in_free_set) return Violation(fmt::format("allocated block {} is in a free set", b));
        allocated += block.size_bytes;
        requested += block.requested_bytes;
        if (!config.ideal && block.requested_bytes > block.size_bytes) {
          return Violation(fmt::format("block {} is smaller than its request", b));
        }
      } else {
        (block.mapped ? free_mapped : unmapped) += 1;
        if (prev != kNil && !blocks[prev].allocated && blocks[prev].mapped == block.mapped) {
          return Violation(fmt::format("free blocks {} and {} were not merged", prev, b));
        }
        const alloc::Pool& pool = pools[block.pool];
        const bool indexed =
            block.mapped ? pool.blocks.count({block.size_bytes, block.address, b}) == 1
                         : pool.unmapped.count({block.address, b}) == 1;
        if (!indexed) return Violation(fmt::format("free block {} is missing from its pool", b));
        // The remembered position must be the block's own entry.
        if (block.mapped != block.in_free_set ||
            (block.mapped && (block.free_pos->block != b || block.free_pos->size_bytes != block.size_bytes ||
                              block.free_pos->address != block.address))) {
          return Violation(fmt::format("free block {} has a stale position in its pool", b));
        }
        if (block.gc_count_base > free_block_calls[pool.is_small]) {
          return Violation(fmt::format("free block {} has a GC stamp from the future", b));
        }
      }
    }
    if (address - segment.address != segment.size_bytes) {
      return Violation(fmt::format("segment {}: blocks sum to {} bytes, segment has {}", s,
                                   address - segment.address, segment.size_bytes));
    }
  }
  if (visited != segment_blocks) {
    return Violation(fmt::format("{} blocks are in no segment's list", segment_blocks - visited));
  }
  // 2. Segments do not overlap.
  std::sort(extents.begin(), extents.end());
  for (size_t i = 1; i < extents.size(); ++i) {
    if (extents[i - 1].first + extents[i - 1].second > extents[i].first) {
      return Violation(fmt::format("segments at {:#x} and {:#x} overlap", extents[i - 1].first,
                                   extents[i].first));
    }
  }
  // 3. Pool indexes hold exactly the free blocks (entries checked above).
  uint64_t indexed_free = 0, indexed_unmapped = 0;
  for (const alloc::Pool& pool : pools) {
    indexed_free += pool.blocks.size();
    indexed_unmapped += pool.unmapped.size();
    for (const alloc::FreeKey& key : pool.blocks) {
      if (!blocks.IsLive(key.block) || blocks[key.block].allocated || !blocks[key.block].mapped ||
          &pools[blocks[key.block].pool] != &pool) {
        return Violation(fmt::format("pool entry {} is not a free block of this pool", key.block));
      }
    }
  }
  if (indexed_free != free_mapped || indexed_unmapped != unmapped) {
    return Violation("pool indexes hold blocks that are not free blocks of any segment");
  }
  // 4. Statistics match the blocks.
  const AllocatorStats& st = stats;
  auto mismatch = [](const char* name, uint64_t stat, uint64_t sum) {
    return Violation(fmt::format("{} is {} but the blocks sum to {}", name, stat, sum));
  };
  if (st.allocated_bytes != allocated) return mismatch("allocated_bytes", st.allocated_bytes, allocated);
  // No record_stream events are modelled, so active == allocated.
  if (st.active_bytes != allocated) return mismatch("active_bytes", st.active_bytes, allocated);
  if (st.requested_bytes != requested) return mismatch("requested_bytes", st.requested_bytes, requested);
  if (st.reserved_bytes != reserved) return mismatch("reserved_bytes", st.reserved_bytes, reserved);
  if (st.num_segments != ranges) return mismatch("num_segments", st.num_segments, ranges);
  if (st.peak_allocated_bytes < st.allocated_bytes || st.peak_reserved_bytes < st.reserved_bytes ||
      st.peak_active_bytes < st.active_bytes || st.peak_requested_bytes < st.requested_bytes) {
    return Violation("a peak is below its current value");
  }
  if (st.reserved_bytes > device_limit_bytes) return Violation("reserved exceeds the device limit");
  if (config.ideal && st.reserved_bytes != st.allocated_bytes) {
    return Violation("ideal mode: reserved != allocated");
  }
  return Ok{};
}

}  // namespace vramscope
