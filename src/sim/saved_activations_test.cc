// Hand-built streams: what SavedAtEndOfForward must find and how it groups it.
#include "vramscope/saved_activations.h"

#include <gtest/gtest.h>

namespace vramscope {
namespace {

TEST(BlockOf, CutsAtTheFirstNumberedComponent) {
  EXPECT_EQ(BlockOf("model.layers.3.mlp.down_proj"), "model.layers.3");
  EXPECT_EQ(BlockOf("down_blocks.1.resnets.0.conv1"), "down_blocks.1");
  EXPECT_EQ(BlockOf("up_blocks.3.attentions.2.transformer_blocks.0.attn1"), "up_blocks.3");
  EXPECT_EQ(BlockOf("mid_block.attentions.0.proj_in"), "mid_block");
  EXPECT_EQ(BlockOf("mid_block"), "mid_block");
  EXPECT_EQ(BlockOf("conv_in"), "conv_in");
  EXPECT_EQ(BlockOf("time_embedding.linear_1"), "time_embedding");
  EXPECT_EQ(BlockOf("bert.encoder.layer.11.output"), "bert.encoder.layer.11");
  EXPECT_EQ(BlockOf(""), "(no module)");
  // A leading number is no block index: nothing names what it counts.
  EXPECT_EQ(BlockOf("0.weight"), "0");
}

// Two steps; the second forward saves more. Temporaries and parameters never count.
EventStream TwoSteps() {
  EventStream s;
  s.BeginPhase(0, Phase::kSetup);
  s.Alloc(1, 1000, Category::kParameters, "init", "conv_in");
  for (uint32_t step = 1; step <= 2; ++step) {
    s.BeginPhase(step, Phase::kForward);
    s.Alloc(10, 300, Category::kActivations, "aten::silu", "down_blocks.0.resnets.0.nonlinearity");
    s.Alloc(11, 200, Category::kActivations, "aten::convolution", "down_blocks.0.resnets.0.conv1");
    s.Alloc(12, 100 * step, Category::kActivations, "aten::native_group_norm",
            "mid_block.resnets.0.norm1");
    s.Alloc(13, 5000, Category::kTemporaries, "aten::add", "down_blocks.0");
    s.Alloc(14, 50, Category::kActivations, "aten::silu", "down_blocks.1.resnets.0.nonlinearity");
    s.Free(13);
    s.Free(14);  // freed in forward: not saved
    s.BeginPhase(step, Phase::kBackward);
    s.Free(12);
    s.Free(11);
    s.Free(10);
    s.BeginPhase(step, Phase::kOptimizer);
  }
  return s;
}

TEST(LayerTypeOf, KeepsTheLastTwoNamedComponents) {
  EXPECT_EQ(LayerTypeOf("down_blocks.0.resnets.1.conv1"), "resnets.conv1");
  EXPECT_EQ(LayerTypeOf("model.layers.3.self_attn.q_proj"), "self_attn.q_proj");
  EXPECT_EQ(LayerTypeOf("up_blocks.1.attentions.2.transformer_blocks.0.ff.net.0.proj"), "net.proj");
  EXPECT_EQ(LayerTypeOf("conv_in"), "conv_in");
  EXPECT_EQ(LayerTypeOf(""), "(no module)");
  EXPECT_EQ(LayerTypeOf("3"), "3");
}

TEST(SavedAtEndOfForward, TakesTheLargestForwardEndAndGroupsIt) {
  const auto saved = SavedAtEndOfForward(TwoSteps());
  ASSERT_TRUE(saved.has_value());
  EXPECT_EQ(saved->step, 2u);
  EXPECT_EQ(saved->total_bytes, 300u + 200u + 200u);
  using Row = std::pair<std::string, uint64_t>;
  EXPECT_EQ(saved->by_block, (std::vector<Row>{{"down_blocks.0", 500}, {"mid_block", 200}}));
  EXPECT_EQ(saved->by_layer,
            (std::vector<Row>{
                {"resnets.nonlinearity", 300}, {"resnets.conv1", 200}, {"resnets.norm1", 200}}));
  EXPECT_EQ(saved->by_op, (std::vector<Row>{{"aten::silu", 300},
                                            {"aten::convolution", 200},
                                            {"aten::native_group_norm", 200}}));
  uint64_t sum = 0;
  for (const Row& r : saved->by_block) sum += r.second;
  EXPECT_EQ(sum, saved->total_bytes);
}

TEST(SavedAtEndOfForward, NothingWithoutABackward) {
  EventStream s;
  s.BeginPhase(1, Phase::kForward);
  s.Alloc(1, 10, Category::kActivations, "aten::mm", "layers.0");
  EXPECT_FALSE(SavedAtEndOfForward(s).has_value());
  s.BeginPhase(1, Phase::kOptimizer);  // forward -> optimizer: no backward either
  EXPECT_FALSE(SavedAtEndOfForward(s).has_value());
}

}  // namespace
}  // namespace vramscope
