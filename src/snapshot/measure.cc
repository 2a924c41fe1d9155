// MeasureSnapshot: the measured timeline of one device, in SimResult shape.
//
// allocated_bytes moves as PyTorch's stat does (up at alloc by the block
// size, down at free_requested), requested_bytes as its requested stat (down
// at free_completed), reserved_bytes with the segment actions. One pass over
// the trace; memory is the records and a bounded timeline.
#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <unordered_map>

#include "block_sizer.h"
#include "reconstruct.h"
#include "vramscope/allocator.h"
#include "vramscope/snapshot.h"
#include "vramscope/timeline_sampler.h"

namespace vramscope {
namespace {

using snapshot::AllocRecord;
using snapshot::kNever;
using snapshot::Reconstruction;

std::string FormatSize(uint64_t bytes) {
  // torch format_size: MiB below 1 GiB, else GiB.
  if (bytes < kGiB) return fmt::format("{:.2f} MiB", static_cast<double>(bytes) / kMiB);
  return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / kGiB);
}

class Measurer {
 public:
  Measurer(Reconstruction& r, const ExplainOptions& options, SnapshotRun* run)
      : r_(r),
        options_(options),
        run_(run),
        sampler_(options.max_timeline_points),
        sizer_(std::make_unique<snapshot::BlockSizer>(r)) {}

  void Run();

 private:
  void Allocate(AllocRecord& rec, uint64_t block_bytes);
  void Free(const AllocRecord& rec);
  void Release(const AllocRecord& rec);
  void ApplyEntry(uint64_t i);
  void Observe(uint64_t i, bool initial);
  std::vector<LiveAllocation> LiveAt(uint64_t entry, bool before_first, size_t keep,
                                     uint64_t* count, std::vector<uint32_t>* ids) const;
  void CollectSites(const std::vector<uint32_t>& live_ids);

  Reconstruction& r_;
  const ExplainOptions& options_;
  SnapshotRun* run_;
  TimelineSampler sampler_;
  std::unique_ptr<snapshot::BlockSizer> sizer_;
  SimResult& sim() { return run_->sim; }

  uint64_t allocated_ = 0, reserved_ = 0, requested_ = 0;
  CategoryBytes by_category_{};
  size_t mark_ = 0;
  bool peak_before_first_ = true;
  bool reserved_underflow_ = false;
  size_t next_forced_ = 0;
};

void Measurer::Allocate(AllocRecord& rec, uint64_t block_bytes) {
  rec.block_bytes = block_bytes;
  allocated_ += block_bytes;
  requested_ += r_.Requested(rec);
  by_category_[static_cast<int>(rec.category)] += block_bytes;
}

void Measurer::Observe(uint64_t i, bool initial) {
  SimResult& s = sim();
  const snapshot::PhaseMark& m = r_.marks[mark_];
  if (initial || allocated_ > s.peak_allocated_bytes) {
    s.peak_allocated_bytes = allocated_;
    s.peak_event_index = i;
    s.peak_step = m.step;
    s.peak_phase = m.phase;
    s.reserved_at_peak_bytes = reserved_;
    s.breakdown_at_peak = by_category_;
    peak_before_first_ = initial;
  }
  s.peak_reserved_bytes = std::max(s.peak_reserved_bytes, reserved_);
  s.peak_requested_bytes = std::max(s.peak_requested_bytes, requested_);
  PhasePeak& phase = s.phases.back();
  phase.peak_allocated_bytes = std::max(phase.peak_allocated_bytes, allocated_);
  phase.peak_reserved_bytes = std::max(phase.peak_reserved_bytes, reserved_);
  const uint64_t fragmentation = reserved_ > allocated_ ? reserved_ - allocated_ : 0;
  if (fragmentation > run_->max_fragmentation_bytes) {
    run_->max_fragmentation_bytes = fragmentation;
    run_->max_fragmentation_entry = i;
  }
  if (!initial) {
    sampler_.Add(TimelinePoint{i, m.step, m.phase, allocated_, reserved_, by_category_});
  }
}

void Measurer::Free(const AllocRecord& rec) {
  allocated_ -= std::min(allocated_, rec.block_bytes);
  uint64_t& cat = by_category_[static_cast<int>(rec.category)];
  cat -= std::min(cat, rec.block_bytes);
}

void Measurer::Release(const AllocRecord& rec) {
  requested_ -= std::min(requested_, r_.Requested(rec));
  sizer_->OnRelease(rec);
}

void Measurer::ApplyEntry(uint64_t i) {
  const TraceEntry e = (*r_.entries)[i];
  std::vector<AllocRecord>& records = r_.records;
  // A block whose address was handed out again without a free in the trace
  // closes before the new alloc at the same entry.
  while (next_forced_ < r_.forced_frees.size() && r_.forced_frees[next_forced_].first == i) {
    const AllocRecord& old = records[r_.forced_frees[next_forced_++].second];
    if (old.free_entry == i) Free(old);
    Release(old);
  }
  const uint32_t id = r_.entry_record[i];
  switch (e.action) {
    case TraceAction::kAlloc:
      if (id != snapshot::kNoRecord) Allocate(records[id], sizer_->OnAlloc(records[id]));
      break;
    case TraceAction::kFreeRequested:
      if (id != snapshot::kNoRecord && records[id].free_entry == i) Free(records[id]);
      break;
    case TraceAction::kFreeCompleted:
      if (id == snapshot::kNoRecord) break;
      if (records[id].free_entry == i) Free(records[id]);  // no free_requested before it
      if (records[id].release_entry == i) Release(records[id]);
      break;
    case TraceAction::kSegmentAlloc:
    case TraceAction::kSegmentMap:
      reserved_ += e.size_bytes;
      ++sim().final_stats.num_device_alloc;
      if (e.action == TraceAction::kSegmentAlloc) sizer_->OnSegmentAlloc(e.addr, e.size_bytes);
      break;
    case TraceAction::kSegmentFree:
    case TraceAction::kSegmentUnmap:
      if (reserved_ < e.size_bytes) reserved_underflow_ = true;
      reserved_ -= std::min(reserved_, e.size_bytes);
      ++sim().final_stats.num_device_free;
      if (e.action == TraceAction::kSegmentFree) sizer_->OnSegmentFree(e.addr);
      break;
    case TraceAction::kOom: {
      ++sim().final_stats.num_ooms;
      if (sim().oom) break;
      OomInfo oom;
      oom.requested_bytes = e.size_bytes;
      oom.alloc_size_bytes = r_.expandable ? e.size_bytes : SegmentSizeFor(e.size_bytes);
      oom.free_device_bytes = e.addr;
      oom.device_limit_bytes = reserved_ + e.addr;
      oom.allocated_bytes = allocated_;
      oom.reserved_bytes = reserved_;
      oom.message = fmt::format(
          "CUDA out of memory. Tried to allocate {}. GPU {} has {} free. Of the allocated "
          "memory {} is allocated by PyTorch, and {} is reserved by PyTorch but unallocated.",
          FormatSize(e.size_bytes), r_.device, FormatSize(e.addr), FormatSize(allocated_),
          FormatSize(reserved_ - std::min(reserved_, allocated_)));
      sim().oom = oom;
      sim().oom_event_index = i;
      sim().oom_step = r_.marks[mark_].step;
      sim().oom_phase = r_.marks[mark_].phase;
      run_->breakdown_at_oom = by_category_;
      uint64_t count = 0;
      run_->live_at_oom = LiveAt(i, /*before_first=*/false, 5, &count, nullptr);
      break;
    }
    default: break;
  }
}

std::vector<LiveAllocation> Measurer::LiveAt(uint64_t entry, bool before_first, size_t keep,
                                             uint64_t* count, std::vector<uint32_t>* ids) const {
  const std::vector<AllocRecord>& records = r_.records;
  std::vector<uint32_t> live;
  for (uint32_t i = 0; i < records.size(); ++i) {
    const AllocRecord& rec = records[i];
    const bool born = rec.initial() || (!before_first && rec.alloc_entry <= entry);
    const bool dead = rec.free_entry != kNever && !before_first && rec.free_entry <= entry;
    if (born && !dead && rec.block_bytes > 0) live.push_back(i);
  }
  *count = live.size();
  const size_t n = std::min(keep, live.size());
  auto larger = [&](uint32_t a, uint32_t b) {
    if (records[a].block_bytes != records[b].block_bytes) {
      return records[a].block_bytes > records[b].block_bytes;
    }
    return a < b;
  };
  if (ids != nullptr) *ids = live;
  std::partial_sort(live.begin(), live.begin() + static_cast<std::ptrdiff_t>(n), live.end(),
                    larger);
  std::vector<LiveAllocation> top;
  top.reserve(n);
  for (size_t k = 0; k < n; ++k) {
    const AllocRecord& rec = records[live[k]];
    LiveAllocation a;
    a.id = live[k];
    a.requested_bytes = r_.Requested(rec);
    a.block_bytes = rec.block_bytes;
    a.category = rec.category;
    const uint32_t stack = r_.Stack(rec);
    a.op = r_.stacks[stack].op;
    a.module = r_.stacks[stack].site;
    if (!rec.initial()) {
      const snapshot::PhaseMark& m = r_.marks[r_.MarkAt(rec.alloc_entry)];
      a.step = m.step;
      a.phase = m.phase;
    }
    top.push_back(std::move(a));
  }
  return top;
}

void Measurer::CollectSites(const std::vector<uint32_t>& live_ids) {
  struct Acc {
    uint64_t bytes = 0, blocks = 0, largest = 0;
    Category category = Category::kOther;
  };
  std::unordered_map<std::string, Acc> sites;
  for (uint32_t id : live_ids) {
    const AllocRecord& rec = r_.records[id];
    const std::string& site = r_.stacks[r_.Stack(rec)].site;
    Acc& acc = sites[site.empty() ? std::string("(no stack recorded)") : site];
    acc.bytes += rec.block_bytes;
    ++acc.blocks;
    if (rec.block_bytes > acc.largest) {
      acc.largest = rec.block_bytes;
      acc.category = rec.category;
    }
  }
  for (auto& [site, acc] : sites) {
    run_->top_sites.push_back(SiteBytes{site, acc.category, acc.bytes, acc.blocks});
  }
  std::sort(run_->top_sites.begin(), run_->top_sites.end(),
            [](const SiteBytes& a, const SiteBytes& b) {
              return a.bytes != b.bytes ? a.bytes > b.bytes : a.site < b.site;
            });
  if (run_->top_sites.size() > options_.top_sites) run_->top_sites.resize(options_.top_sites);
}

void Measurer::Run() {
  std::vector<AllocRecord>& records = r_.records;
  const Trace& entries = *r_.entries;
  SimResult& s = sim();
  s.num_events = entries.size();

  // The state before the first entry.
  reserved_ = r_.initial_reserved_bytes;
  for (AllocRecord& rec : records) {
    if (!rec.initial()) continue;
    Allocate(rec, rec.exact() ? rec.block_bytes : RoundSize(r_.Requested(rec), r_.rounding));
    ++run_->initially_live_blocks;
    run_->initially_live_bytes += rec.block_bytes;
  }
  const snapshot::PhaseMark& first = r_.marks[0];
  s.phases.push_back(PhasePeak{first.step, first.phase, allocated_, reserved_, 0});
  Observe(0, /*initial=*/true);

  for (uint64_t i = 0; i < entries.size(); ++i) {
    while (mark_ + 1 < r_.marks.size() && r_.marks[mark_ + 1].entry <= i) {
      s.phases.back().allocated_at_end_bytes = allocated_;
      ++mark_;
      s.phases.push_back(
          PhasePeak{r_.marks[mark_].step, r_.marks[mark_].phase, allocated_, reserved_, 0});
    }
    ApplyEntry(i);
    Observe(i, /*initial=*/false);
  }
  s.phases.back().allocated_at_end_bytes = allocated_;
  s.timeline = sampler_.Finish();

  s.final_stats.allocated_bytes = allocated_;
  s.final_stats.reserved_bytes = reserved_;
  s.final_stats.requested_bytes = requested_;
  s.final_stats.peak_allocated_bytes = s.peak_allocated_bytes;
  s.final_stats.peak_reserved_bytes = s.peak_reserved_bytes;
  s.final_stats.peak_requested_bytes = s.peak_requested_bytes;
  run_->end_allocated_bytes = allocated_;
  run_->end_reserved_bytes = reserved_;

  std::vector<uint32_t> live_ids;
  s.top_at_peak = LiveAt(s.peak_event_index, peak_before_first_, options_.top_allocations,
                         &s.live_at_peak_count, &live_ids);
  CollectSites(live_ids);
  if (reserved_underflow_) {
    run_->notes.push_back(
        "the trace frees more segment bytes than it had reserved; reserved is clamped at 0 "
        "there (the final segments may be of another device or incomplete)");
  }
}

}  // namespace

Result<SnapshotRun> MeasureSnapshot(const Snapshot& snapshot, const ExplainOptions& options) {
  auto device = snapshot::ChooseDevice(snapshot, options.device);
  if (!device.ok()) return device.error();
  auto reconstruction = snapshot::Reconstruct(snapshot, *device);
  if (!reconstruction.ok()) return reconstruction.error();
  Reconstruction& r = *reconstruction;
  SnapshotRun run;
  run.device = *device;
  run.trace_entries = r.entries->size();
  run.allocations = r.records.size();
  run.has_frames = r.has_frames;
  run.segments_allocated_bytes = r.segments_allocated_bytes;
  run.segments_reserved_bytes = r.segments_reserved_bytes;
  run.initial_reserved_bytes = r.initial_reserved_bytes;
  for (const SnapshotSegment& seg : snapshot.segments) {
    if (seg.device == run.device) ++run.sim.final_stats.num_segments;
  }
  Measurer measurer(r, options, &run);
  measurer.Run();
  run.notes.insert(run.notes.end(), r.notes.begin(), r.notes.end());
  return run;
}

}  // namespace vramscope
