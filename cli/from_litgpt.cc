// --from FILE: a LitGPT fine-tuning config (the YAML of `litgpt finetune_lora
// | finetune_full --config FILE`, config_hub/finetune/*/*.yaml) to flags;
// docs/configs.md has the table. Each mapping cites litgpt 0.5.13:
// finetune/lora.py and full.py setup() / main() / fit(), args.py TrainArgs,
// utils.py get_default_supported_precision, instantiate_*_optimizer,
// chunked_cross_entropy.
//
// LitGPT builds the model from its own modules (model.py GPT, lora.py):
// both scripts set --impl litgpt, which lowers them (llama-style families;
// others are refused, naming the family), LoRAQKVLinear over the fused qkv
// included. With `quantize` (bitsandbytes layers) finetune_lora is estimated
// with transformers' and PEFT's modules, listed as not modelled. Both
// scripts' chunked lm_head and chunked_cross_entropy are --loss litgpt-chunked.
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "from_config_internal.h"
#include "vramscope/common/quote.h"

namespace vramscope::cli {
namespace fromcfg {

// Every LitGPT command takes checkpoint_dir; no other format has it at the top
// level with LitGPT's own keys.
bool LooksLikeLitgpt(const Json& root) {
  static constexpr const char* kKeys[] = {"train", "precision", "quantize", "lora_r", "devices"};
  return root.contains("checkpoint_dir") && HasAny(root, kKeys);
}

namespace {

bool IsLora(const Json& root) {
  static constexpr const char* kKeys[] = {"lora_r",     "lora_alpha",      "lora_dropout",
                                          "lora_query", "lora_key",        "lora_value",
                                          "lora_mlp",   "lora_projection", "lora_head"};
  return HasAny(root, kKeys);
}

// devices (an int, or "auto" / -1: every visible GPU) × num_nodes; 0 when the
// count is left to the machine.
Result<int64_t> LitgptProcesses(const Reader& r, const Json& root) {
  int64_t devices = 1;
  if (auto it = root.find("devices"); it != root.end() && !it->is_null()) {
    if (*it == "auto" || *it == -1) return int64_t{0};
    VS_TRY(v, Number(r, root, "devices", "devices", 1, 1 << 20));
    devices = v.value_or(1);
  }
  VS_TRY(nodes, Number(r, root, "num_nodes", "num_nodes", 1, 1 << 20));
  return devices * nodes.value_or(1);
}

// precision (Fabric's names): *-true is the weights in that dtype with no
// autocast, *-mixed fp32 weights under autocast. Absent:
// get_default_supported_precision(training=True), bf16-mixed on a GPU with
// bf16. quantize (bnb.*, lora only) refuses *-mixed.
Status ReadLitgptPrecision(const Reader& r, const Json& root) {
  static constexpr std::pair<std::string_view, const char*> kPrecisions[] = {
      {"bf16-true", "bf16"},      {"bf16-mixed", "bf16-mixed"}, {"16-true", "fp16"},
      {"16-mixed", "fp16-mixed"}, {"32-true", "fp32"},          {"32", "fp32"},
      {"bf16", "bf16-mixed"},     {"16", "fp16-mixed"}};
  VS_TRY(precision, String(r, root, "precision", "precision"));
  if (precision.empty()) {
    r.Set("--precision", "bf16-mixed",
          "precision (absent: LitGPT's default for training, bf16-mixed on a GPU with bf16)");
    return Ok{};
  }
  const char* flag = nullptr;
  for (const auto& [fabric, ours] : kPrecisions) flag = fabric == precision ? ours : flag;
  if (!flag) {
    return r.Bad("precision",
                 fmt::format("{} is not one of bf16-true, bf16-mixed, 16-true, 16-mixed, 32-true",
                             Shown(Json(precision))));
  }
  r.Set("--precision", flag, "precision");
  return Ok{};
}

// quantize (lora.py setup: bnb.nf4, bnb.nf4-dq, bnb.fp4, bnb.fp4-dq,
// bnb.int8-training) through Fabric's BitsandbytesPrecision: 4-bit is
// --finetune qlora (vramscope's NF4 with double quantization); the optimizer
// becomes bitsandbytes' PagedAdamW (instantiate_bnb_optimizer). One GPU only.
Status ReadLitgptQuantize(const Reader& r, const Json& root, int64_t processes) {
  VS_TRY(quantize, String(r, root, "quantize", "quantize"));
  if (quantize.empty()) return Ok{};
  static constexpr std::string_view kKnown[] = {"bnb.nf4", "bnb.nf4-dq", "bnb.fp4", "bnb.fp4-dq",
                                                "bnb.int8-training"};
  bool known = false;
  for (std::string_view k : kKnown) known = known || k == quantize;
  if (!known) {
    return r.Bad("quantize", fmt::format("{} is not one of bnb.nf4, bnb.nf4-dq, bnb.fp4, "
                                         "bnb.fp4-dq, bnb.int8-training",
                                         Shown(Json(quantize))));
  }
  // Absent, precision is the default bf16-mixed, which quantize refuses too.
  auto p = root.find("precision");
  const std::string precision =
      p != root.end() && p->is_string() ? p->get<std::string>() : "bf16-mixed";
  if (precision.find("mixed") != std::string::npos) {
    return r.Bad("quantize", fmt::format("with precision {} (LitGPT refuses quantization with "
                                         "mixed precision; give bf16-true)",
                                         Shown(Json(precision))));
  }
  if (processes != 1) {
    return r.Bad("quantize", "with more than one device (LitGPT quantizes on one GPU only)");
  }
  if (!IsLora(root)) {
    return r.Bad("quantize", "without LoRA keys: finetune_full takes no quantize");
  }
  if (quantize == "bnb.int8-training") {
    r.NotModelled("quantize", "8-bit (LLM.int8) base weights: modelled as --finetune lora");
    return Ok{};
  }
  r.Set("--finetune", "qlora", "quantize");
  if (quantize != "bnb.nf4-dq") {
    r.NotModelled("quantize", fmt::format("{}: modelled as NF4 with double quantization "
                                          "(fp32 absmax per 64 weights without it)",
                                          Shown(Json(quantize))));
  }
  r.Set("--optimizer", "paged-adamw", "quantize (instantiate_bnb_optimizer: PagedAdamW)");
  return Ok{};
}

// lora.py setup's defaults: lora_r 8, lora_dropout 0.05, query and value on,
// key, projection, mlp and head off. The MLP's fc_1, fc_2 and proj are
// gate, up and down.
Status ReadLitgptLora(const Reader& r, const Json& root) {
  r.Set("--finetune", "lora", "lora_* (finetune_lora)");
  VS_TRY(rank, Number(r, root, "lora_r", "lora_r", 1, 1 << 16));
  r.SetCount("--lora-rank", rank.value_or(8),
             rank ? "lora_r" : "lora_r (absent: finetune_lora's default 8)");
  VS_TRY(dropout, Fraction(r, root, "lora_dropout", "lora_dropout"));
  r.SetFraction("--lora-dropout", dropout.value_or(0.05),
                dropout ? "lora_dropout" : "lora_dropout (absent: finetune_lora's default 0.05)");
  static constexpr std::tuple<const char*, bool, const char*> kTargets[] = {
      {"lora_query", true, "q"},           {"lora_key", false, "k"},
      {"lora_value", true, "v"},           {"lora_projection", false, "o"},
      {"lora_mlp", false, "gate,up,down"}, {"lora_head", false, "lm_head"}};
  std::string targets;
  for (const auto& [key, on_by_default, names] : kTargets) {
    VS_TRY(on, Bool(r, root, key, key));
    if (on.value_or(on_by_default)) targets += (targets.empty() ? "" : ",") + std::string(names);
  }
  if (targets.empty()) return r.Bad("lora_query", "every lora_* target is false: nothing trains");
  r.Set("--lora-targets", targets, "lora_query, lora_key, lora_value, lora_projection, ...");
  // lora.py's LoRALinear is built with the model, under Fabric's precision
  // (init_module): bf16 adapters under bf16-true, fp32 under *-mixed.
  r.Set("--lora-dtype", "model", "lora_* (LitGPT's LoRA layers: the model's dtype)");
  // --impl litgpt lowers lora.py's GPT (LoRAQKVLinear over the fused qkv,
  // LoRALinear elsewhere) in 16 or 32 bits; its bitsandbytes layers are not.
  const auto quantize = root.find("quantize");
  if (quantize == root.end() || quantize->is_null()) {
    r.Set("--impl", "litgpt",
          "lora_* (finetune_lora: litgpt/lora.py's GPT, LoRAQKVLinear over the fused qkv)");
  } else {
    r.NotModelled("quantize",
                  "LitGPT's LoRA layers over bitsandbytes weights: estimated with transformers' "
                  "and PEFT's modules, adapters on q, k, v (--impl litgpt models finetune_lora "
                  "without quantize)");
  }
  return Ok{};
}

// train.micro_batch_size -> --batch; train.global_batch_size / (devices ×
// num_nodes) / micro_batch_size -> --grad-accum (args.py
// gradient_accumulation_iters); train.max_seq_length -> --seq (null: the
// longest sample, up to the model's block_size).
Status ReadLitgptTrain(const Reader& r, const Json& root, int64_t processes) {
  VS_TRY(train, Object(r, root, "train", "train"));
  const Json empty = Json::object();
  const Json& t = train ? *train : empty;
  constexpr int64_t kMax = int64_t{1} << 32;
  VS_TRY(micro, Number(r, t, "micro_batch_size", "train.micro_batch_size", 1, kMax));
  VS_TRY(global, Number(r, t, "global_batch_size", "train.global_batch_size", 1, kMax));
  const int64_t m = micro.value_or(1), g = global.value_or(16);
  r.SetCount(
      "--batch", m,
      micro ? "train.micro_batch_size" : "train.micro_batch_size (absent: LitGPT's default 1)");
  if (processes > 0) {
    const int64_t per_rank = g / processes, accum = per_rank / m;
    if (accum < 1) {
      return r.Bad("train.global_batch_size",
                   fmt::format("{} over {} device(s) is less than micro_batch_size {} (LitGPT "
                               "asserts it is not)",
                               g, processes, m));
    }
    r.SetCount("--grad-accum", accum,
               global ? "train.global_batch_size / devices / micro_batch_size"
                      : "train.global_batch_size (absent: 16) / devices / micro_batch_size");
  }
  VS_TRY(seq, Number(r, t, "max_seq_length", "train.max_seq_length", 1, int64_t{1} << 24));
  if (seq) {
    r.SetCount("--seq", *seq, "train.max_seq_length");
  } else {
    r.NotModelled("train.max_seq_length",
                  "null: rows as long as the longest sample (up to block_size); pass --seq");
  }
  return Ok{};
}

// optimizer: a torch.optim name or {class_path, init_args}
// (instantiate_torch_optimizer; AdamW takes torch's CUDA default, foreach).
Status ReadLitgptOptimizer(const Reader& r, const Json& root) {
  auto it = root.find("optimizer");
  if (it == root.end() || it->is_null()) return Ok{};
  std::string name;
  if (it->is_string()) {
    name = it->get<std::string>();
  } else if (it->is_object()) {
    VS_TRY(path, String(r, *it, "class_path", "optimizer.class_path"));
    name = path;
    if (auto args = it->find("init_args"); args != it->end() && args->is_object()) {
      if (args->value("fused", Json(false)) == true) name += "+fused";
    }
  } else {
    return r.Bad("optimizer", fmt::format("{} is not a name or a class_path mapping", Shown(*it)));
  }
  static constexpr std::pair<std::string_view, const char*> kOptimizers[] = {
      {"AdamW", "adamw"},
      {"torch.optim.AdamW", "adamw"},
      {"Adam", "adamw"},
      {"torch.optim.Adam", "adamw"},
      {"AdamW+fused", "adamw-fused"},
      {"torch.optim.AdamW+fused", "adamw-fused"},
      {"SGD", "sgd"},
      {"torch.optim.SGD", "sgd"}};
  const char* flag = nullptr;
  for (const auto& [lit, ours] : kOptimizers) flag = lit == name ? ours : flag;
  if (flag) {
    r.Set("--optimizer", flag, it->is_string() ? "optimizer" : "optimizer.class_path");
  } else {
    r.NotModelled("optimizer", fmt::format("{}: left to --optimizer", Shown(Json(name))));
  }
  return Ok{};
}

// More than one process: finetune_full shards with Fabric's FSDPStrategy
// (FSDP1, FULL_SHARD, auto_wrap_policy and activation_checkpointing_policy
// {Block}); finetune_lora with ModelParallelStrategy's parallelize_fn
// (FSDP2 fully_shard per Block and trainable Linear, every Block in a
// checkpoint_wrapper).
void ReadLitgptStrategy(const Reader& r, const Json& root, int64_t processes) {
  if (processes == 0) {
    r.Note("the process count", "devices", "\"auto\": every visible GPU; pass --gpus");
    return;
  }
  r.SetCount("--gpus", processes, "devices × num_nodes");
  if (processes == 1) return;
  const bool lora = IsLora(root);
  r.Set("--fsdp", "full",
        lora ? "devices (finetune_lora: FSDP2 per Block)"
             : "devices (finetune_full: FSDPStrategy, FULL_SHARD)");
  r.SetCount("--fsdp-version", lora ? 2 : 1, "devices (the script's strategy)");
  r.Set("--fsdp-wrap", "layers", "devices (the script wraps each Block)");
  // Lightning's FSDPStrategy leaves torch's backward_prefetch default, BACKWARD_PRE.
  if (!lora) r.Set("--fsdp-backward-prefetch", "pre", "devices (FSDPStrategy: torch's default)");
  r.Set("--grad-ckpt", "full", "devices (every Block checkpointed under FSDP)");
}

}  // namespace

Status ReadLitgpt(const Reader& r, const Json& root) {
  VS_TRY(model, String(r, root, "checkpoint_dir", "checkpoint_dir"));
  r.Note(fmt::format("model {}", common::QuoteForMessage(model, common::kQuotedBytes, '\'')),
         "checkpoint_dir", "not applied, the MODEL argument names the model estimated");
  VS_TRY(processes, LitgptProcesses(r, root));
  if (Status st = ReadLitgptPrecision(r, root); !st.ok()) return st;
  if (IsLora(root)) {
    if (Status st = ReadLitgptLora(r, root); !st.ok()) return st;
  } else {
    r.Set("--finetune", "full", "(no lora_* key: finetune_full)");
    r.Set("--impl", "litgpt", "(finetune_full: LitGPT's own GPT, litgpt/model.py)");
  }
  if (Status st = ReadLitgptTrain(r, root, processes); !st.ok()) return st;
  if (Status st = ReadLitgptOptimizer(r, root); !st.ok()) return st;
  if (Status st = ReadLitgptQuantize(r, root, processes); !st.ok()) return st;
  ReadLitgptStrategy(r, root, processes);
  r.Set("--loss", "litgpt-chunked",
        "(fit(): model(input_ids, lm_head_chunk_size=128), chunked_cross_entropy)");
  return Ok{};
}

}  // namespace fromcfg
}  // namespace vramscope::cli
