#include "vramscope/retention.h"

#include <gtest/gtest.h>

#include "vramscope/simulate.h"

namespace vramscope {
namespace {

constexpr uint64_t kMiB = 1 << 20;

// param 100; forward saves act 40 and makes a temp 30 freed in forward;
// backward: gradient in flight g1 20, then act freed, g2 10, g1 freed,
// param.grad 100, g2 freed; optimizer phase.
EventStream Step() {
  EventStream s;
  s.BeginPhase(0, Phase::kSetup);
  s.Alloc(1, 100 * kMiB, Category::kParameters, "init", "w");
  s.BeginPhase(1, Phase::kForward);
  s.Alloc(2, 40 * kMiB, Category::kActivations, "mm", "layer");
  s.Alloc(3, 30 * kMiB, Category::kTemporaries, "add", "layer");
  s.Free(3);
  s.BeginPhase(1, Phase::kBackward);
  s.Alloc(4, 20 * kMiB, Category::kTemporaries, "MmBackward0", "layer");
  s.Free(2);
  s.Alloc(5, 10 * kMiB, Category::kTemporaries, "AddBackward0", "layer");
  s.Free(4);
  s.Alloc(6, 100 * kMiB, Category::kGradients, "AccumulateGrad", "w");
  s.Free(5);
  s.BeginPhase(1, Phase::kOptimizer);
  s.Alloc(2, 1 * kMiB, Category::kOptimizerState, "step", "w");  // id 2 reused after its free
  return s;
}

uint64_t Peak(const EventStream& s) {
  SimOptions o;
  o.alloc.ideal = true;
  auto r = Simulate(s, o);
  EXPECT_TRUE(r.ok()) << r.error().message;
  return r->peak_allocated_bytes;
}

TEST(Retention, BackwardFreesMoveToThePhaseEnd) {
  const EventStream in = Step();
  ASSERT_TRUE(in.Validate().ok());
  // PyTorch order: the largest moment is param + g2 + param.grad = 210 MiB
  // (act 40 was freed before g2; g1 before the grad).
  EXPECT_EQ(Peak(in), 210 * kMiB);
  const EventStream out = RetainGraphUntilEnd(in);
  ASSERT_TRUE(out.Validate().ok()) << out.Validate().error().message;
  // Retained: param + act + g1 + g2 + param.grad = 270 MiB at the grad.
  EXPECT_EQ(Peak(out), 270 * kMiB);
  // Same number of allocations and frees; forward frees untouched.
  EXPECT_EQ(out.size(), in.size());
}

TEST(Retention, StreamWithoutBackwardIsUnchangedInBytes) {
  EventStream s;
  s.Alloc(1, 5 * kMiB, Category::kActivations);
  s.Free(1);
  s.Alloc(1, 7 * kMiB, Category::kActivations);
  const EventStream out = RetainGraphUntilEnd(s);
  ASSERT_TRUE(out.Validate().ok());
  EXPECT_EQ(Peak(out), Peak(s));
}

// A gradient used on another stream and freed in backward: its free moves to
// the phase end, and so does the `x` that completes it, so the rewritten
// stream is still valid and the use survives the renumbering.
TEST(Retention, StreamUsesFollowTheirDeferredFree) {
  EventStream s;
  s.BeginPhase(1, Phase::kBackward);
  s.Alloc(7, kMiB, Category::kGradients, "AccumulateGrad", "w");
  s.RecordStream(7, 2);
  s.Free(7);
  s.UsesDone(7);
  s.Alloc(8, kMiB, Category::kTemporaries, "mm", "w");
  s.BeginPhase(1, Phase::kOptimizer);
  const EventStream out = RetainGraphUntilEnd(s);
  ASSERT_TRUE(out.Validate().ok()) << out.Validate().error().message;
  std::vector<EventKind> kinds;
  for (const Event& e : out.events()) kinds.push_back(e.kind);
  EXPECT_EQ(kinds,
            (std::vector<EventKind>{EventKind::kPhase, EventKind::kAlloc, EventKind::kRecordStream,
                                    EventKind::kAlloc, EventKind::kFree, EventKind::kUsesDone,
                                    EventKind::kPhase}));
  EXPECT_EQ(out.events()[2].stream, 2u);
}

}  // namespace
}  // namespace vramscope
