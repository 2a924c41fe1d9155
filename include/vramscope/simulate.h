// Replays an event stream through the allocator model and measures it.
//
// Memory use is proportional to live allocations and the bounded timeline,
// not to the number of events.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "vramscope/alloc_config.h"
#include "vramscope/allocator.h"
#include "vramscope/category.h"
#include "vramscope/event_stream.h"
#include "vramscope/result.h"

namespace vramscope {

using CategoryBytes = std::array<uint64_t, kNumCategories>;

struct SimOptions {
  AllocatorConfig alloc;
  // What the allocator may reserve (GPU memory minus context and other use).
  uint64_t device_limit_bytes = kUnlimited;
  // Timeline points kept (downsampled, peaks preserved); 0 = no timeline.
  size_t max_timeline_points = 2000;
  // How many of the largest allocations alive at the peak to list.
  size_t top_allocations = 20;
  // Stop at the first simulated OOM (as PyTorch would raise).
  bool stop_at_oom = true;
};

struct TimelinePoint {
  uint64_t event_index = 0;
  uint32_t step = 0;
  Phase phase = Phase::kSetup;
  uint64_t allocated_bytes = 0;
  uint64_t reserved_bytes = 0;
  CategoryBytes by_category{};  // allocated bytes per category
};

struct PhasePeak {
  uint32_t step = 0;
  Phase phase = Phase::kSetup;
  uint64_t peak_allocated_bytes = 0;
  uint64_t peak_reserved_bytes = 0;
  uint64_t allocated_at_end_bytes = 0;  // allocated when the phase ended
};

struct LiveAllocation {
  uint64_t id = 0;
  uint64_t requested_bytes = 0;
  uint64_t block_bytes = 0;  // as counted in allocated
  Category category = Category::kOther;
  std::string op;
  std::string module;
  uint32_t step = 0;  // when it was allocated
  Phase phase = Phase::kSetup;
};

// Reserved memory of one CUDA stream's pools. `name` is the event stream's
// metadata "stream.N" (the lowering names the libraries' side streams), or
// empty.
struct StreamBytes {
  uint32_t stream = 0;
  std::string name;
  uint64_t reserved_bytes = 0;
  friend bool operator==(const StreamBytes&, const StreamBytes&) = default;
};

struct SimResult {
  uint64_t peak_allocated_bytes = 0;
  uint64_t peak_reserved_bytes = 0;
  uint64_t peak_requested_bytes = 0;
  // Where the allocated peak happened (first time it was reached).
  uint64_t peak_event_index = 0;
  uint32_t peak_step = 0;
  Phase peak_phase = Phase::kSetup;
  uint64_t reserved_at_peak_bytes = 0;  // reserved when allocated peaked
  // reserved_bytes split by CUDA stream when reserved peaked (first time):
  // side streams (collectives, prefetch) keep pools of their own.
  std::vector<StreamBytes> reserved_by_stream_at_peak;  // empty: not simulated
  // torch.cuda.memory_stats()["active_bytes.all.peak"]: allocated plus
  // freed blocks another stream still uses (record_stream). Unset when the
  // result was not simulated (a measured snapshot).
  std::optional<uint64_t> peak_active_bytes;
  CategoryBytes breakdown_at_peak{};        // allocated bytes per category
  std::vector<PhasePeak> phases;            // in stream order
  std::vector<TimelinePoint> timeline;      // downsampled, peaks preserved
  std::vector<LiveAllocation> top_at_peak;  // largest first
  uint64_t live_at_peak_count = 0;
  std::optional<OomInfo> oom;  // set if an allocation failed
  uint64_t oom_event_index = 0;
  uint32_t oom_step = 0;
  Phase oom_phase = Phase::kSetup;
  AllocatorStats final_stats;
  uint64_t num_events = 0;
};

// Replays `stream`. Errors: a free or record_stream of an id that is not
// live, an id allocated twice while live, a size above kMaxSizeBytes (each
// names the event index). A kUsesDone without a pending free is ignored
// (EventStream::Validate rejects it).
Result<SimResult> Simulate(const EventStream& stream, const SimOptions& options);

}  // namespace vramscope
