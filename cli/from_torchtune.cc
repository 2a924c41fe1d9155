// --from FILE: a torchtune recipe config (the YAML of `tune run RECIPE
// --config FILE`) to flags; docs/configs.md has the table. Each mapping cites
// torchtune 0.6.1: recipes/{full,lora}_finetune_{single_device,distributed}.py,
// models/*/_model_builders.py, modules/peft/_utils.py, training/precision.py,
// training/activations.py, training/_distributed.py.
//
// torchtune builds the model from its own modules (modules/transformer.py
// TransformerDecoder): a Llama or Mistral builder sets --impl torchtune, which
// lowers those modules; other families are estimated with transformers'
// modules, listed as not modelled.
#include <algorithm>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "from_config_internal.h"
#include "vramscope/common/quote.h"

namespace vramscope::cli {
namespace fromcfg {

// Every torchtune recipe instantiates `model` from its `_component_`, a
// dotted path into torchtune (config/_instantiate.py).
bool LooksLikeTorchtune(const Json& root) {
  auto it = root.find("model");
  if (it == root.end() || !it->is_object()) return false;
  auto c = it->find("_component_");
  return c != it->end() && c->is_string() && c->get<std::string>().rfind("torchtune.", 0) == 0;
}

namespace {

// A member that must be a whole number (the recipes read them as ints; a
// string, "auto" included, is an error).
Result<std::optional<int64_t>> TtCount(const Reader& r, const Json& parent, const char* key,
                                       const std::string& path, int64_t lo, int64_t hi) {
  auto it = parent.find(key);
  if (it != parent.end() && it->is_string()) {
    return r.Bad(path, fmt::format("{} is not a whole number", Shown(*it)));
  }
  return Number(r, parent, key, path, lo, hi);
}

Result<std::optional<bool>> TtFlag(const Reader& r, const Json& parent, const char* key,
                                   const std::string& path) {
  auto it = parent.find(key);
  if (it != parent.end() && it->is_string()) {
    return r.Bad(path, fmt::format("{} is not true or false", Shown(*it)));
  }
  return Bool(r, parent, key, path);
}

// The `_component_` of an object member ("" when the member is absent).
Result<std::string> Component(const Reader& r, const Json& root, const char* key) {
  VS_TRY(obj, Object(r, root, key, key));
  if (!obj) return std::string();
  const std::string path = std::string(key) + "._component_";
  VS_TRY(name, String(r, *obj, "_component_", path));
  if (name.empty()) return r.Bad(path, "missing (torchtune instantiates the object from it)");
  return name;
}

std::string LastSegment(const std::string& dotted) {
  const size_t dot = dotted.rfind('.');
  return dot == std::string::npos ? dotted : dotted.substr(dot + 1);
}

// modules/peft/_utils.py LORA_ATTN_MODULES -> --lora-targets names; the
// builders' apply_lora_to_mlp adds w1, w2, w3 (gate, down, up) and
// apply_lora_to_output the output projection (models/llama3/_component_builders.py).
constexpr std::pair<std::string_view, const char*> kTtAttnModules[] = {
    {"q_proj", "q"}, {"k_proj", "k"}, {"v_proj", "v"}, {"output_proj", "o"}};

Result<std::string> TorchtuneTargets(const Reader& r, const Json& model) {
  auto it = model.find("lora_attn_modules");
  if (it == model.end() || it->is_null()) {
    return r.Bad("model.lora_attn_modules", "missing (torchtune's LoRA builders require it)");
  }
  if (!it->is_array()) {
    return r.Bad("model.lora_attn_modules", fmt::format("{} is not a list", Shown(*it)));
  }
  if (Status st = ShortList(r, *it, "model.lora_attn_modules"); !st.ok()) return st.error();
  std::string targets;
  for (const Json& name : *it) {
    const char* flag = nullptr;
    for (const auto& [tt, ours] : kTtAttnModules) {
      if (name.is_string() && name.get<std::string>() == tt) flag = ours;
    }
    if (!flag) {
      return r.Bad(
          "model.lora_attn_modules",
          fmt::format("{} is not one of q_proj, k_proj, v_proj, output_proj", Shown(name)));
    }
    targets += (targets.empty() ? "" : ",") + std::string(flag);
  }
  VS_TRY(mlp, TtFlag(r, model, "apply_lora_to_mlp", "model.apply_lora_to_mlp"));
  VS_TRY(head, TtFlag(r, model, "apply_lora_to_output", "model.apply_lora_to_output"));
  if (mlp.value_or(false)) targets += std::string(targets.empty() ? "" : ",") + "gate,up,down";
  if (head.value_or(false)) targets += std::string(targets.empty() ? "" : ",") + "lm_head";
  if (targets.empty()) {
    return r.Bad("model.lora_attn_modules", "empty, and no MLP or output adapters: nothing trains");
  }
  return targets;
}

// model: a builder such as torchtune.models.llama3_2.lora_llama3_2_1b. The
// lora_ / qlora_ builders (qlora_ = lora_ with quantize_base=True: torchao's
// NF4, modelled as bitsandbytes' NF4 with double quantization) take
// lora_rank (default 8), lora_dropout (default 0.0) and the targets.
Status ReadTorchtuneModel(const Reader& r, const Json& root) {
  VS_TRY(component, Component(r, root, "model"));
  const Json& model = root["model"];
  r.Note(fmt::format("model {}", common::QuoteForMessage(component, common::kQuotedBytes, '\'')),
         "model._component_", "not applied, the MODEL argument names the model estimated");
  const std::string builder = LastSegment(component);
  // The Llama, Mistral and Qwen2 builders' modules are what --impl torchtune
  // lowers (RMSNorm, RotaryPositionalEmbeddings / Llama3ScaledRoPE /
  // Qwen2RotaryPositionalEmbeddings, MultiHeadAttention, TiedLinear).
  static constexpr std::string_view kLowered[] = {
      "torchtune.models.llama2.",      "torchtune.models.llama3.",   "torchtune.models.llama3_1.",
      "torchtune.models.llama3_2.",    "torchtune.models.llama3_3.", "torchtune.models.mistral.",
      "torchtune.models.code_llama2.", "torchtune.models.qwen2.",    "torchtune.models.qwen2_5."};
  bool lowered = false;
  for (std::string_view prefix : kLowered) lowered = lowered || component.rfind(prefix, 0) == 0;
  if (lowered && builder.find("vision") == std::string::npos) {
    r.Set("--impl", "torchtune",
          "model._component_ (a Llama / Mistral / Qwen2 builder: torchtune's modules)");
  } else {
    r.NotModelled("model._component_",
                  "torchtune's own modules for this family: estimated as transformers' "
                  "(--impl torchtune models Llama, Mistral and Qwen2)");
  }
  VS_TRY(quantize, TtFlag(r, model, "quantize_base", "model.quantize_base"));
  const bool qlora = builder.rfind("qlora_", 0) == 0;
  const bool lora = qlora || builder.rfind("lora_", 0) == 0;
  if (!lora) {
    r.Set("--finetune", "full", "model._component_ (a full model builder)");
    return Ok{};
  }
  const bool four_bit = qlora || quantize.value_or(false);
  r.Set("--finetune", four_bit ? "qlora" : "lora",
        qlora      ? "model._component_ (a qlora_ builder)"
        : four_bit ? "model.quantize_base"
                   : "model._component_ (a lora_ builder)");
  if (four_bit) {
    r.NotModelled("model._component_",
                  "torchao's NF4 base weights: modelled as bitsandbytes' NF4 with double "
                  "quantization");
  }
  VS_TRY(rank, TtCount(r, model, "lora_rank", "model.lora_rank", 1, 1 << 16));
  r.SetCount("--lora-rank", rank.value_or(8),
             rank ? "model.lora_rank" : "model.lora_rank (absent: the builders' default 8)");
  VS_TRY(dropout, Fraction(r, model, "lora_dropout", "model.lora_dropout"));
  r.SetFraction(
      "--lora-dropout", dropout.value_or(0.0),
      dropout ? "model.lora_dropout" : "model.lora_dropout (absent: the builders' default 0.0)");
  VS_TRY(targets, TorchtuneTargets(r, model));
  r.Set("--lora-targets", targets, "model.lora_attn_modules, apply_lora_to_mlp/output");
  VS_TRY(dora, TtFlag(r, model, "use_dora", "model.use_dora"));
  if (dora.value_or(false)) r.NotModelled("model.use_dora", "DoRA's magnitudes and activations");
  // LoRALinear's adapters are made under the recipe's set_default_dtype(dtype)
  // (modules/peft/lora.py), not upcast as PEFT's are.
  r.Set("--lora-dtype", "model", "model._component_ (torchtune's LoRALinear: the model's dtype)");
  return Ok{};
}

// dtype (training/precision.py get_dtype; absent: float32). Every recipe
// builds the model under set_default_dtype(dtype) with no autocast and no
// fp32 master copy (recipe docstrings: "all activations, gradients and
// optimizer states are in bfloat16"): --precision bf16 or fp32. The recipes
// refuse fp16 (`if self._dtype == torch.float16: raise ValueError`).
Status ReadTorchtunePrecision(const Reader& r, const Json& root) {
  VS_TRY(dtype, String(r, root, "dtype", "dtype"));
  if (dtype == "bf16") {
    r.Set("--precision", "bf16", "dtype");
  } else if (dtype == "fp32" || dtype.empty()) {
    r.Set("--precision", "fp32", dtype.empty() ? "dtype (absent: torchtune's float32)" : "dtype");
  } else if (dtype == "fp16") {
    return r.Bad("dtype", "'fp16': torchtune's recipes refuse full fp16 training");
  } else {
    return r.Bad("dtype", fmt::format("{} is not one of bf16, fp32", Shown(Json(dtype))));
  }
  return Ok{};
}

// batch_size -> --batch; tokenizer.max_seq_len (rows are truncated to it and
// padded to the longest in the batch: data/_collate.py padded_collate_sft;
// a packed dataset pads every pack to it: datasets/_packed.py) -> --seq.
Status ReadTorchtuneBatch(const Reader& r, const Json& root) {
  constexpr int64_t kMax = int64_t{1} << 32;
  VS_TRY(batch, TtCount(r, root, "batch_size", "batch_size", 1, kMax));
  if (batch) r.SetCount("--batch", *batch, "batch_size");
  VS_TRY(accum,
         TtCount(r, root, "gradient_accumulation_steps", "gradient_accumulation_steps", 1, kMax));
  if (accum) r.SetCount("--grad-accum", *accum, "gradient_accumulation_steps");
  VS_TRY(tokenizer, Object(r, root, "tokenizer", "tokenizer"));
  std::optional<int64_t> seq;
  if (tokenizer) {
    VS_TRY(v, TtCount(r, *tokenizer, "max_seq_len", "tokenizer.max_seq_len", 1, int64_t{1} << 24));
    seq = v;
  }
  if (seq) {
    r.SetCount("--seq", *seq, "tokenizer.max_seq_len");
  } else {
    r.NotModelled("tokenizer.max_seq_len", "null: rows as long as the longest sample; pass --seq");
  }
  VS_TRY(dataset, Object(r, root, "dataset", "dataset"));
  if (dataset) {
    VS_TRY(packed, TtFlag(r, *dataset, "packed", "dataset.packed"));
    if (packed.value_or(false) && !seq) {
      return r.Bad("dataset.packed", "true without tokenizer.max_seq_len (torchtune refuses it)");
    }
    if (packed.value_or(false)) {
      r.Note("every row max_seq_len tokens", "dataset.packed",
             "packs are padded to tokenizer.max_seq_len; the block-causal mask (flex attention "
             "on CUDA) is not modelled");
    }
  }
  return Ok{};
}

// enable_activation_checkpointing (default false) wraps every
// TransformerSelfAttentionLayer in a non-reentrant checkpoint_wrapper
// (training/activations.py) -> --grad-ckpt full.
// enable_activation_offloading (needs checkpointing, recipe __init__):
// training.get_act_offloading_ctx_manager's OffloadActivations, which
// --activation-offload models under --impl torchtune (the Llama / Mistral
// builders); with other builders' modules it is listed as not modelled.
Status ReadTorchtuneActivations(const Reader& r, const Json& root) {
  VS_TRY(ckpt,
         TtFlag(r, root, "enable_activation_checkpointing", "enable_activation_checkpointing"));
  VS_TRY(offload, TtFlag(r, root, "enable_activation_offloading", "enable_activation_offloading"));
  if (offload.value_or(false) && !ckpt.value_or(false)) {
    return r.Bad("enable_activation_offloading",
                 "true without enable_activation_checkpointing (torchtune refuses it)");
  }
  r.Set("--grad-ckpt", ckpt.value_or(false) ? "full" : "none",
        root.contains("enable_activation_checkpointing")
            ? "enable_activation_checkpointing"
            : "enable_activation_checkpointing (absent: false)");
  if (!offload.value_or(false)) return Ok{};
  const bool own_modules = std::any_of(r.out->knobs.begin(), r.out->knobs.end(), [](const auto& k) {
    return k.flag == "--impl" && k.value == "torchtune";
  });
  if (own_modules) {
    r.Set("--activation-offload", "true", "enable_activation_offloading");
  } else {
    r.NotModelled("enable_activation_offloading",
                  "OffloadActivations is modelled with torchtune's Llama / Mistral / Qwen2 modules "
                  "(--impl torchtune); checkpointed layer inputs estimated as kept on the GPU");
  }
  return Ok{};
}

// optimizer._component_ (instantiated over the trainable parameters).
constexpr std::pair<std::string_view, const char*> kTtOptimizers[] = {
    {"torch.optim.AdamW", "adamw"},
    {"torch.optim.Adam", "adamw"},
    {"bitsandbytes.optim.AdamW8bit", "adamw-8bit"},
    {"bitsandbytes.optim.PagedAdamW8bit", "paged-adamw-8bit"},
    {"bitsandbytes.optim.PagedAdamW", "paged-adamw"},
    {"bitsandbytes.optim.PagedAdamW32bit", "paged-adamw"},
};

// torch.optim.AdamW: fused: true -> adamw-fused, foreach: false -> the
// for-loop step, else foreach (torch's CUDA default). SGD: momentum keeps a
// buffer. optimizer_in_bwd (default false; the recipes refuse it with
// gradient accumulation or clip_grad_norm) -> --optimizer-in-backward.
Status ReadTorchtuneOptimizer(const Reader& r, const Json& root) {
  VS_TRY(name, Component(r, root, "optimizer"));
  if (!name.empty()) {
    const Json& opt = root["optimizer"];
    const char* flag = nullptr;
    for (const auto& [tt, ours] : kTtOptimizers) flag = tt == name ? ours : flag;
    VS_TRY(fused, TtFlag(r, opt, "fused", "optimizer.fused"));
    VS_TRY(foreach, TtFlag(r, opt, "foreach", "optimizer.foreach"));
    if (flag && std::string_view(flag) == "adamw" && fused.value_or(false)) flag = "adamw-fused";
    if (flag && std::string_view(flag) == "adamw" && foreach == false) flag = "adamw-forloop";
    if (name == "torch.optim.SGD") {
      const bool momentum = opt.contains("momentum") && opt["momentum"].is_number() &&
                            opt["momentum"].get<double>() != 0;
      flag = momentum ? "sgd-momentum" : "sgd";
    }
    if (flag) {
      r.Set("--optimizer", flag, "optimizer._component_");
    } else {
      r.NotModelled("optimizer._component_",
                    fmt::format("{}: left to --optimizer", Shown(Json(name))));
    }
  }
  VS_TRY(in_bwd, TtFlag(r, root, "optimizer_in_bwd", "optimizer_in_bwd"));
  if (in_bwd.value_or(false) && root.value("gradient_accumulation_steps", Json(1)) != 1) {
    return r.Bad("optimizer_in_bwd",
                 "true with gradient_accumulation_steps above 1 (torchtune refuses it)");
  }
  if (in_bwd.value_or(false)) r.Set("--optimizer-in-backward", "true", "optimizer_in_bwd");
  return Ok{};
}

// loss._component_: CEWithChunkedOutputLoss -> --loss torchtune-chunked
// (the model returns num_output_chunks chunks of logits: set_num_output_chunks
// in the recipes' _setup_model). Another loss is listed as not modelled.
Status ReadTorchtuneLoss(const Reader& r, const Json& root) {
  VS_TRY(name, Component(r, root, "loss"));
  if (name.empty()) return Ok{};
  if (name == "torchtune.modules.loss.CEWithChunkedOutputLoss") {
    VS_TRY(chunks,
           TtCount(r, root["loss"], "num_output_chunks", "loss.num_output_chunks", 1, 1 << 20));
    if (chunks && *chunks != 8) {
      r.NotModelled("loss.num_output_chunks",
                    fmt::format("{} chunks: modelled as the default 8", *chunks));
    }
    r.Set("--loss", "torchtune-chunked", "loss._component_");
  } else if (name.find("DPO") != std::string::npos || name.find("RSO") != std::string::npos ||
             name.find("SimPO") != std::string::npos || name.find("PPO") != std::string::npos) {
    r.NotModelled("loss._component_",
                  fmt::format("{}: torchtune's preference recipes; estimated as one supervised "
                              "step",
                              Shown(Json(name))));
  } else {
    r.NotModelled("loss._component_",
                  fmt::format("{}: the full logits then the loss; modelled as --loss hf (fp32 "
                              "logits)",
                              Shown(Json(name))));
  }
  return Ok{};
}

// The distributed recipes' keys (full_finetune_distributed.py,
// lora_finetune_distributed.py): FSDP2 (training/_distributed.py
// shard_model: fully_shard per TransformerSelfAttentionLayer, then the
// model) with fsdp_reshard_after_forward (default true; false keeps the
// gathered parameters, --fsdp grad-op) and fsdp_cpu_offload (CPUOffloadPolicy:
// parameters, gradients and the step on the CPU, --offload params). The
// process count is tune run's --nproc_per_node: pass --gpus.
Status ReadTorchtuneDistributed(const Reader& r, const Json& root) {
  static constexpr const char* kKeys[] = {"fsdp_cpu_offload", "fsdp_reshard_after_forward",
                                          "tensor_parallel_dim", "custom_sharded_layers"};
  if (!HasAny(root, kKeys)) {
    r.Note("one process", "(no fsdp_* key)",
           "a single-device recipe; for full_finetune_distributed / lora_finetune_distributed "
           "pass --gpus N --fsdp full --fsdp-version 2");
    return Ok{};
  }
  VS_TRY(reshard, TtFlag(r, root, "fsdp_reshard_after_forward", "fsdp_reshard_after_forward"));
  VS_TRY(offload, TtFlag(r, root, "fsdp_cpu_offload", "fsdp_cpu_offload"));
  r.Set("--fsdp", reshard.value_or(true) ? "full" : "grad-op",
        root.contains("fsdp_reshard_after_forward")
            ? "fsdp_reshard_after_forward"
            : "fsdp_* (a distributed recipe's config: FSDP2, resharded after forward)");
  r.SetCount("--fsdp-version", 2, "fsdp_* (torchtune shards with FSDP2's fully_shard)");
  r.Set("--fsdp-wrap", "layers", "fsdp_* (shard_model: fully_shard on each decoder layer)");
  if (offload.value_or(false)) r.Set("--offload", "params", "fsdp_cpu_offload");
  VS_TRY(tp, TtCount(r, root, "tensor_parallel_dim", "tensor_parallel_dim", 1, 1 << 20));
  if (tp.value_or(1) > 1) r.NotModelled("tensor_parallel_dim", "torchtune's tensor parallelism");
  r.Note("the process count", "fsdp_*",
         "tune run's --nproc_per_node is not in the config; pass --gpus");
  return Ok{};
}

}  // namespace

Status ReadTorchtune(const Reader& r, const Json& root) {
  if (Status st = ReadTorchtuneModel(r, root); !st.ok()) return st;
  if (Status st = ReadTorchtunePrecision(r, root); !st.ok()) return st;
  if (Status st = ReadTorchtuneBatch(r, root); !st.ok()) return st;
  if (Status st = ReadTorchtuneActivations(r, root); !st.ok()) return st;
  if (Status st = ReadTorchtuneOptimizer(r, root); !st.ok()) return st;
  if (Status st = ReadTorchtuneLoss(r, root); !st.ok()) return st;
  if (Status st = ReadTorchtuneDistributed(r, root); !st.ok()) return st;
  VS_TRY(compile, TtFlag(r, root, "compile", "compile"));
  if (compile.value_or(false)) {
    r.NotModelled("compile", "torch.compile of the model and loss; estimated as eager");
  }
  return Ok{};
}

}  // namespace fromcfg
}  // namespace vramscope::cli
