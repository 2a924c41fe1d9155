// Segments() (torch.cuda.memory_snapshot()) and CheckInvariants().
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <deque>
#include <map>
#include <unordered_map>
#include <utility>
#include <vector>

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
                             block.allocated ? block.requested_bytes : 0, block.allocated,
                             /*pending_free=*/block.event_count > 0});
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

// The parts of CachingAllocator::Impl the checks read. Impl is a private
// type of CachingAllocator, so the checks below take its parts instead.
struct AllocatorState {
  const alloc::Arena<Block>& blocks;
  const alloc::Arena<alloc::Segment>& segments;
  const std::deque<alloc::Pool>& pools;
  const std::array<uint64_t, 2>& free_block_calls;
  const AllocatorConfig& config;
  const AllocatorStats& stats;
  uint64_t device_limit_bytes;
  const std::vector<uint64_t>& reserved_by_pool;
  const std::map<uint32_t, alloc::StreamEvents>& events_by_stream;
  const std::unordered_map<uint32_t, std::vector<uint32_t>>& stream_uses;
  size_t open_tickets;
};

// What the walk over the segments' block lists adds up; the pool indexes and
// the statistics must agree with it.
struct BlockTotals {
  uint64_t segment_blocks = 0;  // live blocks that should be in some segment's list
  uint64_t visited = 0;         // blocks reached through the lists
  uint64_t allocated = 0, requested = 0, reserved = 0;
  uint64_t pending = 0;         // freed blocks waiting for other streams' events
  uint64_t pending_events = 0;  // sum of their event counts
  uint64_t pending_blocks = 0;
  std::vector<uint64_t> pool_reserved;  // reserved per pool
  uint64_t ranges = 0;                  // contiguous mapped ranges (torch counts each as a segment)
  uint64_t free_mapped = 0, unmapped = 0;
};

// 1a. Every live block belongs to a live segment of its own pool, and each
// segment has exactly one first block: head_of[segment] is that block.
Status FindSegmentHeads(const AllocatorState& a, std::vector<uint32_t>* head_of,
                        BlockTotals* totals) {
  head_of->assign(a.segments.capacity(), kNil);
  for (uint32_t b = 0; b < a.blocks.capacity(); ++b) {
    const Block& block = a.blocks[b];
    if (!block.live || block.zero_size) continue;
    ++totals->segment_blocks;
    if (!a.segments.IsLive(block.segment)) {
      return Violation(fmt::format("block {} belongs to no live segment", b));
    }
    if (block.pool != a.segments[block.segment].pool) {
      return Violation(fmt::format("block {} is in another pool than its segment", b));
    }
    if (block.prev != kNil) continue;
    if ((*head_of)[block.segment] != kNil) {
      return Violation(fmt::format("segment {} has two first blocks", block.segment));
    }
    (*head_of)[block.segment] = b;
  }
  return Ok{};
}

// A free block (after `prev` in its list): merged with a free neighbour of the
// same kind as PyTorch's free_block does, findable in its pool's index at its
// own entry (what best fit searches), and stamped by the GC clock no later
// than now.
Status CheckFreeBlock(const AllocatorState& a, uint32_t b, uint32_t prev, BlockTotals* totals) {
  const Block& block = a.blocks[b];
  (block.mapped ? totals->free_mapped : totals->unmapped) += 1;
  if (prev != kNil && !a.blocks[prev].allocated && a.blocks[prev].event_count == 0 &&
      a.blocks[prev].mapped == block.mapped) {
    return Violation(fmt::format("free blocks {} and {} were not merged", prev, b));
  }
  const alloc::Pool& pool = a.pools[block.pool];
  const bool indexed = block.mapped ? pool.blocks.count({block.size_bytes, block.address, b}) == 1
                                    : pool.unmapped.count({block.address, b}) == 1;
  if (!indexed) return Violation(fmt::format("free block {} is missing from its pool", b));
  // The remembered position must be the block's own entry.
  if (block.mapped != block.in_free_set ||
      (block.mapped &&
       (block.free_pos->block != b || block.free_pos->size_bytes != block.size_bytes ||
        block.free_pos->address != block.address))) {
    return Violation(fmt::format("free block {} has a stale position in its pool", b));
  }
  if (block.gc_count_base > a.free_block_calls[pool.is_small]) {
    return Violation(fmt::format("free block {} has a GC stamp from the future", b));
  }
  return Ok{};
}

// A block freed while other streams' events are outstanding: mapped, not
// allocated, in no pool, and with no request left (free() keeps
// requested_bytes until free_block, like active).
Status CheckPendingBlock(const AllocatorState& a, uint32_t b, BlockTotals* totals) {
  const Block& block = a.blocks[b];
  if (block.allocated || !block.mapped || block.in_free_set || a.config.ideal) {
    return Violation(fmt::format("pending block {} is allocated, unmapped or cached", b));
  }
  totals->pending += block.size_bytes;
  totals->pending_events += block.event_count;
  ++totals->pending_blocks;
  totals->requested += block.requested_bytes;
  return Ok{};
}

// One block of segment `s`'s list, reached from `prev` and expected at
// `address`: its links, its place (no gap, no overlap), its mapping (only
// expandable segments unmap, page by page), then the allocated or free
// block's own rules. Counts it in `totals`.
Status CheckListedBlock(const AllocatorState& a, uint32_t s, uint32_t b, uint32_t prev,
                        uint64_t address, BlockTotals* totals) {
  const alloc::Segment& segment = a.segments[s];
  const Block& block = a.blocks[b];
  if (++totals->visited > totals->segment_blocks) return Violation("a block list has a cycle");
  if (block.segment != s || block.prev != prev) {
    return Violation(fmt::format("block {} has broken neighbour links", b));
  }
  if (block.address != address || block.size_bytes == 0) {
    return Violation(fmt::format("block {} at {:#x} leaves a gap or overlaps", b, block.address));
  }
  if (!segment.expandable() && !block.mapped) {
    return Violation(fmt::format("block {} of a cudaMalloc segment is unmapped", b));
  }
  if (!block.mapped && ((block.address - segment.address) % segment.page_bytes != 0 ||
                        block.size_bytes % segment.page_bytes != 0)) {
    return Violation(fmt::format("unmapped block {} is not page aligned", b));
  }
  if (block.allocated && !block.mapped)
    return Violation(fmt::format("block {} allocated but unmapped", b));
  if (block.mapped && (prev == kNil || !a.blocks[prev].mapped)) ++totals->ranges;
  if (block.mapped) {
    totals->reserved += block.size_bytes;
    totals->pool_reserved[block.pool] += block.size_bytes;
  }
  if (block.event_count > 0) return CheckPendingBlock(a, b, totals);
  if (!block.allocated) return CheckFreeBlock(a, b, prev, totals);
  if (block.in_free_set) return Violation(fmt::format("allocated block {} is in a free set", b));
  totals->allocated += block.size_bytes;
  totals->requested += block.requested_bytes;
  if (!a.config.ideal && block.requested_bytes > block.size_bytes) {
    return Violation(fmt::format("block {} is smaller than its request", b));
  }
  return Ok{};
}

// 1b. Each live segment's list, from its first block, tiles the segment
// exactly, and the lists together hold every live block once.
Status WalkSegments(const AllocatorState& a, const std::vector<uint32_t>& head_of,
                    BlockTotals* totals) {
  for (uint32_t s = 0; s < a.segments.capacity(); ++s) {
    if (!a.segments.IsLive(s)) continue;
    const alloc::Segment& segment = a.segments[s];
    if (head_of[s] == kNil) return Violation(fmt::format("segment {} has no blocks", s));
    uint64_t address = segment.address;
    uint32_t prev = kNil;
    for (uint32_t b = head_of[s]; b != kNil; prev = b, b = a.blocks[b].next) {
      if (Status ok = CheckListedBlock(a, s, b, prev, address, totals); !ok.ok()) return ok;
      address += a.blocks[b].size_bytes;
    }
    if (address - segment.address != segment.size_bytes) {
      return Violation(fmt::format("segment {}: blocks sum to {} bytes, segment has {}", s,
                                   address - segment.address, segment.size_bytes));
    }
  }
  if (totals->visited != totals->segment_blocks) {
    return Violation(fmt::format("{} blocks are in no segment's list",
                                 totals->segment_blocks - totals->visited));
  }
  return Ok{};
}

// 2. Segments do not overlap (two cudaMallocs never share an address).
Status CheckSegmentsDisjoint(const AllocatorState& a) {
  std::vector<std::pair<uint64_t, uint64_t>> extents;
  for (uint32_t s = 0; s < a.segments.capacity(); ++s) {
    if (a.segments.IsLive(s)) extents.emplace_back(a.segments[s].address, a.segments[s].size_bytes);
  }
  std::sort(extents.begin(), extents.end());
  for (size_t i = 1; i < extents.size(); ++i) {
    if (extents[i - 1].first + extents[i - 1].second > extents[i].first) {
      return Violation(fmt::format("segments at {:#x} and {:#x} overlap", extents[i - 1].first,
                                   extents[i].first));
    }
  }
  return Ok{};
}

// 3. Pool indexes hold exactly the free blocks: each entry is a free block of
// its pool (the blocks' side was checked in the walk), and the counts match.
Status CheckPoolIndexes(const AllocatorState& a, const BlockTotals& totals) {
  uint64_t indexed_free = 0, indexed_unmapped = 0;
  for (const alloc::Pool& pool : a.pools) {
    indexed_free += pool.blocks.size();
    indexed_unmapped += pool.unmapped.size();
    for (const alloc::FreeKey& key : pool.blocks) {
      if (!a.blocks.IsLive(key.block) || a.blocks[key.block].allocated ||
          !a.blocks[key.block].mapped || &a.pools[a.blocks[key.block].pool] != &pool) {
        return Violation(fmt::format("pool entry {} is not a free block of this pool", key.block));
      }
    }
  }
  if (indexed_free != totals.free_mapped || indexed_unmapped != totals.unmapped) {
    return Violation("pool indexes hold blocks that are not free blocks of any segment");
  }
  return Ok{};
}

// 4. Statistics (torch.cuda.memory_stats) match the blocks, peaks are at
// least the current values, and reserved memory stays within the device.
Status CheckStats(const AllocatorState& a, const BlockTotals& totals) {
  const AllocatorStats& st = a.stats;
  auto mismatch = [](const char* name, uint64_t stat, uint64_t sum) {
    return Violation(fmt::format("{} is {} but the blocks sum to {}", name, stat, sum));
  };
  if (st.allocated_bytes != totals.allocated)
    return mismatch("allocated_bytes", st.allocated_bytes, totals.allocated);
  // Active = allocated + freed blocks still waiting for other streams.
  if (st.active_bytes != totals.allocated + totals.pending)
    return mismatch("active_bytes", st.active_bytes, totals.allocated + totals.pending);
  if (st.requested_bytes != totals.requested)
    return mismatch("requested_bytes", st.requested_bytes, totals.requested);
  if (st.reserved_bytes != totals.reserved)
    return mismatch("reserved_bytes", st.reserved_bytes, totals.reserved);
  if (st.num_segments != totals.ranges)
    return mismatch("num_segments", st.num_segments, totals.ranges);
  for (size_t p = 0; p < a.pools.size(); ++p) {
    if (a.reserved_by_pool[p] != totals.pool_reserved[p]) {
      return mismatch("reserved_bytes of a pool", a.reserved_by_pool[p], totals.pool_reserved[p]);
    }
  }
  if (st.peak_allocated_bytes < st.allocated_bytes || st.peak_reserved_bytes < st.reserved_bytes ||
      st.peak_active_bytes < st.active_bytes || st.peak_requested_bytes < st.requested_bytes) {
    return Violation("a peak is below its current value");
  }
  if (st.reserved_bytes > a.device_limit_bytes)
    return Violation("reserved exceeds the device limit");
  if (a.config.ideal && st.reserved_bytes != st.allocated_bytes) {
    return Violation("ideal mode: reserved != allocated");
  }
  return Ok{};
}

// 5. Every pending block's events are queued on their streams, in order,
// and only allocated blocks carry stream uses.
Status CheckStreamEvents(const AllocatorState& a, const BlockTotals& totals) {
  uint64_t queued = 0;
  for (const auto& [stream, events] : a.events_by_stream) {
    uint64_t last_seq = 0;
    for (const alloc::PendingEvent& e : events.queue) {
      if (e.seq <= last_seq || e.seq > events.recorded || !a.blocks.IsLive(e.block) ||
          a.blocks[e.block].event_count == 0) {
        return Violation(fmt::format("stream {} has a stray or unordered event", stream));
      }
      last_seq = e.seq;
    }
    if (events.completed > events.recorded) {
      return Violation(fmt::format("stream {} completed events it never recorded", stream));
    }
    queued += events.queue.size();
  }
  // A ticket is dropped once its block is cached: open ones name pending blocks.
  if (a.open_tickets > totals.pending_blocks) {
    return Violation(fmt::format("{} open free tickets for {} pending blocks", a.open_tickets,
                                 totals.pending_blocks));
  }
  if (queued != totals.pending_events) {
    return Violation(
        fmt::format("{} events queued, pending blocks count {}", queued, totals.pending_events));
  }
  for (const auto& [b, uses] : a.stream_uses) {
    if (!a.blocks.IsLive(b) || !a.blocks[b].allocated) {
      return Violation(fmt::format("block {} has stream uses but is not allocated", b));
    }
  }
  return Ok{};
}

}  // namespace

// The checks run in this order and the first violation is the answer, so a
// broken list is reported as such before the totals built on it disagree.
Status CachingAllocator::Impl::CheckInvariants() const {
  const AllocatorState state{blocks,
                             segments,
                             pools,
                             free_block_calls,
                             config,
                             stats,
                             device_limit_bytes,
                             reserved_by_pool,
                             events_by_stream,
                             stream_uses};
  std::vector<uint32_t> head_of;
  BlockTotals totals;
  totals.pool_reserved.assign(pools.size(), 0);
  if (Status ok = FindSegmentHeads(state, &head_of, &totals); !ok.ok()) return ok;
  if (Status ok = WalkSegments(state, head_of, &totals); !ok.ok()) return ok;
  if (Status ok = CheckSegmentsDisjoint(state); !ok.ok()) return ok;
  if (Status ok = CheckPoolIndexes(state, totals); !ok.ok()) return ok;
  if (Status ok = CheckStreamEvents(state, totals); !ok.ok()) return ok;
  return CheckStats(state, totals);
}

}  // namespace vramscope
