// --from FILE: TRL's trainer configs (trl 1.16.0: trainer/base_config.py,
// sft_config.py, dpo_config.py, model_config.py) to flags; docs/configs.md.
#include <fmt/format.h>

#include "from_config_internal.h"
#include "vramscope/common/json_depth.h"

namespace vramscope::cli {
namespace fromcfg {

// --- TRL's trainer configs (trl 1.16.0: trainer/base_config.py, sft_config.py,
// dpo_config.py, model_config.py): SFTConfig / DPOConfig (TrainingArguments
// subclasses, saved as JSON or written as the YAML of `trl sft|dpo --config`,
// which also takes ModelConfig's keys). TRL 1.15+ trainers compute the loss
// through their fused LM head (--loss trl-fused). ---

constexpr const char* kTrlSftKeys[] = {"packing",
                                       "packing_strategy",
                                       "dataset_text_field",
                                       "completion_only_loss",
                                       "assistant_only_loss",
                                       "eval_packing"};
constexpr const char* kTrlDpoKeys[] = {"beta",
                                       "precompute_ref_log_probs",
                                       "precompute_ref_batch_size",
                                       "ref_model_init_kwargs",
                                       "f_divergence_type",
                                       "f_alpha_divergence_coef",
                                       "loss_weights",
                                       "ld_alpha",
                                       "use_weighting",
                                       "sync_ref_model",
                                       "ref_model_mixup_alpha",
                                       "ref_model_sync_steps",
                                       "discopop_tau"};
// ModelConfig keys (trl sft|dpo --config) no other format has.
constexpr const char* kTrlModelKeys[] = {"use_peft", "model_name_or_path", "lora_target_modules",
                                         "lora_task_type"};

bool LooksLikeTrl(const Json& root) {
  return !root.contains("base_model") &&
         (HasAny(root, kTrlSftKeys) || HasAny(root, kTrlDpoKeys) || HasAny(root, kTrlModelKeys));
}

// The policy's dtype: ModelConfig's `dtype`, else model_init_kwargs.dtype (an
// object, or its JSON text as the CLI passes it). create_model_from_path
// (trainer/utils.py) loads float32 when neither says.
Result<std::pair<std::string, std::string>> TrlDtype(const Reader& r, const Json& root) {
  VS_TRY(top, String(r, root, "dtype", "dtype"));
  if (!top.empty()) return std::make_pair(top, std::string("dtype"));
  auto it = root.find("model_init_kwargs");
  if (it == root.end() || it->is_null()) return std::make_pair(std::string(), std::string());
  Json kwargs = *it;
  if (kwargs.is_string()) {
    // JSON inside a string (as `trl sft --model_init_kwargs '{...}'` passes
    // it): the file's own depth limit was not applied to it, so it is here.
    const std::string& text = it->get_ref<const std::string&>();
    if (common::JsonNestsDeeperThan(text, kMaxConfigDepth)) {
      return r.Bad("model_init_kwargs",
                   fmt::format("a JSON text nested deeper than {} levels", kMaxConfigDepth));
    }
    kwargs = common::FindNulByte(text) ? Json() : Json::parse(text, nullptr, false);
  }
  if (!kwargs.is_object()) {
    return r.Bad("model_init_kwargs", fmt::format("{} is not an object", Shown(*it)));
  }
  VS_TRY(dtype, String(r, kwargs, "dtype", "model_init_kwargs.dtype"));
  return std::make_pair(dtype, std::string("model_init_kwargs.dtype"));
}

// The weights' dtype under bf16 (TRL's default: true unless fp16): float32
// weights under autocast are bf16-mixed; half weights are --precision
// bf16/fp16; none named, the default precision.
Status ReadTrlPrecision(const Reader& r, const Json& root) {
  VS_TRY(fp16, Bool(r, root, "fp16", "fp16"));
  // bf16 (TRL's default, true unless fp16) autocasts over whatever dtype the
  // model loaded in: without model_init_kwargs.dtype, from_pretrained's own
  // default, which is the default precision (ApplyLibraryDefaults).
  VS_TRY(dtype, TrlDtype(r, root));
  const auto& [name, key] = dtype;
  if (name.empty()) return Ok{};
  if (name == "float32") {
    if (!fp16.value_or(false) && root.value("bf16", Json(true)) != Json(false))
      r.Set("--precision", "bf16-mixed", key + " (float32 weights under TRL's bf16 autocast)");
    return Ok{};
  }
  if (name == "bfloat16" || name == "auto") {
    r.Set("--precision", "bf16",
          name == "auto" ? key + " (auto: the checkpoint's dtype, taken as bf16)" : key);
  } else if (name == "float16") {
    r.Set("--precision", "fp16", key);
  } else {
    return r.Bad(
        key, fmt::format("{} is not one of bfloat16, float16, float32, auto", Shown(Json(name))));
  }
  return Ok{};
}

// PEFT's names for a layer's projections, as lora_target_modules lists them.
constexpr std::pair<std::string_view, const char*> kPeftTargets[] = {
    {"q_proj", "q"},       {"k_proj", "k"},   {"v_proj", "v"},       {"o_proj", "o"},
    {"gate_proj", "gate"}, {"up_proj", "up"}, {"down_proj", "down"}, {"lm_head", "lm_head"}};

Status ReadTrlTargets(const Reader& r, const Json& root) {
  auto it = root.find("lora_target_modules");
  if (it == root.end() || it->is_null()) return Ok{};  // PEFT's per-model default: q, v
  if (it->is_string() && it->get<std::string>() == "all-linear") {
    r.Set("--lora-targets", "all-linear", "lora_target_modules");
    return Ok{};
  }
  if (Status st = ShortList(r, *it, "lora_target_modules"); !st.ok()) return st;
  const Json list = it->is_string() ? Json::array({*it}) : *it;
  if (!list.is_array() || list.empty()) {
    return r.Bad("lora_target_modules",
                 fmt::format("{} is not a list of module names", Shown(*it)));
  }
  std::string targets;
  for (const Json& name : list) {
    const char* flag = nullptr;
    for (const auto& [peft, ours] : kPeftTargets) {
      if (name.is_string() && name.get<std::string>() == peft) flag = ours;
    }
    if (!flag) {
      r.NotModelled("lora_target_modules",
                    fmt::format("{}: not a projection vramscope targets; left out", Shown(name)));
      continue;
    }
    targets += (targets.empty() ? "" : ",") + std::string(flag);
  }
  if (!targets.empty()) r.Set("--lora-targets", targets, "lora_target_modules");
  return Ok{};
}

// ModelConfig's PEFT keys: use_peft with lora_r, lora_dropout and the
// targets; load_in_4bit makes it QLoRA.
Status ReadTrlPeft(const Reader& r, const Json& root) {
  VS_TRY(peft, Bool(r, root, "use_peft", "use_peft"));
  if (!peft.value_or(false)) return Ok{};
  VS_TRY(four, Bool(r, root, "load_in_4bit", "load_in_4bit"));
  r.Set("--finetune", four.value_or(false) ? "qlora" : "lora",
        four.value_or(false) ? "use_peft, load_in_4bit" : "use_peft");
  VS_TRY(rank, Number(r, root, "lora_r", "lora_r", 1, 1 << 16));
  r.SetCount("--lora-rank", rank.value_or(16),
             rank ? "lora_r" : "lora_r (absent: ModelConfig's default 16)");
  VS_TRY(dropout, Fraction(r, root, "lora_dropout", "lora_dropout"));
  if (dropout) r.SetFraction("--lora-dropout", *dropout, "lora_dropout");
  for (const char* key : {"use_dora", "load_in_8bit"}) {
    if (root.value(key, Json(false)) == true) r.NotModelled(key, "not modelled");
  }
  if (root.contains("lora_modules_to_save") && !root["lora_modules_to_save"].is_null()) {
    r.NotModelled("lora_modules_to_save", "fully trained extra modules are not modelled");
  }
  return ReadTrlTargets(r, root);
}

// SFTConfig: padding-free rows (padding_free, or packing with the "bfd"
// strategies, which imply it: sft_trainer.py __init__) are --packing.
Status ReadTrlSft(const Reader& r, const Json& root) {
  VS_TRY(packing, Bool(r, root, "packing", "packing"));
  VS_TRY(padding_free, Bool(r, root, "padding_free", "padding_free"));
  VS_TRY(strategy, String(r, root, "packing_strategy", "packing_strategy"));
  if (!strategy.empty() && strategy != "bfd" && strategy != "bfd_split" &&
      strategy != "bfd-requeue" && strategy != "wrapped") {
    return r.Bad("packing_strategy",
                 fmt::format("{} is not one of bfd, bfd_split, wrapped", Shown(Json(strategy))));
  }
  if (padding_free.value_or(false)) {
    r.Set("--packing", "true", "padding_free");
  } else if (packing.value_or(false) && strategy != "wrapped") {
    r.Set("--packing", "true", "packing (strategy bfd: padding-free)");
  }
  for (const char* key : {"completion_only_loss", "assistant_only_loss"}) {
    if (root.value(key, Json(false)) == true) {
      r.Note("every position scored", key,
             "on CUDA TRL's fused head scores only the labelled positions: an upper bound");
    }
  }
  return Ok{};
}

// DPOConfig: --dpo, precompute_ref_log_probs.
Status ReadTrlDpo(const Reader& r, const Json& root) {
  r.Set("--dpo", "true", "(a DPOConfig: beta, ref_model_init_kwargs, ...)");
  VS_TRY(pre, Bool(r, root, "precompute_ref_log_probs", "precompute_ref_log_probs"));
  if (pre.value_or(false)) r.Set("--dpo-precompute-ref", "true", "precompute_ref_log_probs");
  if (root.value("padding_free", Json(false)) == true) {
    r.NotModelled("padding_free", "padding-free DPO rows are not modelled");
  }
  if (root.value("disable_dropout", Json(true)) == false) {
    r.NotModelled("disable_dropout", "dropout kept in DPO's models: --dpo models it off");
  }
  if (root.contains("ref_model_init_kwargs") && !root["ref_model_init_kwargs"].is_null()) {
    r.NotModelled("ref_model_init_kwargs", "the reference is modelled in the policy's dtype");
  }
  return Ok{};
}

Status ReadTrl(const Reader& r, const Json& root) {
  // TrainingArguments' keys, without use_liger_kernel: TRL 1.16 turns Liger's
  // fused cross-entropy off for its own head (--loss trl-fused stays), the
  // layer kernels are --liger below.
  Json args = root;
  args.erase("use_liger_kernel");
  if (Status st = ReadTrainingArguments(r, args); !st.ok()) return st;
  if (!root.contains("gradient_checkpointing")) {
    // TRL's default true, read as TrainingArguments reads true.
    Json on = Json::object();
    on["gradient_checkpointing"] = true;
    if (auto it = root.find("gradient_checkpointing_kwargs"); it != root.end()) on[it.key()] = *it;
    FromConfig scratch;
    const Reader probe{r.file, &scratch, r.transformers_major, r.read};
    if (Status st = ReadHfCheckpointing(probe, on); !st.ok()) return st;
    for (const FileKnob& k : scratch.knobs) {
      r.Copy(k, k.key == "gradient_checkpointing"
                    ? "gradient_checkpointing (absent: TRL's default true)"
                    : k.key);
    }
  }
  if (Status st = ReadTrlPrecision(r, root); !st.ok()) return st;
  VS_TRY(length, Number(r, root, "max_length", "max_length", 1, int64_t{1} << 22));
  if (length) {
    r.SetCount("--seq", *length, "max_length");
  } else if (root.contains("max_length")) {
    r.NotModelled("max_length", "null: no truncation, the longest sample; pass --seq");
  } else {
    r.SetCount("--seq", 1024, "max_length (absent: TRL's default 1024)");
  }
  r.Set("--loss", "trl-fused", "(TRL 1.15+ trainers: the fused LM head)");
  if (Status st = ReadTrlPeft(r, root); !st.ok()) return st;
  if (root.value("use_liger_kernel", Json(false)) == true) {
    r.Set("--liger", "true", "use_liger_kernel");
  }
  if (root.value("activation_offloading", Json(false)) == true) {
    r.NotModelled("activation_offloading", "TRL's activation offloading");
  }
  return HasAny(root, kTrlDpoKeys) ? ReadTrlDpo(r, root) : ReadTrlSft(r, root);
}

}  // namespace fromcfg
}  // namespace vramscope::cli
