// The measured timeline: peaks equal to what the allocator counted, block
// sizes rebuilt from the trace, wrapped traces, OOM snapshots, long traces.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "test_support.h"

namespace vramscope {
namespace {

using snapshot_test::DataPath;
using snapshot_test::LoadOrDie;
using snapshot_test::ModelTracer;
using snapshot_test::ReadBytes;

nlohmann::json Facts() { return nlohmann::json::parse(ReadBytes(DataPath("facts.json"))); }

SnapshotRun MeasureOrDie(const Snapshot& s, ExplainOptions options = {}) {
  auto run = MeasureSnapshot(s, options);
  EXPECT_TRUE(run.ok()) << (run.ok() ? "" : run.error().message);
  return run.ok() ? std::move(*run) : SnapshotRun{};
}

// The generator's allocator counted these while it wrote the trace: the
// measured peaks must be exactly them, from every encoding.
TEST(Measure, PeaksEqualWhatTheAllocatorCounted) {
  const nlohmann::json facts = Facts();
  for (const char* name : {"train_p2.pickle", "train_p4.pickle", "train_p5.pickle"}) {
    const SnapshotRun run = MeasureOrDie(LoadOrDie(name));
    EXPECT_EQ(run.sim.peak_allocated_bytes, facts["train"]["peak_allocated_bytes"].get<uint64_t>())
        << name;
    EXPECT_EQ(run.sim.peak_reserved_bytes, facts["train"]["peak_reserved_bytes"].get<uint64_t>())
        << name;
    EXPECT_EQ(run.end_allocated_bytes, run.segments_allocated_bytes);
    EXPECT_EQ(run.end_reserved_bytes, run.segments_reserved_bytes);
    EXPECT_EQ(run.initially_live_blocks, 0u);
    uint64_t sum = 0;
    for (uint64_t b : run.sim.breakdown_at_peak) sum += b;
    EXPECT_EQ(sum, run.sim.peak_allocated_bytes);
  }
  const SnapshotRun json = MeasureOrDie(LoadOrDie("train_1step.json"));
  const SnapshotRun twin = MeasureOrDie(LoadOrDie("train_1step_p4.pickle"));
  EXPECT_EQ(json.sim.peak_allocated_bytes, twin.sim.peak_allocated_bytes);
  EXPECT_EQ(json.sim.peak_reserved_bytes, twin.sim.peak_reserved_bytes);
  EXPECT_EQ(json.sim.breakdown_at_peak, twin.sim.breakdown_at_peak);
}

TEST(Measure, PhasesAndTopAllocations) {
  const SnapshotRun run = MeasureOrDie(LoadOrDie("train_p4.pickle"));
  ASSERT_EQ(run.sim.phases.size(), 7u);
  EXPECT_EQ(run.sim.phases[3].phase, Phase::kOptimizer);
  EXPECT_EQ(run.sim.peak_phase, Phase::kOptimizer);
  EXPECT_EQ(run.sim.peak_step, 1u);
  ASSERT_FALSE(run.sim.top_at_peak.empty());
  EXPECT_GE(run.sim.top_at_peak.front().block_bytes, run.sim.top_at_peak.back().block_bytes);
  EXPECT_EQ(run.sim.live_at_peak_count, 34u);
  ASSERT_FALSE(run.top_sites.empty());
  EXPECT_TRUE(run.has_frames);
  EXPECT_FALSE(run.sim.timeline.empty());
  EXPECT_FALSE(ExplainMeasured(run).empty());
}

TEST(Measure, WrappedTraceKnowsWhatWasAliveBefore) {
  const SnapshotRun full = MeasureOrDie(LoadOrDie("train_p4.pickle"));
  const SnapshotRun wrapped = MeasureOrDie(LoadOrDie("wrapped.pickle"));
  EXPECT_GT(wrapped.initially_live_blocks, 0u);
  EXPECT_GT(wrapped.initial_reserved_bytes, 0u);
  EXPECT_EQ(wrapped.trace_entries, 150u);
  // The step-2 peak lies inside the kept window: the same bytes.
  EXPECT_EQ(wrapped.sim.peak_allocated_bytes, full.sim.peak_allocated_bytes);
  EXPECT_EQ(wrapped.end_allocated_bytes, wrapped.segments_allocated_bytes);
  EXPECT_EQ(wrapped.end_reserved_bytes, full.end_reserved_bytes);
  EXPECT_GE(wrapped.sim.breakdown_at_peak[static_cast<int>(Category::kGradients)], 0u);
}

TEST(Measure, OomSnapshotSaysWhatFailedAndWhy) {
  const nlohmann::json facts = Facts();
  const Snapshot s = LoadOrDie("oom.pickle");
  const SnapshotRun run = MeasureOrDie(s);
  ASSERT_TRUE(run.sim.oom.has_value());
  const OomInfo& oom = *run.sim.oom;
  EXPECT_EQ(oom.device_limit_bytes, facts["oom"]["limit_bytes"].get<uint64_t>());
  EXPECT_EQ(run.sim.peak_allocated_bytes, facts["oom"]["peak_allocated_bytes"].get<uint64_t>());
  EXPECT_EQ(run.sim.peak_reserved_bytes, facts["oom"]["peak_reserved_bytes"].get<uint64_t>());
  EXPECT_EQ(run.sim.oom_phase, Phase::kOptimizer);
  EXPECT_GT(oom.requested_bytes, 0u);
  EXPECT_FALSE(run.live_at_oom.empty());
  EXPECT_NE(oom.message.find("CUDA out of memory"), std::string::npos);
  const auto lines = ExplainMeasured(run);
  bool has_why = false;
  for (const auto& line : lines) has_why |= line.rfind("Why: ", 0) == 0;
  EXPECT_TRUE(has_why);
  auto gpu = FindGpu("h100-80g");
  ASSERT_TRUE(gpu.ok());
  EXPECT_FALSE(MeasuredReport(run, s, *gpu, "oom.pickle").fits());
}

TEST(Measure, UnsplitBlocksCountWhole) {
  // An 8 MiB block in a fresh 20 MiB segment leaves 12 MiB free; an 11.5 MiB
  // request then takes all of it (0.5 MiB left <= 1 MiB: no split), and
  // PyTorch counts 12 MiB in allocated_bytes although the trace says 11.5.
  ModelTracer t(AllocatorConfig{});
  auto a = t.Malloc(8 * kMiB);
  auto b = t.Malloc(11 * kMiB + kMiB / 2);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(t.stats().allocated_bytes, 20 * kMiB);
  t.Free(*a);
  t.Free(*b);
  const SnapshotRun run = MeasureOrDie(t.Finish());
  EXPECT_EQ(run.sim.peak_allocated_bytes, 20 * kMiB);
  EXPECT_EQ(run.sim.peak_reserved_bytes, 20 * kMiB);
}

// Random malloc/free/empty_cache streams through the allocator model: the
// trace alone must give back the model's own peak counters.
TEST(Measure, RandomStreamsMatchTheModelExactly) {
  for (uint32_t seed : {1u, 2u, 3u, 4u}) {
    std::mt19937_64 rng(seed);
    AllocatorConfig config;
    if (seed == 4) {
      auto parsed = ParseAllocConf("max_split_size_mb:64,roundup_power2_divisions:4");
      ASSERT_TRUE(parsed.ok());
      config = *parsed;
    }
    ModelTracer t(config);
    std::vector<BlockHandle> live;
    for (int op = 0; op < 3000; ++op) {
      const uint64_t pick = rng() % 100;
      if (pick < 55 || live.empty()) {
        const uint64_t kind = rng() % 10;
        uint64_t bytes = kind < 5   ? 1 + rng() % (kMiB)
                         : kind < 8 ? kMiB + rng() % (9 * kMiB)
                                    : 10 * kMiB + rng() % (90 * kMiB);
        auto h = t.Malloc(bytes, rng() % 8 == 0 ? 1 : 0);
        ASSERT_TRUE(h);
        live.push_back(*h);
      } else if (pick < 99) {
        const size_t i = rng() % live.size();
        t.Free(live[i]);
        live[i] = live.back();
        live.pop_back();
      } else {
        t.EmptyCache();
      }
    }
    const AllocatorStats stats = t.stats();
    const SnapshotRun run = MeasureOrDie(t.Finish());
    EXPECT_EQ(run.sim.peak_allocated_bytes, stats.peak_allocated_bytes) << seed;
    EXPECT_EQ(run.sim.peak_reserved_bytes, stats.peak_reserved_bytes) << seed;
    EXPECT_EQ(run.end_allocated_bytes, stats.allocated_bytes) << seed;
    EXPECT_EQ(run.sim.peak_requested_bytes, stats.peak_requested_bytes) << seed;
  }
}

TEST(Measure, LongTracesKeepABoundedTimelineWithThePeak) {
  // 2M entries: memory is the records and ~2x max_timeline_points points.
  snapshot_test::SnapshotBuilder b;
  const uint32_t stack = b.Stack({{"forward", "/m.py"}});
  std::mt19937_64 rng(7);
  std::vector<uint64_t> live;
  uint64_t next = 0x1000;
  for (int i = 0; i < 500000; ++i) {
    if (live.size() < 50 || rng() % 2 == 0) {
      b.Alloc(next, 512 * (1 + rng() % 100), stack);
      live.push_back(next);
      next += 0x100000;
    } else {
      const size_t k = rng() % live.size();
      b.Free(live[k], 512, stack);
      live[k] = live.back();
      live.pop_back();
    }
  }
  ExplainOptions options;
  options.max_timeline_points = 500;
  const SnapshotRun run = MeasureOrDie(b.snapshot(), options);
  EXPECT_LE(run.sim.timeline.size(), 2 * options.max_timeline_points + 2);
  bool peak_kept = false;
  for (const TimelinePoint& p : run.sim.timeline) {
    peak_kept |= p.allocated_bytes == run.sim.peak_allocated_bytes;
    EXPECT_LE(p.allocated_bytes, run.sim.peak_allocated_bytes);
  }
  EXPECT_TRUE(peak_kept);
}

TEST(Measure, DeviceChoice) {
  const Snapshot s = LoadOrDie("train_p4.pickle");
  EXPECT_FALSE(MeasureSnapshot(s, ExplainOptions{3}).ok());
  EXPECT_TRUE(MeasureSnapshot(s, ExplainOptions{0}).ok());
  EXPECT_FALSE(MeasureSnapshot(Snapshot{}, {}).ok());
  // Segments alone (torch.cuda.memory_snapshot()): one point, the final state.
  const SnapshotRun only = MeasureOrDie(LoadOrDie("segments_only.pickle"));
  EXPECT_EQ(only.trace_entries, 0u);
  EXPECT_EQ(only.sim.peak_allocated_bytes, only.segments_allocated_bytes);
  EXPECT_EQ(only.sim.peak_reserved_bytes, only.segments_reserved_bytes);
}

}  // namespace
}  // namespace vramscope
