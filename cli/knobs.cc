#include "knobs.h"

#include <algorithm>
#include <cstdio>

#include <fmt/format.h>

#include "output.h"
#include "vramscope/lower.h"
#include "vramscope/result.h"

namespace vramscope::cli {

namespace {

// The knobs of the diffusion steps (UNet, FLUX): the image, the prompt, the
// frozen text encoders, diffusers' EMA.
void AddDiffusionFlags(CLI::App* sub, KnobArgs* k) {
  sub->add_option("--image-size", k->image_size,
                  "Diffusion UNets and FLUX: image side in pixels (default: a UNet config's "
                  "sample_size x --vae-scale; FLUX 512, the dreambooth scripts' resolution)");
  sub->add_option("--vae-scale", k->vae_scale,
                  "Diffusion UNets and FLUX: pixels per latent (default 8, the VAEs of Stable "
                  "Diffusion and FLUX; 1: pixel space)");
  sub->add_option("--vae", k->vae,
                  "Diffusion UNets and FLUX: the frozen AutoencoderKL (catalog alias or "
                  "vae/config.json) on the GPU, encoding each micro-batch's images (default: "
                  "latents precomputed, no VAE)");
  sub->add_option("--text-len", k->text_len,
                  "Diffusion UNets and FLUX: text-encoder tokens per prompt (default 77, CLIP; "
                  "FLUX: T5's 512, 256 for schnell)");
  sub->add_option("--target-len", k->target_len,
                  "T5: decoder tokens per sample, the labels' length (default: --seq, which is "
                  "the source length)");
  sub->add_option("--text-encoder", k->text_encoders,
                  "Diffusion UNets and FLUX: a frozen text encoder kept on the GPU and run each "
                  "micro-batch (catalog alias, Hub id or config.json; repeatable, in the "
                  "pipeline's order: SDXL and FLUX have two). Default: none, the embeddings "
                  "were precomputed")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  sub->add_flag("--ema", k->ema,
                "Diffusion UNets: diffusers' EMAModel keeps an fp32 copy of the weights on the GPU "
                "(train_text_to_image.py --use_ema)");
  sub->add_flag("--ema-foreach", k->ema_foreach,
                "With --ema: the EMA step uses torch._foreach ops (--foreach_ema)");
}

}  // namespace

void AddKnobFlags(CLI::App* sub, KnobArgs* k) {
  k->app = sub;
  sub->add_option("--batch", k->batch, "Micro-batch per GPU (default 1)");
  sub->add_option("--seq", k->seq, "Tokens per sample (default 2048)");
  sub->add_option("--grad-accum", k->grad_accum, "Micro-batches per optimizer step (default 1)");
  AddDiffusionFlags(sub, k);
  sub->add_option("--steps", k->steps, "Optimizer steps to simulate (default 3)");
  sub->add_option("--precision", k->precision, "fp32, fp16-mixed, bf16-mixed, fp16, bf16");
  sub->add_option("--optimizer", k->optimizer,
                  "none, sgd, sgd-momentum, adamw, adamw-foreach, adamw-fused, adamw-forloop, "
                  "adamw-8bit, paged-adamw-8bit, paged-adamw, adafactor, lion");
  sub->add_option("--finetune", k->finetune, "full, lora, qlora");
  sub->add_option("--lora-rank", k->lora_rank, "LoRA rank (default 16)");
  sub->add_option("--lora-targets", k->lora_targets, "q,k,v,o,gate,up,down,lm_head or all-linear");
  sub->add_option("--lora-dropout", k->lora_dropout, "LoRA dropout (default 0.05)");
  sub->add_option("--impl", k->impl,
                  "whose modules: transformers (default), torchtune or litgpt (their own models)");
  sub->add_option("--lora-dtype", k->lora_dtype,
                  "LoRA adapters' dtype: fp32 (PEFT's default) or model (torchtune, LitGPT)");
  sub->add_option("--grad-ckpt", k->grad_ckpt, "none, full (non-reentrant), reentrant");
  sub->add_option("--attn", k->attn, "eager, sdpa, flash");
  sub->add_option("--loss", k->loss,
                  "hf, chunked, fused-linear, trl-fused, torchtune-chunked, litgpt-chunked");
  sub->add_option("--transformers-version", k->transformers_version,
                  "Behaviour of that release (e.g. 4.45)");
  sub->add_option("--torch-version", k->torch_version,
                  "Behaviour of that PyTorch release (e.g. 2.4)");
  sub->add_option("--gpu", k->gpu, "GPU catalog entry (see `vramscope gpus`)");
  sub->add_option("--alloc-conf", k->alloc_conf, "PYTORCH_CUDA_ALLOC_CONF syntax");
  sub->add_flag("--optimizer-in-backward", k->optimizer_in_backward,
                "Step each parameter from its post-accumulate-grad hook (torch >= 2.1)");
  sub->add_flag("--no-attention-mask", k->no_attention_mask,
                "The batch has no attention_mask (model(input_ids=..., labels=...) alone)");
  sub->add_flag("--no-use-cache", k->no_use_cache,
                "The script sets model.config.use_cache = False: no KV cache in training");
  sub->add_flag("--built-on-gpu", k->built_on_gpu,
                "The model is built with from_config under torch.device('cuda') (from scratch), "
                "not loaded with from_pretrained");
  sub->add_flag("--activation-offload", k->activation_offload,
                "Forward under torch.autograd.graph.save_on_cpu(pin_memory=True): saved tensors "
                "live in host memory; with --impl torchtune and --grad-ckpt full, torchtune's "
                "OffloadActivations (the checkpointed layer inputs)");
  sub->add_flag(
      "--dpo", k->dpo,
      "TRL's DPOTrainer step (trl 1.16; with --loss trl-fused): --batch counts preference "
      "pairs, their chosen and rejected rows run together, then the reference model's "
      "no-grad forward");
  sub->add_flag("--dpo-precompute-ref", k->dpo_precompute_ref,
                "--dpo with precompute_ref_log_probs: no reference forward in the step and, under "
                "full fine-tuning, no reference copy");
  sub->add_flag("--packing", k->packing,
                "Padding-free packing: the --batch sequences of --seq tokens run as one row with "
                "position_ids (DataCollatorWithFlattening, TRL padding_free)");
  sub->add_flag("--liger", k->liger,
                "Liger kernels: RMSNorm, RoPE, SwiGLU, fused linear cross-entropy, as "
                "use_liger_kernel=True applies them (liger-kernel 0.8.5; Llama, Mistral, Qwen2; "
                "implies --loss fused-linear unless --loss trl-fused)");
  sub->add_option("--moe-capacity-factor", k->moe_capacity_factor,
                  "MoE expert capacity factor (0: dropless, the default; >0: padded to capacity)");
  sub->add_option("--moe-imbalance", k->moe_imbalance,
                  "MoE: busiest expert's load over an even share (default 1)");
  sub->add_option("--device-rules", k->device_rules,
                  "cuda (default) or cpu: PyTorch's CPU kernels, only to compare with CPU "
                  "reference traces (docs/fidelity.md)");
  AddParallelFlags(sub, &k->parallel);
  sub->add_option("--max-events", k->max_events,
                  "Work budget: the most events one estimate may lower to (default 2^24 = "
                  "16777216; a sweep's points together: 4 times it); raise it deliberately");
}

namespace {
constexpr const char* kLoraFlags[] = {"--lora-rank", "--lora-targets", "--lora-dropout"};
}  // namespace

void KnobArgs::KeepGiven() {
  // Every flag given, not only some: --precision decides the default precision
  // and any flag overrides a --from file's knob (compare's knobs outlive its app).
  given.clear();
  if (app) {
    for (const CLI::Option* option : app->get_options()) {
      if (option->count() == 0) continue;
      for (const std::string& name : option->get_lnames()) given.push_back("--" + name);
    }
  }
  app = nullptr;
}

bool KnobArgs::Given(const char* flag) const {
  if (app) return app->count(flag) > 0;
  return std::find(given.begin(), given.end(), flag) != given.end();
}

bool KnobArgs::GivenOrRead(const char* flag) const {
  return Given(flag) || std::any_of(file_sources.begin(), file_sources.end(),
                                    [flag](const auto& source) { return source.first == flag; });
}

void KnobArgs::Warn(const ModelSpec& model, const TrainingSetup& setup) const {
  std::vector<std::string> lines = SetupWarnings(model, setup);
  if (setup.finetune == Finetune::kFull) {
    for (const char* flag : kLoraFlags) {
      if (Given(flag)) {
        lines.push_back(fmt::format("{} has no effect without --finetune lora or qlora", flag));
      }
    }
  }
  for (std::string& line : lines) DeferWarning(std::move(line));
}

void AddFromFlag(CLI::App* sub, KnobArgs* k) {
  sub->add_option("--from", k->from_files,
                  "Read knobs from FILE: a DeepSpeed config JSON, HF TrainingArguments JSON, an "
                  "accelerate config YAML, an Axolotl training config YAML, a TRL SFTConfig / "
                  "DPOConfig (JSON or YAML), a torchtune recipe config or a LitGPT fine-tuning "
                  "config (YAML) (repeatable; flags given here win; docs/configs.md)");
}

void AddFromAssumptions(const FromConfig& from, Report* report) {
  for (const FileKnob& k : from.knobs) {
    report->assumptions.push_back(
        {"from file", fmt::format("{} {} (from {}: {})", k.flag, k.value, k.file, k.key), k.flag});
  }
  for (const std::string& line : from.not_modelled) {
    report->assumptions.push_back({"unmodelled", line, ""});
  }
  for (const std::string& line : from.notes) report->assumptions.push_back({"from file", line, ""});
}

bool FromSets(const FromConfig& from, std::string_view flag) {
  return std::any_of(from.knobs.begin(), from.knobs.end(),
                     [&](const FileKnob& k) { return k.flag == flag; });
}

// A knob of a --from file into the flag's field (the value is well-formed:
// from_config.cc writes it). The data-parallel mode is one choice: any of
// --ddp/--zero/--fsdp on the command line overrides the file's.
void KnobArgs::SetFromFile(const FileKnob& k) {
  const std::pair<const char*, std::string*> strings[] = {
      {"--precision", &precision},
      {"--optimizer", &optimizer},
      {"--grad-ckpt", &grad_ckpt},
      {"--loss", &loss},
      {"--finetune", &finetune},
      {"--lora-targets", &lora_targets},
      {"--lora-dtype", &lora_dtype},
      {"--impl", &impl},
      {"--attn", &attn},
      {"--zero", &parallel.zero},
      {"--fsdp", &parallel.fsdp},
      {"--fsdp-backward-prefetch", &parallel.fsdp_backward_prefetch},
      {"--fsdp-wrap", &parallel.fsdp_wrap},
      {"--offload", &parallel.offload},
      {"--zero-buckets", &parallel.zero_buckets},
      {"--zero-overlap-comm", &parallel.zero_overlap_comm}};
  const std::pair<const char*, int64_t*> ints[] = {
      {"--gpus", &parallel.gpus},
      {"--gpus-per-node", &parallel.gpus_per_node},
      {"--fsdp-version", &parallel.fsdp_version},
      {"--ddp-bucket-cap-mb", &parallel.ddp_bucket_cap_mb},
      {"--zero-sub-group-size", &parallel.zero_sub_group_size},
      {"--zero-reduce-bucket-size", &parallel.zero_reduce_bucket_size},
      {"--zero-prefetch-bucket-size", &parallel.zero_prefetch_bucket_size},
      {"--zero-max-live-parameters", &parallel.zero_max_live_parameters},
      {"--zero-max-reuse-distance", &parallel.zero_max_reuse_distance},
      {"--zero-persistence-threshold", &parallel.zero_persistence_threshold}};
  // A reader's flag that no list below takes would be dropped without a word:
  // that is a bug in the reader (the fuzz target fuzz_accelerate_yaml checks
  // its flags against the same set).
  bool taken = false;
  for (const auto& [flag, field] : strings) {
    if (k.flag == flag) *field = k.value, taken = true;
  }
  // Numbers come typed from the reader (FileKnob::count / fraction), never
  // parsed back from their text.
  for (const auto& [flag, field] : ints) {
    if (k.flag != flag) continue;
    VS_CHECK(k.count);
    *field = *k.count, taken = true;
  }
  const std::pair<const char*, bool*> bools[] = {
      {"--ddp", &parallel.ddp},
      {"--dpo", &dpo},
      {"--dpo-precompute-ref", &dpo_precompute_ref},
      {"--packing", &packing},
      {"--liger", &liger},
      {"--optimizer-in-backward", &optimizer_in_backward},
      {"--activation-offload", &activation_offload}};
  for (const auto& [flag, field] : bools) {
    if (k.flag == flag) *field = k.value == "true", taken = true;
  }
  const std::pair<const char*, uint64_t*> counts[] = {{"--batch", &batch},
                                                      {"--grad-accum", &grad_accum},
                                                      {"--seq", &seq},
                                                      {"--lora-rank", &lora_rank}};
  for (const auto& [flag, field] : counts) {
    if (k.flag == flag) {
      VS_CHECK(k.count && *k.count >= 0);  // the readers' ranges start at 1
      *field = static_cast<uint64_t>(*k.count), taken = true;
    }
  }
  if (k.flag == "--lora-dropout") {
    VS_CHECK(k.fraction);
    lora_dropout = *k.fraction, taken = true;
  }
  VS_CHECK(taken);
}

Result<KnobArgs> KnobArgs::WithFiles(FromConfig* from) const {
  VS_TRY(config, ReadConfigFiles(from_files, std::atoi(transformers_version.c_str())));
  return WithConfig(std::move(config), from);
}

KnobArgs KnobArgs::WithConfig(FromConfig config, FromConfig* from) const {
  KnobArgs merged = *this;
  merged.from_files.clear();
  const bool mode_given = Given("--ddp") || Given("--zero") || Given("--fsdp");
  FromConfig applied;
  for (const FileKnob& k : config.knobs) {
    if (Given(k.flag.c_str())) continue;
    const bool mode = k.flag == "--ddp" || k.flag == "--zero" || k.flag == "--fsdp";
    if (mode_given && mode) continue;
    // A later file's data-parallel mode replaces an earlier file's.
    if (mode) {
      for (const char* other : {"--ddp", "--zero", "--fsdp"}) {
        if (k.flag != other) merged.SetFromFile({other, "", k.file, k.key, {}, {}});
      }
    }
    merged.SetFromFile(k);
    std::erase_if(applied.knobs, [&](const FileKnob& a) {
      return a.flag == k.flag ||
             (mode && (a.flag == "--ddp" || a.flag == "--zero" || a.flag == "--fsdp"));
    });
    applied.knobs.push_back(k);
  }
  for (const std::string& line : config.not_modelled) {
    DeferWarning(fmt::format("--from {}: not modelled as written", line));
  }
  applied.not_modelled = std::move(config.not_modelled);
  applied.notes = std::move(config.notes);
  for (const FileKnob& k : applied.knobs) {
    // A key that is a description ("(a DPOConfig: beta, ...)") follows the
    // file without a colon of its own.
    merged.file_sources.emplace_back(
        k.flag, fmt::format("{}{}{}", k.file, k.key.starts_with('(') ? " " : ": ", k.key));
  }
  if (from) *from = std::move(applied);
  return merged;
}

Status KnobArgs::ResolveTextEncoders(const ModelIo& io, TrainingSetup* setup) const {
  for (const std::string& name : text_encoders) {
    auto spec = ResolveModel(name, io);
    if (!spec.ok()) return MakeError("--text-encoder: " + spec.error().message);
    setup->text_encoder_names.push_back(name);
    setup->text_encoders.push_back(std::make_shared<const ModelSpec>(std::move(*spec)));
  }
  return Ok{};
}

Status ResolveVae(const KnobArgs& knobs, const ModelIo& io, TrainingSetup* setup) {
  if (knobs.vae.empty()) return Ok{};
  VS_TRY(vae, ResolveModel(knobs.vae, io));
  if (!vae.is_vae) {
    return MakeError(fmt::format("--vae: {} is not a diffusers AutoencoderKL config ({})",
                                 knobs.vae, vae.architecture));
  }
  if (!knobs.Given("--vae-scale")) {
    setup->vae_scale = vae.vae.Downsampling();
    setup->knob_sources.emplace_back(
        "--vae-scale", fmt::format("--vae {}: block_out_channels (the VAE downsamples by {})",
                                   vae.name, setup->vae_scale));
  }
  setup->vae_name = knobs.vae;
  setup->vae = std::make_shared<const ModelSpec>(std::move(vae));
  return Ok{};
}

Result<TrainingSetup> KnobArgs::ToSetup(FromConfig* from) const {
  if (from_files.empty()) return Convert();
  VS_TRY(merged, WithFiles(from));
  return merged.Convert();
}

Result<TrainingSetup> KnobArgs::Convert() const {
  TrainingSetup s;
  s.batch = batch;
  s.seq = seq;
  s.grad_accum = grad_accum;
  s.steps = steps;
  s.max_events = max_events;
  s.image_size = image_size;
  s.vae_scale = vae_scale;
  s.text_len = text_len;
  s.target_len = target_len;
  s.ema = ema || ema_foreach;
  s.ema_foreach = ema_foreach;
  auto p = ParsePrecision(precision);
  if (!p.ok()) return p.error();
  s.precision = *p;
  auto o = ParseOptimizer(optimizer);
  if (!o.ok()) return o.error();
  s.optimizer = *o;
  auto f = ParseFinetune(finetune);
  if (!f.ok()) return f.error();
  s.finetune = *f;
  s.lora_rank = lora_rank;
  auto t = ParseLoraTargets(lora_targets);
  if (!t.ok()) return t.error();
  s.lora_targets = *t;
  s.lora_dropout = lora_dropout;
  auto ld = ParseLoraDtype(lora_dtype);
  if (!ld.ok()) return ld.error();
  s.lora_dtype = *ld;
  auto im = ParseModelImpl(impl);
  if (!im.ok()) return im.error();
  s.impl = *im;
  auto g = ParseGradCkpt(grad_ckpt);
  if (!g.ok()) return g.error();
  s.grad_ckpt = *g;
  auto a = ParseAttention(attn);
  if (!a.ok()) return a.error();
  s.attn = *a;
  auto l = ParseLoss(loss);
  if (!l.ok()) return l.error();
  s.loss = *l;
  // --liger: the model's forward is Liger's *_lce_forward, whose loss is the
  // fused linear cross-entropy (TRL's own fused head stays when asked for).
  s.liger = liger;
  if (liger && s.loss == LossKind::kHf) s.loss = LossKind::kFusedLinear;
  auto tv = ParseVersion(transformers_version, "--transformers-version");
  if (!tv.ok()) return tv.error();
  s.transformers_version = *tv;
  auto pv = ParseVersion(torch_version, "--torch-version");
  if (!pv.ok()) return pv.error();
  s.torch_version = *pv;
  s.gpu = gpu;
  s.alloc_conf = alloc_conf;
  s.optimizer_in_backward = optimizer_in_backward;
  s.attention_mask = !no_attention_mask;
  s.use_cache = !no_use_cache;
  s.built_on_gpu = built_on_gpu;
  s.activation_offload = activation_offload;
  s.dpo = dpo || dpo_precompute_ref;
  s.dpo_precompute_ref = dpo_precompute_ref;
  s.packed = packing;
  s.moe_capacity_factor = moe_capacity_factor;
  s.moe_imbalance = moe_imbalance;
  auto dr = ParseDeviceRules(device_rules);
  if (!dr.ok()) return dr.error();
  s.device_rules = *dr;
  s.knob_sources = file_sources;
  // Neither the command line nor a --from file named it: the model and the
  // libraries decide (ApplyLibraryDefaults, once the model is resolved).
  s.precision_auto = !GivenOrRead("--precision");
  s.optimizer_auto = !GivenOrRead("--optimizer");
  auto layout = parallel.ToLayout();
  if (!layout.ok()) return AttributeKnobError(layout.error(), s.knob_sources);
  s.parallel = *layout;
  return s;
}

}  // namespace vramscope::cli
