// DeepSpeed ZeRO stage 3 (DeepSpeedZeroOptimizer_Stage3,
// deepspeed/runtime/zero/stage3.py, DeepSpeed 0.19.8): parameters, gradients
// and optimizer state partitioned; every module's parameters gathered around
// its forward and backward by the coordinator (zero3_params.h); gradients
// reduce-scattered from an ipg bucket into a partition buffer.
#include <algorithm>
#include <memory>

#include "int_math.h"
#include "sharding_modes.h"
#include "sharding_zero.h"
#include "zero3_params.h"

namespace vramscope::lower {
namespace {

class Zero3Strategy final : public ShardingStrategy {
 public:
  using ShardingStrategy::ShardingStrategy;

  // The parameter's partition: ceil(numel / N) elements (ds_tensor), on the
  // host with offload_param. Init partitions every parameter, persistent ones
  // too (partition_parameters.py _partition_param, 0.19.8).
  uint64_t StorageBytes(const Param& p) const override {
    // CPU rules: the host partition is in the same memory.
    if (s_.layout.offload == Offload::kParams && !s_.tape->cpu_rules) return 0;
    if (p.nf4) return CeilDiv(p.storage_bytes, s_.world);
    return CeilDiv(p.numel, s_.world) * p.elem_bytes;
  }
  void EndBackward() override;

 protected:
  std::string SetupModule() const override { return std::string(DataParallelName(s_.mode)); }
  void SetupBuffers() override;
  void InstallHooks() override;
  void OnGradAccumulated(TensorId* slot) override;
  void StepShards(const TrainingSetup& setup, OptimizerExtras* extras) override;

 private:
  struct SubGroup {
    std::vector<Param*> params;
    Param master;  // fp32_partitioned_groups_flat[i]
    TensorId host_grad = kNoTensor;
  };
  bool OffloadOptimizer() const { return s_.layout.offload != Offload::kNone; }
  bool MemoryEfficientLinear() const {
    return s_.layout.zero.zero_init || s_.layout.zero.deepspeed_version >= 1904;
  }
  uint64_t Partition(const Param& p) const { return CeilDiv(p.numel, s_.world); }
  uint64_t BucketElements() const { return s_.layout.zero.ReduceBucket(s_.hidden); }
  uint32_t ReduceStream() const { return s_.tape->cpu_rules ? kDefaultStream : kReduceStream; }

  void Defragment();
  void MakeSubGroups();
  void MakeMasters();
  void MakeGradientBuffers();
  void AddToBucket(Param* p);
  void ReduceBucket();
  void PartitionGrads(const std::vector<Param*>& params);

  std::unique_ptr<Zero3Params> params_;
  std::vector<Param*> trainable_;  // fp16_groups, ds_id order
  std::vector<SubGroup> groups_;
  std::unordered_map<const TensorId*, Param*> param_of_slot_;
  uint8_t bytes_ = kF32;  // the trainable parameters' dtype (self.dtype)
  TensorId ipg_ = kNoTensor;
  std::vector<Param*> bucket_;
  uint64_t bucket_elements_ = 0;
  PendingFrees reduced_grads_;  // gradients freed after the reduce stream read them (CUDA)
};

// _create_fp16_partitions_with_defragmentation: the trainable partitions are
// moved into one flat buffer (zero/utils.py defragment: a host buffer, each
// partition freed, then `.to(device)`; CPU rules: the host buffer is it); with
// offload_param into pinned host memory.
void Zero3Strategy::Defragment() {
  Graph& g = s_.tape->graph;
  uint64_t total = 0;
  for (Param* p : trainable_) total += StorageBytes(*p);
  if (total == 0) {
    for (Param* p : trainable_) s_.host_bytes += CeilDiv(p->numel, s_.world) * p->elem_bytes;
    return;
  }
  // On a GPU the partitions go before the device buffer is made (the host
  // buffer holds them meanwhile, and gc.collect(); empty_cache() returns their
  // blocks). CPU rules: the host buffer is made while they are alive, and
  // `.to(device)` returns it: it is the flat buffer.
  const bool host_first = !s_.tape->cpu_rules;
  std::vector<TensorId> old;
  for (Param* p : trainable_) old.push_back(p->var.t);
  if (host_first) {
    for (TensorId t : old) g.Drop(t);
    s_.tape->out()->EmptyCache();
  }
  const TensorId flat = s_.Alloc(total, Category::kParameters, "zero3::defragment");
  for (size_t i = 0; i < trainable_.size(); ++i) {
    g.Ref(flat);
    if (!host_first) g.Drop(old[i]);
    trainable_[i]->var.t = flat;
  }
  s_.buffers.push_back(flat);
}

// _create_fp16_sub_groups: partitions accumulated until sub_group_size.
void Zero3Strategy::MakeSubGroups() {
  uint64_t acc = 0;
  for (Param* p : trainable_) {
    if (groups_.empty() || acc >= s_.layout.zero.sub_group_size) {
      groups_.emplace_back();
      acc = 0;
    }
    groups_.back().params.push_back(p);
    acc += Partition(*p);
  }
  for (SubGroup& sg : groups_) {
    for (Param* p : sg.params) sg.master.numel += Partition(*p);
    sg.master.elem_bytes = kF32;
    sg.master.trainable = true;
    sg.master.module = s_.tape->module();
  }
}

// _create_fp32_partitions: `partition.to(device, fp32).clone().detach()` per
// sub-group (the alias branch compares a torch.device with a string and is
// never taken: a clone even in fp32); with offload_optimizer on the host.
void Zero3Strategy::MakeMasters() {
  Graph& g = s_.tape->graph;
  for (SubGroup& sg : groups_) {
    const uint64_t bytes = sg.master.numel * kF32;
    if (OffloadOptimizer() && !s_.tape->cpu_rules) {
      s_.host_bytes += bytes;
      continue;
    }
    const TensorId cast =
        bytes_ == kF32 ? kNoTensor : s_.Alloc(bytes, Category::kOptimizerState, "aten::_to_copy");
    s_.buffers.push_back(s_.Alloc(bytes, Category::kOptimizerState, "aten::clone"));
    if (cast != kNoTensor) g.Drop(cast);
  }
}

// initialize_optimizer_states: a zeros buffer of the largest sub-group (fp32)
// lives while the states are set up; with offload each sub-group gets its
// host fp32 gradient. Then the contiguous ipg bucket (reduce_bucket_size
// elements, the communication dtype: the model's) and
// grad_partitions_flat_buffer (every trainable partition, the gradient
// accumulation dtype: the model's; on the host with offload).
void Zero3Strategy::MakeGradientBuffers() {
  Graph& g = s_.tape->graph;
  uint64_t largest = 0, total = 0;
  for (const SubGroup& sg : groups_) largest = std::max(largest, sg.master.numel);
  for (Param* p : trainable_) total += Partition(*p);
  const TensorId scratch = OffloadOptimizer()
                               ? s_.HostAlloc(largest * kF32, Category::kGradients, "aten::zeros")
                               : s_.Alloc(largest * kF32, Category::kGradients, "aten::zeros");
  if (OffloadOptimizer()) {
    for (SubGroup& sg : groups_) {
      sg.host_grad = s_.HostAlloc(sg.master.numel * kF32, Category::kGradients, "aten::zeros");
    }
  }
  if (scratch != kNoTensor) g.Drop(scratch);
  if (s_.layout.zero.contiguous_gradients) {
    ipg_ = s_.Alloc(BucketElements() * bytes_, Category::kCommunication, "zero3::ipg_bucket");
  }
  const TensorId partitions =
      OffloadOptimizer()
          ? s_.HostAlloc(total * bytes_, Category::kGradients, "zero3::grad_partitions_flat_buffer")
          : s_.Alloc(total * bytes_, Category::kGradients, "zero3::grad_partitions_flat_buffer");
  if (partitions != kNoTensor) s_.buffers.push_back(partitions);
}

void Zero3Strategy::SetupBuffers() {
  auto& names = s_.tape->out()->metadata();
  names["stream.1"] = "all-gather (DeepSpeed)";
  names["stream.2"] = "reduce-and-partition (DeepSpeed)";
  for (Param& p : s_.tape->params) {
    if (p.trainable && p.numel > 0) trainable_.push_back(&p);
  }
  if (!trainable_.empty()) bytes_ = trainable_.front()->elem_bytes;
  if (!s_.layout.zero.zero_init && !s_.tape->cpu_rules) {
    // Without zero.Init: engine._configure_distributed_model moves the whole
    // model to the GPU (module.to(device)) before Init(module=...) partitions
    // it, freeing each full parameter (engine.py, 0.19.8). CPU rules: the
    // move is a no-op.
    uint64_t full = 0;
    for (const Param& p : s_.tape->params) full += p.nf4 ? p.storage_bytes : p.numel * p.elem_bytes;
    s_.tape->graph.Drop(s_.Alloc(full, Category::kParameters, "deepspeed::module.to(device)"));
  }
  Zero3Params::Options o;
  o.prefetch_bucket = s_.layout.zero.PrefetchBucket(s_.hidden);
  o.max_live = s_.layout.zero.max_live_parameters;
  o.max_reuse = s_.layout.zero.max_reuse_distance;
  o.persistence = s_.layout.zero.PersistenceThreshold(s_.hidden);
  o.offload_params = s_.layout.offload == Offload::kParams;
  // partition_parameters.py Init.__init__ installs LinearFunctionForZeroStage3
  // for a model passed in (Init(module=...)) from 0.19.4 on (PR #8189);
  // before, only zero.Init's __enter__ did.
  o.forward_saves_storage = !MemoryEfficientLinear();
  // overlap_comm (the stage-3 default): gathers on __allgather_stream.
  o.gather_stream =
      s_.tape->cpu_rules || s_.layout.zero.overlap_comm == 0 ? kDefaultStream : kGatherStream;
  params_ = std::make_unique<Zero3Params>(&s_, o);
  params_->Register();
  if (trainable_.empty()) return;
  Defragment();
  MakeSubGroups();
  MakeMasters();
  MakeGradientBuffers();
  params_->GatherOnceEach();
  for (Param* p : trainable_) param_of_slot_[&p->grad] = p;
}

void Zero3Strategy::InstallHooks() {
  ShardingStrategy::InstallHooks();
  params_->Install();
  s_.tape->zero3_linear = MemoryEfficientLinear();
}

// reduce_partition_and_remove_grads (register_grad_hook: the gradient is
// complete) -> reduce_independent_p_g_buckets_and_remove_grads.
void Zero3Strategy::OnGradAccumulated(TensorId* slot) {
  auto it = param_of_slot_.find(slot);
  if (it == param_of_slot_.end() || *slot == kNoTensor) return;
  const uint32_t saved_module = s_.tape->module();
  s_.tape->SetModule("zero3.reduce");
  Graph::HookScope scope(s_.tape->graph);
  if (bucket_elements_ + it->second->numel > BucketElements() && bucket_elements_ > 0) {
    ReduceBucket();
  }
  AddToBucket(it->second);
  s_.tape->graph.SetModule(saved_module);
}

// __add_grad_to_ipg_bucket: a gradient that fits in the bucket's room is
// copied into it on reduce_and_partition_stream and .grad becomes a view of
// the bucket (the gradient freed after record_stream); a larger one stays.
void Zero3Strategy::AddToBucket(Param* p) {
  Graph& g = s_.tape->graph;
  if (ipg_ != kNoTensor && bucket_elements_ + p->numel <= BucketElements()) {
    g.Ref(ipg_);
    if (s_.tape->cpu_rules) {
      g.Drop(p->grad);
    } else {
      reduced_grads_.Add(g.DropUsedOn(p->grad, kReduceStream));
    }
    p->grad = ipg_;
  }
  bucket_.push_back(p);
  bucket_elements_ += p->numel;
}

// partition_grads: each parameter's partition of the reduced gradient is
// copied into grad_partitions_flat_buffer (with offload on the host: the host
// slice is first brought to the device, `grad_buffer.to(device)`); at the
// boundary with offload it is normed in fp64 (_constant_buffered_norm2) and
// cast to fp32 for the host fp32 gradient; .grad is dropped. A rank holding
// only padding of a parameter skips it.
void Zero3Strategy::PartitionGrads(const std::vector<Param*>& params) {
  Graph& g = s_.tape->graph;
  for (Param* p : params) {
    const uint64_t part = Partition(*p);
    const bool real = part * s_.dp_rank < p->numel;
    if (real && OffloadOptimizer()) {
      // CPU rules: the host slice is on the device already.
      const TensorId device = s_.tape->cpu_rules
                                  ? kNoTensor
                                  : g.Alloc(part * bytes_, Category::kGradients, "aten::_to_copy",
                                            s_.tape->module(), ReduceStream());
      NormTemporary(s_, part);
      if (bytes_ != kF32) {
        g.Drop(g.Alloc(part * kF32, Category::kTemporaries, "aten::_to_copy", s_.tape->module()));
      }
      if (device != kNoTensor) g.Drop(device);
    }
    if (p->grad == kNoTensor) continue;
    if (s_.tape->cpu_rules) {
      g.Drop(p->grad);
    } else {
      reduced_grads_.Add(g.DropUsedOn(p->grad, kReduceStream));
    }
    p->grad = kNoTensor;
  }
}

// __reduce_and_partition_ipg_grads: at most two reduces in flight
// (max_param_reduce_events); the bucket's gradients, by ds_id, averaged and
// reduce-scattered (reduce_scatter, the default: __avg_scatter_grads ->
// reduce_scatter_coalesced, runtime/comm/coalesced_collectives.py: one
// gradient whose numel divides by N is reduce-scattered in place; otherwise
// each rank's chunks of every gradient, padded to ceil(numel / N), are
// concatenated into one buffer (torch.cat) whose chunk for this rank holds
// the partitions, alive until they are used), then partitioned.
void Zero3Strategy::ReduceBucket() {
  Graph& g = s_.tape->graph;
  if (bucket_.empty()) return;
  if (reduced_grads_.groups() > 2) reduced_grads_.CompleteOldest(g);
  std::vector<Param*> params = bucket_;
  std::sort(params.begin(), params.end());
  TensorId cat = kNoTensor;
  const bool in_place = params.size() == 1 && params[0]->numel % s_.world == 0;
  if (!in_place) {
    uint64_t padded = 0;
    for (Param* p : params) padded += Partition(*p) * s_.world;
    cat = g.Alloc(padded * bytes_, Category::kCommunication, "aten::cat", s_.tape->module(),
                  ReduceStream());
  }
  PartitionGrads(params);
  if (cat != kNoTensor) g.Drop(cat);
  reduced_grads_.EndGroup();
  bucket_.clear();
  bucket_elements_ = 0;
}

// independent_gradient_partition_epilogue (the last bucket reduced, the
// reduce stream synchronized), then backward_epilogue's
// release_backward_leftovers.
void Zero3Strategy::EndBackward() {
  if (!params_) return;
  const uint32_t saved_module = s_.tape->module();
  s_.tape->SetModule("zero3.reduce");
  {
    Graph::HookScope scope(s_.tape->graph);
    ReduceBucket();
  }
  reduced_grads_.CompleteAll(s_.tape->graph);
  params_->ReleaseBackwardLeftovers();
  s_.tape->graph.SetModule(saved_module);
}

// step(): every parameter released (_partition_all_parameters); the norm
// (get_grad_norm_direct: each gradient partition `.to(torch.double)` in turn;
// with offload, scalars kept at the boundary); per sub-group the partitions
// flattened (torch.cat; one: a view) and cast to fp32, the optimizer stepped,
// the fp32 gradient dropped; then the persistent parameters gathered again.
void Zero3Strategy::StepShards(const TrainingSetup& setup, OptimizerExtras* extras) {
  if (!params_) return;
  Graph& g = s_.tape->graph;
  params_->ReleaseAll();
  if (!OffloadOptimizer()) {
    for (Param* p : trainable_) NormTemporary(s_, Partition(*p));
  }
  for (SubGroup& sg : groups_) {
    if (OffloadOptimizer()) {
      if (s_.tape->cpu_rules) {
        // CPU rules: the host optimizer (torch's, as the reference runs it)
        // steps in the same memory.
        OptimizerStepParams(*s_.tape, setup, {&sg.master}, extras);
      } else if (!sg.master.stepped) {
        sg.master.stepped = true;
        s_.host_bytes += 8 * sg.master.numel;  // DeepSpeedCPUAdam's fp32 moments
      }
      continue;
    }
    TensorId flat = kNoTensor;
    if (sg.params.size() > 1) {
      flat = s_.Alloc(sg.master.numel * bytes_, Category::kTemporaries, "aten::cat");
    }
    TensorId grad = flat;
    if (bytes_ != kF32) {
      grad = s_.Alloc(sg.master.numel * kF32, Category::kTemporaries, "aten::_to_copy");
      if (flat != kNoTensor) g.Drop(flat);
    }
    sg.master.grad = grad;
    OptimizerStepParams(*s_.tape, setup, {&sg.master}, extras);
    if (grad != kNoTensor) g.Drop(grad);
    sg.master.grad = kNoTensor;
  }
  params_->GatherPersistent();
}

}  // namespace

std::unique_ptr<ShardingStrategy> MakeZero3Strategy(ShardState state) {
  return std::make_unique<Zero3Strategy>(std::move(state));
}

}  // namespace vramscope::lower
