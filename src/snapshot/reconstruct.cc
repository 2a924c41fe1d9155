#include "reconstruct.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
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

Result<Reconstruction> Reconstruct(const Snapshot& snapshot, int device) {
  static const Trace kNoEntries;
  Reconstruction r;
  r.device = device;
  r.entries = static_cast<size_t>(device) < snapshot.device_traces.size()
                  ? &snapshot.device_traces[static_cast<size_t>(device)]
                  : &kNoEntries;
  r.stacks = ClassifyStacks(snapshot);
  r.rounding = SnapshotAllocatorConfig(snapshot);
  r.expandable = r.rounding.expandable_segments;
  const Trace& entries = *r.entries;

  for (const TraceEntry e : entries) {
    if (e.action == TraceAction::kAlloc && e.stack != 0) {
      r.has_frames = true;
      break;
    }
    if (e.action == TraceAction::kSegmentMap) r.expandable = true;
  }
  for (const SnapshotSegment& s : snapshot.segments) {
    if (s.device == device && s.expandable) r.expandable = true;
  }

  // Pass 1: match allocs and frees by address; phases from alloc stacks.
  if (entries.size() >= kNoRecord || snapshot.segments.size() >= kNoRecord) {
    return MakeError(
        fmt::format("{} trace entries: more than this reader handles (2^32)", entries.size()));
  }
  // Records: one per alloc, one per free without its alloc, one per block
  // of the final segments the trace never allocated. Reserving that bound
  // means the vector never grows by copying (which would double the peak);
  // what stays unused is never touched, so it costs no resident memory.
  uint64_t record_bound = 0;
  for (const TraceEntry e : entries) {
    record_bound += e.action == TraceAction::kAlloc || e.action == TraceAction::kFreeRequested;
  }
  for (const SnapshotSegment& s : snapshot.segments) {
    if (s.device == device) record_bound += s.blocks.size();
  }
  r.records.reserve(record_bound);
  r.entry_record.assign(entries.size(), kNoRecord);
  PhaseMachine phases(&r.marks, r.has_frames);
  std::unordered_map<uint64_t, uint32_t> live;  // address -> record
  uint64_t unmatched_allocs = 0;
  uint64_t segment_delta_in = 0, segment_delta_out = 0;
  for (uint64_t i = 0; i < entries.size(); ++i) {
    const TraceEntry e = entries[i];
    switch (e.action) {
      case TraceAction::kAlloc: {
        if (auto it = live.find(e.addr); it != live.end()) {
          // A block handed out again without its free in the trace.
          AllocRecord& old = r.records[it->second];
          if (old.free_entry == kNever) old.free_entry = static_cast<uint32_t>(i);
          old.release_entry = static_cast<uint32_t>(i);
          r.forced_frees.emplace_back(i, it->second);
          ++unmatched_allocs;
        }
        AllocRecord rec;
        rec.alloc_entry = static_cast<uint32_t>(i);
        live[e.addr] = static_cast<uint32_t>(r.records.size());
        r.entry_record[i] = static_cast<uint32_t>(r.records.size());
        r.records.push_back(rec);
        phases.OnAlloc(i, r.stacks[e.stack], snapshot.stacks[e.stack].empty());
        break;
      }
      case TraceAction::kFreeRequested: {
        auto it = live.find(e.addr);
        if (it != live.end()) {
          AllocRecord& rec = r.records[it->second];
          if (rec.free_entry == kNever) rec.free_entry = static_cast<uint32_t>(i);
          r.entry_record[i] = it->second;
          break;
        }
        AllocRecord rec;  // allocated before the trace began
        rec.flags = AllocRecord::kInitial;
        rec.alloc_entry = static_cast<uint32_t>(r.initial.size());
        r.initial.push_back(InitialBlock{e.addr, e.size_bytes, e.stack, e.stream});
        rec.free_entry = static_cast<uint32_t>(i);
        live[e.addr] = static_cast<uint32_t>(r.records.size());
        r.entry_record[i] = static_cast<uint32_t>(r.records.size());
        r.records.push_back(rec);
        break;
      }
      case TraceAction::kFreeCompleted: {
        auto it = live.find(e.addr);
        // Without a record the free was requested before the trace began:
        // allocated_bytes had already dropped, nothing to count.
        if (it == live.end()) break;
        AllocRecord& rec = r.records[it->second];
        if (rec.free_entry == kNever) rec.free_entry = static_cast<uint32_t>(i);
        rec.release_entry = static_cast<uint32_t>(i);
        r.entry_record[i] = it->second;
        live.erase(it);
        break;
      }
      case TraceAction::kSegmentAlloc:
      case TraceAction::kSegmentMap: segment_delta_in += e.size_bytes; break;
      case TraceAction::kSegmentFree:
      case TraceAction::kSegmentUnmap: segment_delta_out += e.size_bytes; break;
      default: break;
    }
  }
  if (unmatched_allocs > 0) {
    r.notes.push_back(fmt::format(
        "{} block(s) were allocated again at an address whose free the trace does not show; "
        "each is counted as freed then",
        unmatched_allocs));
  }

  // The final segments: exact block sizes of what is still alive, blocks
  // alive since before the trace, reserved bytes at the end.
  std::map<uint64_t, uint64_t> segments;  // start -> end, at the end of the trace
  uint64_t pending_unknown = 0;
  for (const SnapshotSegment& s : snapshot.segments) {
    if (s.device != device) continue;
    r.segments_reserved_bytes += s.total_bytes;
    segments[s.address] = s.address + s.total_bytes;
    for (const SnapshotBlock& b : s.blocks) {
      if (b.state == BlockState::kInactive) continue;
      if (b.state == BlockState::kActiveAllocated) r.segments_allocated_bytes += b.size_bytes;
      auto it = live.find(b.address);
      if (it != live.end()) {
        AllocRecord& rec = r.records[it->second];
        rec.block_bytes = b.size_bytes;
        rec.flags |= AllocRecord::kExactSize;
        if (b.stack != 0 && r.Stack(rec) == 0) {
          if (rec.initial()) {
            r.initial[rec.alloc_entry].stack = b.stack;
          } else {
            r.segment_stacks[rec.alloc_entry] = b.stack;
            rec.flags |= AllocRecord::kSegmentStack;
          }
        }
        continue;
      }
      if (b.state == BlockState::kActivePendingFree) {
        ++pending_unknown;  // freed before the trace: not in allocated_bytes
        continue;
      }
      AllocRecord rec;
      rec.flags = AllocRecord::kInitial | AllocRecord::kExactSize;
      rec.alloc_entry = static_cast<uint32_t>(r.initial.size());
      r.initial.push_back(InitialBlock{b.address, b.requested_bytes, b.stack, s.stream});
      rec.block_bytes = b.size_bytes;
      r.records.push_back(rec);
    }
  }
  (void)pending_unknown;

  // Walk the segment actions backwards from the final state: what existed
  // when the trace began (MemoryViz.js reconstructs its history the same way).
  for (uint64_t i = entries.size(); i-- > 0;) {
    const TraceEntry e = entries[i];
    if (e.action == TraceAction::kSegmentAlloc) {
      segments.erase(e.addr);
    } else if (e.action == TraceAction::kSegmentFree) {
      segments[e.addr] = e.addr + e.size_bytes;
    }
  }
  r.initial_segments.assign(segments.begin(), segments.end());
  if (r.segments_reserved_bytes + segment_delta_out >= segment_delta_in) {
    r.initial_reserved_bytes = r.segments_reserved_bytes + segment_delta_out - segment_delta_in;
  } else {
    r.notes.push_back(
        "the trace allocated more segment bytes than the final segments hold; the reserved "
        "bytes before the trace are taken as 0");
  }
  Attribute(r);
  return r;
}

}  // namespace vramscope::snapshot
