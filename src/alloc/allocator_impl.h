// CachingAllocator::Impl: state and internal steps of the allocator model.
//
// Method names follow DeviceCachingAllocator's (c10/cuda/CUDACachingAllocator.cpp)
// so each step can be compared with PyTorch's. The steps are split by topic:
//   caching_allocator.cc  malloc / free / best fit / split / merge / stats
//   release.cc            release_cached_blocks, release_available_cached_blocks,
//                         garbage_collect_cached_blocks, OOM message, ideal mode
//   expandable.cc         expandable segments (find, map, unmap)
//   inspect.cc            Segments() and CheckInvariants()
//   stream_events.cc      record_stream: deferred frees and their events
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <memory_resource>
#include <optional>
#include <unordered_map>
#include <vector>

#include "address_space.h"
#include "block_store.h"
#include "vramscope/allocator.h"

namespace vramscope {

struct CachingAllocator::Impl {
  Impl(const AllocatorConfig& config, uint64_t device_limit_bytes);

  // torch: AllocParams.
  struct Request {
    uint64_t orig_bytes = 0;   // caller's size
    uint64_t size_bytes = 0;   // round_size(orig)
    uint64_t alloc_bytes = 0;  // get_allocation_size(size)
    uint32_t pool = alloc::kNil;
    uint32_t block = alloc::kNil;  // the block found or created
  };

  // ---- caching_allocator.cc
  std::optional<BlockHandle> Malloc(uint64_t size_bytes, uint32_t stream);
  FreeTicket Free(BlockHandle handle);
  uint32_t PoolFor(uint32_t stream, bool small);
  bool GetFreeBlock(Request& r);
  bool AllocBlock(Request& r, bool is_retry);
  bool ShouldSplit(uint32_t block, uint64_t size_bytes) const;
  uint32_t AllocFoundBlock(const Request& r, bool split);
  void FreeBlock(uint32_t block);
  uint64_t TryMergeBlocks(uint32_t dst, uint32_t src);
  void InsertFree(uint32_t block);
  void EraseFree(uint32_t block);
  // Takes the entry at `pos` out of `pool`'s free set; its tree node becomes
  // spare_node, for the next InsertFree.
  void ExtractFree(alloc::Pool& pool, alloc::FreeSet::const_iterator pos);
  bool IsExpandable(uint32_t block) const { return segments[blocks[block].segment].expandable(); }
  bool IsSplit(uint32_t block) const {
    return blocks[block].prev != alloc::kNil || blocks[block].next != alloc::kNil;
  }
  bool GcEnabled() const {
    return allowed_max_bytes.has_value() && config.garbage_collection_threshold > 0.0;
  }
  void AddReserved(uint32_t pool, uint64_t bytes);
  void SubReserved(uint32_t pool, uint64_t bytes);
  // Counts a newly allocated block in allocated / active / requested.
  void CountAllocated(uint64_t block_bytes, uint64_t requested_bytes);

  // ---- release.cc
  bool ReleaseCachedBlocks();
  void ReleaseBlocks(alloc::Pool& pool);
  void ReleaseBlock(uint32_t block);
  bool ReleaseAvailableCachedBlocks(const Request& r);
  void GarbageCollectCachedBlocks();
  void RecordOom(uint64_t orig_bytes, uint64_t alloc_bytes);
  void RecordOversizeRequest(uint64_t orig_bytes);
  std::optional<BlockHandle> IdealMalloc(uint64_t size_bytes, uint32_t stream);
  void IdealFree(uint32_t block);

  // ---- expandable.cc
  uint32_t TryAllocateExpandableBlock(const Request& r);
  uint32_t FindExpandableBlock(uint32_t pool, uint64_t size_bytes);
  bool MapBlock(uint32_t block, uint64_t size_bytes);
  void UnmapBlock(uint32_t block);
  void ReleaseExpandableSegment(uint32_t block);
  uint64_t ExpandableSize(uint32_t block) const;

  // ---- stream_events.cc
  void RecordStream(uint32_t block, uint32_t stream);
  FreeTicket InsertEvents(uint32_t block);
  void CompleteFreeEvents(FreeTicket ticket);
  void ProcessEvents();
  void SynchronizeAndFreeEvents();
  // A pending block's last event completed: it goes back to its pool.
  void FinishEvent(uint32_t block, FreeTicket ticket);

  // ---- inspect.cc
  std::vector<SegmentView> Segments() const;
  Status CheckInvariants() const;

  AllocatorConfig config;
  uint64_t device_limit_bytes;
  // torch: allowed_memory_maximum, set by set_per_process_memory_fraction.
  std::optional<uint64_t> allowed_max_bytes;
  AllocatorStats stats;
  std::optional<OomInfo> last_oom;

  // Tree nodes of every pool come from here and are recycled, so the hot
  // path does not call the global allocator once the pools are warm.
  std::pmr::unsynchronized_pool_resource nodes;
  alloc::Arena<alloc::Block> blocks;
  alloc::Arena<alloc::Segment> segments;
  std::deque<alloc::Pool> pools;  // deque: pools never move
  // The tree node of the block last taken out of a free set, reused by the
  // next InsertFree: a malloc that splits and a free that merges then move
  // one node around instead of returning it to `nodes` and taking it back.
  // Declared after `nodes` and `pools` so that it is destroyed first.
  alloc::FreeSet::node_type spare_node;
  std::unordered_map<uint32_t, std::array<uint32_t, 2>> pools_by_stream;  // [large, small]
  uint32_t cached_stream = 0;
  std::array<uint32_t, 2> cached_pools{alloc::kNil, alloc::kNil};
  // torch: BlockPool::get_free_blocks_call_count, one clock per pool kind
  // (all streams share PyTorch's large_blocks / small_blocks pools).
  std::array<uint64_t, 2> free_block_calls{0, 0};  // [large, small]
  alloc::AddressSpace address_space;
  std::vector<uint32_t> scratch;  // reused by release paths
  // reserved_bytes per pool (same index as `pools`), for ReservedByStream.
  std::vector<uint64_t> reserved_by_pool;

  // record_stream state (torch: Block::stream_uses, cuda_events).
  // The other streams each allocated block was used on; only blocks with
  // uses have an entry, erased when the block is freed.
  std::unordered_map<uint32_t, std::vector<uint32_t>> stream_uses;
  std::map<uint32_t, alloc::StreamEvents> events_by_stream;  // ordered: deterministic
  std::unordered_map<FreeTicket, std::vector<alloc::TicketEvent>> tickets;
  FreeTicket next_ticket = 1;
  // Some event was completed since the last ProcessEvents.
  bool events_to_process = false;
};

}  // namespace vramscope
