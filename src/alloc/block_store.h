// Blocks, segments and free-block pools of the allocator model (internal).
//
// Blocks live in an arena indexed by uint32 handles that are reused after a
// block dies, so memory follows the number of live blocks, not the number of
// events. A block's handle doubles as the caller's BlockHandle while it is
// allocated.
#pragma once

#include <cstdint>
#include <deque>
#include <memory_resource>
#include <set>
#include <vector>

#include "vramscope/result.h"

namespace vramscope::alloc {

inline constexpr uint32_t kNil = UINT32_MAX;

// torch: BlockComparatorSize orders free blocks by (stream, size, address);
// each Pool below holds one stream's blocks, so (size, address) remains.
struct FreeKey {
  uint64_t size_bytes;
  uint64_t address;
  uint32_t block;
};
struct FreeKeyLess {
  bool operator()(const FreeKey& a, const FreeKey& b) const {
    // One 128-bit comparison: the compiler can select instead of branching
    // on unpredictable sizes while walking the tree.
    return ((static_cast<unsigned __int128>(a.size_bytes) << 64) | a.address) <
           ((static_cast<unsigned __int128>(b.size_bytes) << 64) | b.address);
  }
};
// torch: BlockComparatorAddress orders unmapped blocks by (stream, address).
struct AddressKey {
  uint64_t address;
  uint32_t block;
};
struct AddressKeyLess {
  bool operator()(const AddressKey& a, const AddressKey& b) const { return a.address < b.address; }
};

using FreeSet = std::pmr::set<FreeKey, FreeKeyLess>;
using UnmappedSet = std::pmr::set<AddressKey, AddressKeyLess>;

// torch: struct Block (c10/cuda/CUDACachingAllocator.cpp). Stream, pool kind
// and expandability are properties of the owning pool / segment.
struct Block {
  uint64_t address = 0;
  uint64_t size_bytes = 0;
  uint64_t requested_bytes = 0;  // caller's size while allocated, else 0
  uint64_t gc_count_base = 0;    // pool clock when inserted (garbage collection)
  uint32_t prev = kNil;          // address-order neighbours in the segment
  uint32_t next = kNil;
  uint32_t segment = kNil;
  uint32_t pool = kNil;
  // torch: Block::event_count: CUDA events recorded at free time on other
  // streams that used the block and not yet processed. While > 0 the block
  // is freed but pending: not allocated, still active, in no pool.
  uint32_t event_count = 0;
  // Where the block sits in its pool's `blocks` set while in_free_set (free
  // and mapped): erasing by position skips a second search of the tree.
  FreeSet::iterator free_pos{};
  bool in_free_set = false;
  bool live = false;       // arena slot in use
  bool allocated = false;  // handed to the caller
  bool mapped = true;      // expandable segments: backed by physical pages
  bool zero_size = false;  // a zero-byte request: no segment, no cost
};

// One cudaMalloc (classic) or one reserved virtual range (expandable).
struct Segment {
  uint64_t address = 0;
  uint64_t size_bytes = 0;  // classic: cudaMalloc size; expandable: reserved VA
  uint64_t page_bytes = 0;  // expandable page size; 0 for classic segments
  uint32_t pool = kNil;
  bool live = false;
  bool expandable() const { return page_bytes != 0; }
};

// A slot vector with a free list: New() reuses the most recently freed slot.
template <typename T>
class Arena {
 public:
  uint32_t New() {
    uint32_t index;
    if (!free_.empty()) {
      index = free_.back();
      free_.pop_back();
      items_[index] = T{};
    } else {
      VS_CHECK(items_.size() < kNil);
      index = static_cast<uint32_t>(items_.size());
      items_.emplace_back();
    }
    items_[index].live = true;
    ++live_count_;
    return index;
  }
  void Delete(uint32_t index) {
    VS_CHECK(items_[index].live);
    items_[index].live = false;
    free_.push_back(index);
    --live_count_;
  }
  T& operator[](uint32_t index) { return items_[index]; }
  const T& operator[](uint32_t index) const { return items_[index]; }
  bool IsLive(uint32_t index) const { return index < items_.size() && items_[index].live; }
  uint32_t capacity() const { return static_cast<uint32_t>(items_.size()); }
  uint64_t live_count() const { return live_count_; }

 private:
  std::vector<T> items_;
  std::vector<uint32_t> free_;
  uint64_t live_count_ = 0;
};

// torch: BlockPool. PyTorch keeps one set for all streams whose comparator
// starts with the stream, so a lookup only ever sees the requesting stream's
// blocks; one Pool per (stream, small/large) is the same thing, with shorter
// keys.
struct Pool {
  Pool(uint32_t stream_id, bool small, std::pmr::memory_resource* nodes)
      : stream(stream_id), is_small(small), blocks(nodes), unmapped(nodes) {}
  uint32_t stream;
  bool is_small;
  FreeSet blocks;        // free, mapped blocks
  UnmappedSet unmapped;  // expandable segments: unmapped ranges
};

// torch: cuda_events: per stream, the events free() recorded for blocks
// that stream used, with the block each one holds back.
struct PendingEvent {
  uint64_t seq = 0;  // the event's number on its stream, from 1
  uint32_t block = kNil;
  uint64_t ticket = 0;  // the free that recorded it (CachingAllocator's FreeTicket)
};
struct StreamEvents {
  uint64_t recorded = 0;           // events recorded on the stream so far
  uint64_t completed = 0;          // events known complete (a prefix: streams run in order)
  std::deque<PendingEvent> queue;  // recorded, not yet processed; by seq
};
// One event of a FreeTicket.
struct TicketEvent {
  uint32_t stream = 0;
  uint64_t seq = 0;
};

}  // namespace vramscope::alloc
