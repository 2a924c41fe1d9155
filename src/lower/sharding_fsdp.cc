// PyTorch FSDP: FSDP1 (FullyShardedDataParallel, flat parameters) and FSDP2
// (fully_shard, per-parameter DTensor shards), as accelerate wraps them.
#include <algorithm>

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
    return CeilDiv(p.numel, s_.world) * ShardElemBytes(p);
  }

  // A parameter's element size as FSDP stores its shard. Under *-mixed the
  // model is in fp32 (the frozen base as loaded; accelerate upcasts trainable
  // parameters to fp32 before sharding: fsdp2_prepare_model, and FSDP1's
  // prepare_model, accelerate 1.15) and MixedPrecision casts only what it
  // gathers; sharded QLoRA keeps its 16-bit weights (PlaceParameters).
  uint8_t ShardElemBytes(const Param& p) const {
    if (s_.mixed && (p.trainable || !s_.qlora)) return 4;
    return p.elem_bytes;
  }

  // MixedPrecision(param_dtype=bf16) gathers the fp32 adapters in half, so
  // they compute in half; PEFT reads `lora_A.weight.dtype` before lora_A's own
  // forward runs, which under PEFT's wrap policy is an FSDP1 unit of its own
  // still showing its sharded fp32 parameter (use_orig_params): it casts its
  // input to fp32 and accelerate's autocast casts it back for the matmul. In
  // a gathered layer (FSDP2; FSDP1 wrapping layers) PEFT sees the half weight.
  void OnAdaptersPlaced(std::vector<Param>* params) const override {
    if (!s_.mixed) return;
    for (Param& p : *params) {
      if (!p.trainable || p.nf4 || p.elem_bytes == kHalf || !s_.peft) continue;
      p.peft_view_bytes = !fsdp2() && PeftPolicy() ? p.elem_bytes : kHalf;
      p.var.elem_bytes = kHalf;
    }
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

  // MixedPrecision(param_dtype=bf16) gathers half parameters; 4-bit: the
  // packed storage. FSDP1 under PEFT's wrap policy (the HF Trainer's
  // update_fsdp_plugin_peft, transformers 5.24 distributed/fsdp.py; peft
  // 0.21.2 utils/other.py fsdp_auto_wrap_policy) makes every adapter weight a
  // unit of its own, gathered around its own use: a few KiB, left out of the
  // layer's gather.
  uint64_t GatheredBytes(const Param& p) const override {
    if (!fsdp2() && PeftPolicy() && p.trainable) return 0;
    return p.nf4 ? p.storage_bytes : p.numel * (s_.mixed ? 2 : p.elem_bytes);
  }

  // The FSDP units ("groups") as accelerate 1.15-1.16 makes them, by the
  // lowering's unit (0 embeddings, 1..L layers, L+1 final norm + head):
  // - FSDP1 (FullyShardedDataParallel + TRANSFORMER_BASED_WRAP): each layer;
  //   the root holds the embeddings, the final norm and the head (0).
  // - FSDP2 (utils/fsdp_utils.py fsdp2_prepare_model): each layer; the input
  //   embedding a unit of its own unless tied (0); [final norm, lm_head] one
  //   group with reshard_after_forward=False (L+1), the tied embedding in it
  //   (0 then); the root gets what is left.
  // - FSDP2 with a PEFT model through the HF Trainer: fsdp2_prepare_auto_wrap_policy
  //   knows only transformer_auto_wrap_policy and size_based_auto_wrap_policy,
  //   not the _or_policy PEFT's fsdp_auto_wrap_policy returns, so no layer is
  //   wrapped: every decoder layer (and its adapters) is in the root
  //   (kRootLayers), gathered for the whole step.
  int MapUnit(int unit) const override {
    const bool layer = unit >= 1 && unit <= s_.num_layers;
    if (RootLayers() && layer) return kRootLayers;
    const bool head = unit == s_.num_layers + 1;
    if (head && (!fsdp2() || s_.tied_embeddings)) return 0;
    return unit;
  }
  static constexpr int kRootLayers = 1;
  bool PeftPolicy() const { return s_.peft && s_.layout.fsdp_wrap == FsdpWrap::kTrainer; }
  bool RootLayers() const { return fsdp2() && PeftPolicy(); }
  bool Root(int group) const {
    return (RootLayers() && group == kRootLayers) ||
           (group == 0 && (!fsdp2() || s_.tied_embeddings));
  }
  // The root stays unsharded from forward into backward (FSDP1
  // _post_forward_reshard skips the root; FSDP2 reshard_after_forward=None is
  // False for the root), accelerate's FSDP2 tail group is made with False, and
  // SHARD_GRAD_OP keeps every unit.
  bool ReshardedAfterForward(int group) const {
    if (s_.layout.fsdp == FsdpSharding::kGradOp || Root(group)) return false;
    return !(fsdp2() && group == s_.num_layers + 1);
  }
  // The root's gradients are reduced once its whole backward is done: FSDP2's
  // root post-backward at the end, FSDP1's flat-parameter hook once the
  // embedding's gradient exists.
  bool ReducedAtEnd(int group) const override { return Root(group); }
  // FSDP1 allocates the padded unsharded flat parameter on _unshard_stream
  // and frees it at reshard after record_stream on the computation stream
  // (_flat_param.py _alloc_padded_unsharded_flat_param,
  // _free_unsharded_flat_param; torch 2.4-2.13). FSDP2 copies out into
  // per-parameter storages on the current stream and never calls
  // record_stream (_fsdp_param.py alloc_all_gather_outputs).
  uint32_t GatheredStream() const override { return fsdp2() ? kDefaultStream : kGatherStream; }
  bool ReleaseRecordsDefaultStream() const override { return !fsdp2(); }

  void SetupBuffers() override;
  void Gather(int unit) override;
  void Prefetch(int unit) override;
  void ReduceUnit(int unit) override;
  void OnForwardUnit(int unit, bool begin) override;

  // FSDP2's root pre-backward, at the first backward node, prefetches the
  // group before the root in post-forward order. Only the layers-in-root
  // layout has parameters in the real root: accelerate's tail group (tied
  // embeddings included) is a group of its own whose pre-backward waits for
  // the logits' gradient (AfterBackwardGather).
  void OnBackwardStart() override {
    if (RootLayers()) PrefetchBefore(kRootLayers);
  }
  // Backward prefetch: FSDP2 prefetches the group before this one in
  // post-forward order (_fsdp_param_group.py _backward_prefetch, torch
  // 2.6-2.13); FSDP1 only with backward_prefetch=BACKWARD_PRE, the previous
  // unit in forward order, which under PEFT's wrap policy is an adapter's
  // unit, not a layer. BACKWARD_POST gathers the next unit after this one's
  // reshard: no overlap, as without prefetch.
  void AfterBackwardGather(int unit) override {
    if (fsdp2()) {
      PrefetchBefore(unit);
    } else if (s_.layout.fsdp_backward_prefetch == FsdpPrefetch::kPre && !PeftPolicy() &&
               unit > 1) {
      Prefetch(unit - 1);
    }
  }
  void PrefetchBefore(int group) {
    for (size_t i = 1; i < post_forward_order_.size(); ++i) {
      if (post_forward_order_[i] == group) Prefetch(post_forward_order_[i - 1]);
    }
  }
  // The root's gradients are reduced here unless its backward was the last.
  void BeforeReleaseAll() override {
    for (size_t g = 0; g < units_.size(); ++g) {
      const int group = static_cast<int>(g);
      if (group != backward_unit_ && Root(group)) ReduceUnit(group);
    }
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
  // FSDP1 CPUOffload: each unit's device copy of its sharded parameter,
  // alive from its unshard to its reshard; and the sharded gradients kept on
  // the device until the end of backward.
  std::vector<TensorId> staged_shard_;
  std::vector<TensorId> offloaded_grads_;
  std::vector<TensorId> staged_inputs_;  // FSDP2 CPUOffloadPolicy: the unit being gathered
  std::vector<std::optional<uint64_t>> mp_shard_done_;  // FSDP1: freed _mp_shard per unit
  // FSDP2's groups in the order their forward ends: the per-unit groups as
  // the forward runs, the root last.
  std::vector<int> post_forward_order_;

  uint64_t ShardBytes(const Unit& u, bool half) const;
  // Returns the _mp_shard that post_unshard frees (kNoTensor without
  // mixed precision: the staged copy stays until reshard).
  TensorId StageFsdp1Offload(int unit);
  void StageFsdp2Offload(const Unit& u);
  void ReleaseStaged(int unit);
  void AfterRelease(int unit) override { ReleaseStaged(unit); }
  TensorId AllocFlatOutput(const Unit& u);
  void DropUnshardedGrads(Unit& u);
  void AllocShardedGrads(const Unit& u);
};

// Bytes of a unit's sharded parameters as FSDP stores them: fp32 for
// trainable parameters under mixed precision (accelerate's upcast), or
// the half dtype when `half`.
uint64_t FsdpStrategy::ShardBytes(const Unit& u, bool half) const {
  uint64_t bytes = 0;
  for (const Param* p : u.params) {
    const uint64_t elem = half ? kHalf : ShardElemBytes(*p);
    bytes += CeilDiv(p->numel, s_.world) * elem;
  }
  return bytes;
}

// FSDP1 CPUOffload(offload_params=True), torch 2.4-2.13 (_runtime_utils.py
// _unshard, _flat_param.py pre_unshard / _use_low_precision_shard /
// flat_param_to): on _pre_unshard_stream the pinned host shard is copied to
// the device. With MixedPrecision the copy is a full-precision temporary
// cast into the low-precision _mp_shard, which the all-gather reads on the
// unshard stream (record_stream) and post_unshard frees; without it the
// device copy is the flat parameter's data until reshard.
TensorId FsdpStrategy::StageFsdp1Offload(int unit) {
  Graph& g = s_.tape->graph;
  const uint32_t module = s_.tape->module();
  const Unit& u = units_[unit];
  const TensorId copy = g.Alloc(ShardBytes(u, false), Category::kParameters,
                                "fsdp::h2d_sharded_param", module, kPreUnshardStream);
  if (!s_.mixed) {
    if (staged_shard_.size() <= static_cast<size_t>(unit))
      staged_shard_.resize(unit + 1, kNoTensor);
    staged_shard_[unit] = copy;
    return kNoTensor;
  }
  const TensorId mp_shard = g.Alloc(ShardBytes(u, true), Category::kParameters, "fsdp::mp_shard",
                                    module, kPreUnshardStream);
  g.Drop(copy);
  return mp_shard;
}

// FSDP2 CPUOffloadPolicy, torch 2.6-2.13 (_fsdp_param.py all_gather_inputs,
// _fsdp_collectives.py foreach_all_gather): on the copy-in stream every
// sharded parameter is copied to the device (fp32 after accelerate's upcast)
// and cast to param_dtype; the casts are copied into the flat all-gather
// output and deleted.
void FsdpStrategy::StageFsdp2Offload(const Unit& u) {
  Graph& g = s_.tape->graph;
  const uint32_t module = s_.tape->module();
  TensorId input = g.Alloc(ShardBytes(u, false), Category::kParameters, "fsdp::h2d_sharded_param",
                           module, kGatherStream);
  if (s_.mixed) {
    const TensorId cast = g.Alloc(ShardBytes(u, true), Category::kParameters,
                                  "fsdp::all_gather_input", module, kGatherStream);
    g.Drop(input);
    input = cast;
  }
  staged_inputs_.push_back(input);  // freed once the flat output holds it
}

// At reshard (inside the unit's release group): FSDP1 offload's staged device
// shard goes (flat_param.data = _local_shard drops it; the unshard stream
// read it, record_stream in _all_gather_flat_param), and a freed _mp_shard's
// event completes with the unit's.
void FsdpStrategy::ReleaseStaged(int unit) {
  if (static_cast<size_t>(unit) < mp_shard_done_.size() && mp_shard_done_[unit]) {
    released_.Add(mp_shard_done_[unit]);
    mp_shard_done_[unit].reset();
  }
  if (static_cast<size_t>(unit) >= staged_shard_.size() || staged_shard_[unit] == kNoTensor) return;
  released_.Add(s_.tape->graph.DropUsedOn(staged_shard_[unit], kGatherStream));
  staged_shard_[unit] = kNoTensor;
}

void FsdpStrategy::SetupBuffers() {
  AssignUnits();
  post_forward_order_.clear();
  for (int unit = 0; unit <= s_.num_layers + 1; ++unit) {
    const int group = MapUnit(unit);
    if (Root(group) || units_[group].params.empty()) continue;
    if (std::find(post_forward_order_.begin(), post_forward_order_.end(), group) ==
        post_forward_order_.end())
      post_forward_order_.push_back(group);
  }
  for (int group = 0; group <= s_.num_layers + 1; ++group) {
    if (Root(group)) post_forward_order_.push_back(group);
  }
  auto& names = s_.tape->out()->metadata();
  names["stream.1"] = fsdp2() ? "all-gather copy-in (FSDP2)" : "unshard (FSDP1)";
  names["stream.2"] = fsdp2() ? "reduce-scatter (FSDP2)" : "post-backward (FSDP1)";
  if (!fsdp2() && s_.layout.offload != Offload::kNone) names["stream.3"] = "pre-unshard (FSDP1)";
  // What the optimizer sees: one sharded parameter per parameter (FSDP2
  // per-parameter DTensor shards; FSDP1's flat shard steps the same bytes).
  for (const Param& p : s_.tape->params) {
    s_.shards.emplace_back();
    Param& s = s_.shards.back();
    s.numel = CeilDiv(p.numel, s_.world);
    s.elem_bytes = ShardElemBytes(p);
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
  const bool offload = s_.layout.offload != Offload::kNone;
  TensorId flat = kNoTensor;
  TensorId mp_shard = kNoTensor;
  if (fsdp2()) {
    if (prefetched_output_.size() > static_cast<size_t>(unit) &&
        prefetched_output_[unit] != kNoTensor) {
      flat = prefetched_output_[unit];
      prefetched_output_[unit] = kNoTensor;
    } else {
      flat = AllocFlatOutput(u);
    }
  } else {
    WaitForOldestRelease();
    if (offload) mp_shard = StageFsdp1Offload(unit);
  }
  AllocGathered(u, "fsdp::all_gather");
  if (mp_shard != kNoTensor) {
    // post_unshard: the all-gather read it on the unshard stream. Its event
    // completes with the unit's reshard (stream order: the gather precedes
    // the unit's compute).
    if (mp_shard_done_.size() <= static_cast<size_t>(unit)) mp_shard_done_.resize(unit + 1);
    mp_shard_done_[unit] = s_.tape->graph.DropUsedOn(mp_shard, kGatherStream);
  }
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
  prefetched_output_[unit] = AllocFlatOutput(u);
}

// FSDP2's flat all-gather output, on the copy-in stream (implicit forward /
// backward prefetch, _fsdp_param_group.py get_all_gather_streams), after the
// offloaded inputs are staged; freed without record_stream (the streams wait
// on the copy-out event instead).
TensorId FsdpStrategy::AllocFlatOutput(const Unit& u) {
  Graph& g = s_.tape->graph;
  if (s_.layout.offload != Offload::kNone) {
    StageFsdp2Offload(u);
  } else if (s_.mixed) {
    // MixedPrecisionPolicy(param_dtype=bf16) over fp32 shards: all_gather_inputs
    // casts each shard to param_dtype (_fsdp_param.py, torch 2.6-2.13) and
    // foreach_all_gather copies the casts into the flat output, then drops them.
    staged_inputs_.push_back(g.Alloc(ShardBytes(u, true), Category::kParameters,
                                     "fsdp::all_gather_input", s_.tape->module(), kGatherStream));
  }
  const TensorId flat = g.Alloc(u.gather_bytes, Category::kCommunication, "fsdp::all_gather_output",
                                s_.tape->module(), kGatherStream);
  for (TensorId t : staged_inputs_) g.Drop(t);
  staged_inputs_.clear();
  return flat;
}

void FsdpStrategy::OnForwardUnit(int unit, bool begin) {
  const uint32_t saved_module = s_.tape->module();
  const int u = MapUnit(unit);
  // FSDP2's root pre-forward gathers the root group before any other unit runs.
  if (begin && unit == 0 && RootLayers()) Gather(kRootLayers);
  if (begin) {
    Gather(u);
  } else if (unit == s_.num_layers + 1 && forward_all_gather_state_ != kNoTensor) {
    // The root's post-forward: FSDP2 drops the last AllGatherState.
    s_.tape->graph.Drop(forward_all_gather_state_);
    forward_all_gather_state_ = kNoTensor;
  } else if (ReshardedAfterForward(u)) {
    Release(u);
  }
  s_.tape->graph.SetModule(saved_module);
}

// FSDP2 foreach_reduce (torch 2.4-2.11): the unsharded gradients are copied
// into one reduce-scatter input (current stream), freed, reduce-scattered
// into a 1/N output in reduce_dtype on reduce_scatter_stream, then
// accumulated into the fp32 sharded .grad (allocated there too). FSDP1
// _post_backward_hook (torch 2.4-2.13): on _post_backward_stream the padded
// gradient and the sharded output are allocated, and the autograd gradient,
// read there, is freed after record_stream(_post_backward_stream).
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
  const TensorId input = g.Alloc(bytes, Category::kCommunication, "fsdp::reduce_scatter_input",
                                 module, fsdp2() ? kDefaultStream : kReduceStream);
  DropUnshardedGrads(u);
  // Without a separate reduce dtype FSDP2's sharded .grad are views of the
  // reduce-scatter output itself (the first backward of a step): allocated
  // here as the shards' gradients, no second copy.
  const bool output_is_grad = fsdp2() && !s_.mixed && s_.layout.offload == Offload::kNone;
  const TensorId output = output_is_grad
                              ? kNoTensor
                              : g.Alloc(CeilDiv(bytes, s_.world), Category::kCommunication,
                                        "fsdp::reduce_scatter_output", module, kReduceStream);
  if (fsdp2()) {
    reduce_scatter_state_ = input;
  } else {
    g.Drop(input);
  }
  if (s_.layout.offload == Offload::kNone) {
    AllocShardedGrads(u);
  } else if (!fsdp2() && output != kNoTensor) {
    // FSDP1 CPUOffload: the device _saved_grad_shard stays until
    // _post_backward_final_callback (prepare_gradient_for_optim); the
    // offload copy reads it on the same stream.
    offloaded_grads_.push_back(output);
    return;
  }
  if (output != kNoTensor) g.Drop(output);
}

void FsdpStrategy::DropUnshardedGrads(Unit& u) {
  Graph& g = s_.tape->graph;
  // Completed reduces: at most two in flight (assumed like DeepSpeed's
  // max_param_reduce_events; docs/parallel.md).
  if (!fsdp2() && reduced_grads_.groups() > 2) reduced_grads_.CompleteOldest(g);
  for (Param* p : u.params) {
    if (p->grad == kNoTensor) continue;
    if (fsdp2()) {
      g.Drop(p->grad);  // unsharded_grads.clear(): same stream, no record_stream
    } else {
      reduced_grads_.Add(g.DropUsedOn(p->grad, kReduceStream));
    }
    p->grad = kNoTensor;
  }
  reduced_grads_.EndGroup();
}

void FsdpStrategy::AllocShardedGrads(const Unit& u) {
  Graph& g = s_.tape->graph;
  for (Param* p : u.params) {
    if (!p->trainable) continue;
    Param& shard = s_.shards[p - s_.tape->params.data()];
    if (shard.grad == kNoTensor) {
      shard.grad = g.Alloc(shard.numel * shard.elem_bytes, Category::kGradients,
                           "fsdp::sharded_grad", p->module, kReduceStream);
    }
  }
}

void FsdpStrategy::AfterReleaseAll() {
  for (TensorId t : offloaded_grads_) s_.tape->graph.Drop(t);
  offloaded_grads_.clear();
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
