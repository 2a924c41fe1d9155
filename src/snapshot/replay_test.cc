// Replay: the measured allocation stream through the allocator model
// reproduces the snapshot's reserved peak within 1% with its own settings.
#include <gtest/gtest.h>

#include <random>

#include "test_support.h"

namespace vramscope {
namespace {

using snapshot_test::LoadOrDie;
using snapshot_test::ModelTracer;

struct Replayed {
  uint64_t measured_reserved = 0;
  uint64_t replayed_reserved = 0;
  uint64_t measured_allocated = 0;
  uint64_t replayed_allocated = 0;
};

Replayed Replay(const Snapshot& s, const AllocatorConfig& config) {
  Replayed out;
  auto run = MeasureSnapshot(s);
  EXPECT_TRUE(run.ok()) << (run.ok() ? "" : run.error().message);
  if (!run.ok()) return out;
  auto stream = SnapshotToEventStream(s);
  EXPECT_TRUE(stream.ok());
  if (!stream.ok()) return out;
  EXPECT_TRUE(stream->Validate().ok());
  SimOptions options;
  options.alloc = config;
  // As the replay command: the limit the run had at its OOM, else none.
  if (run->sim.oom) options.device_limit_bytes = run->sim.oom->device_limit_bytes;
  auto sim = Simulate(*stream, options);
  EXPECT_TRUE(sim.ok()) << (sim.ok() ? "" : sim.error().message);
  if (!sim.ok()) return out;
  out.measured_reserved = run->sim.peak_reserved_bytes;
  out.replayed_reserved = sim->peak_reserved_bytes;
  out.measured_allocated = run->sim.peak_allocated_bytes;
  out.replayed_allocated = sim->peak_allocated_bytes;
  return out;
}

void ExpectWithinOnePercent(uint64_t replayed, uint64_t measured, const std::string& what) {
  const double diff = std::abs(static_cast<double>(replayed) - static_cast<double>(measured));
  EXPECT_LE(diff, 0.01 * static_cast<double>(measured))
      << what << ": replayed " << replayed << " vs measured " << measured;
}

TEST(Replay, GeneratedSnapshotsWithTheirOwnSettings) {
  for (const char* name : {"train_p4.pickle", "train_1step.json", "oom.pickle", "wrapped.pickle"}) {
    const Snapshot s = LoadOrDie(name);
    const Replayed r = Replay(s, SnapshotAllocatorConfig(s));
    ASSERT_GT(r.measured_reserved, 0u) << name;
    ExpectWithinOnePercent(r.replayed_reserved, r.measured_reserved, name);
    ExpectWithinOnePercent(r.replayed_allocated, r.measured_allocated, name);
  }
}

TEST(Replay, StreamsFromTheModelItself) {
  // Traces written by driving CachingAllocator: the segment actions follow
  // the allocator's rules by construction.
  for (uint32_t seed : {11u, 12u, 13u}) {
    std::mt19937_64 rng(seed);
    ModelTracer t(AllocatorConfig{});
    std::vector<BlockHandle> live;
    for (int op = 0; op < 4000; ++op) {
      if (live.empty() || rng() % 100 < 52) {
        const uint64_t bytes =
            rng() % 4 == 0 ? 10 * kMiB + rng() % (60 * kMiB) : 1 + rng() % (4 * kMiB);
        auto h = t.Malloc(bytes, rng() % 5 == 0 ? 1 : 0);
        ASSERT_TRUE(h);
        live.push_back(*h);
      } else if (rng() % 200 == 0) {
        t.EmptyCache();
      } else {
        const size_t i = rng() % live.size();
        t.Free(live[i]);
        live[i] = live.back();
        live.pop_back();
      }
    }
    const uint64_t model_peak = t.stats().peak_reserved_bytes;
    const Snapshot s = t.Finish();
    const Replayed r = Replay(s, SnapshotAllocatorConfig(s));
    EXPECT_EQ(r.measured_reserved, model_peak);
    ExpectWithinOnePercent(r.replayed_reserved, r.measured_reserved,
                           "seed " + std::to_string(seed));
  }
}

TEST(Replay, OtherSettingsChangeThePrediction) {
  // A fragmenting pattern: many 3 MiB blocks in 20 MiB segments, every other
  // one kept, then 25 MiB requests that fit no cached block. Expandable
  // segments reuse the gaps; the default allocator must reserve more.
  ModelTracer t(AllocatorConfig{});
  std::vector<BlockHandle> small;
  for (int i = 0; i < 60; ++i) small.push_back(*t.Malloc(3 * kMiB));
  for (size_t i = 0; i < small.size(); i += 2) t.Free(small[i]);
  for (int i = 0; i < 4; ++i) (void)t.Malloc(25 * kMiB);
  const Snapshot s = t.Finish();
  auto expandable = ParseAllocConf("expandable_segments:True");
  ASSERT_TRUE(expandable.ok());
  const Replayed own = Replay(s, SnapshotAllocatorConfig(s));
  const Replayed other = Replay(s, *expandable);
  ExpectWithinOnePercent(own.replayed_reserved, own.measured_reserved, "own");
  EXPECT_LT(other.replayed_reserved, own.replayed_reserved);
}

TEST(Replay, EventStreamCarriesCategoriesPhasesAndInitialBlocks) {
  const Snapshot s = LoadOrDie("wrapped.pickle");
  auto stream = SnapshotToEventStream(s);
  ASSERT_TRUE(stream.ok());
  ASSERT_TRUE(stream->Validate().ok());
  size_t allocs = 0, phases = 0;
  bool saw_optimizer_state = false;
  for (const Event& e : stream->events()) {
    allocs += e.kind == EventKind::kAlloc;
    phases += e.kind == EventKind::kPhase;
    saw_optimizer_state |= e.kind == EventKind::kAlloc && e.category == Category::kOptimizerState;
  }
  EXPECT_GT(allocs, 30u);
  EXPECT_GE(phases, 3u);
  EXPECT_TRUE(saw_optimizer_state);
  EXPECT_FALSE(SnapshotToEventStream(s, 5).ok());
}

}  // namespace
}  // namespace vramscope
