// PyTorch FSDP: FSDP1 (FullyShardedDataParallel, flat parameters) and FSDP2
// (fully_shard, per-parameter DTensor shards), as accelerate wraps them.
#include "int_math.h"
#include "sharding_modes.h"

namespace vramscope::lower {
namespace {

class FsdpStrategy final : public GatheringStrategy {
 public:
  using GatheringStrategy::GatheringStrategy;

  uint64_t StorageBytes(const Param& p) const override {
    // CPUOffload / CPUOffloadPolicy: sharded params on the host.
    if (s_.layout.offload != Offload::kNone) return 0;
    // bitsandbytes Params4bit (FSDP-QLoRA, bnb_4bit_quant_storage 0.43+): the
    // packed 4-bit storage is what is flattened and sharded.
    if (p.nf4) return CeilDiv(p.storage_bytes, s_.world);
    // accelerate upcasts trainable params to fp32 before sharding (FSDP1 and
    // FSDP2 "Upcast to fp32 master weights", accelerate 0.30-1.x).
    const uint64_t shard_elem = s_.mixed && p.trainable ? 4 : p.elem_bytes;
    return CeilDiv(p.numel, s_.world) * shard_elem;
  }

  void ZeroGrad() override {
    for (Param& s : s_.shards) {
      if (s.grad == kNoTensor) continue;
      s_.tape->graph.Drop(s.grad);
      s.grad = kNoTensor;
    }
    ShardingStrategy::ZeroGrad();
  }

 protected:
  std::string SetupModule() const override { return "fsdp"; }
  bool fsdp2() const { return s_.layout.fsdp_version == 2; }

  // MixedPrecision(param_dtype=bf16) gathers half parameters; 4-bit: the packed storage.
  uint64_t GatheredBytes(const Param& p) const override {
    return p.nf4 ? p.storage_bytes : p.numel * (s_.mixed ? 2 : p.elem_bytes);
  }
  int MapUnit(int unit) const override { return unit == s_.num_layers + 1 ? 0 : unit; }
  bool RootReducedAtEnd() const override { return true; }

  void SetupBuffers() override;
  void Gather(int unit) override;
  void Prefetch(int unit) override;
  void ReduceUnit(int unit) override;
  void OnForwardUnit(int unit, bool begin) override;

  // FSDP2's root pre-backward prefetches the last layer (the first whose
  // backward runs).
  void OnBackwardStart() override {
    if (fsdp2() && s_.num_layers > 0 && static_cast<size_t>(s_.num_layers) < units_.size())
      Prefetch(s_.num_layers);
  }
  // Backward prefetch (FSDP1 BACKWARD_PRE default; FSDP2 prefetches one
  // module in reverse post-forward order): the next unit is gathered while
  // this one computes.
  void AfterBackwardGather(int unit) override {
    if (unit > 1) Prefetch(unit - 1);
  }
  // The root unit (embeddings, final norm, head) finishes its backward only
  // with the embedding: its gradients are reduced here (FSDP2's root
  // post-backward; FSDP1's flat parameter hook fires once all of its
  // gradients exist), and it stays gathered until then.
  void BeforeReleaseAll() override {
    if (backward_unit_ != 0 && !units_.empty()) ReduceUnit(0);
  }
  void AfterReleaseAll() override;

  void StepShards(const TrainingSetup& setup, OptimizerExtras* extras) override {
    if (s_.layout.offload != Offload::kNone) return;  // the CPU steps
    std::vector<Param*> with_grad;
    for (Param& s : s_.shards) {
      if (s.grad != kNoTensor) with_grad.push_back(&s);
    }
    OptimizerStepParams(*s_.tape, setup, with_grad, extras);
  }

 private:
  // FSDP2: the forward's AllGatherState (the last copied-out all-gather
  // output, kept until the next forward copy-out or the root's post-forward)
  // and the backward prefetches issued but not yet copied out, per unit.
  TensorId forward_all_gather_state_ = kNoTensor;
  std::vector<TensorId> prefetched_output_;
  TensorId reduce_scatter_state_ = kNoTensor;  // FSDP2: the last reduce-scatter's input
};

void FsdpStrategy::SetupBuffers() {
  AssignUnits();
  // What the optimizer sees: one sharded parameter per parameter (FSDP2
  // per-parameter DTensor shards; FSDP1's flat shard steps the same bytes).
  for (const Param& p : s_.tape->params) {
    s_.shards.emplace_back();
    Param& s = s_.shards.back();
    s.numel = CeilDiv(p.numel, s_.world);
    s.elem_bytes = s_.mixed && p.trainable ? 4 : p.elem_bytes;
    s.module = p.module;
    s.trainable = p.trainable;
  }
  // CPUOffload / CPUOffloadPolicy: sharded params, grads and optimizer on
  // the host (fp32 params + grads + Adam moments).
  if (s_.layout.offload != Offload::kNone)
    s_.host_bytes += CeilDiv(s_.TrainableElements(), s_.world) * 16;
}

// FSDP2 (_fsdp_collectives.py foreach_all_gather / foreach_all_gather_copy_out,
// _fsdp_param_group.py wait_for_unshard; torch 2.4-2.13, seen in the 2.13 CPU
// trace): all_gather_copy_in allocates one flat output of the whole unit (each
// rank's input is a view into it); the copy-out then fills every parameter's
// unsharded storage. In forward the output is kept as the AllGatherState until
// the next unit's copy-out; in backward it is freed at once. FSDP1 gathers
// into the flat parameter's storage directly.
void FsdpStrategy::Gather(int unit) {
  Unit& u = units_[unit];
  if (u.gathered != kNoTensor || u.gather_bytes == 0) return;
  s_.tape->SetModule("fsdp.all_gather");
  TensorId flat = kNoTensor;
  if (fsdp2()) {
    if (prefetched_output_.size() > static_cast<size_t>(unit) &&
        prefetched_output_[unit] != kNoTensor) {
      flat = prefetched_output_[unit];
      prefetched_output_[unit] = kNoTensor;
    } else {
      flat = s_.tape->graph.Alloc(u.gather_bytes, Category::kCommunication,
                                  "fsdp::all_gather_output", s_.tape->module());
    }
  }
  AllocGathered(u, "fsdp::all_gather");
  if (!fsdp2()) return;
  if (in_backward_) {
    s_.tape->graph.Drop(flat);
    return;
  }
  if (forward_all_gather_state_ != kNoTensor) s_.tape->graph.Drop(forward_all_gather_state_);
  forward_all_gather_state_ = flat;
}

// FSDP2 issues a prefetch's all-gather (the flat output) and copies out
// later; FSDP1 gathers it whole.
void FsdpStrategy::Prefetch(int unit) {
  if (!fsdp2()) {
    Gather(unit);
    return;
  }
  Unit& u = units_[unit];
  if (u.gathered != kNoTensor || u.gather_bytes == 0) return;
  if (prefetched_output_.size() <= static_cast<size_t>(unit))
    prefetched_output_.resize(unit + 1, kNoTensor);
  if (prefetched_output_[unit] != kNoTensor) return;
  s_.tape->SetModule("fsdp.all_gather");
  prefetched_output_[unit] = s_.tape->graph.Alloc(u.gather_bytes, Category::kCommunication,
                                                  "fsdp::all_gather_output", s_.tape->module());
}

void FsdpStrategy::OnForwardUnit(int unit, bool begin) {
  const uint32_t saved_module = s_.tape->module();
  const int u = MapUnit(unit);
  if (begin) {
    Gather(u);
  } else if (unit == s_.num_layers + 1 && forward_all_gather_state_ != kNoTensor) {
    // The root's post-forward: FSDP2 drops the last AllGatherState.
    s_.tape->graph.Drop(forward_all_gather_state_);
    forward_all_gather_state_ = kNoTensor;
  } else if (u != 0 && s_.layout.fsdp != FsdpSharding::kGradOp) {
    // The root stays unsharded from forward into backward (FSDP1
    // _post_forward_reshard skips the root; FSDP2 reshard_after_forward=None
    // is False for the root); SHARD_GRAD_OP keeps every unit.
    Release(u);
  }
  s_.tape->graph.SetModule(saved_module);
}

// FSDP2 foreach_reduce (torch 2.4-2.11): the unsharded gradients are copied
// into one reduce-scatter input, freed, reduce-scattered into a 1/N output in
// reduce_dtype, then accumulated into the fp32 sharded .grad.
void FsdpStrategy::ReduceUnit(int unit) {
  Unit& u = units_[unit];
  Graph& g = s_.tape->graph;
  uint64_t bytes = 0;
  for (Param* p : u.params) bytes += p->grad != kNoTensor ? g.Bytes(p->grad) : 0;
  if (bytes == 0) return;
  s_.tape->SetModule("fsdp.reduce_scatter");
  const uint32_t module = s_.tape->module();
  // FSDP2 keeps the previous reduce-scatter's input as the ReduceScatterState
  // until the next post-backward (or the final callback) replaces it
  // (_fsdp_param_group.py post_backward, torch 2.4-2.13; seen in the 2.13 CPU
  // trace); FSDP1 frees it at once.
  if (fsdp2() && reduce_scatter_state_ != kNoTensor) {
    g.Drop(reduce_scatter_state_);
    reduce_scatter_state_ = kNoTensor;
  }
  const TensorId input =
      g.Alloc(bytes, Category::kCommunication, "fsdp::reduce_scatter_input", module);
  for (Param* p : u.params) {
    if (p->grad == kNoTensor) continue;
    g.Drop(p->grad);
    p->grad = kNoTensor;
  }
  // Without a separate reduce dtype FSDP2's sharded .grad are views of the
  // reduce-scatter output itself (the first backward of a step): allocated
  // here as the shards' gradients, no second copy.
  const bool output_is_grad = fsdp2() && !s_.mixed && s_.layout.offload == Offload::kNone;
  const TensorId output = output_is_grad
                              ? kNoTensor
                              : g.Alloc(CeilDiv(bytes, s_.world), Category::kCommunication,
                                        "fsdp::reduce_scatter_output", module);
  if (fsdp2()) {
    reduce_scatter_state_ = input;
  } else {
    g.Drop(input);
  }
  if (s_.layout.offload == Offload::kNone) {
    for (Param* p : u.params) {
      if (!p->trainable) continue;
      Param& shard = s_.shards[p - s_.tape->params.data()];
      if (shard.grad == kNoTensor) {
        shard.grad = g.Alloc(shard.numel * shard.elem_bytes, Category::kGradients,
                             "fsdp::sharded_grad", p->module);
      }
    }
  }
  if (output != kNoTensor) g.Drop(output);
}

void FsdpStrategy::AfterReleaseAll() {
  for (TensorId& t : prefetched_output_) {
    if (t != kNoTensor) s_.tape->graph.Drop(t);
    t = kNoTensor;
  }
  if (reduce_scatter_state_ != kNoTensor) {  // the root's final callback
    s_.tape->graph.Drop(reduce_scatter_state_);
    reduce_scatter_state_ = kNoTensor;
  }
}

}  // namespace

std::unique_ptr<ShardingStrategy> MakeFsdpStrategy(ShardState state) {
  return std::make_unique<FsdpStrategy>(std::move(state));
}

}  // namespace vramscope::lower
