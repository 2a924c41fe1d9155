// optimizer.step() as memory sees it, against byte counts worked out here
// from torch.optim's source (torch 2.x; see the rules in optimizer.cc): the
// params and their .grad are made by hand, one step is lowered, and the
// stream is simulated in ideal mode (reserved == allocated == requested) and,
// where block sizes matter, with the caching allocator.
#include "optimizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "vramscope/simulate.h"

namespace vramscope::lower {
namespace {

struct ParamShape {
  uint64_t numel;
  uint8_t elem_bytes;
};

// A tape holding the given parameters, each with a .grad of its own size.
class OptimizerFixture {
 public:
  explicit OptimizerFixture(const std::vector<ParamShape>& shapes) : tape_(&stream_) {
    tape_.SetModule("model");
    for (const ParamShape& s : shapes) {
      Param p;
      p.name = "p" + std::to_string(tape_.params.size());
      p.numel = s.numel;
      p.elem_bytes = s.elem_bytes;
      p.var = tape_.New(s.numel, s.elem_bytes, Category::kParameters, "param");
      p.grad =
          tape_.graph.Alloc(s.numel * s.elem_bytes, Category::kGradients, "grad", tape_.module());
      tape_.params.push_back(p);
    }
  }

  OptimizerExtras Step(OptimizerKind kind) {
    TrainingSetup setup;
    setup.optimizer = kind;
    OptimizerExtras extras;
    OptimizerStep(tape_, setup, /*first_step=*/!stepped_, &extras);
    stepped_ = true;
    return extras;
  }

  SimResult Simulate(bool ideal) const {
    SimOptions o;
    o.alloc.ideal = ideal;
    auto r = vramscope::Simulate(stream_, o);
    EXPECT_TRUE(r.ok());
    return *r;
  }

  // Sizes of the allocations made after the first `skip` events, in order.
  std::vector<uint64_t> AllocSizesAfter(size_t skip) const {
    std::vector<uint64_t> out;
    const auto& events = stream_.events();
    for (size_t i = skip; i < events.size(); ++i) {
      if (events[i].kind == EventKind::kAlloc) out.push_back(events[i].size_bytes);
    }
    return out;
  }
  size_t EventCount() const { return stream_.size(); }

 private:
  EventStream stream_;
  Tape tape_;
  bool stepped_ = false;
};

uint64_t TotalBytes(const std::vector<ParamShape>& shapes) {
  uint64_t total = 0;
  for (const ParamShape& s : shapes) total += s.numel * s.elem_bytes;
  return total;
}

// _multi_tensor_adam: params S + grads S + exp_avg/exp_avg_sq 2S, and at the
// peak the _foreach_sqrt list, S more: 5S. The step counters stay on the CPU.
TEST(OptimizerStep, AdamWForeachPeakIsFiveTimesTheParameterBytes) {
  const std::vector<ParamShape> shapes = {{1000, 4}, {3000, 4}, {640, 4}};
  const uint64_t s = TotalBytes(shapes);
  OptimizerFixture f(shapes);
  f.Step(OptimizerKind::kAdamW);
  SimResult r = f.Simulate(/*ideal=*/true);
  EXPECT_EQ(r.peak_allocated_bytes, 5 * s);
  EXPECT_EQ(r.final_stats.allocated_bytes, 4 * s);  // the sqrt list is gone
  // A second step adds no state and peaks the same.
  f.Step(OptimizerKind::kAdamW);
  r = f.Simulate(true);
  EXPECT_EQ(r.peak_allocated_bytes, 5 * s);
  EXPECT_EQ(r.final_stats.allocated_bytes, 4 * s);
}

// Two (device, dtype) groups: the first group's sqrt list is still bound when
// the second group's list is made (Python rebinds the name afterwards), so
// both lists are alive at the peak: 5 x (fp32 bytes + bf16 bytes), not
// 4 x total + the larger list.
TEST(OptimizerStep, AdamWForeachKeepsThePreviousGroupsListUntilRebound) {
  const std::vector<ParamShape> shapes = {{2048, 4}, {1024, 2}, {512, 4}, {4096, 2}};
  const uint64_t fp32 = 2048 * 4 + 512 * 4;
  const uint64_t bf16 = 1024 * 2 + 4096 * 2;
  OptimizerFixture f(shapes);
  f.Step(OptimizerKind::kAdamW);
  SimResult r = f.Simulate(true);
  EXPECT_EQ(r.peak_allocated_bytes, 5 * (fp32 + bf16));
  EXPECT_EQ(r.final_stats.allocated_bytes, 4 * (fp32 + bf16));
}

// _single_tensor_adam: for parameter i, the previous denom, sqrt_i and the
// division result are alive together: max_i(P[i-1] + 2 P[i]) over 4S.
TEST(OptimizerStep, AdamWForLoopHoldsOneSqrtAndTwoDenoms) {
  const std::vector<ParamShape> shapes = {{500, 4}, {3000, 4}, {2000, 4}};
  const uint64_t s = TotalBytes(shapes);
  uint64_t temps = 0, previous = 0;
  for (const ParamShape& p : shapes) {
    const uint64_t bytes = p.numel * p.elem_bytes;
    temps = std::max(temps, previous + 2 * bytes);
    previous = bytes;
  }
  // Here the last parameter, with the second one's denom still alive.
  EXPECT_EQ(temps, 3000 * 4 + 2 * 2000 * 4);
  OptimizerFixture f(shapes);
  f.Step(OptimizerKind::kAdamWForLoop);
  SimResult r = f.Simulate(true);
  EXPECT_EQ(r.peak_allocated_bytes, 4 * s + temps);
  EXPECT_EQ(r.final_stats.allocated_bytes, 4 * s);
}

// _fused_adamw: no temporaries; Adam._init_group makes state["step"] first (a
// float32 scalar on the device when fused), then exp_avg and exp_avg_sq.
// Each 4-byte step is a 512-byte block in the caching allocator.
TEST(OptimizerStep, AdamWFusedKeepsADeviceStepPerParameterAndNoTemporaries) {
  const std::vector<ParamShape> shapes = {{1024, 4}, {4096, 4}};
  const uint64_t s = TotalBytes(shapes);
  OptimizerFixture f(shapes);
  const size_t before = f.EventCount();
  f.Step(OptimizerKind::kAdamWFused);
  EXPECT_EQ(f.AllocSizesAfter(before),
            (std::vector<uint64_t>{4, 1024 * 4, 1024 * 4, 4, 4096 * 4, 4096 * 4}));
  SimResult ideal = f.Simulate(true);
  EXPECT_EQ(ideal.peak_allocated_bytes, 4 * s + 2 * 4);
  // Caching allocator: every size here is a multiple of 512 but the steps.
  SimResult cached = f.Simulate(false);
  EXPECT_EQ(cached.final_stats.allocated_bytes, 4 * s + 2 * 512);
  // Second step: nothing new.
  const size_t before2 = f.EventCount();
  f.Step(OptimizerKind::kAdamWFused);
  EXPECT_TRUE(f.AllocSizesAfter(before2).empty());
}

// bitsandbytes 0.50.2 Optimizer2State.init_state / get_state_buffer, param by
// param: a param of >= 4096 elements gets uint8 state1 and state2 of its
// numel, then fp32 absmax1 and absmax2 (one per 256 values), the two 1 KiB
// quantization maps coming to the GPU before the first of them; a smaller one
// gets two fp32 states. Paged: states of params of >= 1e5 elements live in
// managed memory; smaller states and every absmax stay on the device.
TEST(OptimizerStep, BitsAndBytesStatesAsInitStateAllocatesThem) {
  const std::vector<ParamShape> shapes = {{1000, 4}, {8192, 4}, {200000, 4}};
  OptimizerFixture eight(shapes);
  size_t before = eight.EventCount();
  OptimizerExtras extras = eight.Step(OptimizerKind::kAdamW8bit);
  EXPECT_EQ(eight.AllocSizesAfter(before),
            (std::vector<uint64_t>{4000, 4000,                        // small: fp32 states
                                   1024, 1024, 8192, 8192, 128, 128,  // qmaps, 8192 elements
                                   200000, 200000, 3128, 3128}));
  EXPECT_EQ(extras.managed_state_bytes, 0u);
  before = eight.EventCount();
  eight.Step(OptimizerKind::kAdamW8bit);
  EXPECT_TRUE(eight.AllocSizesAfter(before).empty());

  OptimizerFixture paged(shapes);
  before = paged.EventCount();
  extras = paged.Step(OptimizerKind::kPagedAdamW8bit);
  EXPECT_EQ(paged.AllocSizesAfter(before),
            (std::vector<uint64_t>{4000, 4000, 1024, 1024, 8192, 8192, 128, 128, 3128, 3128}));
  EXPECT_EQ(extras.managed_state_bytes, 2u * 200000);
  OptimizerFixture paged32(shapes);
  before = paged32.EventCount();
  extras = paged32.Step(OptimizerKind::kPagedAdamW);
  EXPECT_EQ(paged32.AllocSizesAfter(before),
            (std::vector<uint64_t>{4000, 4000, 8192 * 4, 8192 * 4}));
  EXPECT_EQ(extras.managed_state_bytes, 2u * 200000 * 4);
}

// _multi_tensor_sgd: plain SGD updates in place; with momentum the first step
// clones every grad into momentum_buffer, later steps allocate nothing.
TEST(OptimizerStep, SgdIsInPlaceAndMomentumClonesGradsOnce) {
  const std::vector<ParamShape> shapes = {{700, 4}, {1300, 2}};
  const uint64_t s = TotalBytes(shapes);
  OptimizerFixture plain(shapes);
  plain.Step(OptimizerKind::kSgd);
  EXPECT_EQ(plain.Simulate(true).peak_allocated_bytes, 2 * s);

  OptimizerFixture momentum(shapes);
  momentum.Step(OptimizerKind::kSgdMomentum);
  EXPECT_EQ(momentum.Simulate(true).final_stats.allocated_bytes, 3 * s);
  const size_t before = momentum.EventCount();
  momentum.Step(OptimizerKind::kSgdMomentum);
  EXPECT_TRUE(momentum.AllocSizesAfter(before).empty());
}

}  // namespace
}  // namespace vramscope::lower
