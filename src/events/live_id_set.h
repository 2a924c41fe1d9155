// LiveIdSet: the allocation ids that are live while a stream is read or
// validated (private to src/events).
//
// A flat open-addressing hash set of uint64 ids (linear probing, deletion by
// backward shift, so no tombstones accumulate over millions of alloc/free
// pairs). One array of 8-byte slots and no per-id heap node: the reader does
// one insert or erase per line, and std::unordered_set's node allocation
// would dominate parse time. Memory is proportional to the peak number of
// live ids (load factor at most 1/2), not to the number of events.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace vramscope::events_internal {

class LiveIdSet {
 public:
  // Returns false (and changes nothing) if `id` is already in the set.
  bool Insert(uint64_t id);
  // Returns false if `id` is not in the set.
  bool Erase(uint64_t id);
  bool Contains(uint64_t id) const;
  size_t size() const { return size_; }

 private:
  // Slots hold ids; kEmptySlot marks a free slot. The id equal to kEmptySlot
  // itself is tracked out of band by has_empty_slot_id_.
  static constexpr uint64_t kEmptySlot = ~uint64_t{0};

  size_t HomeSlot(uint64_t id) const;
  void Grow();

  std::vector<uint64_t> slots_;  // size is 0 or a power of two
  size_t size_ = 0;              // ids in the set, including the out-of-band one
  bool has_empty_slot_id_ = false;
};

// The record_stream rules the reader and EventStream::Validate() share: a use
// (`u`) names a live id; a free of a used id leaves it pending; `x` names a
// pending id. The caller checks liveness. Memory: the used and pending ids.
class StreamUseTracker {
 public:
  void Use(uint64_t id) { used_.Insert(id); }
  void Free(uint64_t id) {
    if (used_.Erase(id)) pending_.Insert(id);
  }
  // False if `id` is not pending (never used, not freed yet, or done).
  bool Done(uint64_t id) { return pending_.Erase(id); }
  size_t pending() const { return pending_.size(); }

 private:
  LiveIdSet used_;
  LiveIdSet pending_;
};

}  // namespace vramscope::events_internal
