// The malloc / free path of PyTorch's CUDACachingAllocator (native backend),
// following DeviceCachingAllocator in c10/cuda/CUDACachingAllocator.cpp of
// torch 2.4-2.11 (the steps below did not change across those versions
// except where noted).
#include <algorithm>

#include "allocator_impl.h"
#include "sizing.h"

namespace vramscope {

using alloc::Block;
using alloc::kNil;

namespace {

// Where simulated device addresses start (looks like a CUDA pointer) and end.
constexpr uint64_t kAddressBase = 0x7f0000000000;
constexpr uint64_t kAddressEnd = ~uint64_t{0} - (2 * kMiB - 1);

void Raise(uint64_t& current, uint64_t& peak, uint64_t bytes) {
  current += bytes;
  peak = std::max(peak, current);
}

std::optional<uint64_t> AllowedMaximum(const AllocatorConfig& config, uint64_t limit_bytes) {
  if (!config.per_process_memory_fraction) return std::nullopt;
  // torch setMemoryFraction: allowed = fraction * total device memory. The
  // model's total is the device limit.
  const double allowed = *config.per_process_memory_fraction * static_cast<double>(limit_bytes);
  if (allowed >= 18446744073709551615.0) return kUnlimited;
  return static_cast<uint64_t>(allowed);
}

}  // namespace

CachingAllocator::Impl::Impl(const AllocatorConfig& cfg, uint64_t limit_bytes)
    : config(cfg),
      device_limit_bytes(limit_bytes),
      allowed_max_bytes(AllowedMaximum(cfg, limit_bytes)),
      // Ideal mode hands out exact sizes; keep them 512-byte aligned like
      // cudaMalloc. Caching modes only ever reserve multiples of 2 MiB.
      address_space(kAddressBase, kAddressEnd & ~(2 * kMiB - 1),
                    cfg.ideal ? alloc::kMinBlockBytes : 2 * kMiB) {
  VS_CHECK(ValidateAllocConfig(cfg).ok());
}

void CachingAllocator::Impl::AddReserved(uint32_t pool, uint64_t bytes) {
  Raise(stats.reserved_bytes, stats.peak_reserved_bytes, bytes);
  reserved_by_pool[pool] += bytes;
}
void CachingAllocator::Impl::SubReserved(uint32_t pool, uint64_t bytes) {
  VS_CHECK(stats.reserved_bytes >= bytes && reserved_by_pool[pool] >= bytes);
  stats.reserved_bytes -= bytes;
  reserved_by_pool[pool] -= bytes;
}
void CachingAllocator::Impl::CountAllocated(uint64_t block_bytes, uint64_t requested_bytes) {
  Raise(stats.allocated_bytes, stats.peak_allocated_bytes, block_bytes);
  Raise(stats.active_bytes, stats.peak_active_bytes, block_bytes);
  Raise(stats.requested_bytes, stats.peak_requested_bytes, requested_bytes);
}

uint32_t CachingAllocator::Impl::PoolFor(uint32_t stream, bool small) {
  if (cached_pools[0] == kNil || stream != cached_stream) {
    auto [it, inserted] = pools_by_stream.try_emplace(stream);
    if (inserted) {
      for (int kind = 0; kind < 2; ++kind) {
        it->second[kind] = static_cast<uint32_t>(pools.size());
        pools.emplace_back(stream, /*small=*/kind == 1, &nodes);
        reserved_by_pool.push_back(0);
      }
    }
    cached_stream = stream;
    cached_pools = it->second;
  }
  return cached_pools[small ? 1 : 0];
}

void CachingAllocator::Impl::InsertFree(uint32_t b) {
  Block& block = blocks[b];
  alloc::Pool& pool = pools[block.pool];
  VS_CHECK(!block.in_free_set);
  // torch BlockPool::insert_into_blocks stamps the pool's clock for GC.
  block.gc_count_base = free_block_calls[pool.is_small];
  const alloc::FreeKey key{block.size_bytes, block.address, b};
  if (spare_node.empty()) {
    const auto [pos, inserted] = pool.blocks.insert(key);
    VS_CHECK(inserted);
    block.free_pos = pos;
  } else {
    spare_node.value() = key;
    const auto result = pool.blocks.insert(std::move(spare_node));
    VS_CHECK(result.inserted);
    block.free_pos = result.position;
  }
  block.in_free_set = true;
}

void CachingAllocator::Impl::ExtractFree(alloc::Pool& pool, alloc::FreeSet::const_iterator pos) {
  blocks[pos->block].in_free_set = false;
  spare_node = pool.blocks.extract(pos);
}

void CachingAllocator::Impl::EraseFree(uint32_t b) {
  const Block& block = blocks[b];
  VS_CHECK(block.in_free_set && block.free_pos->block == b);
  ExtractFree(pools[block.pool], block.free_pos);
}

// torch: DeviceCachingAllocator::malloc.
std::optional<BlockHandle> CachingAllocator::Impl::Malloc(uint64_t orig_bytes, uint32_t stream) {
  if (orig_bytes == 0) {
    // torch: allocate(0) returns a null DataPtr without calling malloc, so
    // a zero-byte tensor costs nothing and touches no statistic.
    const uint32_t b = blocks.New();
    blocks[b].zero_size = true;
    blocks[b].allocated = true;
    return b;
  }
  if (orig_bytes >= alloc::kOneExaBytes) {
    RecordOversizeRequest(orig_bytes);
    return std::nullopt;
  }
  if (config.ideal) return IdealMalloc(orig_bytes, stream);
  // torch: malloc first processes outstanding CUDA events (process_events),
  // returning blocks whose other-stream work has completed.
  if (events_to_process) ProcessEvents();

  Request r;
  r.orig_bytes = orig_bytes;
  r.size_bytes = RoundSize(orig_bytes, config);
  r.pool = PoolFor(stream, r.size_bytes <= alloc::kSmallSizeBytes);  // torch get_pool
  r.alloc_bytes = SegmentSizeFor(r.size_bytes);

  // torch: get_free_block || (trigger_free_memory_callbacks && get_free_block);
  // no callbacks are registered in a plain training process.
  bool found = GetFreeBlock(r);
  if (!found) {
    if (GcEnabled()) GarbageCollectCachedBlocks();
    found = AllocBlock(r, /*is_retry=*/false) ||
            (ReleaseAvailableCachedBlocks(r) && AllocBlock(r, false)) ||
            (ReleaseCachedBlocks() && AllocBlock(r, /*is_retry=*/true));
  }
  if (!found) {
    RecordOom(orig_bytes, r.alloc_bytes);
    return std::nullopt;
  }
  return AllocFoundBlock(r, ShouldSplit(r.block, r.size_bytes));
}

// torch: DeviceCachingAllocator::get_free_block.
bool CachingAllocator::Impl::GetFreeBlock(Request& r) {
  alloc::Pool& pool = pools[r.pool];
  // The GC "age" clock ticks on every lookup, hit or miss, but only when GC
  // can run (fraction set and threshold > 0).
  if (GcEnabled()) ++free_block_calls[pool.is_small];
  auto it = pool.blocks.lower_bound({r.size_bytes, 0, kNil});
  if (it == pool.blocks.end()) return false;
  if (config.expandable_segments && IsExpandable(it->block)) {
    // Best fit counts a block followed by unmapped pages as the size it can
    // grow to, so interior free blocks are preferred over the growable tail.
    auto next = std::next(it);
    while (IsExpandable(it->block) && next != pool.blocks.end() &&
           ExpandableSize(next->block) < ExpandableSize(it->block)) {
      it = next++;
    }
  }
  const uint64_t max_split = config.max_split_size_bytes;
  // Do not hand an oversize block (never split) to a smaller request.
  if (r.size_bytes < max_split && it->size_bytes >= max_split) return false;
  // An oversize request may take a cached block only if it wastes less than
  // max_non_split_rounding (torch >= 2.6; kLargeBuffer = 20 MiB before).
  if (r.size_bytes >= max_split &&
      it->size_bytes >= alloc::AddSaturating(r.size_bytes, config.max_non_split_rounding_bytes)) {
    return false;
  }
  r.block = it->block;
  ExtractFree(pool, it);
  return true;
}

// torch: DeviceCachingAllocator::alloc_block.
bool CachingAllocator::Impl::AllocBlock(Request& r, bool is_retry) {
  if (is_retry) ++stats.num_alloc_retries;
  // The fraction check uses alloc_size (the segment size) even for
  // expandable segments, which map only the pages they need.
  if (allowed_max_bytes &&
      !alloc::FitsUnder(stats.reserved_bytes, r.alloc_bytes, *allowed_max_bytes)) {
    return false;
  }
  if (config.expandable_segments) {
    r.block = TryAllocateExpandableBlock(r);
    return r.block != kNil;
  }
  // cudaMalloc(alloc_size) fails when the device has less free memory.
  if (!alloc::FitsUnder(stats.reserved_bytes, r.alloc_bytes, device_limit_bytes)) return false;
  const std::optional<uint64_t> address = address_space.Reserve(r.alloc_bytes);
  if (!address) return false;
  const uint32_t s = segments.New();
  segments[s].address = *address;
  segments[s].size_bytes = r.alloc_bytes;
  segments[s].pool = r.pool;
  const uint32_t b = blocks.New();
  Block& block = blocks[b];
  block.address = *address;
  block.size_bytes = r.alloc_bytes;
  block.segment = s;
  block.pool = r.pool;
  AddReserved(r.pool, r.alloc_bytes);
  ++stats.num_segments;
  ++stats.num_device_alloc;
  r.block = b;
  return true;
}

// torch: DeviceCachingAllocator::should_split.
bool CachingAllocator::Impl::ShouldSplit(uint32_t b, uint64_t size_bytes) const {
  const uint64_t remaining = blocks[b].size_bytes - size_bytes;
  if (pools[blocks[b].pool].is_small || config.expandable_segments) {
    return remaining >= alloc::kMinBlockBytes;
  }
  // Large pool: keep the whole block unless more than 1 MiB would be left
  // (exactly 1 MiB left -> no split), and never split oversize requests.
  return size_bytes < config.max_split_size_bytes && remaining > alloc::kSmallSizeBytes;
}

// torch: DeviceCachingAllocator::alloc_found_block.
uint32_t CachingAllocator::Impl::AllocFoundBlock(const Request& r, bool split) {
  uint32_t b = r.block;
  if (split) {
    // Carve the request from the front; the old block keeps the remainder
    // and goes back to the pool.
    const uint32_t remaining = b;
    b = blocks.New();
    Block& rem = blocks[remaining];
    Block& block = blocks[b];
    block.address = rem.address;
    block.size_bytes = r.size_bytes;
    block.segment = rem.segment;
    block.pool = rem.pool;
    block.prev = rem.prev;
    block.next = remaining;
    if (rem.prev != kNil) blocks[rem.prev].next = b;
    rem.prev = b;
    rem.address += r.size_bytes;
    rem.size_bytes -= r.size_bytes;
    InsertFree(remaining);
  }
  Block& block = blocks[b];
  block.allocated = true;
  block.requested_bytes = r.orig_bytes;
  // allocated and active count the whole block, including an unsplit
  // remainder; requested counts the caller's size.
  CountAllocated(block.size_bytes, r.orig_bytes);
  return b;
}

// torch: DeviceCachingAllocator::free. allocated_bytes drops at once; a
// block used on other streams waits for their events (insert_events) before
// free_block caches it.
FreeTicket CachingAllocator::Impl::Free(BlockHandle handle) {
  VS_CHECK(blocks.IsLive(handle) && blocks[handle].allocated);
  if (blocks[handle].zero_size) {
    blocks.Delete(handle);
    return kNoPendingFree;
  }
  if (config.ideal) {
    IdealFree(handle);
    return kNoPendingFree;
  }
  Block& block = blocks[handle];
  block.allocated = false;
  VS_CHECK(stats.allocated_bytes >= block.size_bytes);
  stats.allocated_bytes -= block.size_bytes;
  if (stream_uses.count(handle) != 0) return InsertEvents(handle);
  FreeBlock(handle);
  return kNoPendingFree;
}

// torch: DeviceCachingAllocator::free_block: merge with free neighbours of
// the same segment right away, then cache the block.
void CachingAllocator::Impl::FreeBlock(uint32_t b) {
  const uint64_t original_bytes = blocks[b].size_bytes;
  const uint64_t requested = blocks[b].requested_bytes;
  TryMergeBlocks(b, blocks[b].prev);
  TryMergeBlocks(b, blocks[b].next);
  blocks[b].requested_bytes = 0;
  InsertFree(b);
  stats.active_bytes -= original_bytes;
  stats.requested_bytes -= requested;
}

// torch: DeviceCachingAllocator::try_merge_blocks. dst is in no pool set;
// src is absorbed if it is free (not pending on another stream's events)
// and equally mapped.
uint64_t CachingAllocator::Impl::TryMergeBlocks(uint32_t dst, uint32_t src) {
  if (src == kNil || blocks[src].allocated || blocks[src].event_count > 0 ||
      blocks[src].mapped != blocks[dst].mapped) {
    return 0;
  }
  const Block source = blocks[src];
  if (source.mapped) {
    EraseFree(src);
  } else {
    const size_t erased = pools[source.pool].unmapped.erase({source.address, src});
    VS_CHECK(erased == 1);
  }
  Block& d = blocks[dst];
  if (d.prev == src) {  // [src dst]
    d.address = source.address;
    d.prev = source.prev;
    if (d.prev != kNil) blocks[d.prev].next = dst;
  } else {  // [dst src]
    VS_CHECK(d.next == src);
    d.next = source.next;
    if (d.next != kNil) blocks[d.next].prev = dst;
  }
  d.size_bytes += source.size_bytes;
  blocks.Delete(src);
  return source.size_bytes;
}

// ---- public API -----------------------------------------------------------

CachingAllocator::CachingAllocator(const AllocatorConfig& config, uint64_t device_limit_bytes)
    : impl_(std::make_unique<Impl>(config, device_limit_bytes)) {}
CachingAllocator::~CachingAllocator() = default;
CachingAllocator::CachingAllocator(CachingAllocator&&) noexcept = default;
CachingAllocator& CachingAllocator::operator=(CachingAllocator&&) noexcept = default;

std::optional<BlockHandle> CachingAllocator::Malloc(uint64_t size_bytes, uint32_t stream) {
  return impl_->Malloc(size_bytes, stream);
}
FreeTicket CachingAllocator::Free(BlockHandle handle) { return impl_->Free(handle); }
void CachingAllocator::RecordStream(BlockHandle handle, uint32_t stream) {
  VS_CHECK(IsAllocated(handle));
  impl_->RecordStream(handle, stream);
}
void CachingAllocator::CompleteFreeEvents(FreeTicket ticket) { impl_->CompleteFreeEvents(ticket); }
void CachingAllocator::EmptyCache() { impl_->ReleaseCachedBlocks(); }

bool CachingAllocator::IsAllocated(BlockHandle handle) const {
  return impl_->blocks.IsLive(handle) && impl_->blocks[handle].allocated;
}
uint64_t CachingAllocator::BlockAddress(BlockHandle handle) const {
  VS_CHECK(IsAllocated(handle));
  return impl_->blocks[handle].address;
}
uint64_t CachingAllocator::BlockSize(BlockHandle handle) const {
  VS_CHECK(IsAllocated(handle));
  return impl_->blocks[handle].size_bytes;
}

const AllocatorStats& CachingAllocator::stats() const { return impl_->stats; }
std::vector<StreamReserved> CachingAllocator::ReservedByStream() const {
  std::map<uint32_t, uint64_t> by_stream;
  for (size_t p = 0; p < impl_->pools.size(); ++p) {
    if (impl_->reserved_by_pool[p] > 0)
      by_stream[impl_->pools[p].stream] += impl_->reserved_by_pool[p];
  }
  std::vector<StreamReserved> out;
  for (const auto& [stream, bytes] : by_stream) out.push_back({stream, bytes});
  return out;
}
void CachingAllocator::ResetPeaks() {
  AllocatorStats& s = impl_->stats;
  s.peak_allocated_bytes = s.allocated_bytes;
  s.peak_reserved_bytes = s.reserved_bytes;
  s.peak_active_bytes = s.active_bytes;
  s.peak_requested_bytes = s.requested_bytes;
}
const std::optional<OomInfo>& CachingAllocator::last_oom() const { return impl_->last_oom; }
const AllocatorConfig& CachingAllocator::config() const { return impl_->config; }
std::vector<SegmentView> CachingAllocator::Segments() const { return impl_->Segments(); }
Status CachingAllocator::CheckInvariants() const { return impl_->CheckInvariants(); }

}  // namespace vramscope
