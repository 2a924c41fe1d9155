// Replays an event stream through the CachingAllocator model.
//
// One pass measures peaks, phases, the timeline and the OOM, and also keeps
// what was alive at the allocated peak without copying the live set at every
// new peak: an allocation live at the peak is either still live at the end,
// or it was freed after the peak, and those are set aside as they are freed
// (the list is dropped whenever a higher peak is reached). Memory stays
// proportional to live allocations, not to the number of events.
#include <algorithm>
#include <unordered_map>

#include <fmt/format.h>

#include "live_map.h"
#include "vramscope/common/checked.h"
#include "vramscope/simulate.h"
#include "vramscope/timeline_sampler.h"

namespace vramscope {
namespace {

struct LiveEntry {
  BlockHandle handle = 0;
  uint64_t block_bytes = 0;
  uint64_t alloc_event = 0;
  uint32_t step = 0;
  Phase phase = Phase::kSetup;
  Category category = Category::kOther;
};

struct LiveAt {
  uint64_t id = 0;
  LiveEntry entry;
};

// Replay state.
struct Replayer {
  Replayer(const SimOptions& options)
      : allocator(options.alloc, options.device_limit_bytes),
        track_peak_set(options.top_allocations > 0) {}

  CachingAllocator allocator;
  sim::LiveMap<LiveEntry> live;
  // Ids whose allocation failed with OOM (when not stopping at OOM): their
  // frees are ignored.
  std::unordered_map<uint64_t, bool> failed;
  // Freed ids whose memory waits for other streams' work (record_stream),
  // with the allocator's ticket for that work; the newest free of an id.
  std::unordered_map<uint64_t, FreeTicket> pending;
  CategoryBytes by_category{};
  uint32_t step = 0;
  Phase phase = Phase::kSetup;

  // The live set at the peak is wanted (top allocations).
  bool track_peak_set;
  bool have_peak = false;
  uint64_t peak_event = 0;
  // Allocations that were live at the peak and have been freed since.
  std::vector<LiveAt> freed_since_peak;

  enum class Outcome { kOk, kOom };

  // The state after the current event is the new allocated peak.
  void MarkPeak(uint64_t index) {
    have_peak = true;
    peak_event = index;
    freed_since_peak.clear();
  }

  // Applies event `index`. Returns an Error for streams that break lifetime
  // rules (the file reader reports these with line numbers first).
  Result<Outcome> Apply(const Event& e, uint64_t index) {
    switch (e.kind) {
      case EventKind::kPhase:
        step = e.step;
        phase = e.phase;
        return Outcome::kOk;
      case EventKind::kEmptyCache:
        allocator.EmptyCache();
        pending.clear();  // empty_cache waited for every event
        return Outcome::kOk;
      case EventKind::kAlloc: {
        if (e.size_bytes > kMaxSizeBytes) {
          return MakeError(
              fmt::format("event {}: alloc size {} is above 2^62 bytes", index, e.size_bytes));
        }
        if (live.Find(e.id) != nullptr) {
          return MakeError(
              fmt::format("event {}: alloc of id {} that is already live", index, e.id));
        }
        std::optional<BlockHandle> handle = allocator.Malloc(e.size_bytes, e.stream);
        if (!handle) {
          failed[e.id] = true;
          return Outcome::kOom;
        }
        const uint64_t block_bytes = allocator.BlockSize(*handle);
        LiveEntry& entry = live.Insert(e.id);
        entry.handle = *handle;
        entry.block_bytes = block_bytes;
        entry.alloc_event = index;
        entry.step = step;
        entry.phase = phase;
        entry.category = e.category;
        by_category[static_cast<int>(e.category)] += block_bytes;
        return Outcome::kOk;
      }
      case EventKind::kFree: {
        const LiveEntry* entry = live.Find(e.id);
        if (entry == nullptr) {
          if (failed.erase(e.id) != 0) return Outcome::kOk;
          return MakeError(fmt::format("event {}: free of id {} that is not live", index, e.id));
        }
        by_category[static_cast<int>(entry->category)] -= entry->block_bytes;
        if (const FreeTicket ticket = allocator.Free(entry->handle); ticket != kNoPendingFree) {
          pending[e.id] = ticket;
        }
        if (track_peak_set && have_peak && entry->alloc_event <= peak_event) {
          freed_since_peak.push_back({e.id, *entry});
        }
        live.Erase(e.id);
        return Outcome::kOk;
      }
      case EventKind::kRecordStream: return RecordStream(e, index);
      case EventKind::kUsesDone: {
        // Nothing pending when the use was on the allocation's own stream,
        // in ideal mode, or after an empty_cache already waited for it.
        if (auto it = pending.find(e.id); it != pending.end()) {
          allocator.CompleteFreeEvents(it->second);
          pending.erase(it);
        }
        return Outcome::kOk;
      }
    }
    return Outcome::kOk;
  }

  Result<Outcome> RecordStream(const Event& e, uint64_t index) {
    const LiveEntry* entry = live.Find(e.id);
    if (entry == nullptr) {
      if (failed.count(e.id) != 0) return Outcome::kOk;
      return MakeError(
          fmt::format("event {}: record_stream of id {} that is not live", index, e.id));
    }
    allocator.RecordStream(entry->handle, e.stream);
    return Outcome::kOk;
  }

  // What was live right after event peak_event: allocated up to it and not
  // freed by then.
  std::vector<LiveAt> LiveAtPeak() const {
    std::vector<LiveAt> out = freed_since_peak;
    live.ForEach([&](uint64_t id, const LiveEntry& entry) {
      if (entry.alloc_event <= peak_event) out.push_back({id, entry});
    });
    return out;
  }
};

std::vector<StreamBytes> NamedStreams(const EventStream& stream,
                                      const std::vector<StreamReserved>& reserved) {
  std::vector<StreamBytes> out;
  out.reserve(reserved.size());
  for (const StreamReserved& r : reserved) {
    auto it = stream.metadata().find(fmt::format("stream.{}", r.stream));
    out.push_back({r.stream, it == stream.metadata().end() ? "" : it->second, r.reserved_bytes});
  }
  return out;
}

void ClosePhase(std::vector<PhasePeak>& phases, uint64_t allocated_bytes) {
  if (!phases.empty()) phases.back().allocated_at_end_bytes = allocated_bytes;
}

std::vector<LiveAllocation> TopAtPeak(const EventStream& stream, std::vector<LiveAt> order,
                                      size_t top_allocations) {
  const size_t keep = std::min(top_allocations, order.size());
  // Largest first; ties by allocation order so output is deterministic.
  auto larger = [](const LiveAt& a, const LiveAt& b) {
    if (a.entry.block_bytes != b.entry.block_bytes)
      return a.entry.block_bytes > b.entry.block_bytes;
    return a.entry.alloc_event < b.entry.alloc_event;
  };
  std::partial_sort(order.begin(), order.begin() + keep, order.end(), larger);
  std::vector<LiveAllocation> top;
  top.reserve(keep);
  for (size_t i = 0; i < keep; ++i) {
    const LiveEntry& entry = order[i].entry;
    const Event& e = stream.events()[entry.alloc_event];
    top.push_back(LiveAllocation{order[i].id, e.size_bytes, entry.block_bytes, entry.category,
                                 std::string(stream.String(e.op)),
                                 std::string(stream.String(e.module)), entry.step, entry.phase});
  }
  return top;
}

// Every running total of the replay (allocated, reserved, requested, per
// category) is at most the sum of the stream's allocation sizes, each counted
// as the allocator may round it: at most doubled (roundup_power2_divisions)
// plus a 20 MiB segment's worth. When that sum fits 64 bits no total can
// wrap; a stream that needs more (five allocations of 2^62 bytes, each within
// the format's limit) is refused instead of replayed with wrapped numbers
// (docs/hardening.md). One pass, no allocation.
Status CheckSizesFit64Bits(const EventStream& stream) {
  constexpr uint64_t kRoundingSlackBytes = uint64_t{20} << 20;
  uint64_t sum = 0;
  for (const Event& e : stream.events()) {
    if (e.kind != EventKind::kAlloc) continue;
    const auto doubled = common::CheckedMul(e.size_bytes, 2);
    const auto next = doubled ? common::CheckedAdd(sum, *doubled + kRoundingSlackBytes)
                              : std::nullopt;  // size <= 2^62: doubled + slack fits
    if (!next) {
      return MakeError(
          "the allocation sizes of the stream sum past 2^64 bytes (counting the allocator's "
          "rounding): no device has that much memory, and the totals would wrap");
    }
    sum = *next;
  }
  return Ok{};
}

}  // namespace

Result<SimResult> Simulate(const EventStream& stream, const SimOptions& options) {
  if (Status s = CheckSizesFit64Bits(stream); !s.ok()) return s.error();
  SimResult result;
  Replayer replay(options);
  TimelineSampler timeline(options.max_timeline_points);
  const auto& events = stream.events();
  result.num_events = events.size();
  for (uint64_t i = 0; i < events.size(); ++i) {
    const Event& e = events[i];
    if (e.kind == EventKind::kPhase) {
      ClosePhase(result.phases, replay.allocator.stats().allocated_bytes);
    }
    auto outcome = replay.Apply(e, i);
    if (!outcome.ok()) return outcome.error();
    const AllocatorStats& stats = replay.allocator.stats();
    if (e.kind == EventKind::kPhase || result.phases.empty()) {
      PhasePeak p;
      p.step = replay.step;
      p.phase = replay.phase;
      p.peak_allocated_bytes = stats.allocated_bytes;
      p.peak_reserved_bytes = stats.reserved_bytes;
      result.phases.push_back(p);
    }
    if (*outcome == Replayer::Outcome::kOom) {
      if (!result.oom) {
        result.oom = replay.allocator.last_oom();
        result.oom_event_index = i;
        result.oom_step = replay.step;
        result.oom_phase = replay.phase;
      }
      if (options.stop_at_oom) break;
    }
    if (stats.reserved_bytes > result.peak_reserved_bytes) {
      // The reserved peak only moves when a segment is created: rare.
      result.peak_reserved_bytes = stats.reserved_bytes;
      result.reserved_by_stream_at_peak = NamedStreams(stream, replay.allocator.ReservedByStream());
    }
    PhasePeak& current = result.phases.back();
    current.peak_allocated_bytes = std::max(current.peak_allocated_bytes, stats.allocated_bytes);
    current.peak_reserved_bytes = std::max(current.peak_reserved_bytes, stats.reserved_bytes);
    if (!replay.have_peak || stats.allocated_bytes > result.peak_allocated_bytes) {
      replay.MarkPeak(i);
      result.peak_allocated_bytes = stats.allocated_bytes;
      result.peak_event_index = i;
      result.peak_step = replay.step;
      result.peak_phase = replay.phase;
      result.reserved_at_peak_bytes = stats.reserved_bytes;
      result.breakdown_at_peak = replay.by_category;
    }
    if (options.max_timeline_points > 0) {  // searches and sweeps skip the copy
      timeline.Add(TimelinePoint{i, replay.step, replay.phase, stats.allocated_bytes,
                                 stats.reserved_bytes, replay.by_category});
    }
  }
  ClosePhase(result.phases, replay.allocator.stats().allocated_bytes);
  result.final_stats = replay.allocator.stats();
  result.peak_reserved_bytes = result.final_stats.peak_reserved_bytes;
  result.peak_requested_bytes = result.final_stats.peak_requested_bytes;
  result.peak_active_bytes = result.final_stats.peak_active_bytes;
  result.timeline = timeline.Finish();
  if (replay.have_peak && options.top_allocations > 0) {
    std::vector<LiveAt> live_at_peak = replay.LiveAtPeak();
    result.live_at_peak_count = live_at_peak.size();
    result.top_at_peak = TopAtPeak(stream, std::move(live_at_peak), options.top_allocations);
  }
  return result;
}

}  // namespace vramscope
