// Strategies that keep every parameter whole on each rank: plain replicas,
// torch DistributedDataParallel, and Megatron-LM's data-parallel side.
#include <algorithm>

#include "int_math.h"
#include "sharding_modes.h"

namespace vramscope::lower {
namespace {

class ReplicatedStrategy final : public ShardingStrategy {
 public:
  using ShardingStrategy::ShardingStrategy;

 protected:
  bool HalfEngine() const override { return false; }
  std::string SetupModule() const override { return std::string(DataParallelName(s_.mode)); }

  // torch DistributedDataParallel construction (torch 2.13 nn/parallel/distributed.py
  // __init__, _sync_module_states, _ddp_init_helper). First the parameters and
  // buffers are broadcast from rank 0 through dist._broadcast_coalesced, which
  // flattens them into one flat tensor per 250 MiB (`broadcast_bucket_size`),
  // each freed once its values are copied back. Then the Reducer gets ONE
  // bucket per dtype holding every trainable parameter's gradient:
  // _BucketCapacityConfig.compute_bucket_size_limits returns [sys.maxsize]
  // unless find_unused_parameters (False by default) or static_graph, because
  // the parameters' order is not yet the order their gradients are ready in.
  // The buckets by bucket_cap_mb come at the second forward (BeginForward).
  void SetupBuffers() override {
    if (s_.mode != DataParallel::kDdp) return;
    constexpr uint64_t kBroadcastBucketBytes = uint64_t{250} << 20;
    uint64_t flat = 0;
    for (const Param& p : s_.tape->params) {
      flat += p.storage_bytes;
      if (flat >= kBroadcastBucketBytes) {
        s_.tape->graph.Drop(s_.Alloc(flat, Category::kCommunication, "ddp::broadcast_coalesced"));
        flat = 0;
      }
    }
    if (flat > 0)
      s_.tape->graph.Drop(s_.Alloc(flat, Category::kCommunication, "ddp::broadcast_coalesced"));
    for (const auto& [elem_bytes, bytes] : TrainableBytesByDtype()) {
      (void)elem_bytes;
      s_.buffers.push_back(s_.Alloc(bytes, Category::kCommunication, "ddp::bucket"));
    }
  }

  // DistributedDataParallel._pre_forward calls reducer._rebuild_buckets() at the
  // first forward after a backward (reducer.cpp rebuild_buckets, torch 2.x): the
  // single bucket is cleared, then buckets are made in the order the gradients
  // were ready (the reverse of the parameters' order here), each closed once it
  // holds at least its limit: the first dist._DEFAULT_FIRST_BUCKET_BYTES (1 MiB)
  // with the default bucket_cap_mb, bucket_cap_mb's bytes otherwise, then
  // bucket_cap_mb each (_BucketCapacityConfig.create). Per dtype.
  void BeginForward() override {
    if (s_.mode != DataParallel::kDdp || rebuilt_ || !backward_done_) return;
    rebuilt_ = true;
    const uint32_t saved = s_.tape->module();
    s_.tape->SetModule("ddp");
    for (TensorId t : s_.buffers) s_.tape->graph.Drop(t);
    s_.buffers.clear();
    const uint64_t cap = s_.layout.ddp_bucket_cap_mb << 20;
    const uint64_t first = s_.layout.ddp_bucket_cap_mb == 25 ? uint64_t{1} << 20 : cap;
    for (const auto& [elem_bytes, total] : TrainableBytesByDtype()) {
      (void)total;
      uint64_t filled = 0, limit = first;
      for (auto it = s_.tape->params.rbegin(); it != s_.tape->params.rend(); ++it) {
        if (!it->trainable || it->elem_bytes != elem_bytes) continue;
        filled += it->numel * it->elem_bytes;
        if (filled >= limit) {
          s_.buffers.push_back(s_.Alloc(filled, Category::kCommunication, "ddp::bucket"));
          filled = 0;
          limit = cap;
        }
      }
      if (filled > 0)
        s_.buffers.push_back(s_.Alloc(filled, Category::kCommunication, "ddp::bucket"));
    }
    s_.tape->graph.SetModule(saved);
  }

  void EndBackward() override { backward_done_ = true; }

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

 private:
  // Trainable gradient bytes per element size (the Reducer buckets by dtype),
  // in order of first appearance.
  std::vector<std::pair<uint8_t, uint64_t>> TrainableBytesByDtype() const {
    std::vector<std::pair<uint8_t, uint64_t>> out;
    for (const Param& p : s_.tape->params) {
      if (!p.trainable) continue;
      auto it = std::find_if(out.begin(), out.end(),
                             [&](const auto& kv) { return kv.first == p.elem_bytes; });
      if (it == out.end()) it = out.insert(out.end(), {p.elem_bytes, 0});
      it->second += p.numel * p.elem_bytes;
    }
    return out;
  }

  bool backward_done_ = false;
  bool rebuilt_ = false;
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
