// Attribution: phases from stacks, categories from stacks and lifetimes.
#include <gtest/gtest.h>

#include "reconstruct.h"
#include "stack_tags.h"
#include "test_support.h"

namespace vramscope::snapshot {
namespace {

using snapshot_test::SnapshotBuilder;

constexpr const char* kModule = "/env/site-packages/torch/nn/modules/module.py";

TEST(StackTags, FrameRules) {
  EXPECT_EQ(FrameTags("_call_impl", kModule), kTagForward);
  EXPECT_EQ(FrameTags("forward", "/work/model.py"), kTagForward);
  EXPECT_EQ(FrameTags("_apply", kModule), kTagLoad);
  EXPECT_EQ(FrameTags("from_pretrained", "/x/transformers/modeling_utils.py"), kTagLoad);
  EXPECT_EQ(FrameTags("__init__", "/x/torch/nn/modules/linear.py"), kTagLoad);
  EXPECT_EQ(FrameTags("_init_group", "/x/torch/optim/adamw.py"), kTagOptimizer);
  EXPECT_EQ(FrameTags("wrapper", "/x/torch/optim/optimizer.py"), kTagOptimizer);
  EXPECT_EQ(FrameTags("zero_grad", "/x/torch/optim/optimizer.py"), kTagZeroGrad);
  EXPECT_EQ(FrameTags("step", "/x/torch/optim/lr_scheduler.py"), 0u);
  EXPECT_EQ(FrameTags("unscale_", "/x/torch/amp/grad_scaler.py"), kTagOptimizer);
  EXPECT_EQ(FrameTags("backward", "/x/torch/_tensor.py"), kTagBackward);
  EXPECT_EQ(FrameTags("_engine_run_backward", "/x/torch/autograd/graph.py"), kTagBackward);
  EXPECT_EQ(FrameTags("torch::autograd::Engine::thread_main(std::shared_ptr<>)", "??"),
            kTagBackward);
  EXPECT_EQ(FrameTags("torch::autograd::AccumulateGrad::apply", "??"),
            kTagAccumulateGrad | kTagBackward);
  EXPECT_EQ(FrameTags("cross_entropy", "/x/torch/nn/functional.py"), kTagLoss);
  EXPECT_EQ(FrameTags("ForCausalLMLoss", "/x/transformers/loss/loss_utils.py"), kTagLoss);
  EXPECT_EQ(FrameTags("all_reduce", "/x/torch/distributed/distributed_c10d.py"), kTagComm);
  EXPECT_EQ(FrameTags("c10d::ProcessGroupNCCL::allreduce", "??"), kTagComm);
  EXPECT_EQ(FrameTags("at::cuda::getNewWorkspace", "??"), kTagWorkspace);
  EXPECT_EQ(FrameTags("recompute_fn", "/x/torch/utils/checkpoint.py"), kTagCheckpoint);
  EXPECT_EQ(FrameTags("train", "/work/train.py"), 0u);
}

// One training step and the start of the next, one block per rule.
struct StepStacks {
  SnapshotBuilder b;
  uint32_t load, fwd, loss, bwd, accum, opt_init, opt_tmp, zero, comm, work, user, ckpt;
  StepStacks() {
    load = b.Stack({{"_apply", kModule}, {"main", "/work/train.py"}});
    fwd = b.Stack(
        {{"linear", "/work/model.py"}, {"_call_impl", kModule}, {"train", "/work/train.py"}});
    loss = b.Stack({{"cross_entropy", "/x/torch/nn/functional.py"}, {"train", "/work/train.py"}});
    bwd = b.Stack({{"torch::autograd::generated::MmBackward0::apply", "??"},
                   {"torch::autograd::Engine::thread_main", "??"}});
    accum = b.Stack({{"torch::autograd::AccumulateGrad::apply", "??"}});
    opt_init = b.Stack({{"_init_group", "/x/torch/optim/adamw.py"}, {"train", "/work/train.py"}});
    opt_tmp = b.Stack({{"_multi_tensor_adamw", "/x/torch/optim/adamw.py"}});
    zero = b.Stack({{"zero_grad", "/x/torch/optim/optimizer.py"}});
    comm = b.Stack({{"all_reduce", "/x/torch/distributed/distributed_c10d.py"}});
    work = b.Stack({{"at::cuda::getNewWorkspace", "??"}, {"linear", "/work/model.py"}});
    user = b.Stack({{"train", "/work/train.py"}});
    ckpt =
        b.Stack({{"forward", "/work/model.py"}, {"recompute_fn", "/x/torch/utils/checkpoint.py"}});
  }
};

Category CategoryOf(const Reconstruction& r, uint64_t address) {
  for (const AllocRecord& rec : r.records) {
    if (r.Address(rec) == address) return rec.category;
  }
  ADD_FAILURE() << "no record at " << address;
  return Category::kOther;
}

TEST(Attribution, OneRulePerBlock) {
  StepStacks run;
  SnapshotBuilder& b = run.b;
  b.Alloc(0x100, 4096, run.load);  // parameter
  b.Alloc(0x200, 1024, run.user);  // input batch: alive through the step
  b.Alloc(0x300, 8192, run.fwd);   // activation: freed in backward
  b.Alloc(0x400, 8192, run.fwd);   // forward temporary
  b.Free(0x400, 8192, run.fwd);
  b.Alloc(0x500, 8192, run.work);   // cuBLAS workspace
  b.Alloc(0x600, 4096, run.loss);   // loss
  b.Alloc(0x700, 4096, run.accum);  // .grad via AccumulateGrad
  b.Alloc(0x800, 4096, run.bwd);    // gradient created in backward, kept
  b.Alloc(0x900, 4096, run.bwd);    // backward temporary
  b.Free(0x900, 4096, run.bwd);
  b.Alloc(0xa00, 4096, run.ckpt);  // recomputed activation (inside backward)
  b.Free(0xa00, 4096, run.bwd);
  b.Free(0x300, 8192, run.bwd);
  b.Free(0x600, 4096, run.bwd);
  b.Alloc(0xb00, 4096, run.comm);  // gradient bucket
  b.Free(0xb00, 4096, run.comm);
  b.Alloc(0xc00, 4096, run.opt_init);  // optimizer state
  b.Alloc(0xd00, 4096, run.opt_tmp);   // optimizer temporary
  b.Free(0xd00, 4096, run.opt_tmp);
  b.Free(0x700, 4096, run.zero);
  b.Free(0x800, 4096, run.zero);
  b.Free(0x200, 1024, run.user);
  b.Alloc(0xe00, 8192, run.fwd);  // step 2 begins
  auto r = Reconstruct(b.snapshot(), 0);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(CategoryOf(*r, 0x100), Category::kParameters);
  EXPECT_EQ(CategoryOf(*r, 0x200), Category::kOther);
  EXPECT_EQ(CategoryOf(*r, 0x300), Category::kActivations);
  EXPECT_EQ(CategoryOf(*r, 0x400), Category::kTemporaries);
  EXPECT_EQ(CategoryOf(*r, 0x500), Category::kWorkspace);
  EXPECT_EQ(CategoryOf(*r, 0x600), Category::kLoss);
  EXPECT_EQ(CategoryOf(*r, 0x700), Category::kGradients);
  EXPECT_EQ(CategoryOf(*r, 0x800), Category::kGradients);
  EXPECT_EQ(CategoryOf(*r, 0x900), Category::kTemporaries);
  EXPECT_EQ(CategoryOf(*r, 0xa00), Category::kActivations);
  EXPECT_EQ(CategoryOf(*r, 0xb00), Category::kCommunication);
  EXPECT_EQ(CategoryOf(*r, 0xc00), Category::kOptimizerState);
  EXPECT_EQ(CategoryOf(*r, 0xd00), Category::kTemporaries);
  EXPECT_EQ(CategoryOf(*r, 0xe00), Category::kActivations);  // alive mid-forward at the end

  // Phases: setup, step 1 forward / backward / optimizer, step 2 forward.
  std::vector<std::pair<uint32_t, Phase>> phases;
  for (const PhaseMark& m : r->marks) phases.emplace_back(m.step, m.phase);
  const std::vector<std::pair<uint32_t, Phase>> expected = {{0, Phase::kSetup},
                                                            {1, Phase::kForward},
                                                            {1, Phase::kBackward},
                                                            {1, Phase::kOptimizer},
                                                            {2, Phase::kForward}};
  EXPECT_EQ(phases, expected);
}

TEST(Attribution, FramelessAllocationAfterForwardIsTheEngineThread) {
  // stacks="python": the autograd engine's device thread has no Python
  // frames, so its allocations come with an empty stack.
  StepStacks run;
  run.b.Alloc(0x100, 4096, run.fwd);
  run.b.Alloc(0x200, 4096, 0);
  run.b.Free(0x100, 4096, 0);
  auto r = Reconstruct(run.b.snapshot(), 0);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->marks.size(), 3u);
  EXPECT_EQ(r->marks[2].phase, Phase::kBackward);
  EXPECT_EQ(CategoryOf(*r, 0x100), Category::kActivations);
  EXPECT_EQ(CategoryOf(*r, 0x200), Category::kGradients);
}

TEST(Attribution, WithoutStacksEverythingIsOther) {
  SnapshotBuilder b;
  b.Alloc(0x100, 4096, 0);
  b.Alloc(0x200, 4096, 0);
  b.Free(0x200, 4096, 0);
  auto r = Reconstruct(b.snapshot(), 0);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->has_frames);
  for (const AllocRecord& rec : r->records) EXPECT_EQ(rec.category, Category::kOther);
}

TEST(Attribution, BlocksAliveBeforeTheTrace) {
  // The trace wrapped: a free without its alloc (zero_grad frees a .grad),
  // and an allocated block of the final segments the trace never saw.
  StepStacks run;
  run.b.Free(0x100, 4096, run.zero);
  SnapshotSegment seg;
  seg.address = 0x1000;
  seg.total_bytes = 2 * kMiB;
  seg.small_pool = true;
  seg.blocks.push_back(
      SnapshotBlock{0x1000, 4096, 4000, run.opt_init, BlockState::kActiveAllocated});
  seg.blocks.push_back(SnapshotBlock{0x2000, 2 * kMiB - 4096, 0, 0, BlockState::kInactive});
  run.b.snapshot().segments.push_back(seg);
  auto r = Reconstruct(run.b.snapshot(), 0);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(CategoryOf(*r, 0x100), Category::kGradients);
  EXPECT_EQ(CategoryOf(*r, 0x1000), Category::kOptimizerState);
  for (const AllocRecord& rec : r->records) EXPECT_TRUE(rec.initial());
  EXPECT_EQ(r->initial_reserved_bytes, 2 * kMiB);
}

TEST(Attribution, GeneratedTrainingRun) {
  // tests/data/snapshots/train_p4.pickle: every category the run has.
  const Snapshot s = snapshot_test::LoadOrDie("train_p4.pickle");
  auto r = Reconstruct(s, 0);
  ASSERT_TRUE(r.ok());
  std::array<int, kNumCategories> count{};
  for (const AllocRecord& rec : r->records) ++count[static_cast<int>(rec.category)];
  for (Category c : {Category::kParameters, Category::kGradients, Category::kOptimizerState,
                     Category::kActivations, Category::kLoss, Category::kTemporaries,
                     Category::kCommunication, Category::kWorkspace}) {
    EXPECT_GT(count[static_cast<int>(c)], 0) << CategoryJsonKey(c);
  }
  EXPECT_EQ(count[static_cast<int>(Category::kParameters)], 7);
  EXPECT_EQ(count[static_cast<int>(Category::kOptimizerState)], 14);
  EXPECT_EQ(count[static_cast<int>(Category::kWorkspace)], 2);
  EXPECT_EQ(count[static_cast<int>(Category::kGradients)], 14);  // 7 per step
}

}  // namespace
}  // namespace vramscope::snapshot
