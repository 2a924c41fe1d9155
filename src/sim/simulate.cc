// Replays an event stream through the CachingAllocator model.
//
// Two passes: the first measures (peaks, phases, timeline, OOM); the second
// replays up to the allocated peak to list what was alive there. Replay is
// cheap (millions of events per second), and this keeps memory proportional
// to live allocations instead of copying the live set at every new peak.
#include <algorithm>
#include <unordered_map>

#include <fmt/format.h>

#include "timeline.h"
#include "vramscope/simulate.h"

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

// Replay state shared by both passes.
struct Replayer {
  Replayer(const SimOptions& options)
      : allocator(options.alloc, options.device_limit_bytes) {}

  CachingAllocator allocator;
  std::unordered_map<uint64_t, LiveEntry> live;
  // Ids whose allocation failed with OOM (when not stopping at OOM): their
  // frees are ignored.
  std::unordered_map<uint64_t, bool> failed;
  CategoryBytes by_category{};
  uint32_t step = 0;
  Phase phase = Phase::kSetup;

  enum class Outcome { kOk, kOom };

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
        return Outcome::kOk;
      case EventKind::kAlloc: {
        if (e.size_bytes > kMaxSizeBytes) {
          return MakeError(fmt::format("event {}: alloc size {} is above 2^62 bytes",
                                       index, e.size_bytes));
        }
        if (live.count(e.id) != 0) {
          return MakeError(fmt::format("event {}: alloc of id {} that is already live",
                                       index, e.id));
        }
        std::optional<BlockHandle> handle = allocator.Malloc(e.size_bytes, e.stream);
        if (!handle) {
          failed[e.id] = true;
          return Outcome::kOom;
        }
        const uint64_t block_bytes = allocator.BlockSize(*handle);
        live.emplace(e.id, LiveEntry{*handle, block_bytes, index, step, phase, e.category});
        by_category[static_cast<int>(e.category)] += block_bytes;
        return Outcome::kOk;
      }
      case EventKind::kFree: {
        auto it = live.find(e.id);
        if (it == live.end()) {
          if (failed.erase(e.id) != 0) return Outcome::kOk;
          return MakeError(fmt::format("event {}: free of id {} that is not live",
                                       index, e.id));
        }
        by_category[static_cast<int>(it->second.category)] -= it->second.block_bytes;
        allocator.Free(it->second.handle);
        live.erase(it);
        return Outcome::kOk;
      }
    }
    return Outcome::kOk;
  }
};

void ClosePhase(std::vector<PhasePeak>& phases, uint64_t allocated_bytes) {
  if (!phases.empty()) phases.back().allocated_at_end_bytes = allocated_bytes;
}

std::vector<LiveAllocation> CollectTopAtPeak(const EventStream& stream,
                                             const SimOptions& options,
                                             uint64_t peak_event_index,
                                             uint64_t* live_count) {
  Replayer replay(options);
  const auto& events = stream.events();
  for (uint64_t i = 0; i <= peak_event_index && i < events.size(); ++i) {
    // The first pass already validated these events.
    (void)replay.Apply(events[i], i);
  }
  *live_count = replay.live.size();
  std::vector<std::pair<uint64_t, const LiveEntry*>> order;
  order.reserve(replay.live.size());
  for (const auto& [id, entry] : replay.live) order.emplace_back(id, &entry);
  const size_t keep = std::min(options.top_allocations, order.size());
  // Largest first; ties by allocation order so output is deterministic.
  auto larger = [](const auto& a, const auto& b) {
    if (a.second->block_bytes != b.second->block_bytes)
      return a.second->block_bytes > b.second->block_bytes;
    return a.second->alloc_event < b.second->alloc_event;
  };
  std::partial_sort(order.begin(), order.begin() + keep, order.end(), larger);
  std::vector<LiveAllocation> top;
  top.reserve(keep);
  for (size_t i = 0; i < keep; ++i) {
    const LiveEntry& entry = *order[i].second;
    const Event& e = events[entry.alloc_event];
    top.push_back(LiveAllocation{order[i].first, e.size_bytes, entry.block_bytes,
                                 entry.category, std::string(stream.String(e.op)),
                                 std::string(stream.String(e.module)), entry.step,
                                 entry.phase});
  }
  return top;
}

}  // namespace

Result<SimResult> Simulate(const EventStream& stream, const SimOptions& options) {
  SimResult result;
  Replayer replay(options);
  sim::TimelineSampler timeline(options.max_timeline_points);
  const auto& events = stream.events();
  result.num_events = events.size();
  bool have_peak = false;

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
    PhasePeak& current = result.phases.back();
    current.peak_allocated_bytes = std::max(current.peak_allocated_bytes, stats.allocated_bytes);
    current.peak_reserved_bytes = std::max(current.peak_reserved_bytes, stats.reserved_bytes);
    if (!have_peak || stats.allocated_bytes > result.peak_allocated_bytes) {
      have_peak = true;
      result.peak_allocated_bytes = stats.allocated_bytes;
      result.peak_event_index = i;
      result.peak_step = replay.step;
      result.peak_phase = replay.phase;
      result.reserved_at_peak_bytes = stats.reserved_bytes;
      result.breakdown_at_peak = replay.by_category;
    }
    timeline.Add(TimelinePoint{i, replay.step, replay.phase, stats.allocated_bytes,
                               stats.reserved_bytes, replay.by_category});
  }
  ClosePhase(result.phases, replay.allocator.stats().allocated_bytes);
  result.final_stats = replay.allocator.stats();
  result.peak_reserved_bytes = result.final_stats.peak_reserved_bytes;
  result.peak_requested_bytes = result.final_stats.peak_requested_bytes;
  result.timeline = timeline.Finish();
  if (have_peak && options.top_allocations > 0) {
    result.top_at_peak = CollectTopAtPeak(stream, options, result.peak_event_index,
                                          &result.live_at_peak_count);
  }
  return result;
}

}  // namespace vramscope
