#include "reconstruct.h"

#include "vramscope/common/checked.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>
#include <unordered_map>

namespace vramscope::snapshot {
namespace {

// Infers the phase of a training step from the stacks of allocations.
//
// Only allocations move the phase (a free says little: frees of one phase
// happen in another). Precedence when a stack carries several tags:
// optimizer > backward > forward, because optimizer.step and backward run
// inside user code that may itself be called from a module's forward. A new
// step starts when a forward follows an optimizer step (gradient
// accumulation's forward after backward stays in the step).
class PhaseMachine {
 public:
  PhaseMachine(std::vector<PhaseMark>* marks, bool has_frames)
      : marks_(marks), has_frames_(has_frames) {
    marks_->push_back(PhaseMark{0, 0, Phase::kSetup});
  }

  void OnAlloc(uint64_t entry, const StackInfo& info, bool empty_stack) {
    const uint32_t t = info.tags;
    const Phase current = marks_->back().phase;
    Phase target = current;
    if (t & kTagOptimizer) {
      target = Phase::kOptimizer;
    } else if (t & kTagBackward) {
      target = Phase::kBackward;
    } else if (t & kTagCheckpoint) {
      // Recomputation inside backward calls the module's forward again.
      target = current == Phase::kBackward ? Phase::kBackward : Phase::kForward;
    } else if (t & (kTagForward | kTagLoss)) {
      target = Phase::kForward;
    } else if (empty_stack && has_frames_ && current == Phase::kForward) {
      // Stacks were recorded but this one has no frame at all: with
      // stacks="python" that is a thread without Python frames, which in a
      // training step is the autograd engine's device thread.
      target = Phase::kBackward;
    }
    if (target == current) return;
    uint32_t step = marks_->back().step;
    if (target == Phase::kForward && current == Phase::kOptimizer) ++step;
    if (step == 0) step = 1;  // the first training phase is step 1
    marks_->push_back(PhaseMark{entry, step, target});
  }

 private:
  std::vector<PhaseMark>* marks_;
  bool has_frames_;
};

}  // namespace

size_t Reconstruction::MarkAt(uint64_t entry) const {
  auto it = std::upper_bound(marks.begin(), marks.end(), entry,
                             [](uint64_t e, const PhaseMark& m) { return e < m.entry; });
  return it == marks.begin() ? 0 : static_cast<size_t>(it - marks.begin()) - 1;
}

Result<int> ChooseDevice(const Snapshot& snapshot, int requested) {
  const auto has_segments = [&](int d) {
    return std::any_of(snapshot.segments.begin(), snapshot.segments.end(),
                       [d](const SnapshotSegment& s) { return s.device == d; });
  };
  if (requested >= 0) {
    const bool traced = static_cast<size_t>(requested) < snapshot.device_traces.size() &&
                        !snapshot.device_traces[static_cast<size_t>(requested)].empty();
    if (!traced && !has_segments(requested)) {
      return MakeError(
          fmt::format("device {}: the snapshot has no trace entries and no segments "
                      "for it",
                      requested));
    }
    return requested;
  }
  int best = -1;
  size_t best_entries = 0;
  for (size_t d = 0; d < snapshot.device_traces.size(); ++d) {
    if (snapshot.device_traces[d].size() > best_entries) {
      best_entries = snapshot.device_traces[d].size();
      best = static_cast<int>(d);
    }
  }
  if (best >= 0) return best;
  int lowest = -1;
  for (const SnapshotSegment& s : snapshot.segments) {
    if (lowest < 0 || s.device < lowest) lowest = s.device;
  }
  if (lowest >= 0) return lowest;
  return MakeError(
      "the snapshot is empty: no trace entries and no segments (was "
      "torch.cuda.memory._record_memory_history() called before the run?)");
}

namespace {

// Live blocks by address: the record each address's current block has.
using LiveRecords = std::unordered_map<uint64_t, uint32_t>;

// The device's trace and stacks, and what the block sizes depend on: the
// snapshot's allocator settings, and whether segments are expandable (a
// segment_map entry or an expandable final segment says so even when the
// recorded settings do not).
Reconstruction StartReconstruction(const Snapshot& snapshot, int device) {
  static const Trace kNoEntries;
  Reconstruction r;
  r.device = device;
  r.entries = static_cast<size_t>(device) < snapshot.device_traces.size()
                  ? &snapshot.device_traces[static_cast<size_t>(device)]
                  : &kNoEntries;
  r.stacks = ClassifyStacks(snapshot);
  r.rounding = SnapshotAllocatorConfig(snapshot);
  r.expandable = r.rounding.expandable_segments;
  // has_frames: the first alloc with a stack ends the scan (expandable is
  // then only what was seen before it, as it always was).
  for (const TraceEntry e : *r.entries) {
    if (e.action == TraceAction::kAlloc && e.stack != 0) {
      r.has_frames = true;
      break;
    }
    if (e.action == TraceAction::kSegmentMap) r.expandable = true;
  }
  for (const SnapshotSegment& s : snapshot.segments) {
    if (s.device == device && s.expandable) r.expandable = true;
  }
  return r;
}

// Records: one per alloc, one per free without its alloc, one per block of
// the final segments the trace never allocated. Reserving that bound means
// the vector never grows by copying (which would double the peak); what
// stays unused is never touched, so it costs no resident memory.
uint64_t RecordBound(const Snapshot& snapshot, int device, const Trace& entries) {
  uint64_t bound = 0;
  for (const TraceEntry e : entries) {
    bound += e.action == TraceAction::kAlloc || e.action == TraceAction::kFreeRequested;
  }
  for (const SnapshotSegment& s : snapshot.segments) {
    if (s.device == device) bound += s.blocks.size();
  }
  return bound;
}

// Every running total of explain and replay (allocated, requested,
// reserved, per category, the reserved bytes before the trace) is at most
// the sum of every size the device's trace and final segments name, each
// counted twice plus 20 MiB (a block is the request rounded up, at most
// doubled by roundup_power2_divisions, in a segment of at most 20 MiB more).
// The replay simulator (sim/simulate.cc CheckSizesFit64Bits) bounds its
// stream the same way, so a snapshot this accepts always replays: with 512
// bytes of slack here, two allocs just under 2^62 bytes passed this check and
// failed the simulator's (a fuzz_snapshot_reader finding). When that sum fits
// 64 bits no total can wrap. A real trace is far from it (2^64 bytes is 16
// EiB); a forged one, such as five allocs of 2^62 bytes, is refused instead of
// explained with wrapped numbers.
Status CheckSizesFit64Bits(const Snapshot& snapshot, int device, const Trace& entries) {
  constexpr uint64_t kRoundingSlackBytes = uint64_t{20} << 20;
  std::optional<uint64_t> sum = 0;
  auto add = [&sum](uint64_t size_bytes) {
    if (sum) sum = common::CheckedAdd(*sum, size_bytes);
    if (sum) sum = common::CheckedAdd(*sum, size_bytes);
    if (sum) sum = common::CheckedAdd(*sum, kRoundingSlackBytes);
  };
  for (const TraceEntry e : entries) {
    if (e.action != TraceAction::kOom && e.action != TraceAction::kOther) add(e.size_bytes);
  }
  for (const SnapshotSegment& s : snapshot.segments) {
    if (s.device == device) add(s.total_bytes);
  }
  if (sum) return Ok{};
  return MakeError(fmt::format(
      "device_traces[{}]: the sizes of its trace entries and segments sum past 2^64 bytes (no "
      "device has that much memory; the totals would wrap)",
      device));
}

// Pass 1 over the trace: matches allocs with frees by address into records,
// marks phases from alloc stacks, and sums the segment actions (to find the
// reserved bytes before the trace).
class TraceMatcher {
 public:
  TraceMatcher(const Snapshot& snapshot, Reconstruction* r)
      : snapshot_(snapshot), r_(*r), phases_(&r->marks, r->has_frames) {}

  void Run() {
    const Trace& entries = *r_.entries;
    for (uint64_t i = 0; i < entries.size(); ++i) {
      const TraceEntry e = entries[i];
      switch (e.action) {
        case TraceAction::kAlloc: OnAlloc(static_cast<uint32_t>(i), e); break;
        case TraceAction::kFreeRequested: OnFreeRequested(static_cast<uint32_t>(i), e); break;
        case TraceAction::kFreeCompleted: OnFreeCompleted(static_cast<uint32_t>(i), e); break;
        case TraceAction::kSegmentAlloc:
        case TraceAction::kSegmentMap: segment_bytes_in_ += e.size_bytes; break;
        case TraceAction::kSegmentFree:
        case TraceAction::kSegmentUnmap: segment_bytes_out_ += e.size_bytes; break;
        default: break;
      }
    }
    if (unmatched_allocs_ > 0) {
      r_.notes.push_back(fmt::format(
          "{} block(s) were allocated again at an address whose free the trace does not show; "
          "each is counted as freed then",
          unmatched_allocs_));
    }
  }

  // Blocks alive at the end of the trace.
  const LiveRecords& live() const { return live_; }
  uint64_t segment_bytes_in() const { return segment_bytes_in_; }
  uint64_t segment_bytes_out() const { return segment_bytes_out_; }

 private:
  // A new record for the block at `addr`, acted on by entry i.
  void AddRecord(uint32_t i, uint64_t addr, const AllocRecord& rec) {
    const auto index = static_cast<uint32_t>(r_.records.size());
    live_[addr] = index;
    r_.entry_record[i] = index;
    r_.records.push_back(rec);
  }

  void OnAlloc(uint32_t i, const TraceEntry& e) {
    if (auto it = live_.find(e.addr); it != live_.end()) {
      // A block handed out again without its free in the trace.
      AllocRecord& old = r_.records[it->second];
      if (old.free_entry == kNever) old.free_entry = i;
      old.release_entry = i;
      r_.forced_frees.emplace_back(i, it->second);
      ++unmatched_allocs_;
    }
    AllocRecord rec;
    rec.alloc_entry = i;
    AddRecord(i, e.addr, rec);
    phases_.OnAlloc(i, r_.stacks[e.stack], snapshot_.stacks[e.stack].empty());
  }

  void OnFreeRequested(uint32_t i, const TraceEntry& e) {
    if (auto it = live_.find(e.addr); it != live_.end()) {
      AllocRecord& rec = r_.records[it->second];
      if (rec.free_entry == kNever) rec.free_entry = i;
      r_.entry_record[i] = it->second;
      return;
    }
    AllocRecord rec;  // allocated before the trace began
    rec.flags = AllocRecord::kInitial;
    rec.alloc_entry = static_cast<uint32_t>(r_.initial.size());
    r_.initial.push_back(InitialBlock{e.addr, e.size_bytes, e.stack, e.stream});
    rec.free_entry = i;
    AddRecord(i, e.addr, rec);
  }

  void OnFreeCompleted(uint32_t i, const TraceEntry& e) {
    auto it = live_.find(e.addr);
    // Without a record the free was requested before the trace began:
    // allocated_bytes had already dropped, nothing to count.
    if (it == live_.end()) return;
    AllocRecord& rec = r_.records[it->second];
    if (rec.free_entry == kNever) rec.free_entry = i;
    rec.release_entry = i;
    r_.entry_record[i] = it->second;
    live_.erase(it);
  }

  const Snapshot& snapshot_;
  Reconstruction& r_;
  PhaseMachine phases_;
  LiveRecords live_;
  uint64_t unmatched_allocs_ = 0;
  uint64_t segment_bytes_in_ = 0;
  uint64_t segment_bytes_out_ = 0;
};

// A final-segment block the trace allocated and never freed: its size is
// now exact, and its stack fills in one the trace did not record.
void AdoptFinalBlock(const SnapshotBlock& b, AllocRecord& rec, Reconstruction& r) {
  rec.block_bytes = b.size_bytes;
  rec.flags |= AllocRecord::kExactSize;
  if (b.stack == 0 || r.Stack(rec) != 0) return;
  if (rec.initial()) {
    r.initial[rec.alloc_entry].stack = b.stack;
  } else {
    r.segment_stacks[rec.alloc_entry] = b.stack;
    rec.flags |= AllocRecord::kSegmentStack;
  }
}

// The final segments: exact block sizes of what is still alive, blocks
// alive since before the trace, reserved bytes at the end. Returns the
// segments at the end of the trace (start -> end).
std::map<uint64_t, uint64_t> ReadFinalSegments(const Snapshot& snapshot, const LiveRecords& live,
                                               Reconstruction& r) {
  std::map<uint64_t, uint64_t> segments;
  for (const SnapshotSegment& s : snapshot.segments) {
    if (s.device != r.device) continue;
    r.segments_reserved_bytes += s.total_bytes;
    segments[s.address] = s.address + s.total_bytes;
    for (const SnapshotBlock& b : s.blocks) {
      if (b.state == BlockState::kInactive) continue;
      if (b.state == BlockState::kActiveAllocated) r.segments_allocated_bytes += b.size_bytes;
      if (auto it = live.find(b.address); it != live.end()) {
        AdoptFinalBlock(b, r.records[it->second], r);
        continue;
      }
      // Pending free and unknown to the trace: freed before the trace
      // began, so not in allocated_bytes.
      if (b.state == BlockState::kActivePendingFree) continue;
      AllocRecord rec;
      rec.flags = AllocRecord::kInitial | AllocRecord::kExactSize;
      rec.alloc_entry = static_cast<uint32_t>(r.initial.size());
      r.initial.push_back(InitialBlock{b.address, b.requested_bytes, b.stack, s.stream});
      rec.block_bytes = b.size_bytes;
      r.records.push_back(rec);
    }
  }
  return segments;
}

// Walks the segment actions backwards from the final state to what existed
// when the trace began (MemoryViz.js reconstructs its history the same
// way), and the reserved bytes then.
void FindInitialSegments(std::map<uint64_t, uint64_t> segments, const TraceMatcher& matcher,
                         Reconstruction& r) {
  const Trace& entries = *r.entries;
  for (uint64_t i = entries.size(); i-- > 0;) {
    const TraceEntry e = entries[i];
    if (e.action == TraceAction::kSegmentAlloc) {
      segments.erase(e.addr);
    } else if (e.action == TraceAction::kSegmentFree) {
      segments[e.addr] = e.addr + e.size_bytes;
    }
  }
  r.initial_segments.assign(segments.begin(), segments.end());
  const uint64_t out = matcher.segment_bytes_out();
  const uint64_t in = matcher.segment_bytes_in();
  if (r.segments_reserved_bytes + out >= in) {
    r.initial_reserved_bytes = r.segments_reserved_bytes + out - in;
  } else {
    r.notes.push_back(
        "the trace allocated more segment bytes than the final segments hold; the reserved "
        "bytes before the trace are taken as 0");
  }
}

}  // namespace

Result<Reconstruction> Reconstruct(const Snapshot& snapshot, int device) {
  Reconstruction r = StartReconstruction(snapshot, device);
  const Trace& entries = *r.entries;
  if (entries.size() >= kNoRecord || snapshot.segments.size() >= kNoRecord) {
    return MakeError(
        fmt::format("{} trace entries: more than this reader handles (2^32)", entries.size()));
  }
  if (Status s = CheckSizesFit64Bits(snapshot, device, entries); !s.ok()) return s.error();
  r.records.reserve(RecordBound(snapshot, device, entries));
  r.entry_record.assign(entries.size(), kNoRecord);
  TraceMatcher matcher(snapshot, &r);
  matcher.Run();
  FindInitialSegments(ReadFinalSegments(snapshot, matcher.live(), r), matcher, r);
  Attribute(r);
  return r;
}

}  // namespace vramscope::snapshot
