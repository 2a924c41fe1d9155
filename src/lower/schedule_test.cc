// The step schedule, worked by hand from Megatron-LM's schedules.py
// (forward_backward_pipelining_without_interleaving / _with_interleaving).
#include "schedule.h"

#include <string>

#include <gtest/gtest.h>

namespace vramscope::lower {
namespace {

// "F0 B0 F1 ..." (pass kind and chunk) for readable expectations.
std::string Spell(const std::vector<Pass>& passes) {
  std::string out;
  for (const Pass& p : passes) {
    if (!out.empty()) out += ' ';
    out += (p.forward ? 'F' : 'B') + std::to_string(p.chunk);
  }
  return out;
}

TEST(ScheduleTest, OneGpuAlternatesForwardAndBackward) {
  EXPECT_EQ(Spell(PipelineSchedule(1, 1, 0, 1)), "F0 B0");
  EXPECT_EQ(Spell(PipelineSchedule(3, 1, 0, 1)), "F0 B0 F0 B0 F0 B0");
}

TEST(ScheduleTest, FirstOfFourStagesWarmsUpWithThreeForwards) {
  // Stage 0 of pp = 4: pp - rank - 1 = 3 warm-up forwards, one steady 1F1B
  // pair for the fourth micro-batch, then the three outstanding backwards.
  EXPECT_EQ(Spell(PipelineSchedule(4, 1, 3, 4)), "F0 F0 F0 F0 B0 B0 B0 B0");
  // More micro-batches: the steady state alternates.
  EXPECT_EQ(Spell(PipelineSchedule(5, 1, 3, 4)), "F0 F0 F0 F0 B0 F0 B0 B0 B0 B0");
  // The last stage has no warm-up: it is the one-GPU order.
  EXPECT_EQ(Spell(PipelineSchedule(2, 1, 0, 4)), "F0 B0 F0 B0");
}

TEST(ScheduleTest, WarmupIsCappedAtThePasses) {
  EXPECT_EQ(Spell(PipelineSchedule(2, 1, 7, 4)), "F0 F0 B0 B0");
}

TEST(ScheduleTest, InterleavedRunsPpForwardsPerChunkInTurn) {
  // pp = 2, two chunks, four micro-batches, rank 0's warm-up
  // (pp - rank - 1) * 2 + (chunks - 1) * pp = 4: forwards go chunk 0 for pp
  // micro-batches, then chunk 1; backwards start with the last chunk.
  EXPECT_EQ(Spell(PipelineSchedule(4, 2, 4, 2)), "F0 F0 F1 F1 F0 B1 F0 B1 F1 B0 F1 B0 B1 B1 B0 B0");
}

// With the warm-up Megatron gives each stage (rank_classes.cc: pp - stage - 1;
// interleaved (pp - stage - 1) * 2 + (chunks - 1) * pp), every backward finds
// its chunk's forward in flight and every forward is backed once.
TEST(ScheduleTest, EveryForwardHasOneLaterBackwardOfItsChunk) {
  for (uint64_t micro : {1, 2, 3, 4, 8}) {
    for (uint32_t pp : {1, 2, 4}) {
      for (uint64_t chunks : {1, 2, 3}) {
        if (chunks > 1 && (pp == 1 || micro % pp != 0)) continue;  // Megatron's interleaving rules
        for (uint32_t stage = 0; stage < pp; ++stage) {
          const uint64_t warmup =
              chunks == 1 ? pp - stage - 1 : (pp - stage - 1) * 2 + (chunks - 1) * pp;
          std::vector<int64_t> open(chunks, 0);
          const std::vector<Pass> passes = PipelineSchedule(micro, chunks, warmup, pp);
          for (const Pass& p : passes) {
            ASSERT_LT(p.chunk, chunks);
            open[p.chunk] += p.forward ? 1 : -1;
            ASSERT_GE(open[p.chunk], 0)
                << "a backward before its forward: micro " << micro << " pp " << pp << " chunks "
                << chunks << " stage " << stage;
          }
          for (int64_t o : open) EXPECT_EQ(o, 0);
          EXPECT_EQ(passes.size(), 2 * micro * chunks);
        }
      }
    }
  }
}

}  // namespace
}  // namespace vramscope::lower
