#include "placement.h"

#include <algorithm>
#include <array>
#include <map>

#include <fmt/format.h>

namespace vramscope::lower {

// transformers >= 5.0 stores routed experts as 3-D nn.Parameters
// (`*Experts.gate_up_proj` [E, 2I, h], `down_proj` [E, h, I]), not nn.Linear:
// PEFT's target_modules ("all-linear" or gate/up/down names) no longer reach
// them, and bitsandbytes' replace_with_bnb_linear (nn.Linear / Conv1D only)
// leaves them unquantized.
bool IsStackedExpert(const ParamTensor& pt, int transformers_version) {
  return transformers_version >= 500 && IsRoutedExpert(pt.role);
}

bool IsLoraTarget(const ParamTensor& pt, const std::vector<std::string>& targets,
                  int transformers_version) {
  if (!pt.is_linear_weight || IsStackedExpert(pt, transformers_version)) return false;
  for (const std::string& t : targets) {
    if (t == "all-linear") return pt.role != ParamRole::kLmHead && pt.role != ParamRole::kRouter;
    if (t == ParamRoleName(pt.role)) return true;
    if (t == "q" && pt.role == ParamRole::kQkv) return true;
    if ((t == "gate" || t == "up") && pt.role == ParamRole::kGateUp) return true;
  }
  return false;
}

uint64_t LoraAdapterParams(const ParamTensor& pt, const TrainingSetup& setup) {
  if (setup.finetune == Finetune::kFull || pt.shape.size() != 2) return 0;
  if (!IsLoraTarget(pt, setup.lora_targets, setup.transformers_version)) return 0;
  return setup.lora_rank * (pt.shape[0] + pt.shape[1]);
}

namespace {

// Whether a parameter belongs to the pipeline stage (all of them on one GPU):
// its layers, the embeddings on the first stage, the final norm and head on
// the last (a tied head: the last stage's copy of the embedding, as Megatron
// keeps one for the output layer).
bool InSpan(const ParamTensor& pt, const StageSpan& span, bool tied) {
  if (pt.layer >= 0)
    return static_cast<uint64_t>(pt.layer) >= span.first_layer &&
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

// LitGPT's GPT.cos / GPT.sin (litgpt/model.py 0.5.13, max_seq_length's
// setter, build_rope_cache): non-persistent [max_seq_length, rope_n_elem]
// buffers, fp32 (`torch.arange(seq_len).float()`). The fine-tuning scripts set
// `model.max_seq_length = min(longest_seq_length, ...)` after fabric.setup:
// below block_size (max_position_embeddings) that rebuilds them, fp32, at the
// longest row (--seq); at block_size they stay as Fabric converted them
// (bf16-true / 16-true: half).
void PlaceLitgptRopeCache(Tape& tape, const ModelSpec& model, const TrainingSetup& setup) {
  const uint64_t rows = std::min<uint64_t>(setup.seq, model.max_position_embeddings);
  const bool converted =
      setup.seq >= model.max_position_embeddings &&
      (setup.precision == Precision::kBf16 || setup.precision == Precision::kFp16);
  const uint8_t bytes = converted ? kHalf : kF32;
  tape.graph.SetModule(tape.graph.Intern("model"));
  for (Var* v : {&tape.rope_cos, &tape.rope_sin}) {
    *v = tape.New(rows * model.head_dim, bytes, Category::kParameters, "register_buffer");
  }
}

// Non-persistent buffers that model.to(device) places beside the parameters,
// where they are big enough to matter. GPT2Attention (transformers 4.x, 4.57.6
// modeling_gpt2.py __init__) registers a bool causal table `bias`
// [1, 1, n_positions, n_positions] and a scalar fp32 `masked_bias` in every
// layer: 1 MiB per layer at GPT-2's 1024 positions. transformers 5.x builds
// masks per call instead and registers neither.
void PlaceBuffers(Tape& tape, const ModelSpec& model, const TrainingSetup& setup,
                  const std::vector<StageSpan>& chunks) {
  if (setup.impl == ModelImpl::kLitgpt) {
    PlaceLitgptRopeCache(tape, model, setup);
    return;
  }
  if (setup.impl == ModelImpl::kTorchtune) {
    // torchtune's rotary cache (RotaryPositionalEmbeddings / Llama3ScaledRoPE
    // rope_init, 0.6.1): [max_seq_len, head_dim / 2, 2] fp32, one module
    // shared by every layer (the component builders make one `rope`).
    // Qwen2RotaryPositionalEmbeddings keeps cos and sin of the whole head_dim:
    // [max_seq_len, 2 * head_dim] fp32.
    // Each module also has its theta [head_dim / 2] fp32. The LoRA builders of
    // llama2, llama3, mistral and qwen2 make one module per layer
    // (lora_*_self_attention); llama3_1 / llama3_2's share one.
    const uint64_t per_position = model.model_type == "qwen2" ? 2 * model.head_dim : model.head_dim;
    const uint64_t module_bytes =
        (model.max_position_embeddings * per_position + model.head_dim / 2) * kF32;
    const bool per_layer = setup.finetune != Finetune::kFull && !model.rope_llama3_scaled;
    const uint64_t modules = per_layer ? model.num_layers : 1;
    for (uint64_t i = 0; i < modules; ++i) {
      tape.graph.SetModule(
          tape.graph.Intern(fmt::format("model.layers.{}.attn.pos_embeddings", i)));
      tape.graph.Alloc(module_bytes, Category::kParameters, "register_buffer", tape.graph.module());
    }
    return;
  }
  if (model.is_clip) {
    // CLIPTextEmbeddings / CLIPVisionEmbeddings: position_ids
    // (arange(positions).expand(1, -1)), an int64 non-persistent nn.Buffer
    // each (transformers 5.24.0 modeling_clip.py; register_buffer in 4.57.6).
    const ClipSpec& c = model.clip;
    for (const uint64_t positions :
         {c.has_text ? c.max_positions : 0, c.has_vision ? c.Patches() + 1 : 0}) {
      if (positions == 0) continue;
      tape.graph.Alloc(positions * kI64, Category::kParameters, "register_buffer",
                       tape.graph.module());
    }
    return;
  }
  if (model.model_type == "bert") {
    // BertEmbeddings: position_ids (arange(max_position_embeddings).expand(1, -1))
    // and token_type_ids (zeros of its size), int64, non-persistent buffers
    // moved to the device with the model (4.57.6 register_buffer, 5.24.0
    // nn.Buffer).
    tape.graph.SetModule(tape.graph.Intern("bert.embeddings"));
    for (int i = 0; i < 2; ++i) {
      tape.graph.Alloc(model.max_position_embeddings * kI64, Category::kParameters,
                       "register_buffer", tape.graph.module());
    }
    return;
  }
  if (model.model_type != "gpt2" || setup.transformers_version >= 500) return;
  const uint64_t positions = model.max_position_embeddings;
  for (const StageSpan& span : chunks) {
    const uint64_t end_layer = std::min<uint64_t>(span.end_layer, model.num_layers);
    for (uint64_t i = span.first_layer; i < end_layer; ++i) {
      tape.graph.SetModule(tape.graph.Intern(fmt::format("transformer.h.{}.attn", i)));
      tape.graph.Alloc(positions * positions, Category::kParameters, "register_buffer",
                       tape.graph.module());
      tape.graph.Alloc(4, Category::kParameters, "register_buffer", tape.graph.module());
    }
  }
}

// bitsandbytes NF4 with double quantization: 0.5 byte per weight, one 8-bit
// absmax per 64 values, fp32 absmax per 256 of those (QLoRA paper §3).
uint64_t Nf4StorageBytes(uint64_t numel) {
  return numel / 2 + (numel + 63) / 64 + ((numel + 63) / 64 + 255) / 256 * 4;
}

// The rest of a Params4bit's QuantState, per weight: quantize_4bit makes the
// NF4 code table (get_4bit_type: 16 fp32 values, a new tensor per call) and
// the offset (`_absmax.mean()`, a 0-dim fp32 tensor), and its nested
// quantize_blockwise keeps its own copy of the dynamic code (256 fp32:
// `code.to(A.device, copy=True)`) (bitsandbytes 0.50.2 functional.py; every
// weight's own in the CPU fidelity traces, 0.43-0.45 alike).
constexpr uint64_t kNf4CodeBytes = 16 * 4, kNf4OffsetBytes = 4, kNestedCodeBytes = 256 * 4;

void PlaceQuantStates(Tape& tape, const PlacementRules& rules) {
  if (rules.sharded_qlora) return;  // bnb_4bit_quant_storage: sharded with the weight
  for (const Param& p : tape.params) {
    if (!p.nf4 || p.unit < 0) continue;
    for (uint64_t bytes : {kNf4CodeBytes, kNf4OffsetBytes, kNestedCodeBytes})
      tape.graph.Alloc(bytes, Category::kParameters, "bnb::quant_state", p.module);
  }
}

// One model parameter as loaded on this rank, before allocation.
Param LoadedParam(const ParamTensor& pt, const TrainingSetup& setup,
                  const std::vector<StageSpan>& chunks, bool tied, uint64_t num_layers,
                  const PlacementRules& rules, EventStream* out) {
  const bool lora = setup.finetune != Finetune::kFull;
  const bool qlora = setup.finetune == Finetune::kQLora;
  Param p;
  p.name = pt.name;
  // Outside the stage: a zero-byte placeholder keeps indices aligned with
  // model.params (IndexParams); it is frozen and never used.
  const bool here = InStage(pt, chunks, tied);
  p.unit = here ? UnitOf(pt, num_layers) : -1;
  p.module = out->Intern(pt.module);
  p.numel = pt.numel;
  p.elem_bytes = rules.param_bytes;
  p.trainable = !lora;
  p.storage_bytes = p.numel * p.elem_bytes;
  if (IsStackedExpert(pt, setup.transformers_version) && pt.layer >= 0) {
    p.stack = 1 + 2 * static_cast<uint32_t>(pt.layer) + (pt.role == ParamRole::kExpertDown ? 1 : 0);
  }
  if (qlora && pt.is_linear_weight && pt.role != ParamRole::kLmHead &&
      !IsStackedExpert(pt, setup.transformers_version)) {
    p.storage_bytes = Nf4StorageBytes(p.numel);
    p.nf4 = true;
  } else if (qlora && !rules.sharded_qlora) {
    // peft prepare_model_for_kbit_training casts non-quantized params to fp32.
    p.elem_bytes = kF32;
    p.storage_bytes = p.numel * kF32;
  }
  if (!here) {
    p.numel = 0;
    p.storage_bytes = 0;
    p.trainable = false;
  }
  return p;
}

// lora_A [r, in] and lora_B [out, r] of one targeted weight, allocated.
// `adapter_bytes`: the adapters' dtype. get_peft_model upcasts them to fp32
// (PeftModel(autocast_adapter_dtype=True), peft 0.12-0.21); diffusers'
// add_adapter injects them with inject_adapter_in_model, which keeps the base
// layer's dtype (peft 0.21.2 tuners/lora/layer.py update_layer,
// _move_adapter_to_device_of_base_layer; seen in the CPU fidelity traces).
// `numels`: lora_A's and lora_B's elements; `litgpt`: LitGPT's names
// (`qkv.lora_A`, parameters of the LoRA module itself) rather than PEFT's.
void AttachAdapterPair(Tape& tape, const ParamTensor& pt, size_t base,
                       const std::array<uint64_t, 2>& numels, const StorageBytesFn& storage,
                       uint8_t adapter_bytes, bool litgpt) {
  for (int k = 0; k < 2; ++k) {
    Param ad;
    const std::string suffix = k == 0 ? ".lora_A" : ".lora_B";
    ad.name = pt.module + suffix + (litgpt ? "" : ".default.weight");
    ad.module = tape.out()->Intern(litgpt ? pt.module : pt.module + suffix);
    ad.numel = numels[k];
    ad.elem_bytes = adapter_bytes;
    ad.storage_bytes = ad.numel * adapter_bytes;
    ad.trainable = true;
    ad.unit = tape.params[base].unit;
    tape.graph.SetModule(ad.module);
    ad.var.t = tape.graph.Alloc(storage(ad), Category::kParameters, "peft::lora", ad.module);
    ad.var.numel = ad.numel;
    ad.var.elem_bytes = adapter_bytes;
    (k == 0 ? tape.params[base].lora_a : tape.params[base].lora_b) =
        static_cast<int>(tape.params.size());
    tape.params.push_back(std::move(ad));
    Param& placed = tape.params.back();  // reserved by PlaceParameters: addresses are stable
    placed.var.fn = tape.graph.AddAccumulateGrad(placed.storage_bytes, &placed.grad);
  }
}

}  // namespace

// transformers >= 5.0 stores each layer's routed experts as two 3-D
// nn.Parameters, gate_up_proj [E, 2I, h] and down_proj [E, h, I]
// (Qwen2MoeExperts / Qwen3MoeExperts / MixtralExperts, 5.24.0): one storage
// each, where 4.x had one nn.Linear per expert. The lowering keeps one Param
// per expert matrix (for grouped_mm and the optimizer) but places them as
// slices of the stacked storage: 0 for gate and up, 1 for down, -1 otherwise.
// Measured on the H100: with per-expert tensors, qwen1.5-moe-a2.7b's setup
// reserved 4.9 GiB more than the real 26.9 GiB (three 5.5 MiB experts per
// 20 MiB segment). Layouts that shard or split parameters keep per-expert
// storage (their builders differ).
int ExpertStack(ParamRole role) {
  if (role == ParamRole::kExpertGate || role == ParamRole::kExpertUp) return 0;
  return role == ParamRole::kExpertDown ? 1 : -1;
}

bool StacksExperts(const ModelSpec& model, const TrainingSetup& setup) {
  const bool sharded = setup.parallel.model_parallel() ||
                       setup.parallel.dp_mode == DataParallel::kZero3 ||
                       setup.parallel.dp_mode == DataParallel::kFsdp;
  return setup.transformers_version >= 500 && !sharded && setup.moe_capacity_factor == 0 &&
         std::any_of(model.params.begin(), model.params.end(),
                     [](const ParamTensor& pt) { return IsRoutedExpert(pt.role); });
}

// from_config on the device: the head (nn.Linear(hidden, vocab), built last,
// after the backbone and its buffers) allocates its own weight, in the
// weights' dtype; post_init's tie_weights then points it at the word
// embedding and that weight is freed (transformers 5.x modeling_utils.py). A
// transient of the embedding's size, seen in every tied model measured on the
// H100 (setup peak minus end: Llama-3.2-1B 501 MiB in bf16, Qwen2.5-0.5B
// 519 MiB in fp32, GPT-2, BERT, Gemma 2) and in no untied one. Its freed block
// stays cached and shapes later segments. Not for layouts that shard or split
// the parameters (their builders differ).
void PlaceUntiedHeadTransient(Tape& tape, const ModelSpec& model, const TrainingSetup& setup,
                              const PlacementRules& rules) {
  if (setup.parallel.model_parallel() || setup.parallel.dp_mode == DataParallel::kZero3 ||
      setup.parallel.dp_mode == DataParallel::kFsdp) {
    return;
  }
  const Param* word = nullptr;
  for (size_t i = 0; i < tape.params.size() && i < model.params.size(); ++i) {
    const Param& p = tape.params[i];
    if (model.params[i].role != ParamRole::kEmbed || p.unit < 0) continue;
    if (word == nullptr || p.numel > word->numel) word = &p;
  }
  if (word == nullptr) return;
  tape.SetModule("lm_head");
  const TensorId head =
      tape.graph.Alloc(rules.storage(*word), Category::kParameters, "aten::empty", tape.module());
  tape.graph.Drop(head);
}

void PlaceParameters(Tape& tape, const ModelSpec& model, const TrainingSetup& setup,
                     const std::vector<StageSpan>& chunks, const PlacementRules& rules) {
  const bool tied =
      std::none_of(model.params.begin(), model.params.end(),
                   [](const ParamTensor& pt) { return pt.role == ParamRole::kLmHead; });
  tape.params.reserve(model.params.size() * 3);  // room for two adapters each: stable addresses
  for (const ParamTensor& pt : model.params) {
    tape.params.push_back(
        LoadedParam(pt, setup, chunks, tied, model.num_layers, rules, tape.out()));
  }
  tape.SetModule("model");
  // (layer, stack) -> {first param index, stacked bytes}
  std::map<std::pair<int, int>, std::pair<size_t, uint64_t>> stacks;
  if (StacksExperts(model, setup)) {
    for (size_t i = 0; i < tape.params.size(); ++i) {
      const int stack = ExpertStack(model.params[i].role);
      if (stack < 0 || tape.params[i].unit < 0) continue;
      auto [it, fresh] = stacks.try_emplace({model.params[i].layer, stack}, i, 0);
      it->second.second += rules.storage(tape.params[i]);
    }
  }
  for (size_t i = 0; i < tape.params.size(); ++i) {
    Param& p = tape.params[i];
    if (p.unit < 0) continue;  // not on this pipeline stage
    tape.graph.SetModule(p.module);
    const auto group = stacks.find({model.params[i].layer, ExpertStack(model.params[i].role)});
    if (group == stacks.end()) {
      p.var.t =
          tape.graph.Alloc(rules.storage(p), Category::kParameters, "from_pretrained", p.module);
    } else if (group->second.first == i) {
      p.var.t = tape.graph.Alloc(group->second.second, Category::kParameters, "from_pretrained",
                                 p.module);
    } else {  // a later expert of the same stacked parameter: a slice of its storage
      p.var.t = tape.params[group->second.first].var.t;
      tape.graph.Ref(p.var.t);
    }
    p.var.numel = p.numel;
    p.var.elem_bytes = p.elem_bytes;
    if (p.trainable) p.var.fn = tape.graph.AddAccumulateGrad(p.numel * p.elem_bytes, &p.grad);
  }
  PlaceQuantStates(tape, rules);
  PlaceBuffers(tape, model, setup, chunks);
  if (tied && setup.built_on_gpu) PlaceUntiedHeadTransient(tape, model, setup, rules);
}

namespace {

// LoRAQKVLinear's adapted slices (litgpt/lora.py 0.5.13: Config.lora_query,
// lora_key, lora_value become `enable_lora`): --lora-targets q, k, v, or
// all-linear for the three.
LitgptQkvLora LitgptQkvParts(const ModelSpec& model, const TrainingSetup& setup) {
  LitgptQkvLora qkv;
  qkv.q_out = model.num_heads * model.head_dim;
  qkv.kv_out = model.num_kv_heads * model.head_dim;
  qkv.batch = setup.batch;
  for (const std::string& t : setup.lora_targets) {
    const bool all = t == "all-linear";
    qkv.q = qkv.q || all || t == "q";
    qkv.k = qkv.k || all || t == "k";
    qkv.v = qkv.v || all || t == "v";
  }
  return qkv;
}

// lora_A's and lora_B's elements for `pt`, {0, 0} when it is not a target.
// LitGPT's fused qkv (`*qkv` set): lora_A [r * N, in] and lora_B
// [adapted out, r] for its N adapted slices.
std::array<uint64_t, 2> AdapterNumels(const ParamTensor& pt, const ModelSpec& model,
                                      const TrainingSetup& setup, LitgptQkvLora* qkv) {
  const uint64_t r = setup.lora_rank;
  if (setup.impl == ModelImpl::kLitgpt && pt.role == ParamRole::kQkv &&
      setup.finetune != Finetune::kFull) {
    const LitgptQkvLora parts = LitgptQkvParts(model, setup);
    if (parts.Parts() == 0) return {0, 0};
    *qkv = parts;
    return {r * parts.Parts() * pt.shape[1], parts.AdaptedOut() * r};
  }
  if (LoraAdapterParams(pt, setup) == 0) return {0, 0};
  // A Conv1D weight is stored [in, out] (peft's fan_in_fan_out layers take
  // in/out from it the same way).
  const uint64_t out_features = pt.conv1d ? pt.shape[1] : pt.shape[0];
  const uint64_t in_features = pt.conv1d ? pt.shape[0] : pt.shape[1];
  return {r * in_features, out_features * r};
}

}  // namespace

Result<uint64_t> AttachLoraAdapters(Tape& tape, const ModelSpec& model, const TrainingSetup& setup,
                                    bool whole_model, const StorageBytesFn& storage) {
  // Trainable; fp32 through get_peft_model, the base weight's dtype through
  // diffusers' add_adapter (AttachAdapterPair), the model's compute dtype under
  // --lora-dtype model (torchtune, LitGPT: made with the model; over 4-bit
  // weights, the 16-bit compute dtype).
  uint64_t lora_params = 0;
  const size_t base_count = tape.params.size();
  for (size_t i = 0; i < base_count; ++i) {
    const ParamTensor& pt = model.params[i];
    const std::array<uint64_t, 2> numels =
        AdapterNumels(pt, model, setup, &tape.params[i].litgpt_qkv);
    if (numels[0] == 0 || tape.params[i].unit < 0) continue;
    lora_params += numels[0] + numels[1];
    // The LoRA script upcasts the adapters under fp16 mixed precision only
    // (cast_training_params(unet, dtype=torch.float32); train_dreambooth_lora_flux.py
    // likewise for the FLUX transformer).
    const uint8_t adapter_bytes =
        setup.lora_dtype == LoraDtype::kModel      ? ParamBytes(setup.precision)
        : !model.is_unet && !model.is_flux         ? kF32
        : setup.precision == Precision::kFp16Mixed ? kF32
                                                   : tape.params[i].elem_bytes;
    AttachAdapterPair(tape, pt, i, numels, storage, adapter_bytes,
                      setup.impl == ModelImpl::kLitgpt);
  }
  if (lora_params == 0 && whole_model) {
    return MakeError(fmt::format("--lora-targets: none of '{}' matches a linear layer of {}",
                                 fmt::join(setup.lora_targets, ","), model.name));
  }
  return lora_params;
}

}  // namespace vramscope::lower
