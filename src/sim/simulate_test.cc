#include "vramscope/simulate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <unordered_map>

namespace vramscope {
namespace {

SimOptions Ideal() {
  SimOptions o;
  o.alloc.ideal = true;
  return o;
}

TEST(Simulate, IdealPeakAndBreakdownAreSumsOfLiveSizes) {
  EventStream s;
  s.Alloc(1, 1000, Category::kParameters, "aten::empty", "model");
  s.BeginPhase(1, Phase::kForward);
  s.Alloc(2, 300, Category::kActivations, "aten::mm", "model.l0");
  s.Alloc(3, 50, Category::kTemporaries);
  s.Free(3);
  s.BeginPhase(1, Phase::kBackward);
  s.Alloc(4, 1000, Category::kGradients);
  s.Free(2);
  auto r = Simulate(s, Ideal());
  ASSERT_TRUE(r.ok()) << r.error().message;
  // Peak: params 1000 + act 300 + grad 1000 before the activation is freed.
  EXPECT_EQ(r->peak_allocated_bytes, 2300u);
  EXPECT_EQ(r->peak_reserved_bytes, 2300u);
  EXPECT_EQ(r->peak_phase, Phase::kBackward);
  EXPECT_EQ(r->peak_step, 1u);
  EXPECT_EQ(r->breakdown_at_peak[static_cast<int>(Category::kParameters)], 1000u);
  EXPECT_EQ(r->breakdown_at_peak[static_cast<int>(Category::kActivations)], 300u);
  EXPECT_EQ(r->breakdown_at_peak[static_cast<int>(Category::kGradients)], 1000u);
  ASSERT_EQ(r->phases.size(), 3u);
  EXPECT_EQ(r->phases[1].phase, Phase::kForward);
  EXPECT_EQ(r->phases[1].peak_allocated_bytes, 1350u);
  EXPECT_EQ(r->phases[1].allocated_at_end_bytes, 1300u);
  EXPECT_EQ(r->phases[2].peak_allocated_bytes, 2300u);
  ASSERT_EQ(r->top_at_peak.size(), 3u);
  EXPECT_EQ(r->top_at_peak[0].id, 1u);  // 1000, allocated first
  EXPECT_EQ(r->top_at_peak[1].id, 4u);
  EXPECT_EQ(r->top_at_peak[2].op, "aten::mm");
  EXPECT_EQ(r->top_at_peak[2].module, "model.l0");
  EXPECT_EQ(r->live_at_peak_count, 3u);
}

TEST(Simulate, CachingAllocatorRoundsAndReserves) {
  EventStream s;
  s.Alloc(1, 100, Category::kOther);  // 512 B block in a 2 MiB small segment
  auto r = Simulate(s, SimOptions{});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->peak_allocated_bytes, 512u);
  EXPECT_EQ(r->peak_reserved_bytes, 2u << 20);
  EXPECT_EQ(r->peak_requested_bytes, 100u);
}

// A block used on another stream is reusable only after its `x` record: the
// second 3 MiB allocation needs the free remainder of the segment, the third
// (after `x`) takes the first block back. Reserved is split by stream at its
// peak: stream 1's segment is the side stream's cost.
TEST(Simulate, RecordStreamDelaysReuseUntilUsesDone) {
  constexpr uint64_t MiB = 1 << 20;
  EventStream s;
  s.metadata()["stream.1"] = "all-gather";
  s.Alloc(1, 3 * MiB, Category::kParameters, "gather", "", /*stream=*/1);
  s.RecordStream(1, 0);
  s.Free(1);
  s.Alloc(2, 3 * MiB, Category::kParameters, "gather", "", 1);
  s.UsesDone(1);
  s.Alloc(3, 3 * MiB, Category::kParameters, "gather", "", 1);
  s.Alloc(4, 3 * MiB, Category::kActivations, "mm", "", 0);
  ASSERT_TRUE(s.Validate().ok());
  auto r = Simulate(s, SimOptions{});
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->peak_allocated_bytes, 9 * MiB);
  EXPECT_EQ(r->final_stats.active_bytes, 9 * MiB);
  EXPECT_EQ(r->peak_reserved_bytes, 40 * MiB);
  EXPECT_EQ(r->reserved_by_stream_at_peak,
            (std::vector<StreamBytes>{{0, "", 20 * MiB}, {1, "all-gather", 20 * MiB}}));
  EXPECT_EQ(r->final_stats.num_device_alloc, 2u);
  // Without the `x` the third allocation finds only 11 MiB free: a new segment.
  EventStream late = s;
  late.mutable_events().erase(late.mutable_events().begin() + 4);
  auto r2 = Simulate(late, SimOptions{});
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(r2->final_stats.active_bytes, 12 * MiB);
  EXPECT_EQ(r2->final_stats.num_device_alloc, 2u);
}

TEST(Simulate, RecordStreamOfUnknownIdIsAnError) {
  EventStream s;
  s.RecordStream(5, 1);
  auto r = Simulate(s, SimOptions{});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "event 0: record_stream of id 5 that is not live");
}

TEST(Simulate, FreeOfUnknownIdIsAnError) {
  EventStream s;
  s.Free(7);
  auto r = Simulate(s, Ideal());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "event 0: free of id 7 that is not live");
}

// Five allocations of 2^62 bytes are each within the format's limit, but
// their sum is not: refused, not replayed with wrapped totals (issue 24).
TEST(Simulate, SizesSummingPast64BitsAreAnError) {
  EventStream s;
  for (uint64_t id = 1; id <= 5; ++id) s.Alloc(id, kMaxSizeBytes, Category::kActivations);
  auto r = Simulate(s, Ideal());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("past 2^64"), std::string::npos) << r.error().message;
  EventStream one;  // the largest allocation alone is still replayed
  one.Alloc(1, kMaxSizeBytes, Category::kActivations);
  EXPECT_TRUE(Simulate(one, Ideal()).ok());
}

TEST(Simulate, DoubleAllocIsAnError) {
  EventStream s;
  s.Alloc(7, 1, Category::kOther);
  s.Alloc(7, 1, Category::kOther);
  auto r = Simulate(s, Ideal());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("already live"), std::string::npos);
}

TEST(Simulate, OomStopsAndReportsWhere) {
  EventStream s;
  s.BeginPhase(2, Phase::kBackward);
  s.Alloc(1, 60 << 20, Category::kActivations);
  s.Alloc(2, 60 << 20, Category::kGradients);
  s.Alloc(3, 1, Category::kOther);
  SimOptions o;
  o.device_limit_bytes = 100u << 20;
  auto r = Simulate(s, o);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(r->oom.has_value());
  EXPECT_EQ(r->oom_event_index, 2u);
  EXPECT_EQ(r->oom_step, 2u);
  EXPECT_EQ(r->oom_phase, Phase::kBackward);
  EXPECT_EQ(r->peak_allocated_bytes, 60u << 20);
  EXPECT_FALSE(r->oom->message.empty());
}

TEST(Simulate, ContinuesPastOomWhenAsked) {
  EventStream s;
  s.Alloc(1, 60 << 20, Category::kActivations);
  s.Alloc(2, 60 << 20, Category::kGradients);
  s.Free(2);  // the failed allocation's free is ignored
  s.Free(1);
  s.Alloc(3, 10 << 20, Category::kOther);
  SimOptions o;
  o.device_limit_bytes = 100u << 20;
  o.stop_at_oom = false;
  auto r = Simulate(s, o);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r->oom.has_value());
  EXPECT_EQ(r->final_stats.allocated_bytes, 10u << 20);
}

TEST(Simulate, TimelineIsBoundedAndKeepsThePeak) {
  EventStream s;
  std::mt19937_64 rng(42);
  uint64_t next = 1;
  std::vector<uint64_t> live;
  s.BeginPhase(1, Phase::kForward);
  for (int i = 0; i < 200000; ++i) {
    if (live.empty() || rng() % 3 != 0) {
      s.Alloc(next, 512 * (1 + rng() % 64), Category::kActivations);
      live.push_back(next++);
    } else {
      size_t k = rng() % live.size();
      s.Free(live[k]);
      live[k] = live.back();
      live.pop_back();
    }
  }
  SimOptions o = Ideal();
  o.max_timeline_points = 500;
  auto r = Simulate(s, o);
  ASSERT_TRUE(r.ok());
  EXPECT_LE(r->timeline.size(), 2 * o.max_timeline_points + 1);
  uint64_t max_alloc = 0;
  for (const auto& p : r->timeline) max_alloc = std::max(max_alloc, p.allocated_bytes);
  EXPECT_EQ(max_alloc, r->peak_allocated_bytes);
  for (size_t i = 1; i < r->timeline.size(); ++i) {
    EXPECT_LT(r->timeline[i - 1].event_index, r->timeline[i].event_index);
  }
}

TEST(Simulate, TimelineMarksEveryPhase) {
  EventStream s;
  for (uint32_t step = 1; step <= 3; ++step) {
    for (Phase p : {Phase::kForward, Phase::kBackward, Phase::kOptimizer}) {
      s.BeginPhase(step, p);
      for (int i = 0; i < 1000; ++i) {
        s.Alloc(1, 4096, Category::kTemporaries);
        s.Free(1);
      }
    }
  }
  SimOptions o = Ideal();
  o.max_timeline_points = 16;
  auto r = Simulate(s, o);
  ASSERT_TRUE(r.ok());
  int changes = 0;
  for (size_t i = 1; i < r->timeline.size(); ++i) {
    if (r->timeline[i].phase != r->timeline[i - 1].phase) ++changes;
  }
  EXPECT_EQ(changes, 8);
  EXPECT_EQ(r->phases.size(), 9u);
}

// Simulate() keeps the live set at the peak in its single pass (allocations
// freed after the peak are set aside). Reference: replay the stream again up
// to the peak event with the allocator alone and list what is live there.
std::vector<LiveAllocation> LiveAtPeakByReplay(const EventStream& s, const SimOptions& o,
                                               uint64_t peak_event_index) {
  CachingAllocator allocator(o.alloc, o.device_limit_bytes);
  struct Live {
    BlockHandle handle;
    uint64_t event;
    uint32_t step;
    Phase phase;
  };
  std::unordered_map<uint64_t, Live> live;
  uint32_t step = 0;
  Phase phase = Phase::kSetup;
  for (uint64_t i = 0; i <= peak_event_index; ++i) {
    const Event& e = s.events()[i];
    if (e.kind == EventKind::kPhase) {
      step = e.step;
      phase = e.phase;
    } else if (e.kind == EventKind::kAlloc) {
      if (auto h = allocator.Malloc(e.size_bytes, e.stream)) live[e.id] = Live{*h, i, step, phase};
    } else if (e.kind == EventKind::kFree) {
      if (auto it = live.find(e.id); it != live.end()) {
        allocator.Free(it->second.handle);
        live.erase(it);
      }
    }
  }
  std::vector<std::pair<uint64_t, Live>> order(live.begin(), live.end());
  std::sort(order.begin(), order.end(), [&](const auto& a, const auto& b) {
    const uint64_t ab = allocator.BlockSize(a.second.handle),
                   bb = allocator.BlockSize(b.second.handle);
    return ab != bb ? ab > bb : a.second.event < b.second.event;
  });
  std::vector<LiveAllocation> out;
  for (const auto& [id, l] : order) {
    const Event& e = s.events()[l.event];
    out.push_back(LiveAllocation{id, e.size_bytes, allocator.BlockSize(l.handle), e.category,
                                 std::string(s.String(e.op)), std::string(s.String(e.module)),
                                 l.step, l.phase});
  }
  return out;
}

TEST(Simulate, LiveAtPeakMatchesASecondReplay) {
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    std::mt19937_64 rng(seed);
    EventStream s;
    std::vector<uint64_t> live;
    uint32_t step = 0;
    for (int i = 0; i < 20000; ++i) {
      const uint64_t roll = rng() % 100;
      if (roll == 0) {
        ++step;
        s.BeginPhase(step / 3 + 1, static_cast<Phase>(1 + step % 3));
      } else if ((roll < 55 && live.size() < 300) || live.empty()) {
        // Ids are reused once freed (400 ids, at most 300 live), so an id
        // live at the peak may be allocated again after it.
        uint64_t id;
        do {
          id = 1 + rng() % 400;
        } while (std::find(live.begin(), live.end(), id) != live.end());
        const uint64_t bytes = rng() % 8 == 0 ? 1 + rng() % (64 << 20) : 1 + rng() % (1 << 20);
        s.Alloc(id, bytes, static_cast<Category>(rng() % kNumCategories),
                rng() % 2 ? "aten::mm" : "aten::add", "layer." + std::to_string(rng() % 4));
        live.push_back(id);
      } else {
        const size_t k = rng() % live.size();
        s.Free(live[k]);
        live[k] = live.back();
        live.pop_back();
      }
    }
    for (bool limited : {false, true}) {
      SimOptions o;
      o.top_allocations = seed % 2 ? 10 : 100000;  // a partial list, and all of it
      if (limited) {
        o.device_limit_bytes = 2u << 30;  // OOMs along the way; failed ids' frees are ignored
        o.stop_at_oom = seed % 3 != 0;
      }
      auto r = Simulate(s, o);
      ASSERT_TRUE(r.ok()) << r.error().message;
      std::vector<LiveAllocation> want = LiveAtPeakByReplay(s, o, r->peak_event_index);
      EXPECT_EQ(r->live_at_peak_count, want.size()) << "seed " << seed;
      want.resize(std::min<size_t>(want.size(), o.top_allocations));
      ASSERT_EQ(r->top_at_peak.size(), want.size()) << "seed " << seed;
      for (size_t i = 0; i < want.size(); ++i) {
        const LiveAllocation& got = r->top_at_peak[i];
        EXPECT_EQ(got.id, want[i].id) << "seed " << seed << " entry " << i;
        EXPECT_EQ(got.block_bytes, want[i].block_bytes);
        EXPECT_EQ(got.requested_bytes, want[i].requested_bytes);
        EXPECT_EQ(got.category, want[i].category);
        EXPECT_EQ(got.op, want[i].op);
        EXPECT_EQ(got.module, want[i].module);
        EXPECT_EQ(got.step, want[i].step);
        EXPECT_EQ(got.phase, want[i].phase);
      }
    }
  }
}

}  // namespace
}  // namespace vramscope
