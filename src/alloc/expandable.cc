// Expandable segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True).
// torch 2.4-2.11: Note [Expandable Segments], struct ExpandableSegment,
// find_expandable_block, try_allocate_expandable_block, map_block,
// unmap_block, release_expandable_segment (c10/cuda/CUDACachingAllocator.cpp).
//
// Each (stream, pool) grows one segment: a reserved virtual range of 1 1/8
// times the device's memory, backed page by page (2 MiB pages for the small
// pool, 20 MiB for the large pool). Blocks tile the range; unmapped ranges
// are blocks with mapped == false kept in the pool's `unmapped` set.
#include <algorithm>

#include "allocator_impl.h"
#include "sizing.h"

namespace vramscope {

using alloc::Block;
using alloc::kNil;

namespace {

// The device memory PyTorch sizes the reservation by (totalGlobalMem); the
// model uses its device limit, capped at 1 EiB: every request PyTorch
// accepts (< 1 EB) still fits one reservation, and a dozen reservations fit
// in the 64-bit address space when the limit is "unlimited".
constexpr uint64_t kMaxReservationBasis = uint64_t{1} << 60;

}  // namespace

// torch get_free_block's expandable_size: a block followed by unmapped pages
// can grow into them.
uint64_t CachingAllocator::Impl::ExpandableSize(uint32_t b) const {
  const Block& block = blocks[b];
  if (block.next != kNil && !blocks[block.next].mapped) {
    return block.size_bytes + blocks[block.next].size_bytes;
  }
  return block.size_bytes;
}

// torch: try_allocate_expandable_block. Maps whole pages for the rounded
// request (p.size(), not alloc_size) at the lowest address that can hold it.
uint32_t CachingAllocator::Impl::TryAllocateExpandableBlock(const Request& r) {
  uint32_t candidate = FindExpandableBlock(r.pool, r.size_bytes);
  if (candidate == kNil) return kNil;
  if (!blocks[candidate].mapped &&
      !MapBlock(candidate, std::min(blocks[candidate].size_bytes, r.size_bytes))) {
    return kNil;
  }
  while (blocks[candidate].size_bytes < r.size_bytes) {
    // Invariant: free -> unmapped -> ...; mapping the next range merges it
    // into the candidate. A failure here keeps the pages already mapped,
    // as in PyTorch.
    const uint64_t remaining_bytes = r.size_bytes - blocks[candidate].size_bytes;
    const uint32_t next = blocks[candidate].next;
    VS_CHECK(next != kNil && !blocks[next].mapped);
    if (!MapBlock(next, std::min(remaining_bytes, blocks[next].size_bytes))) return kNil;
    candidate = next;
  }
  EraseFree(candidate);
  return candidate;
}

// torch: find_expandable_block: the lowest-address unmapped range of this
// stream's pool that, together with a free block right before it and the
// free / unmapped blocks after it, holds size_bytes; else a new segment.
uint32_t CachingAllocator::Impl::FindExpandableBlock(uint32_t pool_index, uint64_t size_bytes) {
  alloc::Pool& pool = pools[pool_index];
  // A block waiting for another stream's events is not allocatable either.
  auto allocatable = [&](uint32_t b) {
    return b != kNil && !blocks[b].allocated && blocks[b].event_count == 0;
  };
  auto has_room = [&](uint32_t b) {
    uint64_t bytes = 0;
    while (bytes < size_bytes && allocatable(b)) {
      bytes += blocks[b].size_bytes;
      b = blocks[b].next;
    }
    return bytes >= size_bytes;
  };
  for (const alloc::AddressKey& key : pool.unmapped) {
    uint32_t c = key.block;
    if (allocatable(blocks[c].prev)) c = blocks[c].prev;
    if (has_room(c)) return c;
  }
  // A new segment: reserve page * ceil(1.125 * device memory / page).
  const uint64_t page_bytes = pool.is_small ? alloc::kSmallBufferBytes : alloc::kLargeBufferBytes;
  const uint64_t basis = std::min(device_limit_bytes, kMaxReservationBasis);
  const uint64_t va_bytes = alloc::RoundUpSaturating(basis + basis / 8, page_bytes);
  // Deviation: PyTorch would fail an assertion mapping past the end of a
  // reservation smaller than the request; the model reports an OOM.
  if (va_bytes < size_bytes) return kNil;
  const std::optional<uint64_t> address = address_space.Reserve(va_bytes);
  if (!address) return kNil;
  const uint32_t s = segments.New();
  segments[s].address = *address;
  segments[s].size_bytes = va_bytes;
  segments[s].page_bytes = page_bytes;
  segments[s].pool = pool_index;
  const uint32_t b = blocks.New();
  Block& block = blocks[b];
  block.address = *address;
  block.size_bytes = va_bytes;
  block.segment = s;
  block.pool = pool_index;
  block.mapped = false;
  pool.unmapped.insert({block.address, b});
  return b;
}

// torch: map_block + ExpandableSegment::map: back the pages covering the
// first size_bytes of an unmapped block; the rest stays unmapped. The
// mapped part merges with free neighbours. All-or-nothing per call, as
// ExpandableSegment::map releases the pages it created when one fails.
bool CachingAllocator::Impl::MapBlock(uint32_t b, uint64_t size_bytes) {
  const alloc::Segment& segment = segments[blocks[b].segment];
  const uint64_t page = segment.page_bytes;
  VS_CHECK(!blocks[b].mapped && size_bytes > 0 && size_bytes <= blocks[b].size_bytes);
  VS_CHECK((blocks[b].address - segment.address) % page == 0);
  const uint64_t mapped_bytes = alloc::RoundUpSaturating(size_bytes, page);
  if (!alloc::FitsUnder(stats.reserved_bytes, mapped_bytes, device_limit_bytes)) return false;

  alloc::Pool& pool = pools[blocks[b].pool];
  pool.unmapped.erase({blocks[b].address, b});
  blocks[b].mapped = true;
  if (mapped_bytes < blocks[b].size_bytes) {
    const uint32_t rest = blocks.New();
    Block& block = blocks[b];
    Block& remaining = blocks[rest];
    remaining.address = block.address + mapped_bytes;
    remaining.size_bytes = block.size_bytes - mapped_bytes;
    remaining.segment = block.segment;
    remaining.pool = block.pool;
    remaining.mapped = false;
    remaining.prev = b;
    remaining.next = block.next;
    if (block.next != kNil) blocks[block.next].prev = rest;
    block.next = rest;
    block.size_bytes = mapped_bytes;
    pool.unmapped.insert({remaining.address, rest});
  }
  // Contiguous mapped ranges count as segments (as in memory_snapshot()).
  const Block& block = blocks[b];
  const bool prev_mapped = block.prev != kNil && blocks[block.prev].mapped;
  const bool next_mapped = block.next != kNil && blocks[block.next].mapped;
  stats.num_segments = stats.num_segments + 1 - prev_mapped - next_mapped;

  TryMergeBlocks(b, blocks[b].prev);
  TryMergeBlocks(b, blocks[b].next);
  InsertFree(b);
  AddReserved(blocks[b].pool, mapped_bytes);
  ++stats.num_device_alloc;
  return true;
}

// torch: unmap_block + ExpandableSegment::unmap: unmap the pages lying
// entirely inside free block b; partial pages at either end stay mapped as
// free blocks.
void CachingAllocator::Impl::UnmapBlock(uint32_t b) {
  const alloc::Segment& segment = segments[blocks[b].segment];
  const uint64_t page = segment.page_bytes;
  const uint64_t offset = blocks[b].address - segment.address;
  const uint64_t first_page = alloc::RoundUpSaturating(offset, page) / page;
  const uint64_t end_page = (offset + blocks[b].size_bytes) / page;
  if (first_page >= end_page) return;
  EraseFree(b);
  const uint64_t unmap_address = segment.address + first_page * page;
  const uint64_t unmap_bytes = (end_page - first_page) * page;
  const uint64_t before_bytes = unmap_address - blocks[b].address;
  const uint64_t after_bytes = blocks[b].size_bytes - before_bytes - unmap_bytes;

  auto split_off = [&](uint64_t address, uint64_t bytes, bool before) {
    const uint32_t part = blocks.New();
    Block& block = blocks[b];
    Block& p = blocks[part];
    p.address = address;
    p.size_bytes = bytes;
    p.segment = block.segment;
    p.pool = block.pool;
    if (before) {  // prev? -> part -> b
      p.prev = block.prev;
      p.next = b;
      if (block.prev != kNil) blocks[block.prev].next = part;
      block.prev = part;
    } else {  // b -> part -> next?
      p.prev = b;
      p.next = block.next;
      if (block.next != kNil) blocks[block.next].prev = part;
      block.next = part;
    }
    InsertFree(part);
  };
  if (before_bytes > 0) split_off(blocks[b].address, before_bytes, /*before=*/true);
  if (after_bytes > 0) split_off(unmap_address + unmap_bytes, after_bytes, /*before=*/false);

  Block& block = blocks[b];
  block.address = unmap_address;
  block.size_bytes = unmap_bytes;
  block.mapped = false;
  const bool left_mapped = block.prev != kNil && blocks[block.prev].mapped;
  const bool right_mapped = block.next != kNil && blocks[block.next].mapped;
  stats.num_segments = stats.num_segments + left_mapped + right_mapped - 1;

  TryMergeBlocks(b, blocks[b].prev);
  TryMergeBlocks(b, blocks[b].next);
  pools[blocks[b].pool].unmapped.insert({blocks[b].address, b});
  SubReserved(blocks[b].pool, unmap_bytes);
  ++stats.num_device_free;
}

// torch: release_expandable_segment: a segment whose whole range is unmapped
// gives its virtual range back.
void CachingAllocator::Impl::ReleaseExpandableSegment(uint32_t b) {
  const Block block = blocks[b];
  const alloc::Segment segment = segments[block.segment];
  VS_CHECK(!block.mapped && block.size_bytes == segment.size_bytes);
  const size_t erased = pools[block.pool].unmapped.erase({block.address, b});
  VS_CHECK(erased == 1);
  address_space.Release(segment.address, segment.size_bytes);
  segments.Delete(block.segment);
  blocks.Delete(b);
}

}  // namespace vramscope
