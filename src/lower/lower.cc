#include "vramscope/lower.h"

#include <algorithm>
#include <memory>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "data_parallel.h"
#include "ops.h"
#include "rank_classes.h"
#include "optimizer.h"
#include "tape.h"
#include "encoder.h"
#include "transformer.h"

namespace vramscope {
namespace lower {
namespace {

uint8_t ParamBytes(Precision p) {
  switch (p) {
    case Precision::kFp16:
    case Precision::kBf16:
      return kHalf;
    default:
      return kF32;
  }
}

// The library versions whose code the lowering's rules were read from
// (docs/lowering.md): transformers 4.36 (the DynamicCache) to 5.24, torch 2.0
// to 2.13.
constexpr int kOldestTransformers = 436, kNewestTransformers = 524;
constexpr int kOldestTorch = 200, kNewestTorch = 213;

std::string VersionText(int v) { return fmt::format("{}.{}", v / 100, v % 100); }

Status Validate(const ModelSpec& m, const TrainingSetup& s) {
  auto bad = [](std::string msg) { return Status(MakeError(std::move(msg))); };
  if (s.batch == 0 || s.batch > 65536) return bad(fmt::format("--batch: {} is outside 1..65536", s.batch));
  if (s.seq == 0 || s.seq > (uint64_t{1} << 22)) return bad(fmt::format("--seq: {} is outside 1..4194304", s.seq));
  if (s.batch * s.seq > (uint64_t{1} << 26)) return bad(fmt::format("--batch x --seq: {} tokens per micro-batch is above the 67108864 limit", s.batch * s.seq));
  if (s.grad_accum == 0 || s.grad_accum > 4096) return bad(fmt::format("--grad-accum: {} is outside 1..4096", s.grad_accum));
  if (s.steps == 0 || s.steps > 16) return bad(fmt::format("--steps: {} is outside 1..16", s.steps));
  if (s.finetune != Finetune::kFull) {
    if (s.lora_rank == 0 || s.lora_rank > m.hidden_size)
      return bad(fmt::format("--lora-rank: {} must be between 1 and the hidden size {}", s.lora_rank, m.hidden_size));
    if (!(s.lora_dropout >= 0 && s.lora_dropout < 1))  // NaN fails too
      return bad(fmt::format("--lora-dropout: {} is outside [0, 1)", s.lora_dropout));
  }
  if (s.attn == Attention::kFlash && s.precision == Precision::kFp32)
    return bad("--attn flash: flash-attn 2 runs in fp16 / bf16 only; with --precision fp32 use sdpa or eager, or a 16-bit precision");
  if (s.finetune == Finetune::kQLora && s.precision == Precision::kFp32)
    return bad("--finetune qlora: needs a 16-bit compute dtype; use --precision bf16 or bf16-mixed, not fp32");
  if (s.optimizer_in_backward && s.optimizer == OptimizerKind::kNone)
    return bad("--optimizer-in-backward: needs an optimizer (--optimizer is none)");
  if (s.optimizer_in_backward && s.grad_accum > 1)
    return bad("--optimizer-in-backward: steps at every backward, so it cannot accumulate gradients (--grad-accum must be 1)");
  if (s.activation_offload && s.grad_ckpt != GradCkpt::kNone)
    return bad("--activation-offload: not modelled together with --grad-ckpt (use one or the other)");
  if (m.is_encoder && m.model_type != "bert")
    return bad(fmt::format("{}: encoder models other than bert (model_type '{}') are not lowered yet", m.name, m.model_type));
  if (m.is_encoder && s.loss != LossKind::kHf)
    return bad("--loss: chunked and fused-linear losses are modelled for causal LMs only, not for bert");
  if (!(s.moe_capacity_factor == 0 || (s.moe_capacity_factor >= 0.01 && s.moe_capacity_factor <= 64)))
    return bad(fmt::format("--moe-capacity-factor: {} is outside 0 (dropless) or 0.01..64", s.moe_capacity_factor));
  if (!(s.moe_imbalance >= 1 && s.moe_imbalance <= 1024))
    return bad(fmt::format("--moe-imbalance: {} is outside 1..1024", s.moe_imbalance));
  if (s.moe_capacity_factor > 0 && s.moe_imbalance != 1)
    return bad("--moe-imbalance: with --moe-capacity-factor every expert is capped (drop the imbalance or the capacity)");
  const ParallelLayout& l = s.parallel;
  const bool distributed = l.multi_gpu() || l.dp_mode != DataParallel::kNone;
  if (distributed && s.optimizer_in_backward)
    return bad("--optimizer-in-backward: not modelled with several GPUs (DDP, ZeRO, FSDP and Megatron hook the gradients themselves)");
  if (distributed && s.activation_offload && l.model_parallel())
    return bad("--activation-offload: not modelled with Megatron-style --tp/--pp/--cp/--ep");
  if (m.is_encoder && (l.dp_mode == DataParallel::kZero3 || l.dp_mode == DataParallel::kFsdp))
    return bad(fmt::format("--{}: parameter sharding is modelled for decoder models, not for {}",
                           l.dp_mode == DataParallel::kFsdp ? "fsdp" : "zero 3", m.name));
  if (l.sp && m.num_experts > 0)
    return bad("--sp: sequence parallelism with mixture-of-experts layers is not modelled yet");
  if (l.sp && (s.batch * s.seq / l.cp) % l.tp != 0)
    return bad(fmt::format("--sp: {} tokens per micro-batch per rank do not split over tp = {}", s.batch * s.seq / l.cp, l.tp));
  if (l.cp > 1 && s.attn == Attention::kEager)
    return bad("--cp: context parallelism needs --attn sdpa or flash (ring attention over flash kernels)");
  if (l.cp > 1 && s.seq % (2 * l.cp) != 0)
    return bad(fmt::format("--cp: --seq {} is not a multiple of 2 x cp = {} (Megatron splits the sequence into 2 x cp chunks)", s.seq, 2 * l.cp));
  if (m.num_heads == 0 || m.hidden_size == 0 || m.num_layers == 0 || m.vocab_size == 0)
    return bad(fmt::format("{}: the model config lacks hidden size, heads, layers or vocabulary", m.name));
  return Ok{};
}

// transformers >= 5.0 stores routed experts as 3-D nn.Parameters
// (`*Experts.gate_up_proj` [E, 2I, h], `down_proj` [E, h, I]), not nn.Linear:
// PEFT's target_modules ("all-linear" or gate/up/down names) no longer reach
// them, and bitsandbytes' replace_with_bnb_linear (nn.Linear / Conv1D only)
// leaves them unquantized.
bool IsStackedExpert(const ParamTensor& pt, int transformers_version) {
  return transformers_version >= 500 && IsRoutedExpert(pt.role);
}

bool IsLoraTarget(const ParamTensor& pt, const std::vector<std::string>& targets, int transformers_version) {
  if (!pt.is_linear_weight || IsStackedExpert(pt, transformers_version)) return false;
  for (const std::string& t : targets) {
    if (t == "all-linear") return pt.role != ParamRole::kLmHead && pt.role != ParamRole::kRouter;
    if (t == ParamRoleName(pt.role)) return true;
    if (t == "q" && pt.role == ParamRole::kQkv) return true;
    if ((t == "gate" || t == "up") && pt.role == ParamRole::kGateUp) return true;
  }
  return false;
}

}  // namespace
}  // namespace lower

namespace lower {
namespace {

// Whether a parameter belongs to the pipeline stage (all of them on one GPU):
// its layers, the embeddings on the first stage, the final norm and head on
// the last (a tied head: the last stage's copy of the embedding, as Megatron
// keeps one for the output layer).
bool InSpan(const ParamTensor& pt, const StageSpan& span, bool tied) {
  if (pt.layer >= 0) return static_cast<uint64_t>(pt.layer) >= span.first_layer &&
                            static_cast<uint64_t>(pt.layer) < span.end_layer;
  if (pt.role == ParamRole::kEmbed) return span.embed || (tied && span.head);
  if (IsInputSide(pt.role)) return span.embed;
  return span.head;
}

bool InStage(const ParamTensor& pt, const std::vector<StageSpan>& chunks, bool tied) {
  for (const StageSpan& span : chunks) {
    if (InSpan(pt, span, tied)) return true;
  }
  return false;
}

int UnitOf(const ParamTensor& pt, uint64_t num_layers) {
  if (pt.layer >= 0) return pt.layer + 1;
  if (IsInputSide(pt.role)) return 0;
  return static_cast<int>(num_layers) + 1;
}

// One rank class: `model` is the rank's (tensor/expert-sharded) model.
// Non-persistent buffers that model.to(device) places beside the parameters,
// where they are big enough to matter. GPT2Attention (transformers 4.x, 4.57.6
// modeling_gpt2.py __init__) registers a bool causal table `bias`
// [1, 1, n_positions, n_positions] and a scalar fp32 `masked_bias` in every
// layer: 1 MiB per layer at GPT-2's 1024 positions. transformers 5.x builds
// masks per call instead and registers neither.
void PlaceBuffers(Tape& tape, const ModelSpec& model, const TrainingSetup& setup,
                  const std::vector<StageSpan>& chunks) {
  if (model.model_type == "bert") {
    // BertEmbeddings: position_ids (arange(max_position_embeddings).expand(1, -1))
    // and token_type_ids (zeros of its size), int64, non-persistent buffers
    // moved to the device with the model (4.57.6 register_buffer, 5.24.0
    // nn.Buffer).
    tape.graph.SetModule(tape.graph.Intern("bert.embeddings"));
    for (int i = 0; i < 2; ++i) {
      tape.graph.Alloc(model.max_position_embeddings * kI64, Category::kParameters, "register_buffer",
                       tape.graph.module());
    }
    return;
  }
  if (model.model_type != "gpt2" || setup.transformers_version >= 500) return;
  const uint64_t positions = model.max_position_embeddings;
  for (const StageSpan& span : chunks) {
    const uint64_t end_layer = std::min<uint64_t>(span.end_layer, model.num_layers);
    for (uint64_t i = span.first_layer; i < end_layer; ++i) {
      tape.graph.SetModule(tape.graph.Intern(fmt::format("transformer.h.{}.attn", i)));
      tape.graph.Alloc(positions * positions, Category::kParameters, "register_buffer", tape.graph.module());
      tape.graph.Alloc(4, Category::kParameters, "register_buffer", tape.graph.module());
    }
  }
}

Result<Lowered> LowerRank(const ModelSpec& model, const TrainingSetup& setup, const GpuSpec& gpu,
                          const RankClassPlan& plan) {
  Lowered result;
  EventStream& out = result.stream;
  out.metadata()["source"] = "vramscope lower";
  out.metadata()["model"] = model.name;
  Tape tape(&out);
  const ParallelLayout& layout = setup.parallel;
  std::unique_ptr<DataParallelRuntime> dp;
  if (layout.multi_gpu() || layout.dp_mode != DataParallel::kNone) {
    const uint32_t world = layout.dp_mode == DataParallel::kFsdp && layout.fsdp == FsdpSharding::kHybrid
                               ? std::min(layout.dp(), layout.gpus_per_node)
                               : layout.dp();
    dp = std::make_unique<DataParallelRuntime>(&tape, setup, world, layout.model_parallel(), model.hidden_size,
                                               static_cast<int>(model.num_layers));
  }
  const bool half_model = dp && dp->casts_model_to_half();
  const uint8_t pbytes = half_model ? kHalf : ParamBytes(setup.precision);
  const bool lora = setup.finetune != Finetune::kFull;
  const bool qlora = setup.finetune == Finetune::kQLora;
  // QLoRA over FSDP / ZeRO-3 ("sharded QLoRA"): the 4-bit weights are loaded
  // with a 16-bit quant storage and the trainers never call
  // prepare_model_for_kbit_training ("one should never call
  // peft_module_casting_to_bf16 or prepare_model_for_kbit_training when doing
  // QLoRA + FSDP / DS-Zero3", TRL SFTTrainer / prepare_peft_model, 0.9-0.2x):
  // the other weights keep their 16-bit dtype, so the residual stream does too.
  const bool sharded_qlora = qlora && dp && (layout.dp_mode == DataParallel::kFsdp ||
                                             layout.dp_mode == DataParallel::kZero3);
  tape.autocast = !half_model && (setup.precision == Precision::kBf16Mixed || setup.precision == Precision::kFp16Mixed);
  tape.compute_bytes = setup.precision == Precision::kFp32 ? kF32 : kHalf;
  const std::vector<StageSpan>& chunks = plan.chunks;
  const bool whole_model = chunks.size() == 1 && chunks[0].first_layer == 0 && chunks[0].embed && chunks[0].head;
  const bool tied = std::none_of(model.params.begin(), model.params.end(),
                                 [](const ParamTensor& pt) { return pt.role == ParamRole::kLmHead; });

  // --- setup: parameters as from_pretrained / from_config place them --------
  tape.params.reserve(model.params.size() * 3);
  tape.lora_dropout = setup.lora_dropout;
  tape.cpu_rules = setup.device_rules == DeviceRules::kCpu;
  for (const ParamTensor& pt : model.params) {
    Param p;
    p.name = pt.name;
    // Outside the stage: a zero-byte placeholder keeps indices aligned with
    // model.params (IndexParams); it is frozen and never used.
    const bool here = InStage(pt, chunks, tied);
    p.unit = here ? UnitOf(pt, model.num_layers) : -1;
    p.module = out.Intern(pt.module);
    p.numel = pt.numel;
    p.elem_bytes = pbytes;
    p.trainable = !lora;
    p.storage_bytes = p.numel * p.elem_bytes;
    if (IsStackedExpert(pt, setup.transformers_version) && pt.layer >= 0) {
      p.stack = 1 + 2 * static_cast<uint32_t>(pt.layer) + (pt.role == ParamRole::kExpertDown ? 1 : 0);
    }
    if (qlora && pt.is_linear_weight && pt.role != ParamRole::kLmHead && !IsStackedExpert(pt, setup.transformers_version)) {
      // bitsandbytes NF4 with double quantization: 0.5 byte per weight, one
      // 8-bit absmax per 64 values, fp32 absmax per 256 of those (QLoRA paper §3).
      p.storage_bytes = p.numel / 2 + (p.numel + 63) / 64 + ((p.numel + 63) / 64 + 255) / 256 * 4;
      p.nf4 = true;
    } else if (qlora && !sharded_qlora) {
      // peft prepare_model_for_kbit_training casts non-quantized params to fp32.
      p.elem_bytes = kF32;
      p.storage_bytes = p.numel * kF32;
    }
    if (!here) {
      p.numel = 0;
      p.storage_bytes = 0;
      p.trainable = false;
    }
    tape.params.push_back(std::move(p));
  }
  tape.SetModule("model");
  for (Param& p : tape.params) {
    if (p.unit < 0) continue;  // not on this pipeline stage
    tape.graph.SetModule(p.module);
    p.var.t = tape.graph.Alloc(dp ? dp->StorageBytes(p) : p.storage_bytes, Category::kParameters,
                               "from_pretrained", p.module);
    p.var.numel = p.numel;
    p.var.elem_bytes = p.elem_bytes;
    if (p.trainable) p.var.fn = tape.graph.AddAccumulateGrad(p.numel * p.elem_bytes, &p.grad);
  }
  PlaceBuffers(tape, model, setup, chunks);
  // LoRA adapters: lora_A [r, in] and lora_B [out, r], trainable, fp32
  // (peft get_peft_model autocast_adapter_dtype=True upcasts 16-bit adapters).
  uint64_t lora_params = 0;
  if (lora) {
    const size_t base_count = tape.params.size();
    for (size_t i = 0; i < base_count; ++i) {
      const ParamTensor& pt = model.params[i];
      if (!IsLoraTarget(pt, setup.lora_targets, setup.transformers_version) || pt.shape.size() != 2) continue;
      if (tape.params[i].unit < 0) continue;
      lora_params += setup.lora_rank * (pt.shape[0] + pt.shape[1]);
      // lora_A [r, in], lora_B [out, r]; a Conv1D weight is stored [in, out]
      // (peft's fan_in_fan_out layers take in/out from it the same way).
      const uint64_t out_features = pt.conv1d ? pt.shape[1] : pt.shape[0];
      const uint64_t in_features = pt.conv1d ? pt.shape[0] : pt.shape[1];
      const uint64_t numels[2] = {setup.lora_rank * in_features, out_features * setup.lora_rank};
      for (int k = 0; k < 2; ++k) {
        Param ad;
        ad.name = pt.module + (k == 0 ? ".lora_A.default.weight" : ".lora_B.default.weight");
        ad.module = out.Intern(pt.module + (k == 0 ? ".lora_A" : ".lora_B"));
        ad.numel = numels[k];
        ad.elem_bytes = kF32;
        ad.storage_bytes = ad.numel * kF32;
        ad.trainable = true;
        ad.unit = tape.params[i].unit;
        tape.graph.SetModule(ad.module);
        ad.var.t = tape.graph.Alloc(dp ? dp->StorageBytes(ad) : ad.storage_bytes, Category::kParameters,
                                    "peft::lora", ad.module);
        ad.var.numel = ad.numel;
        ad.var.elem_bytes = kF32;
        (k == 0 ? tape.params[i].lora_a : tape.params[i].lora_b) = static_cast<int>(tape.params.size());
        tape.params.push_back(std::move(ad));
        Param& placed = tape.params.back();  // reserved above: addresses are stable
        placed.var.fn = tape.graph.AddAccumulateGrad(placed.storage_bytes, &placed.grad);
      }
    }
    if (lora_params == 0 && whole_model) {
      return MakeError(fmt::format("--lora-targets: none of '{}' matches a linear layer of {}",
                                   fmt::join(setup.lora_targets, ","), model.name));
    }
  }
  ModelParams mp;
  EncoderParams ep;
  if (model.is_encoder) {
    VS_TRY(indexed, IndexEncoderParams(model, tape.params));
    ep = indexed;
  } else {
    mp = IndexParams(model, tape.params);
  }
  if (!model.is_encoder && (!mp.embed || mp.layers.empty())) {
    return MakeError(fmt::format("{}: could not find the embedding and layers in its parameter list", model.name));
  }
  for (const StageSpan& span : chunks) {
    const size_t end_layer = std::min<size_t>(span.end_layer, mp.layers.size());
    for (size_t i = model.is_encoder ? end_layer : span.first_layer; i < end_layer; ++i) {
      const LayerParams& lp = mp.layers[i];
      const bool attn_ok = lp.qkv || (lp.q && lp.k && lp.v);
      if (!attn_ok || !lp.o || !lp.norm1) {
        return MakeError(fmt::format("{}: layer {} lacks attention or norm parameters", model.name, i));
      }
    }
  }

  uint64_t stage_params = 0;
  for (const Param& p : tape.params) stage_params += p.unit >= 0 && !p.name.empty() ? p.numel : 0;
  stage_params -= lora_params;
  result.parameters = stage_params + lora_params;
  result.trainable_parameters = lora ? lora_params : stage_params;
  OptimizerExtras extras;
  // cuBLAS workspaces: one per (handle, stream); the forward runs on the main
  // thread's handle, backward on the autograd engine thread's handle
  // (CublasHandlePool.cpp getCurrentCUDABlasHandle + getNewWorkspace).
  bool forward_workspace = false, backward_workspace = false;
  // torch.amp.GradScaler (torch 2.x, fp16 autocast only): scale() creates the
  // fp32 `_scale` and int32 `_growth_tracker` lazily at its first call and
  // keeps them; each scale() returns loss * scale (MulBackward0 saves the
  // scale tensor, not a copy).
  const bool grad_scaler = setup.precision == Precision::kFp16Mixed && !half_model;
  Var scaler_state[2];
  // Optimizer in backward (PyTorch tutorial "fuse the optimizer step into
  // the backward pass", torch >= 2.1): one single-parameter optimizer per
  // parameter, stepped and zeroed from register_post_accumulate_grad_hook, so
  // each .grad dies as soon as it is complete.
  std::unordered_map<TensorId*, Param*> param_of_grad;
  if (setup.optimizer_in_backward) {
    for (Param& p : tape.params) param_of_grad[&p.grad] = &p;
    tape.graph.post_accumulate_hook = [&](TensorId* slot) {
      auto it = param_of_grad.find(slot);
      if (it == param_of_grad.end() || *slot == kNoTensor) return;
      OptimizerStepParams(tape, setup, {it->second}, &extras);
      tape.graph.Drop(*slot);  // optimizer.zero_grad(set_to_none=True)
      *slot = kNoTensor;
    };
  }
  if (dp) dp->Setup();
  // Micro-batches per step: a pipeline's --microbatches, else --grad-accum.
  const uint64_t requested_micro_batches =
      layout.pp > 1 && layout.microbatches > 0 ? layout.microbatches : setup.grad_accum;
  // A pipeline stage in 1F1B steady state repeats one forward + one backward
  // with the same micro-batches in flight; after the warm-up, two such pairs
  // show every memory state the rest would repeat (the cooldown drains the
  // same way whatever the count).
  const uint64_t micro_batches = layout.pp > 1 && chunks.size() == 1
                                     ? std::min<uint64_t>(requested_micro_batches, plan.warmup + 2)
                                     : requested_micro_batches;
  if (micro_batches < requested_micro_batches) {
    result.notes.push_back(fmt::format(
        "pipeline: {} of {} micro-batches per step simulated on each stage; 1F1B repeats the same memory "
        "pattern after its warm-up", micro_batches, requested_micro_batches));
  }
  // Forwards whose backward has not run, per model chunk.
  std::vector<std::vector<ForwardOut>> in_flight(chunks.size());
  uint32_t step = 1;
  auto forward = [&](size_t chunk) {
    const StageSpan& span = chunks[chunk];
    out.BeginPhase(step, Phase::kForward);
    if (!forward_workspace && gpu.cublas_workspace_bytes > 0 && !tape.cpu_rules) {
      tape.SetModule("cublas");
      tape.graph.Alloc(gpu.cublas_workspace_bytes, Category::kWorkspace, "cublas_workspace", tape.module());
      forward_workspace = true;
    }
    tape.graph.offload_saved = setup.activation_offload;
    ForwardOut f = model.is_encoder ? EncoderForward(tape, model, ep, setup)
                                    : Forward(tape, model, mp, setup, span);
    ClearAutocastCache(tape);
    tape.graph.offload_saved = false;
    if (grad_scaler) {
      tape.SetModule("grad_scaler");
      if (scaler_state[0].t == kNoTensor) {
        scaler_state[0] = tape.New(1, kF32, Category::kOther, "GradScaler._scale");
        scaler_state[1] = tape.New(1, 4, Category::kOther, "GradScaler._growth_tracker");
      }
      Var scaled = Mul(tape, f.loss, scaler_state[0], "aten::mul");
      tape.Drop(f.loss);
      f.loss = scaled;
    }
    if (!span.head) {
      // Megatron deallocate_output_tensor (core 0.x, deallocate_pipeline_outputs):
      // once sent, the output's storage is freed; its grad_fn stays.
      tape.graph.Drop(f.loss.t);
      f.loss.t = kNoTensor;
    }
    in_flight[chunk].push_back(f);
  };
  auto backward = [&](size_t chunk) {
    const StageSpan& span = chunks[chunk];
    ForwardOut f = in_flight[chunk].front();
    in_flight[chunk].erase(in_flight[chunk].begin());
    out.BeginPhase(step, Phase::kBackward);
    if (!backward_workspace && gpu.cublas_workspace_bytes > 0 && !tape.cpu_rules) {
      tape.SetModule("cublas");
      tape.graph.Alloc(gpu.cublas_workspace_bytes, Category::kWorkspace, "cublas_workspace", tape.module());
      backward_workspace = true;
    }
    if (span.head) {
      tape.graph.Backward(f.loss);
      tape.Drop(f.loss);
    } else {
      // The gradient received from the next stage seeds this stage's backward.
      tape.SetModule("pipeline");
      tape.graph.Backward(f.loss, "pp::recv_grad", Category::kTemporaries);
    }
    // The graph goes: leaves made by enable_input_require_grads and their .grad.
    // Only this micro-batch's leaves: theirs have a .grad now. (Slots stay:
    // micro-batches still in flight hold their addresses.)
    for (size_t i = 0; i < tape.input_grads.size(); ++i) {
      if (tape.input_grads[i] == kNoTensor) continue;
      tape.graph.Drop(tape.input_grads[i]);
      tape.input_grads[i] = kNoTensor;
      tape.graph.Drop(tape.input_leaves[i]);
      tape.input_leaves[i] = kNoTensor;
    }
    if (dp) dp->EndBackward();
  };
  for (; step <= setup.steps; ++step) {
    // 1F1B (Megatron schedules.py): warm-up forwards, then one forward and
    // one backward at a time, then the remaining backwards. One GPU: F, B.
    // Interleaved (v chunks): the k-th forward runs chunk (k mod (pp*v)) / pp,
    // the k-th backward the reverse (schedules.py get_model_chunk_id).
    const uint64_t v = chunks.size();
    const uint64_t units = micro_batches * v;
    const uint64_t warmup = std::min<uint64_t>(plan.warmup, units);
    const uint64_t group = uint64_t{layout.pp} * v;
    auto chunk_of = [&](uint64_t k, bool forward_pass) -> size_t {
      const uint64_t c = v == 1 ? 0 : (k % group) / layout.pp;
      return static_cast<size_t>(forward_pass ? c : v - 1 - c);
    };
    uint64_t forwards = 0, backwards = 0;
    for (uint64_t i = 0; i < warmup; ++i) forward(chunk_of(forwards++, true));
    for (uint64_t i = warmup; i < units; ++i) {
      forward(chunk_of(forwards++, true));
      backward(chunk_of(backwards++, false));
    }
    for (uint64_t i = 0; i < warmup; ++i) backward(chunk_of(backwards++, false));
    out.BeginPhase(step, Phase::kOptimizer);
    Var found_inf;
    if (grad_scaler) {
      // scaler.step -> unscale_: found_inf = torch.full((), 0.0); inv_scale =
      // _scale.double().reciprocal().float(); grads unscaled in place by
      // _amp_foreach_non_finite_check_and_unscale_. update() works in place.
      tape.SetModule("grad_scaler");
      found_inf = tape.New(1, kF32, Category::kOther, "aten::full");
      Var as_double = tape.New(1, 8, Category::kTemporaries, "aten::_to_copy");
      Var recip = tape.New(1, 8, Category::kTemporaries, "aten::reciprocal");
      tape.Drop(as_double);
      Var inv_scale = tape.New(1, kF32, Category::kTemporaries, "aten::_to_copy");
      tape.Drop(recip);
      tape.Drop(inv_scale);
    }
    if (dp) {
      dp->Step(setup, &extras);
    } else if (!setup.optimizer_in_backward) {
      OptimizerStep(tape, setup, step == 1, &extras);
    }
    if (grad_scaler) tape.Drop(found_inf);  // after scaler.update()
    if (dp) {
      dp->ZeroGrad();
    } else {
      ZeroGrad(tape);
    }
  }
  result.managed_bytes = extras.managed_state_bytes;
  result.host_peak_bytes = tape.graph.host_peak_bytes() + (dp ? dp->host_bytes() : 0);
  if (lora) result.notes.push_back("LoRA adapters are counted; their forward is modelled as part of the frozen linear (detailed PEFT paths: see docs/lowering.md).");
  if (qlora) {
    // transformers 5.x stacks each MoE layer's experts into 3-D parameters;
    // replace_with_bnb_linear (integrations/bitsandbytes.py, 5.24.0) swaps only
    // nn.Linear / Conv1D modules for bnb ones, so the experts stay 16-bit.
    uint64_t expert_bytes = 0;  // as this rank holds them
    for (size_t i = 0; i < model.params.size() && i < tape.params.size(); ++i) {
      if (IsStackedExpert(model.params[i], setup.transformers_version)) expert_bytes += tape.params[i].storage_bytes;
    }
    if (expert_bytes > 0) {
      result.notes.push_back(fmt::format(
          "QLoRA under transformers 5.x does not quantize this model's experts: they are stacked 3-D parameters, "
          "and bitsandbytes replaces nn.Linear layers only (integrations/bitsandbytes.py), so {:.2f} GiB of experts "
          "stay unquantized (fp32 after prepare_model_for_kbit_training). transformers 4.x "
          "(--transformers-version 4.57) keeps one nn.Linear per expert, which is quantized.",
          static_cast<double>(expert_bytes) / static_cast<double>(uint64_t{1} << 30)));
    }
  }
  if (dp) {
    for (const std::string& n : dp->notes()) result.notes.push_back(n);
  }
  return result;
}

}  // namespace
}  // namespace lower

Result<std::vector<LoweredRank>> LowerRankClasses(const ModelSpec& model, const TrainingSetup& setup,
                                                  const GpuSpec& gpu, const RankClassCallback& each) {
  using namespace lower;
  if (Status s = Validate(model, setup); !s.ok()) return s.error();
  if (Status s = ValidateLayout(setup.parallel); !s.ok()) return s.error();
  VS_TRY(local, ShardModel(model, setup));
  TrainingSetup local_setup = setup;
  // Context parallelism: each rank holds seq / cp tokens of every sample
  // (Megatron-LM / Transformer Engine ring attention).
  local_setup.seq = setup.seq / setup.parallel.cp;
  VS_TRY(plans, PlanRankClasses(local, local_setup));
  // Rank classes share nothing mutable: lowered concurrently, one thread each,
  // and each handed to `each` on its own thread as soon as it is lowered.
  std::vector<LoweredRank> out(plans.size());
  std::vector<Status> status(plans.size(), Ok{});
  auto work = [&](size_t i) {
    const RankClassPlan& plan = plans[i];
    auto lowered = LowerRank(local, local_setup, gpu, plan);
    if (!lowered.ok()) {
      status[i] = lowered.error();
      return;
    }
    LoweredRank& r = out[i];
    r.rank_class = plan.name;
    r.ranks = plan.ranks;
    r.nccl_bytes = NcclBytes(setup.parallel);
    r.lowered = std::move(lowered.value());
    if (setup.parallel.model_parallel()) {
      for (const std::string& n : local.notes) {
        if (std::find(model.notes.begin(), model.notes.end(), n) == model.notes.end()) r.lowered.notes.push_back(n);
      }
      // The report counts the whole model's parameters, not one rank's.
      uint64_t adapters = 0;
      if (setup.finetune != Finetune::kFull) {
        for (const ParamTensor& pt : model.params) {
          if (IsLoraTarget(pt, setup.lora_targets, setup.transformers_version) && pt.shape.size() == 2)
            adapters += setup.lora_rank * (pt.shape[0] + pt.shape[1]);
        }
      }
      r.lowered.parameters = model.ParameterCount() + adapters;
      r.lowered.trainable_parameters = adapters > 0 ? adapters : model.ParameterCount();
    }
    if (each) status[i] = each(i, r);
  };
  std::vector<std::thread> workers;
  for (size_t i = 1; i < plans.size(); ++i) workers.emplace_back(work, i);
  work(0);
  for (std::thread& w : workers) w.join();
  for (const Status& st : status) {
    if (!st.ok()) return st.error();
  }
  return out;
}

std::vector<std::string> SetupWarnings(const ModelSpec& model, const TrainingSetup& setup) {
  std::vector<std::string> out;
  if (model.max_position_embeddings > 0 && setup.seq > model.max_position_embeddings) {
    if (model.position == PositionKind::kLearned) {
      out.push_back(fmt::format("--seq {} is beyond {}'s {} learned positions: the real model would fail "
                                "(position index out of range); estimated as asked",
                                setup.seq, model.name, model.max_position_embeddings));
    } else {
      out.push_back(fmt::format("--seq {} is beyond {}'s max_position_embeddings {}: estimated as asked, "
                                "but the model was not trained on positions that far",
                                setup.seq, model.name, model.max_position_embeddings));
    }
  }
  const int tv = setup.transformers_version, pv = setup.torch_version;
  if (tv < lower::kOldestTransformers || tv > lower::kNewestTransformers) {
    out.push_back(fmt::format("--transformers-version {} is outside {}..{}, the releases the lowering's rules "
                              "were read from: estimated with the nearest behaviour",
                              lower::VersionText(tv), lower::VersionText(lower::kOldestTransformers), lower::VersionText(lower::kNewestTransformers)));
  }
  if (pv < lower::kOldestTorch || pv > lower::kNewestTorch) {
    out.push_back(fmt::format("--torch-version {} is outside {}..{}, the releases the lowering's rules were "
                              "read from: estimated with the nearest behaviour",
                              lower::VersionText(pv), lower::VersionText(lower::kOldestTorch), lower::VersionText(lower::kNewestTorch)));
  }
  return out;
}

Result<Lowered> LowerTraining(const ModelSpec& model, const TrainingSetup& setup, const GpuSpec& gpu) {
  VS_TRY(ranks, LowerRankClasses(model, setup, gpu));
  return std::move(ranks.front().lowered);
}

}  // namespace vramscope
