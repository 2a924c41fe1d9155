#include "vramscope/setup.h"

#include <fmt/format.h>

#include <optional>
#include <utility>

#include "vramscope/common/quote.h"
#include "vramscope/common/version.h"
#include "vramscope/model.h"

namespace vramscope {
namespace {

template <typename E>
struct Named {
  std::string_view name;
  E value;
};

constexpr Named<Precision> kPrecisions[] = {{"fp32", Precision::kFp32},
                                            {"fp16-mixed", Precision::kFp16Mixed},
                                            {"bf16-mixed", Precision::kBf16Mixed},
                                            {"fp16", Precision::kFp16},
                                            {"bf16", Precision::kBf16}};
constexpr Named<OptimizerKind> kOptimizers[] = {
    {"none", OptimizerKind::kNone},
    {"sgd", OptimizerKind::kSgd},
    {"sgd-momentum", OptimizerKind::kSgdMomentum},
    {"adamw", OptimizerKind::kAdamW},
    {"adamw-foreach", OptimizerKind::kAdamW},
    {"adamw-fused", OptimizerKind::kAdamWFused},
    {"adamw-forloop", OptimizerKind::kAdamWForLoop},
    {"adamw-8bit", OptimizerKind::kAdamW8bit},
    {"paged-adamw-8bit", OptimizerKind::kPagedAdamW8bit},
    {"paged-adamw", OptimizerKind::kPagedAdamW},
    {"adafactor", OptimizerKind::kAdafactor},
    {"lion", OptimizerKind::kLion}};
constexpr Named<Finetune> kFinetunes[] = {
    {"full", Finetune::kFull}, {"lora", Finetune::kLora}, {"qlora", Finetune::kQLora}};
constexpr Named<GradCkpt> kCkpts[] = {
    {"none", GradCkpt::kNone}, {"full", GradCkpt::kFull}, {"reentrant", GradCkpt::kReentrant}};
constexpr Named<Attention> kAttns[] = {
    {"eager", Attention::kEager}, {"sdpa", Attention::kSdpa}, {"flash", Attention::kFlash}};
constexpr Named<LossKind> kLosses[] = {{"hf", LossKind::kHf},
                                       {"chunked", LossKind::kChunked},
                                       {"fused-linear", LossKind::kFusedLinear},
                                       {"trl-fused", LossKind::kTrlFused},
                                       {"torchtune-chunked", LossKind::kTorchtuneChunked},
                                       {"litgpt-chunked", LossKind::kLitgptChunked}};
constexpr Named<DeviceRules> kDeviceRules[] = {{"cuda", DeviceRules::kCuda},
                                               {"cpu", DeviceRules::kCpu}};
constexpr Named<LoraDtype> kLoraDtypes[] = {{"fp32", LoraDtype::kFp32},
                                            {"model", LoraDtype::kModel}};
constexpr Named<ModelImpl> kModelImpls[] = {{"transformers", ModelImpl::kTransformers},
                                            {"torchtune", ModelImpl::kTorchtune},
                                            {"litgpt", ModelImpl::kLitgpt}};

template <typename E, size_t N>
Result<E> Parse(const Named<E> (&table)[N], std::string_view text, std::string_view flag) {
  std::string choices;
  for (const auto& entry : table) {
    if (entry.name == text) return entry.value;
    if (!choices.empty()) choices += ", ";
    choices += entry.name;
  }
  return MakeError(fmt::format("{}: {} is not one of {}", flag,
                               common::QuoteForMessage(text, common::kQuotedBytes, '\''), choices));
}

template <typename E, size_t N>
std::string_view Name(const Named<E> (&table)[N], E value) {
  for (const auto& entry : table) {
    if (entry.value == value) return entry.name;
  }
  return "?";
}

}  // namespace

std::string_view PrecisionName(Precision p) { return Name(kPrecisions, p); }
std::string_view OptimizerName(OptimizerKind o) { return Name(kOptimizers, o); }
std::string_view FinetuneName(Finetune f) { return Name(kFinetunes, f); }
std::string_view GradCkptName(GradCkpt g) { return Name(kCkpts, g); }
std::string_view AttentionName(Attention a) { return Name(kAttns, a); }
std::string_view LossName(LossKind l) { return Name(kLosses, l); }
std::string_view DeviceRulesName(DeviceRules d) { return Name(kDeviceRules, d); }
std::string_view LoraDtypeName(LoraDtype d) { return Name(kLoraDtypes, d); }
std::string_view ModelImplName(ModelImpl m) { return Name(kModelImpls, m); }

Result<Precision> ParsePrecision(std::string_view t) {
  return Parse(kPrecisions, t, "--precision");
}
Result<OptimizerKind> ParseOptimizer(std::string_view t) {
  return Parse(kOptimizers, t, "--optimizer");
}
Result<Finetune> ParseFinetune(std::string_view t) { return Parse(kFinetunes, t, "--finetune"); }
Result<GradCkpt> ParseGradCkpt(std::string_view t) { return Parse(kCkpts, t, "--grad-ckpt"); }
Result<Attention> ParseAttention(std::string_view t) { return Parse(kAttns, t, "--attn"); }
Result<LossKind> ParseLoss(std::string_view t) { return Parse(kLosses, t, "--loss"); }
Result<DeviceRules> ParseDeviceRules(std::string_view t) {
  return Parse(kDeviceRules, t, "--device-rules");
}
Result<LoraDtype> ParseLoraDtype(std::string_view t) {
  return Parse(kLoraDtypes, t, "--lora-dtype");
}
Result<ModelImpl> ParseModelImpl(std::string_view t) { return Parse(kModelImpls, t, "--impl"); }

// MAJOR.MINOR (common::ParseMajorMinor), optionally followed by ".PATCH..."
// (ignored); MAJOR at least 1.
Result<int> ParseVersion(std::string_view text, std::string_view field) {
  std::string_view rest;
  const std::optional<common::MajorMinor> version = common::ParseMajorMinor(text, &rest);
  if (!version || version->major < 1 || (!rest.empty() && rest.front() != '.')) {
    return MakeError(fmt::format("{}: {} is not a version like 4.46", field,
                                 common::QuoteForMessage(text, common::kQuotedBytes, '\'')));
  }
  return version->Packed();
}

Result<std::vector<std::string>> ParseLoraTargets(std::string_view text) {
  static constexpr std::string_view kKnown[] = {"q",  "k",    "v",       "o",         "gate",
                                                "up", "down", "lm_head", "all-linear"};
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string_view::npos) comma = text.size();
    std::string_view item = text.substr(start, comma - start);
    bool known = false;
    for (std::string_view k : kKnown) known = known || k == item;
    if (!known) {
      return MakeError(fmt::format(
          "--lora-targets: {} is not one of q, k, v, o, gate, up, down, lm_head, all-linear",
          common::QuoteForMessage(item, common::kQuotedBytes, '\'')));
    }
    out.emplace_back(item);
    start = comma + 1;
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> DescribeSetup(const TrainingSetup& s) {
  std::vector<std::pair<std::string, std::string>> k = {
      {"batch", std::to_string(s.batch)},
      {"seq", std::to_string(s.seq)},
      {"grad_accum", std::to_string(s.grad_accum)},
      {"precision", std::string(PrecisionName(s.precision))},
      {"optimizer", std::string(OptimizerName(s.optimizer))},
      {"finetune", std::string(FinetuneName(s.finetune))},
      {"grad_ckpt", std::string(GradCkptName(s.grad_ckpt))},
      {"attn", std::string(AttentionName(s.attn))},
      {"loss", std::string(LossName(s.loss))},
      {"transformers_version",
       fmt::format("{}.{}", s.transformers_version / 100, s.transformers_version % 100)},
      {"gpu", s.gpu},
      {"alloc_conf", s.alloc_conf},
      {"steps", std::to_string(s.steps)}};
  for (auto& kv : DescribeLayout(s.parallel)) k.push_back(std::move(kv));
  if (s.moe_capacity_factor > 0)
    k.emplace_back("moe_capacity_factor", fmt::format("{}", s.moe_capacity_factor));
  if (s.moe_imbalance != 1) k.emplace_back("moe_imbalance", fmt::format("{}", s.moe_imbalance));
  if (s.optimizer_in_backward) k.emplace_back("optimizer_in_backward", "true");
  if (s.activation_offload) k.emplace_back("activation_offload", "true");
  if (s.packed) k.emplace_back("packing", "padding-free");
  if (s.liger) k.emplace_back("liger", "true");
  if (s.dpo) k.emplace_back("dpo", s.dpo_precompute_ref ? "precomputed-reference" : "true");
  if (!s.attention_mask) k.emplace_back("attention_mask", "false");
  if (!s.use_cache) k.emplace_back("use_cache", "false");
  if (s.built_on_gpu) k.emplace_back("built_on_gpu", "true");
  if (s.ema) k.emplace_back("ema", s.ema_foreach ? "foreach" : "true");
  for (const std::string& name : s.text_encoder_names) k.emplace_back("text_encoder", name);
  if (s.device_rules != DeviceRules::kCuda)
    k.emplace_back("device_rules", std::string(DeviceRulesName(s.device_rules)));
  if (s.impl != ModelImpl::kTransformers)
    k.emplace_back("impl", std::string(ModelImplName(s.impl)));
  if (s.finetune != Finetune::kFull && s.lora_dtype != LoraDtype::kFp32)
    k.emplace_back("lora_dtype", std::string(LoraDtypeName(s.lora_dtype)));
  if (s.finetune != Finetune::kFull) {
    std::string targets;
    for (const auto& t : s.lora_targets) targets += (targets.empty() ? "" : ",") + t;
    k.insert(k.begin() + 6, {{"lora_rank", std::to_string(s.lora_rank)},
                             {"lora_targets", targets},
                             {"lora_dropout", fmt::format("{}", s.lora_dropout)}});
  }
  return k;
}

uint64_t TextLen(const ModelSpec& model, const TrainingSetup& setup) {
  if (setup.text_len != 0) return setup.text_len;
  if (model.is_flux) return model.flux.guidance_embeds ? 512 : 256;
  return 77;
}

namespace {

// Frameworks that decide the precision themselves, whatever the checkpoint's
// dtype: their default, in words, or nothing for transformers' own loading.
std::optional<std::pair<Precision, std::string_view>> FrameworkPrecision(const ModelSpec& model,
                                                                         const TrainingSetup& s) {
  using P = std::pair<Precision, std::string_view>;
  // torchtune 0.6.1's recipe configs all say `dtype: bf16` (the recipe's own
  // fallback without the key is fp32: --from a config reads it).
  if (s.impl == ModelImpl::kTorchtune)
    return P{Precision::kBf16, "torchtune's recipe configs (dtype: bf16), no autocast"};
  // LitGPT 0.5.13 get_default_supported_precision(training=True).
  if (s.impl == ModelImpl::kLitgpt)
    return P{Precision::kBf16Mixed,
             "LitGPT's default for training (get_default_supported_precision: bf16-mixed)"};
  if (model.is_unet || model.is_flux || model.is_vae)
    return P{Precision::kBf16Mixed,
             "diffusers' training scripts (--mixed_precision bf16): the model loaded in fp32, "
             "accelerate's autocast"};
  if (s.parallel.model_parallel())
    return P{Precision::kBf16Mixed, "Megatron-LM's --bf16, which keeps fp32 main parameters"};
  switch (s.parallel.dp_mode) {
    case DataParallel::kZero1:
    case DataParallel::kZero2:
    case DataParallel::kZero3:
      return P{Precision::kBf16Mixed,
               "DeepSpeed's bf16.enabled, which keeps fp32 master partitions whatever dtype "
               "the model loaded in"};
    case DataParallel::kFsdp:
      return P{Precision::kBf16Mixed,
               "accelerate's FSDP, which upcasts trainable parameters to fp32 under mixed "
               "precision"};
    default: return std::nullopt;
  }
}

}  // namespace

namespace {

// transformers' TrainingArguments: default_optim = "adamw_torch_fused" when
// torch >= 2.8 (training_args.py, read in 4.57.6 and 5.24.0; older releases
// not checked, so left at torch's foreach AdamW). The Trainer builds it for
// the transformers implementation; torchtune / LitGPT recipes, diffusers'
// scripts, DeepSpeed's engine (its config's optimizer block) and Megatron-LM
// build their own (plan/assumptions.cc says whose).
bool TrainerBuildsTheOptimizer(const ModelSpec& model, const TrainingSetup& s) {
  if (s.impl != ModelImpl::kTransformers || s.parallel.model_parallel()) return false;
  if (model.is_unet || model.is_flux || model.is_vae) return false;
  const DataParallel dp = s.parallel.dp_mode;
  return dp != DataParallel::kZero1 && dp != DataParallel::kZero2 && dp != DataParallel::kZero3;
}

void ApplyDefaultOptimizer(const ModelSpec& model, TrainingSetup* s) {
  if (!s->optimizer_auto) return;
  s->optimizer_auto = false;
  if (TrainerBuildsTheOptimizer(model, *s) && s->torch_version >= 208 &&
      s->transformers_version >= 457)
    s->optimizer = OptimizerKind::kAdamWFused;
}

}  // namespace

void ApplyLibraryDefaults(const ModelSpec& model, TrainingSetup* s) {
  ApplyDefaultOptimizer(model, s);
  if (!s->precision_auto) return;
  s->precision_auto = false;
  if (auto framework = FrameworkPrecision(model, *s)) {
    s->precision = framework->first;
    s->precision_default = fmt::format("the default of {}", framework->second);
    return;
  }
  // transformers 4.x from_pretrained: torch_dtype None -> torch.get_default_dtype()
  // (float32, modeling_utils.py 4.57.6); Trainer(bf16=True) autocasts.
  if (s->transformers_version < 500) {
    s->precision = Precision::kBf16Mixed;
    s->precision_default =
        "the default of transformers 4.x: from_pretrained loads float32 (torch_dtype=None), "
        "Trainer(bf16=True) autocasts";
    return;
  }
  // transformers 5.x from_pretrained: dtype None -> "auto" -> config.dtype
  // (modeling_utils.py 5.24.0, _get_dtype).
  const std::string& dtype = model.torch_dtype;
  if (dtype == "bfloat16" || dtype == "float16") {
    s->precision = dtype == "bfloat16" ? Precision::kBf16 : Precision::kFp16;
    s->precision_default = fmt::format(
        "the default of transformers 5: from_pretrained(dtype=\"auto\") loads the checkpoint's "
        "{} (config.json); Trainer(bf16=True)'s autocast over them casts no weight (its fp32 "
        "ops, e.g. LayerNorm outputs, are not modelled); fp32 master weights: --precision "
        "bf16-mixed",
        dtype);
    return;
  }
  s->precision = Precision::kBf16Mixed;
  s->precision_default = fmt::format(
      "the default of transformers 5: from_pretrained(dtype=\"auto\") loads the checkpoint's "
      "dtype, {}; Trainer(bf16=True) autocasts; 16-bit weights: --precision bf16",
      dtype.empty() ? "none named in config.json (float32 assumed)" : dtype);
}

Error AttributeKnobError(Error error,
                         const std::vector<std::pair<std::string, std::string>>& sources) {
  const std::string_view message = error.message;
  if (!message.starts_with("--")) return error;
  size_t end = message.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-", 2);
  if (end == std::string_view::npos) end = message.size();
  const std::string_view flag = message.substr(0, end), rest = message.substr(end);
  for (const auto& [from, source] : sources) {
    if (from != flag) continue;
    // "--batch: why" -> "SOURCE: why"; "--finetune qlora: why" -> "SOURCE:
    // qlora: why"; "--batch x --seq: why" -> "SOURCE x --seq: why".
    const bool value_follows = rest.starts_with(' ') && !rest.starts_with(" x ");
    return MakeError(fmt::format("{}{}{}", source, value_follows ? ":" : "", rest));
  }
  return error;
}

}  // namespace vramscope
