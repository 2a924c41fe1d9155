#include "data_parallel.h"

#include <algorithm>
#include <unordered_map>

#include <fmt/format.h>

#include "int_math.h"

namespace vramscope::lower {
namespace {

bool IsZero(DataParallel m) {
  return m == DataParallel::kZero1 || m == DataParallel::kZero2 || m == DataParallel::kZero3;
}

// "model.layers.12.mlp" -> 12; -1 when the module is not in a decoder layer.
int LayerOfModule(std::string_view m) {
  constexpr std::string_view kPrefix = "model.layers.";
  if (m.substr(0, kPrefix.size()) != kPrefix) return -1;
  int layer = 0;
  size_t i = kPrefix.size();
  if (i >= m.size() || m[i] < '0' || m[i] > '9') return -1;
  for (; i < m.size() && m[i] >= '0' && m[i] <= '9'; ++i) layer = layer * 10 + (m[i] - '0');
  return layer;
}

}  // namespace

DataParallelRuntime::DataParallelRuntime(Tape* tape, const TrainingSetup& setup, uint32_t world,
                                         bool megatron, uint64_t hidden_size, int num_layers)
    : tape_(tape),
      mode_(setup.parallel.dp_mode),
      layout_(setup.parallel),
      world_(std::max<uint32_t>(1, world)),
      megatron_(megatron),
      hidden_(hidden_size),
      num_layers_(num_layers),
      mixed_(setup.precision == Precision::kBf16Mixed || setup.precision == Precision::kFp16Mixed) {}

bool DataParallelRuntime::casts_model_to_half() const {
  // DeepSpeed engine._configure_distributed_model: module.half()/.bfloat16()
  // (0.14-0.16); FSDP MixedPrecision(param_dtype=bf16) gathers half
  // parameters; Megatron keeps bf16/fp16 params with fp32 main params.
  return mixed_ && (megatron_ || IsZero(mode_) || mode_ == DataParallel::kFsdp);
}

uint64_t DataParallelRuntime::StorageBytes(const Param& p) const {
  const uint64_t full = p.storage_bytes;
  // bitsandbytes Params4bit (QLoRA): what is flattened, sharded and gathered
  // is the packed 4-bit storage (bnb_4bit_quant_storage, 0.43+; FSDP-QLoRA),
  // not numel values of the compute dtype.
  if (p.nf4 && (mode_ == DataParallel::kZero3 || mode_ == DataParallel::kFsdp)) {
    if (layout_.offload != Offload::kNone && mode_ == DataParallel::kFsdp) return 0;
    return CeilDiv(full, world_);
  }
  if (mode_ == DataParallel::kZero3) {
    // stage3_param_persistence_threshold: smaller params stay whole on every
    // rank (partition_parameters.py, ds_persist).
    if (p.numel < layout_.zero.PersistenceThreshold(hidden_)) return full;
    if (layout_.offload == Offload::kParams) return 0;  // partitions in host memory
    return CeilDiv(p.numel, world_) * p.elem_bytes;
  }
  if (mode_ == DataParallel::kFsdp) {
    if (layout_.offload != Offload::kNone) return 0;  // CPUOffload: sharded params on the host
    // accelerate upcasts trainable params to fp32 before sharding (FSDP1 and
    // FSDP2 "Upcast to fp32 master weights", accelerate 0.30-1.x).
    const uint64_t shard_elem = mixed_ && p.trainable ? 4 : p.elem_bytes;
    return CeilDiv(p.numel, world_) * shard_elem;
  }
  return full;
}

int DataParallelRuntime::FsdpUnit(int unit) const {
  if (mode_ != DataParallel::kFsdp) return unit;
  return unit == num_layers_ + 1 ? 0 : unit;
}

int DataParallelRuntime::UnitOfModule(uint32_t module) {
  if (module >= unit_of_module_.size()) unit_of_module_.resize(module + 1, -2);
  int& u = unit_of_module_[module];
  if (u != -2) return u;
  const std::string_view m = tape_->out()->String(module);
  const int layer = LayerOfModule(m);
  if (layer >= 0) {
    u = layer + 1;
  } else if (m == "model" || m == "model.embed_tokens" || m == "model.rotary_emb" || m == "pipeline" ||
             m.substr(0, 18) == "model.embed_tokens") {
    u = 0;
  } else {
    u = num_layers_ + 1;  // final norm, lm_head, loss
  }
  u = FsdpUnit(u);
  return u;
}

void DataParallelRuntime::Setup() {
  AssignUnits();
  tape_->SetModule(megatron_ ? "megatron" : std::string(DataParallelName(mode_)));
  if (megatron_) {
    SetupMegatron();
  } else if (mode_ == DataParallel::kDdp) {
    SetupDdp();
  } else if (IsZero(mode_)) {
    SetupZero();
  } else if (mode_ == DataParallel::kFsdp) {
    SetupFsdp();
  }
  if (mode_ == DataParallel::kZero3 && layout_.offload == Offload::kParams) {
    host_bytes_ += CeilDiv(TrainableElements(), world_) * (mixed_ ? 2 : 4);
  }

  tape_->unit_hook = [this](int unit, bool begin) { OnForwardUnit(unit, begin); };
  if (mode_ == DataParallel::kZero3 || mode_ == DataParallel::kFsdp) {
    tape_->graph.pre_node_hook = [this](uint32_t module) { OnBackwardNode(module); };
  }
  for (Param& p : tape_->params) param_of_slot_owner_.push_back(&p);
  tape_->graph.post_accumulate_hook = [this](TensorId* slot) { OnGradAccumulated(slot); };
}

// Each unit's parameters and what gathering it allocates (ZeRO-3 / FSDP).
void DataParallelRuntime::AssignUnits() {
  units_.assign(num_layers_ + 2, Unit{});
  const bool zero3 = mode_ == DataParallel::kZero3;
  const bool fsdp = mode_ == DataParallel::kFsdp;
  std::vector<uint64_t> largest(units_.size(), 0);
  for (Param& p : tape_->params) {
    if (p.unit < 0) continue;
    const int u = FsdpUnit(p.unit);
    Unit& unit = units_[u];
    unit.params.push_back(&p);
    // A 4-bit weight is gathered as its packed storage (StorageBytes).
    const uint64_t gathered_bytes = p.nf4 ? p.storage_bytes : p.numel * p.elem_bytes;
    if (zero3 && p.numel >= layout_.zero.PersistenceThreshold(hidden_)) {
      unit.gather_bytes += gathered_bytes;
      largest[u] = std::max(largest[u], gathered_bytes);
    }
    if (fsdp) unit.gather_bytes += p.nf4 ? p.storage_bytes : p.numel * (mixed_ ? 2 : p.elem_bytes);
  }
  if (zero3 && layout_.zero.zero_init) {
    // ZeRO-3 fetches per sub-module (fetch_sub_module) and prefetches at most
    // stage3_prefetch_bucket_size elements ahead, so a layer's gathered set is
    // bounded by its largest module plus the prefetch bucket
    // (partitioned_param_coordinator.py, DeepSpeed 0.14-0.16).
    const uint64_t prefetch = layout_.zero.PrefetchBucket(hidden_) * (mixed_ ? 2 : 4);
    for (size_t u = 0; u < units_.size(); ++u) {
      units_[u].gather_bytes = std::min(units_[u].gather_bytes, largest[u] + prefetch);
    }
  }
}

TensorId DataParallelRuntime::AllocBuffer(uint64_t bytes, Category c, std::string_view op) {
  return tape_->graph.Alloc(bytes, c, op, tape_->module());
}

uint64_t DataParallelRuntime::TrainableElements() const {
  uint64_t trainable = 0;
  for (const Param& p : tape_->params) trainable += p.trainable ? p.numel : 0;
  return trainable;
}

void DataParallelRuntime::SetupMegatron() {
  const uint32_t module = tape_->module();
  const uint64_t trainable = TrainableElements();
  const uint64_t part = CeilDiv(trainable, world_);
  // Megatron-LM core DistributedDataParallel (core 0.5-0.13): one
  // contiguous fp32 grad buffer (_ParamAndGradBuffer.grad_data) for all
  // params, main_grad views into it; the optimizer's fp32 main params are
  // clones (Float16OptimizerWithFloat16Params), sharded over dp with the
  // distributed optimizer (--zero 1).
  main_grads_.push_back(AllocBuffer(trainable * 4, Category::kGradients, "megatron::grad_buffer"));
  const uint64_t master = mode_ == DataParallel::kZero1 ? part : trainable;
  if (mixed_) buffers_.push_back(AllocBuffer(master * 4, Category::kOptimizerState, "megatron::main_params"));
  shards_.emplace_back();
  shards_.back().numel = master;
  shards_.back().elem_bytes = 4;
  shards_.back().module = module;
}

void DataParallelRuntime::SetupDdp() {
  // torch DistributedDataParallel Reducer (torch 2.x): gradients are copied
  // into flat buckets allocated at construction, the first of
  // dist._DEFAULT_FIRST_BUCKET_BYTES (1 MiB), the rest of bucket_cap_mb, in
  // reverse parameter order.
  uint64_t cap = 1 << 20, filled = 0;
  for (auto it = tape_->params.rbegin(); it != tape_->params.rend(); ++it) {
    if (!it->trainable) continue;
    filled += it->numel * it->elem_bytes;
    if (filled >= cap) {
      buffers_.push_back(AllocBuffer(filled, Category::kCommunication, "ddp::bucket"));
      filled = 0;
      cap = layout_.ddp_bucket_cap_mb << 20;
    }
  }
  if (filled > 0) buffers_.push_back(AllocBuffer(filled, Category::kCommunication, "ddp::bucket"));
}

void DataParallelRuntime::SetupZero() {
  const uint32_t module = tape_->module();
  const uint64_t part = CeilDiv(TrainableElements(), world_);
  // fp32 master partition (stage_1_and_2.py single_partition_of_fp32_groups;
  // stage3.py _create_fp32_partitions), on the host with offload_optimizer.
  const bool offload = layout_.offload != Offload::kNone;
  if (mode_ == DataParallel::kZero3 && !layout_.zero.zero_init) {
    // No zero.Init: engine._configure_distributed_model moves the whole
    // half model to the GPU before Init(module=...) partitions it and
    // frees each full parameter (DeepSpeed 0.14.2 engine.py).
    uint64_t full = 0;
    for (const Param& p : tape_->params) full += p.numel * p.elem_bytes;
    tape_->graph.Drop(AllocBuffer(full, Category::kParameters, "deepspeed::module.to(device)"));
  }
  if (mode_ == DataParallel::kZero3) {
    // Sub-groups: partitions accumulated until >= sub_group_size (stage3.py
    // _create_fp16_sub_groups); each steps on its own.
    uint64_t acc = 0;
    for (const Param& p : tape_->params) {
      if (!p.trainable) continue;
      acc += CeilDiv(p.numel, world_);
      if (acc >= layout_.zero.sub_group_size) {
        shards_.emplace_back();
        shards_.back().numel = acc;
        acc = 0;
      }
    }
    if (acc > 0) {
      shards_.emplace_back();
      shards_.back().numel = acc;
    }
  } else {
    shards_.emplace_back();
    shards_.back().numel = part;
  }
  for (Param& s : shards_) {
    s.elem_bytes = mixed_ ? 4 : tape_->params.front().elem_bytes;
    s.module = module;
    s.trainable = true;
    if (!mixed_) continue;
    if (offload) {
      host_bytes_ += s.numel * 4;
    } else {
      buffers_.push_back(AllocBuffer(s.numel * 4, Category::kOptimizerState, "zero::fp32_partition"));
    }
  }
  if (mode_ == DataParallel::kZero3) {
    const uint8_t grad_bytes = mixed_ ? 2 : 4;
    if (offload) {
      host_bytes_ += part * 4;  // fp32 gradient partitions, pinned
    } else {
      // grad_partitions_flat_buffer in the gradient accumulation dtype (the
      // model's half dtype by default, engine.get_data_types()).
      grad_partition_ = AllocBuffer(part * grad_bytes, Category::kGradients, "zero3::grad_partitions");
    }
    if (layout_.zero.contiguous_gradients) {
      const uint64_t elems = layout_.zero.ReduceBucket(hidden_);
      ipg_bucket_ = AllocBuffer(elems * grad_bytes, Category::kCommunication, "zero3::ipg_bucket");
    }
  }
  // Host: Adam moments (DeepSpeedCPUAdam, lazily created), and for stages
  // 1-2 the pinned fp32 gradient partition (initialize_optimizer_states)
  // and temp_grad_buffer_for_cpu_offload (largest param, half).
  if (offload) host_bytes_ += 8 * part;
  if (offload && mode_ != DataParallel::kZero3) {
    // stage_1_and_2.py (0.14.2): temp_grad_buffer_for_gpu_offload, the
    // largest parameter's numel in the half dtype, persistent.
    uint64_t largest = 0;
    for (const Param& p : tape_->params) largest = std::max(largest, p.trainable ? p.numel : 0);
    buffers_.push_back(AllocBuffer(largest * (mixed_ ? 2 : 4), Category::kCommunication, "zero::temp_grad_buffer"));
    largest_numel_ = largest;
    host_bytes_ += 4 * part + largest * (mixed_ ? 2 : 4);
  }
}

void DataParallelRuntime::SetupFsdp() {
  const uint64_t part = CeilDiv(TrainableElements(), world_);
  // What the optimizer sees: one sharded parameter per parameter (FSDP2
  // per-parameter DTensor shards; FSDP1's flat shard steps the same bytes).
  for (const Param& p : tape_->params) {
    shards_.emplace_back();
    Param& s = shards_.back();
    s.numel = CeilDiv(p.numel, world_);
    s.elem_bytes = mixed_ && p.trainable ? 4 : p.elem_bytes;
    s.module = p.module;
    s.trainable = p.trainable;
  }
  // CPUOffload / CPUOffloadPolicy: sharded params, grads and optimizer on
  // the host (fp32 params + grads + Adam moments).
  if (layout_.offload != Offload::kNone) host_bytes_ += part * 16;
}

bool DataParallelRuntime::KeptAcrossTurn(int unit) const {
  // ZeRO-3 keeps a module's params gathered when they are used again within
  // stage3_max_reuse_distance elements of the trace (__params_to_release);
  // between a unit's forward and its backward lie the forward and the
  // backward of every later unit.
  uint64_t distance = 0;
  for (size_t u = unit + 1; u < units_.size(); ++u) {
    for (const Param* p : units_[u].params) distance += 2 * p->numel;
  }
  return distance < layout_.zero.max_reuse_distance;
}

void DataParallelRuntime::Gather(int unit) {
  Unit& u = units_[unit];
  if (u.gathered != kNoTensor || u.gather_bytes == 0) return;
  const bool fsdp2 = mode_ == DataParallel::kFsdp && layout_.fsdp_version == 2;
  tape_->SetModule(mode_ == DataParallel::kFsdp ? "fsdp.all_gather" : "zero3.all_gather");
  // FSDP2 (_fsdp_collectives.py foreach_all_gather / foreach_all_gather_copy_out,
  // _fsdp_param_group.py wait_for_unshard; torch 2.4-2.13, seen in the 2.13 CPU
  // trace): all_gather_copy_in allocates one flat output of the whole unit
  // (each rank's input is a view into it); the copy-out then fills every
  // parameter's unsharded storage. In forward the output is kept as the
  // AllGatherState until the next unit's copy-out; in backward it is freed at
  // once.
  TensorId flat = kNoTensor;
  if (fsdp2) {
    if (prefetched_output_.size() > static_cast<size_t>(unit) && prefetched_output_[unit] != kNoTensor) {
      flat = prefetched_output_[unit];
      prefetched_output_[unit] = kNoTensor;
    } else {
      flat = tape_->graph.Alloc(u.gather_bytes, Category::kCommunication, "fsdp::all_gather_output",
                                tape_->module());
    }
  }
  u.gathered = tape_->graph.Alloc(u.gather_bytes, Category::kParameters,
                                  mode_ == DataParallel::kFsdp ? "fsdp::all_gather" : "zero3::all_gather",
                                  tape_->module());
  if (!fsdp2) return;
  if (in_backward_) {
    tape_->graph.Drop(flat);
    return;
  }
  if (forward_all_gather_state_ != kNoTensor) tape_->graph.Drop(forward_all_gather_state_);
  forward_all_gather_state_ = flat;
}

void DataParallelRuntime::Prefetch(int unit) {
  if (mode_ != DataParallel::kFsdp || layout_.fsdp_version != 2) {
    Gather(unit);
    return;
  }
  Unit& u = units_[unit];
  if (u.gathered != kNoTensor || u.gather_bytes == 0) return;
  if (prefetched_output_.size() <= static_cast<size_t>(unit)) prefetched_output_.resize(unit + 1, kNoTensor);
  if (prefetched_output_[unit] != kNoTensor) return;
  tape_->SetModule("fsdp.all_gather");
  prefetched_output_[unit] = tape_->graph.Alloc(u.gather_bytes, Category::kCommunication,
                                                "fsdp::all_gather_output", tape_->module());
}

void DataParallelRuntime::Release(int unit) {
  if (unit < 0) return;
  Unit& u = units_[unit];
  if (u.gathered == kNoTensor) return;
  tape_->graph.Drop(u.gathered);
  u.gathered = kNoTensor;
}

void DataParallelRuntime::OnForwardUnit(int unit, bool begin) {
  const bool zero3 = mode_ == DataParallel::kZero3;
  const bool fsdp = mode_ == DataParallel::kFsdp;
  if (!zero3 && !fsdp) return;
  const uint32_t saved_module = tape_->module();
  const int u = FsdpUnit(unit);
  if (begin) {
    Gather(u);
  } else if (fsdp && unit == num_layers_ + 1 && forward_all_gather_state_ != kNoTensor) {
    // The root's post-forward: FSDP2 drops the last AllGatherState.
    tape_->graph.Drop(forward_all_gather_state_);
    forward_all_gather_state_ = kNoTensor;
  } else if (fsdp) {
    // The root stays unsharded from forward into backward (FSDP1
    // _post_forward_reshard skips the root; FSDP2 reshard_after_forward=None
    // is False for the root); SHARD_GRAD_OP keeps every unit.
    if (u != 0 && layout_.fsdp != FsdpSharding::kGradOp) Release(u);
  } else if (!KeptAcrossTurn(u) && (layout_.zero.zero_init || u == 0)) {
    // Without zero.Init the gathered Linear weights stay referenced by
    // autograd until their backward (DeepSpeed 0.14.2-0.16.4: the memory
    // saving linear of partition_parameters.py is installed only inside
    // Init.__enter__); the embedding saves no weight.
    Release(u);
  }
  tape_->graph.SetModule(saved_module);
}

void DataParallelRuntime::OnBackwardNode(uint32_t module) {
  const int unit = UnitOfModule(module);
  if (unit == backward_unit_) return;
  const uint32_t saved_module = tape_->module();
  if (!in_backward_) {
    in_backward_ = true;
    // FSDP2's root pre-backward prefetches the last layer (the first whose
    // backward runs).
    if (mode_ == DataParallel::kFsdp && layout_.fsdp_version == 2 && num_layers_ > 0 &&
        static_cast<size_t>(num_layers_) < units_.size()) {
      Prefetch(num_layers_);
    }
  }
  // FSDP's root unit (embeddings, final norm, head) finishes its backward only
  // with the embedding, at the very end: its gradients are reduced in
  // EndBackward (FSDP2's root post-backward; FSDP1's flat parameter hook fires
  // once all of its gradients exist), and it stays gathered.
  const bool root = mode_ == DataParallel::kFsdp && backward_unit_ == 0;
  if (backward_unit_ >= 0 && !root) {
    ReduceUnit(backward_unit_);
    Release(backward_unit_);
  }
  backward_unit_ = unit;
  Gather(unit);
  // FSDP backward prefetch (FSDP1 BACKWARD_PRE default; FSDP2 prefetches
  // one module in reverse post-forward order): the next unit is gathered
  // while this one computes.
  if (mode_ == DataParallel::kFsdp && unit > 1) Prefetch(unit - 1);
  tape_->graph.SetModule(saved_module);
}

void DataParallelRuntime::ReduceUnit(int unit) {
  Unit& u = units_[unit];
  if (mode_ == DataParallel::kZero3) {
    // Gradients are copied into the ipg bucket and reduce-scattered into the
    // persistent partition buffer; the full gradients are freed
    // (stage3.py __add_grad_to_ipg_bucket / __reduce_and_partition_ipg_grads).
    for (Param* p : u.params) {
      if (p->grad == kNoTensor) continue;
      tape_->graph.Drop(p->grad);
      p->grad = kNoTensor;
    }
    return;
  }
  if (mode_ != DataParallel::kFsdp) return;
  // FSDP2 foreach_reduce (torch 2.4-2.11): the unsharded gradients are copied
  // into one reduce-scatter input, freed, reduce-scattered into a 1/N output
  // in reduce_dtype, then accumulated into the fp32 sharded .grad.
  uint64_t bytes = 0;
  for (Param* p : u.params) bytes += p->grad != kNoTensor ? tape_->graph.Bytes(p->grad) : 0;
  if (bytes == 0) return;
  tape_->SetModule("fsdp.reduce_scatter");
  const uint32_t module = tape_->module();
  const bool fsdp2 = layout_.fsdp_version == 2;
  // FSDP2 keeps the previous reduce-scatter's input as the ReduceScatterState
  // until the next post-backward (or the final callback) replaces it
  // (_fsdp_param_group.py post_backward, torch 2.4-2.13; seen in the 2.13 CPU
  // trace); FSDP1 frees it at once.
  if (fsdp2 && reduce_scatter_state_ != kNoTensor) {
    tape_->graph.Drop(reduce_scatter_state_);
    reduce_scatter_state_ = kNoTensor;
  }
  const TensorId input = tape_->graph.Alloc(bytes, Category::kCommunication, "fsdp::reduce_scatter_input", module);
  for (Param* p : u.params) {
    if (p->grad == kNoTensor) continue;
    tape_->graph.Drop(p->grad);
    p->grad = kNoTensor;
  }
  // Without a separate reduce dtype FSDP2's sharded .grad are views of the
  // reduce-scatter output itself (the first backward of a step): allocated
  // here as the shards' gradients, no second copy.
  const bool output_is_grad = fsdp2 && !mixed_ && layout_.offload == Offload::kNone;
  const TensorId output = output_is_grad ? kNoTensor
                                         : tape_->graph.Alloc(CeilDiv(bytes, world_), Category::kCommunication,
                                                              "fsdp::reduce_scatter_output", module);
  if (fsdp2) {
    reduce_scatter_state_ = input;
  } else {
    tape_->graph.Drop(input);
  }
  if (layout_.offload == Offload::kNone) {
    for (Param* p : u.params) {
      if (!p->trainable) continue;
      Param& shard = shards_[p - tape_->params.data()];
      if (shard.grad == kNoTensor) {
        shard.grad = tape_->graph.Alloc(shard.numel * shard.elem_bytes, Category::kGradients,
                                        "fsdp::sharded_grad", p->module);
      }
    }
  }
  if (output != kNoTensor) tape_->graph.Drop(output);
}

void DataParallelRuntime::EndBackward() {
  const uint32_t saved_module = tape_->module();
  for (TensorId t : ipg_) tape_->graph.Drop(t);
  ipg_.clear();
  if (backward_unit_ >= 0) ReduceUnit(backward_unit_);
  if (mode_ == DataParallel::kFsdp && backward_unit_ != 0 && !units_.empty()) ReduceUnit(0);
  for (size_t u = 0; u < units_.size(); ++u) Release(static_cast<int>(u));
  for (TensorId& t : prefetched_output_) {
    if (t != kNoTensor) tape_->graph.Drop(t);
    t = kNoTensor;
  }
  if (reduce_scatter_state_ != kNoTensor) {  // the root's final callback
    tape_->graph.Drop(reduce_scatter_state_);
    reduce_scatter_state_ = kNoTensor;
  }
  backward_unit_ = -1;
  in_backward_ = false;
  tape_->graph.SetModule(saved_module);
}

void DataParallelRuntime::OnGradAccumulated(TensorId* slot) {
  if (*slot == kNoTensor) return;
  const bool view = mode_ == DataParallel::kDdp && layout_.gradient_as_bucket_view;
  if (megatron_ || view) {
    // Megatron: the backward hook adds .grad into main_grad and sets it to
    // None (gradient_accumulation_fusion writes the weight gradient there
    // directly). DDP gradient_as_bucket_view: .grad is a view of its bucket.
    tape_->graph.Drop(*slot);
    *slot = megatron_ ? kNoTensor : tape_->graph.Alloc(0, Category::kGradients, "ddp::bucket_view", tape_->module());
    return;
  }
  if (mode_ != DataParallel::kZero1 && mode_ != DataParallel::kZero2) return;
  const uint32_t saved_module = tape_->module();
  tape_->SetModule("zero");
  const uint32_t module = tape_->module();
  const uint8_t grad_bytes = mixed_ ? 2 : 4;
  if (ipg_.empty()) {
    // stage_1_and_2.py backward() (0.14.2-0.16.4): with contiguous_gradients
    // (forced on by cpu offload) one ipg buffer of reduce_bucket_size
    // elements per backward, two with overlap_comm (off by default for
    // stages 1-2), freed in the reduction epilogue.
    const uint64_t elems = layout_.zero.ReduceBucket(hidden_);
    const int count = layout_.zero.overlap_comm == 1 ? 2 : 1;
    for (int i = 0; i < count; ++i) {
      ipg_.push_back(tape_->graph.Alloc(elems * grad_bytes, Category::kCommunication, "zero::ipg_buffer", module));
    }
  }
  if (layout_.offload != Offload::kNone && largest_numel_ > 0 &&
      tape_->graph.Bytes(*slot) == largest_numel_ * grad_bytes) {
    // The worst data-parallel rank: the one whose partition holds the largest
    // parameter runs _has_inf_or_nan on its whole gradient (.float() copy,
    // isnan, isinf, or, .float(): about 11 bytes per element at once;
    // stage_1_and_2.py update_overflow_tracker_for_param_grad, offload path).
    const TensorId check = tape_->graph.Alloc(largest_numel_ * 11, Category::kTemporaries, "zero::has_inf_or_nan", module);
    tape_->graph.Drop(check);
  }
  {
    if (mode_ == DataParallel::kZero2 && layout_.offload == Offload::kNone && grad_partition_ == kNoTensor) {
      uint64_t trainable = 0;
      for (const Param& p : tape_->params) trainable += p.trainable ? p.numel : 0;
      grad_partition_ = tape_->graph.Alloc(CeilDiv(trainable, world_) * grad_bytes, Category::kGradients,
                                           "zero2::grads_in_partition", module);
    }
  }
  if (mode_ == DataParallel::kZero2) {
    // Reduced into the partition buffer (or the pinned host buffer with
    // offload); param.grad = None.
    tape_->graph.Drop(*slot);
    *slot = kNoTensor;
  }
  tape_->graph.SetModule(saved_module);
}

void DataParallelRuntime::Step(const TrainingSetup& setup, OptimizerExtras* extras) {
  tape_->SetModule("optimizer");
  const uint32_t module = tape_->module();
  if (mode_ == DataParallel::kDdp || (mode_ == DataParallel::kNone && !megatron_)) {
    OptimizerStep(*tape_, setup, false, extras);
    return;
  }
  if (mode_ == DataParallel::kFsdp) {
    if (layout_.offload != Offload::kNone) return;  // the CPU steps
    std::vector<Param*> with_grad;
    for (Param& s : shards_) {
      if (s.grad != kNoTensor) with_grad.push_back(&s);
    }
    OptimizerStepParams(*tape_, setup, with_grad, extras);
    return;
  }
  TrainingSetup fused = setup;
  if (megatron_) {
    // Megatron steps with its fused Adam (Apex / Transformer Engine
    // FusedAdam): no foreach temporaries; grads are the main_grad views.
    if (setup.optimizer == OptimizerKind::kAdamW || setup.optimizer == OptimizerKind::kAdamWForLoop) {
      fused.optimizer = OptimizerKind::kAdamWFused;
    }
    for (Param& s : shards_) {
      s.grad = tape_->graph.Alloc(0, Category::kGradients, "megatron::main_grad_view", module);
      OptimizerStepParams(*tape_, fused, {&s}, extras);
      tape_->graph.Drop(s.grad);
      s.grad = kNoTensor;
    }
    return;
  }
  // DeepSpeed ZeRO: per sub-group (stage 3) or per param group (stages 1-2),
  // the half gradients are flattened and cast to an fp32 gradient
  // (stage3.py _prepare_fp32_grad_for_sub_group; stage_1_and_2.py step:
  // flatten(...).to(fp32)), the optimizer steps the fp32 partition, the
  // result is copied into the half partition and the fp32 gradient freed.
  const bool offload = layout_.offload != Offload::kNone;
  for (Param& s : shards_) {
    if (offload) {
      // The CPU optimizer steps; stage 1-2 copies the updated fp32 partition
      // back through a device fp32 copy (fp32_partition.to(device)).
      if (mode_ != DataParallel::kZero3) {
        const TensorId back = tape_->graph.Alloc(s.numel * 4, Category::kTemporaries, "zero::fp32_to_device", module);
        tape_->graph.Drop(back);
      }
      continue;
    }
    const TensorId flat = tape_->graph.Alloc(s.numel * (mixed_ ? 2 : 4), Category::kTemporaries, "zero::flatten", module);
    s.grad = tape_->graph.Alloc(s.numel * 4, Category::kTemporaries, "zero::fp32_grad", module);
    tape_->graph.Drop(flat);
    OptimizerStepParams(*tape_, setup, {&s}, extras);
    tape_->graph.Drop(s.grad);
    s.grad = kNoTensor;
  }
}

void DataParallelRuntime::ZeroGrad() {
  for (Param& s : shards_) {
    if (mode_ == DataParallel::kFsdp && s.grad != kNoTensor) {
      tape_->graph.Drop(s.grad);
      s.grad = kNoTensor;
    }
  }
  lower::ZeroGrad(*tape_);
}

}  // namespace vramscope::lower
