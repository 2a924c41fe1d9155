#include "vramscope/simulate.h"

#include <gtest/gtest.h>

#include <random>

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

TEST(Simulate, FreeOfUnknownIdIsAnError) {
  EventStream s;
  s.Free(7);
  auto r = Simulate(s, Ideal());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "event 0: free of id 7 that is not live");
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

}  // namespace
}  // namespace vramscope
