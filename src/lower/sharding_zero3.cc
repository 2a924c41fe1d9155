// DeepSpeed ZeRO (0.14-0.16): stages 1-2 partition optimizer state (and
// gradients), stage 3 also the parameters, gathered per module around its
// forward and backward.
#include <algorithm>

#include "int_math.h"
#include "sharding_modes.h"

namespace vramscope::lower {
namespace {

// fp32 master partitions (stage_1_and_2.py single_partition_of_fp32_groups;
// stage3.py _create_fp32_partitions), on the host with offload_optimizer.
// Stage 3 splits them into sub-groups: partitions accumulated until >=
// sub_group_size (stage3.py _create_fp16_sub_groups); each steps on its own.
void SetupMasterPartitions(ShardState& s, bool stage3) {
  const uint32_t module = s.tape->module();
  if (stage3) {
    uint64_t acc = 0;
    for (const Param& p : s.tape->params) {
      if (!p.trainable) continue;
      acc += CeilDiv(p.numel, s.world);
      if (acc >= s.layout.zero.sub_group_size) {
        s.shards.emplace_back();
        s.shards.back().numel = acc;
        acc = 0;
      }
    }
    if (acc > 0) {
      s.shards.emplace_back();
      s.shards.back().numel = acc;
    }
  } else {
    s.shards.emplace_back();
    s.shards.back().numel = CeilDiv(s.TrainableElements(), s.world);
  }
  const bool offload = s.layout.offload != Offload::kNone;
  for (Param& shard : s.shards) {
    shard.elem_bytes = s.mixed ? 4 : s.tape->params.front().elem_bytes;
    shard.module = module;
    shard.trainable = true;
    if (!s.mixed) continue;
    if (offload) {
      s.host_bytes += shard.numel * 4;
    } else {
      s.buffers.push_back(
          s.Alloc(shard.numel * 4, Category::kOptimizerState, "zero::fp32_partition"));
    }
  }
}

// Per sub-group (stage 3) or per param group (stages 1-2), the half gradients
// are flattened and cast to an fp32 gradient (stage3.py
// _prepare_fp32_grad_for_sub_group; stage_1_and_2.py step:
// flatten(...).to(fp32)), the optimizer steps the fp32 partition, the result
// is copied into the half partition and the fp32 gradient freed. With
// offload the CPU optimizer steps; stages 1-2 copy the updated fp32 partition
// back through a device fp32 copy (fp32_partition.to(device)).
void StepMasterPartitions(ShardState& s, bool stage3, const TrainingSetup& setup,
                          OptimizerExtras* extras) {
  const uint32_t module = s.tape->module();
  const bool offload = s.layout.offload != Offload::kNone;
  Graph& g = s.tape->graph;
  for (Param& shard : s.shards) {
    if (offload) {
      if (!stage3)
        g.Drop(g.Alloc(shard.numel * 4, Category::kTemporaries, "zero::fp32_to_device", module));
      continue;
    }
    const TensorId flat =
        g.Alloc(shard.numel * (s.mixed ? 2 : 4), Category::kTemporaries, "zero::flatten", module);
    shard.grad = g.Alloc(shard.numel * 4, Category::kTemporaries, "zero::fp32_grad", module);
    g.Drop(flat);
    OptimizerStepParams(*s.tape, setup, {&shard}, extras);
    g.Drop(shard.grad);
    shard.grad = kNoTensor;
  }
}

class Zero3Strategy final : public GatheringStrategy {
 public:
  using GatheringStrategy::GatheringStrategy;

  uint64_t StorageBytes(const Param& p) const override {
    // bitsandbytes Params4bit (QLoRA): what is flattened, sharded and gathered
    // is the packed 4-bit storage (bnb_4bit_quant_storage, 0.43+), not numel
    // values of the compute dtype.
    if (p.nf4) return CeilDiv(p.storage_bytes, s_.world);
    // stage3_param_persistence_threshold: smaller params stay whole on every
    // rank (partition_parameters.py, ds_persist).
    if (p.numel < s_.layout.zero.PersistenceThreshold(s_.hidden)) return p.storage_bytes;
    if (s_.layout.offload == Offload::kParams) return 0;  // partitions in host memory
    return CeilDiv(p.numel, s_.world) * p.elem_bytes;
  }

 protected:
  std::string SetupModule() const override { return std::string(DataParallelName(s_.mode)); }

  uint64_t GatheredBytes(const Param& p) const override {
    if (p.numel < s_.layout.zero.PersistenceThreshold(s_.hidden)) return 0;
    return p.nf4 ? p.storage_bytes : p.numel * p.elem_bytes;  // 4-bit: the packed storage
  }

  // ZeRO-3 fetches per sub-module (fetch_sub_module) and prefetches at most
  // stage3_prefetch_bucket_size elements ahead, so a layer's gathered set is
  // bounded by its largest module plus the prefetch bucket
  // (partitioned_param_coordinator.py, DeepSpeed 0.14-0.16).
  uint64_t GatherLimit(uint64_t largest_bytes) const override {
    if (!s_.layout.zero.zero_init) return UINT64_MAX;
    return largest_bytes + s_.layout.zero.PrefetchBucket(s_.hidden) * (s_.mixed ? 2 : 4);
  }

  void SetupBuffers() override;

  // With overlap_comm (the stage-3 default, config.py overlap_comm_valid)
  // parameters are gathered on __allgather_stream and released by free_param
  // after record_stream on the computation stream
  // (partitioned_param_coordinator.py __all_gather_params_,
  // partition_parameters.py free_param; DeepSpeed 0.14-0.16).
  uint32_t GatheredStream() const override { return kGatherStream; }
  bool ReleaseRecordsDefaultStream() const override { return true; }

  void Gather(int unit) override {
    Unit& u = units_[unit];
    if (u.gathered != kNoTensor || u.gather_bytes == 0) return;
    // The computation stream is assumed two units behind the CPU, as
    // FSDP1's rate limiter enforces (docs/parallel.md); DeepSpeed's fetch
    // throttle (__max_ongoing_fetch_events = 2) waits on the all-gather
    // stream only.
    WaitForOldestRelease();
    s_.tape->SetModule("zero3.all_gather");
    // offload_param: each partition is first copied to the device
    // (p.ds_tensor.to(device) in all_gather_coalesced, on the all-gather
    // stream) and freed once copied into the gather buffer
    // (partition_parameters.py, DeepSpeed 0.14-0.16).
    TensorId staged = kNoTensor;
    if (s_.layout.offload == Offload::kParams) {
      staged = s_.tape->graph.Alloc(CeilDiv(u.gather_bytes, s_.world), Category::kParameters,
                                    "zero3::h2d_partition", s_.tape->module(), kGatherStream);
    }
    AllocGathered(u, "zero3::all_gather");
    s_.tape->graph.Drop(staged);
  }

  // Gradients are copied into the ipg bucket on reduce_and_partition_stream
  // and reduce-scattered into the persistent partition buffer; each full
  // gradient is freed after record_stream on that stream, and at most two
  // reduces stay in flight (max_param_reduce_events: the oldest is waited
  // for) (stage3.py __add_grad_to_ipg_bucket /
  // __reduce_and_partition_ipg_grads, DeepSpeed 0.14-0.16).
  void ReduceUnit(int unit) override {
    Graph& g = s_.tape->graph;
    if (reduced_grads_.groups() > 2) reduced_grads_.CompleteOldest(g);
    uint64_t partition_bytes = 0;
    for (Param* p : units_[unit].params) {
      if (p->grad == kNoTensor) continue;
      partition_bytes += CeilDiv(g.Bytes(p->grad), s_.world);
      reduced_grads_.Add(g.DropUsedOn(p->grad, kReduceStream));
      p->grad = kNoTensor;
    }
    reduced_grads_.EndGroup();
    if (s_.layout.offload != Offload::kNone && partition_bytes > 0) {
      // offload_optimizer: partition_grads copies each rank partition to
      // the host and back to a device buffer (grad_buffer.to(device)) on the
      // same stream (stage3.py partition_grads, 0.16).
      s_.tape->SetModule("zero3.reduce");
      g.Drop(g.Alloc(partition_bytes, Category::kCommunication, "zero3::grad_partition_copy",
                     s_.tape->module(), kReduceStream));
    }
  }

  void OnForwardUnit(int unit, bool begin) override {
    const uint32_t saved_module = s_.tape->module();
    if (begin) {
      Gather(unit);
    } else if (!KeptAcrossTurn(unit) && (s_.layout.zero.zero_init || !SavesGatheredWeights(unit))) {
      Release(unit);
    }
    s_.tape->graph.SetModule(saved_module);
  }

  void StepShards(const TrainingSetup& setup, OptimizerExtras* extras) override {
    StepMasterPartitions(s_, true, setup, extras);
  }

 private:
  // Whether autograd keeps a reference to the unit's gathered weights from its
  // forward to its backward, so that DeepSpeed's release (free_param:
  // param.data = torch.empty(0), partition_parameters.py 0.14-0.16) frees no
  // memory. Without zero.Init it does: F.linear saves the gathered weight (the
  // memory-saving LinearFunctionForZeroStage3, which saves the parameter
  // instead, is installed only inside Init.__enter__). The embedding saves no
  // weight. A checkpointed decoder layer saves nothing in its forward
  // (torch.utils.checkpoint: non-reentrant packs a handle in place of each
  // saved tensor, reentrant runs the forward under no_grad), so its weights
  // go at release and its backward's recompute gathers them again.
  bool SavesGatheredWeights(int unit) const {
    if (unit == 0) return false;
    const bool decoder_layer = unit >= 1 && unit <= s_.num_layers;
    return !(decoder_layer && s_.checkpointed_layers);
  }

  // ZeRO-3 keeps a module's params gathered when they are used again within
  // stage3_max_reuse_distance elements of the trace (__params_to_release);
  // between a unit's forward and its backward lie the forward and the
  // backward of every later unit.
  bool KeptAcrossTurn(int unit) const {
    uint64_t distance = 0;
    for (size_t u = unit + 1; u < units_.size(); ++u) {
      for (const Param* p : units_[u].params) distance += 2 * p->numel;
    }
    return distance < s_.layout.zero.max_reuse_distance;
  }

  TensorId grad_partition_ = kNoTensor;
  TensorId ipg_bucket_ = kNoTensor;
};

void Zero3Strategy::SetupBuffers() {
  AssignUnits();
  auto& names = s_.tape->out()->metadata();
  names["stream.1"] = "all-gather (DeepSpeed)";
  names["stream.2"] = "reduce-and-partition (DeepSpeed)";
  const bool offload = s_.layout.offload != Offload::kNone;
  if (!s_.layout.zero.zero_init) {
    // No zero.Init: engine._configure_distributed_model moves the whole half
    // model to the GPU before Init(module=...) partitions it and frees each
    // full parameter (DeepSpeed 0.14.2 engine.py).
    uint64_t full = 0;
    for (const Param& p : s_.tape->params) full += p.numel * p.elem_bytes;
    s_.tape->graph.Drop(s_.Alloc(full, Category::kParameters, "deepspeed::module.to(device)"));
  }
  SetupMasterPartitions(s_, true);
  const uint64_t part = CeilDiv(s_.TrainableElements(), s_.world);
  const uint8_t grad_bytes = s_.mixed ? 2 : 4;
  if (offload) {
    s_.host_bytes += part * 4;  // fp32 gradient partitions, pinned
  } else {
    // grad_partitions_flat_buffer in the gradient accumulation dtype (the
    // model's half dtype by default, engine.get_data_types()).
    grad_partition_ = s_.Alloc(part * grad_bytes, Category::kGradients, "zero3::grad_partitions");
  }
  if (s_.layout.zero.contiguous_gradients) {
    const uint64_t elems = s_.layout.zero.ReduceBucket(s_.hidden);
    ipg_bucket_ = s_.Alloc(elems * grad_bytes, Category::kCommunication, "zero3::ipg_bucket");
  }
  // Host: Adam moments (DeepSpeedCPUAdam, lazily created); the parameter
  // partitions with offload_param.
  if (offload) s_.host_bytes += 8 * part;
  if (s_.layout.offload == Offload::kParams) s_.host_bytes += part * (s_.mixed ? 2 : 4);
}

}  // namespace

std::unique_ptr<ShardingStrategy> MakeZero3Strategy(ShardState state) {
  return std::make_unique<Zero3Strategy>(std::move(state));
}

}  // namespace vramscope::lower
