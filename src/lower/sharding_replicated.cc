// Strategies that keep every parameter whole on each rank: plain replicas,
// torch DistributedDataParallel, and Megatron-LM's data-parallel side.
#include "sharding_modes.h"

#include "int_math.h"

namespace vramscope::lower {
namespace {

class ReplicatedStrategy final : public ShardingStrategy {
 public:
  using ShardingStrategy::ShardingStrategy;

 protected:
  bool HalfEngine() const override { return false; }
  std::string SetupModule() const override { return std::string(DataParallelName(s_.mode)); }

  // torch DistributedDataParallel Reducer (torch 2.x): gradients are copied
  // into flat buckets allocated at construction, the first of
  // dist._DEFAULT_FIRST_BUCKET_BYTES (1 MiB), the rest of bucket_cap_mb, in
  // reverse parameter order.
  void SetupBuffers() override {
    if (s_.mode != DataParallel::kDdp) return;
    uint64_t cap = 1 << 20, filled = 0;
    for (auto it = s_.tape->params.rbegin(); it != s_.tape->params.rend(); ++it) {
      if (!it->trainable) continue;
      filled += it->numel * it->elem_bytes;
      if (filled >= cap) {
        s_.buffers.push_back(s_.Alloc(filled, Category::kCommunication, "ddp::bucket"));
        filled = 0;
        cap = s_.layout.ddp_bucket_cap_mb << 20;
      }
    }
    if (filled > 0) s_.buffers.push_back(s_.Alloc(filled, Category::kCommunication, "ddp::bucket"));
  }

  // DDP gradient_as_bucket_view: .grad is a view of its bucket.
  void OnGradAccumulated(TensorId* slot) override {
    if (*slot == kNoTensor || s_.mode != DataParallel::kDdp || !s_.layout.gradient_as_bucket_view)
      return;
    s_.tape->graph.Drop(*slot);
    *slot = s_.tape->graph.Alloc(0, Category::kGradients, "ddp::bucket_view", s_.tape->module());
  }

  void StepShards(const TrainingSetup& setup, OptimizerExtras* extras) override {
    OptimizerStep(*s_.tape, setup, false, extras);
  }
};

class MegatronStrategy final : public ShardingStrategy {
 public:
  using ShardingStrategy::ShardingStrategy;

 protected:
  std::string SetupModule() const override { return "megatron"; }

  // Megatron-LM core DistributedDataParallel (core 0.5-0.13): one contiguous
  // fp32 grad buffer (_ParamAndGradBuffer.grad_data) for all params,
  // main_grad views into it; the optimizer's fp32 main params are clones
  // (Float16OptimizerWithFloat16Params), sharded over dp with the distributed
  // optimizer (--zero 1).
  void SetupBuffers() override {
    const uint32_t module = s_.tape->module();
    const uint64_t trainable = s_.TrainableElements();
    main_grads_.push_back(s_.Alloc(trainable * 4, Category::kGradients, "megatron::grad_buffer"));
    const uint64_t master =
        s_.mode == DataParallel::kZero1 ? CeilDiv(trainable, s_.world) : trainable;
    if (s_.mixed)
      s_.buffers.push_back(
          s_.Alloc(master * 4, Category::kOptimizerState, "megatron::main_params"));
    s_.shards.emplace_back();
    s_.shards.back().numel = master;
    s_.shards.back().elem_bytes = 4;
    s_.shards.back().module = module;
  }

  // The backward hook adds .grad into main_grad and sets it to None
  // (gradient_accumulation_fusion writes the weight gradient there directly).
  void OnGradAccumulated(TensorId* slot) override {
    if (*slot == kNoTensor) return;
    s_.tape->graph.Drop(*slot);
    *slot = kNoTensor;
  }

  // Megatron steps with its fused Adam (Apex / Transformer Engine FusedAdam):
  // no foreach temporaries; grads are the main_grad views.
  void StepShards(const TrainingSetup& setup, OptimizerExtras* extras) override {
    const uint32_t module = s_.tape->module();
    TrainingSetup fused = setup;
    if (setup.optimizer == OptimizerKind::kAdamW ||
        setup.optimizer == OptimizerKind::kAdamWForLoop) {
      fused.optimizer = OptimizerKind::kAdamWFused;
    }
    for (Param& s : s_.shards) {
      s.grad = s_.tape->graph.Alloc(0, Category::kGradients, "megatron::main_grad_view", module);
      OptimizerStepParams(*s_.tape, fused, {&s}, extras);
      s_.tape->graph.Drop(s.grad);
      s.grad = kNoTensor;
    }
  }

 private:
  std::vector<TensorId> main_grads_;  // the fp32 main_grad buffer
};

}  // namespace

std::unique_ptr<ShardingStrategy> MakeReplicatedStrategy(ShardState state) {
  return std::make_unique<ReplicatedStrategy>(std::move(state));
}

std::unique_ptr<ShardingStrategy> MakeMegatronStrategy(ShardState state) {
  return std::make_unique<MegatronStrategy>(std::move(state));
}

}  // namespace vramscope::lower
