// LiveMap: allocation id -> value for the allocations that are live while a
// stream is replayed (private to src/sim).
//
// Why not std::unordered_map: the replay does one insert or erase per event,
// and a node-based map spends more time in malloc / free for its nodes (and
// in a modulo by a prime per lookup) than the allocator model spends on the
// event. This is a chained hash table without per-entry heap nodes: buckets
// hold the index of their first entry, entries sit in one array and link to
// the next entry of their bucket, and freed entries are reused last-in
// first-out (the entry freed last is the one most likely still in cache).
// Memory follows the peak number of live ids, not the number of events.
//
// Iteration order is the table's, which depends on the ids: callers that need
// a deterministic order sort what they read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "vramscope/event_stream.h"
#include "vramscope/result.h"

namespace vramscope::sim {

template <typename V>
class LiveMap {
 public:
  // The value of `id`, or nullptr. The pointer is valid until the next
  // Insert or Erase.
  V* Find(uint64_t id) {
    if (heads_.empty()) return nullptr;
    for (uint32_t e = heads_[Bucket(id)]; e != kNone; e = entries_[e].next) {
      if (entries_[e].id == id) return &entries_[e].value;
    }
    return nullptr;
  }

  // Inserts `id` and returns its value, default-initialized, to be filled
  // in place; `id` must not be present (Find first). The reference is valid
  // until the next Insert or Erase.
  V& Insert(uint64_t id) {
    if (size_ >= heads_.size()) Grow();  // at most one entry per bucket on average
    uint32_t e;
    if (free_ != kNone) {
      e = free_;
      free_ = entries_[e].next;
    } else {
      VS_CHECK(entries_.size() < kNone);
      e = static_cast<uint32_t>(entries_.size());
      entries_.emplace_back();
    }
    uint32_t& head = heads_[Bucket(id)];
    Entry& entry = entries_[e];
    entry.id = id;
    entry.next = head;
    entry.value = V{};
    head = e;
    ++size_;
    return entry.value;
  }

  // Removes `id`; returns false when it is not present.
  bool Erase(uint64_t id) {
    if (heads_.empty()) return false;
    for (uint32_t* link = &heads_[Bucket(id)]; *link != kNone; link = &entries_[*link].next) {
      const uint32_t e = *link;
      if (entries_[e].id != id) continue;
      *link = entries_[e].next;
      entries_[e].next = free_;
      free_ = e;
      --size_;
      return true;
    }
    return false;
  }

  size_t size() const { return size_; }

  // Calls f(id, const V&) for every entry, in table order.
  template <typename F>
  void ForEach(F&& f) const {
    for (uint32_t head : heads_) {
      for (uint32_t e = head; e != kNone; e = entries_[e].next)
        f(entries_[e].id, entries_[e].value);
    }
  }

 private:
  static constexpr uint32_t kNone = UINT32_MAX;

  struct Entry {
    uint64_t id = 0;
    uint32_t next = kNone;  // next entry of the bucket, or of the free list
    V value{};
  };

  // Ids usually come in runs of consecutive numbers (lowering and recorders
  // number allocations in order), but may be addresses or other strided
  // values. Adding the id to a mix of id / 16 keeps 16 consecutive ids in
  // neighbouring buckets (one cache line of heads) and still spreads runs
  // and strides over the whole table.
  size_t Bucket(uint64_t id) const {
    return static_cast<size_t>(id + MixAllocationId(id >> 4)) & (heads_.size() - 1);
  }

  void Grow() {
    std::vector<uint32_t> old = std::move(heads_);
    heads_.assign(old.empty() ? 64 : old.size() * 2, kNone);
    for (uint32_t head : old) {
      for (uint32_t e = head; e != kNone;) {
        const uint32_t next = entries_[e].next;
        uint32_t& new_head = heads_[Bucket(entries_[e].id)];
        entries_[e].next = new_head;
        new_head = e;
        e = next;
      }
    }
  }

  std::vector<uint32_t> heads_;  // bucket -> first entry; size 0 or a power of two
  std::vector<Entry> entries_;
  uint32_t free_ = kNone;  // first reusable entry
  size_t size_ = 0;
};

}  // namespace vramscope::sim
