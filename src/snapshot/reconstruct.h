// Reconstruct: one device's trace turned into allocation records (one per
// block lifetime) and phase marks, the common ground of explain and replay.
//
// A record lives from its alloc entry to free_requested (when PyTorch stops
// counting it in allocated_bytes) and free_completed (when the block can be
// reused, after any record_stream events). Blocks alive before the first
// entry (the trace ring buffer kept only the last max_entries actions, or
// recording started late) become "initial" records: a free without an alloc,
// or an allocated block of the final segments the trace never allocated.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <unordered_map>
#include <vector>

#include "stack_tags.h"
#include "vramscope/category.h"
#include "vramscope/event_stream.h"
#include "vramscope/result.h"
#include "vramscope/snapshot.h"

namespace vramscope::snapshot {

// Entry indices are below 2^32 - 1 (Reconstruct refuses longer traces).
inline constexpr uint32_t kNever = std::numeric_limits<uint32_t>::max();
inline constexpr uint32_t kNoRecord = std::numeric_limits<uint32_t>::max();

// 24 bytes: one per allocation of a trace of any length. What the alloc
// entry records (address, requested size, stack, stream) is read from it
// (Reconstruction::Address ...), not copied.
struct AllocRecord {
  uint64_t block_bytes = 0;  // filled by the timeline pass (exact ones earlier)
  // Trace records: the alloc entry. Initial records: index into
  // Reconstruction::initial.
  uint32_t alloc_entry = 0;
  uint32_t free_entry = kNever;     // free_requested (or free_completed alone)
  uint32_t release_entry = kNever;  // free_completed
  Category category = Category::kOther;
  uint8_t flags = 0;

  static constexpr uint8_t kInitial = 1;       // alive before the first entry
  static constexpr uint8_t kExactSize = 2;     // block size known from the final segments
  static constexpr uint8_t kSegmentStack = 4;  // stack from the final segments
  bool initial() const { return (flags & kInitial) != 0; }
  bool exact() const { return (flags & kExactSize) != 0; }
};
static_assert(sizeof(AllocRecord) == 24);

// What an initial record's alloc entry would have said (from a free
// without an alloc, or a block of the final segments).
struct InitialBlock {
  uint64_t address = 0;
  uint64_t requested_bytes = 0;
  uint32_t stack = 0;
  uint16_t stream = 0;
};

// The phase that starts at `entry` (and lasts until the next mark).
struct PhaseMark {
  uint64_t entry = 0;
  uint32_t step = 0;
  Phase phase = Phase::kSetup;
};

struct Reconstruction {
  int device = 0;
  const Trace* entries = nullptr;
  // Trace allocs in entry order, with initial records interleaved where they
  // were discovered (a free) or at the end (final segments).
  std::vector<AllocRecord> records;
  std::vector<InitialBlock> initial;
  // Alloc entry -> stack, for blocks alive at the end whose alloc entry had
  // no frames but whose final segment block has (kSegmentStack).
  std::unordered_map<uint32_t, uint32_t> segment_stacks;
  std::vector<PhaseMark> marks;  // marks[0] = {0, 0, setup}
  // Per trace entry, the record an alloc / free_requested / free_completed
  // entry acts on (kNoRecord: none, e.g. a free of a block freed before the
  // trace). Later passes walk the trace with it instead of matching again.
  std::vector<uint32_t> entry_record;
  // Blocks closed at an alloc entry because the allocator handed their
  // address out again without a free in the trace: (entry, record), in
  // entry order.
  std::vector<std::pair<uint64_t, uint32_t>> forced_frees;
  std::vector<StackInfo> stacks;
  AllocatorConfig rounding;  // the snapshot's settings (block sizes)
  bool has_frames = false;
  bool expandable = false;
  uint64_t initial_reserved_bytes = 0;
  uint64_t segments_reserved_bytes = 0;   // final segments of the device
  uint64_t segments_allocated_bytes = 0;  // their active_allocated blocks
  // Segments alive at the first entry: address -> end (for block sizes).
  std::vector<std::pair<uint64_t, uint64_t>> initial_segments;
  std::vector<std::string> notes;

  // Index of the mark in force at `entry`.
  size_t MarkAt(uint64_t entry) const;

  // A record's address, requested bytes, stack and stream.
  uint64_t Address(const AllocRecord& rec) const {
    return rec.initial() ? initial[rec.alloc_entry].address : (*entries)[rec.alloc_entry].addr;
  }
  uint64_t Requested(const AllocRecord& rec) const {
    return rec.initial() ? initial[rec.alloc_entry].requested_bytes
                         : (*entries)[rec.alloc_entry].size_bytes;
  }
  uint32_t Stack(const AllocRecord& rec) const {
    if (rec.initial()) return initial[rec.alloc_entry].stack;
    if (rec.flags & AllocRecord::kSegmentStack) return segment_stacks.at(rec.alloc_entry);
    return (*entries)[rec.alloc_entry].stack;
  }
  uint16_t Stream(const AllocRecord& rec) const {
    return rec.initial() ? initial[rec.alloc_entry].stream : (*entries)[rec.alloc_entry].stream;
  }
};

// Chooses the device (-1: most trace entries, else lowest with segments).
Result<int> ChooseDevice(const Snapshot& snapshot, int requested);

// Matches allocs with frees, finds initial blocks, infers phases and
// attributes every record (docs/snapshot.md, "Attribution").
Result<Reconstruction> Reconstruct(const Snapshot& snapshot, int device);

// Sets records[i].category (called by Reconstruct; exposed for tests).
void Attribute(Reconstruction& r);

}  // namespace vramscope::snapshot
