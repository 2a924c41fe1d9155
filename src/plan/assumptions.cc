// The defaults an estimate rests on, in words, each with the flag that
// changes it (issue 18: a report says what it assumed).
#include <fmt/format.h>

#include <optional>

#include "vramscope/estimate.h"

namespace vramscope {
namespace {

// Under *-mixed precision the sharding engines do not autocast fp32 weights
// (docs/parallel.md, sharding.h casts_model_to_half).
std::optional<std::string> EngineWeights(const TrainingSetup& s) {
  const bool mixed = s.precision == Precision::kBf16Mixed || s.precision == Precision::kFp16Mixed;
  if (!mixed) return std::nullopt;
  const char* half = s.precision == Precision::kBf16Mixed ? "bf16" : "fp16";
  if (s.parallel.model_parallel()) {
    return fmt::format(
        "Megatron-LM: {} parameters, an fp32 gradient buffer (main_grad), fp32 main "
        "parameters and optimizer state",
        half);
  }
  switch (s.parallel.dp_mode) {
    case DataParallel::kZero1:
    case DataParallel::kZero2:
    case DataParallel::kZero3:
      return fmt::format(
          "DeepSpeed casts the module to {} (no autocast); fp32 master partitions "
          "and optimizer state",
          half);
    case DataParallel::kFsdp:
      return fmt::format(
          "accelerate upcasts trainable parameters to fp32 and FSDP shards them; "
          "MixedPrecision gathers and computes in {}; fp32 sharded gradients and "
          "optimizer state",
          half);
    default: return std::nullopt;
  }
}

// The weights' words, with whose default the precision is when none was
// given (TrainingSetup::precision_default), else `hint`: the other choice.
std::string Defaulted(const TrainingSetup& s, const std::string& text, std::string_view hint) {
  if (s.precision_default.empty()) return fmt::format("{}{}", text, hint);
  return fmt::format("{} ({})", text, s.precision_default);
}

std::string PlainWeights(const TrainingSetup& s) {
  switch (s.precision) {
    case Precision::kFp32: return "fp32 weights, gradients and optimizer state; no autocast";
    case Precision::kBf16Mixed:
      return Defaulted(s,
                       "fp32 weights (the model loaded in float32) under torch.autocast(bfloat16); "
                       "fp32 gradients and optimizer state",
                       "; the checkpoint's own 16-bit dtype, as transformers 5 loads a bf16 "
                       "checkpoint by default, is --precision bf16");
    case Precision::kFp16Mixed:
      return Defaulted(s,
                       "fp32 weights under torch.autocast(float16) with a GradScaler; fp32 "
                       "gradients and optimizer state",
                       "");
    case Precision::kBf16:
      return Defaulted(s, "bf16 weights, gradients and optimizer state, no fp32 master copy",
                       "; fp32 master weights under autocast are --precision bf16-mixed");
    case Precision::kFp16:
      return Defaulted(s, "fp16 weights, gradients and optimizer state, no fp32 master copy", "");
  }
  return "";
}

std::string Weights(const TrainingSetup& s) {
  if (std::optional<std::string> engine = EngineWeights(s)) return Defaulted(s, *engine, "");
  return PlainWeights(s);
}

// Whose AdamW the run builds, for the words: the HF Trainer's, a torchtune
// or LitGPT recipe's, DeepSpeed's own, or Megatron-LM's (no library default
// named).
enum class OptimizerOwner { kHfTrainer, kRecipe, kDeepSpeed, kMegatron };

OptimizerOwner Owner(const TrainingSetup& s) {
  if (s.impl != ModelImpl::kTransformers) return OptimizerOwner::kRecipe;
  if (s.parallel.model_parallel()) return OptimizerOwner::kMegatron;
  const DataParallel dp = s.parallel.dp_mode;
  if (dp == DataParallel::kZero1 || dp == DataParallel::kZero2 || dp == DataParallel::kZero3) {
    return OptimizerOwner::kDeepSpeed;
  }
  return OptimizerOwner::kHfTrainer;
}

std::string AdamW(const TrainingSetup& s) {
  // transformers' TrainingArguments: default_optim = "adamw_torch_fused"
  // with torch >= 2.8 (training_args.py, 4.57.6 and 5.24.0). torchtune's
  // recipes and LitGPT build the optimizer their config names
  // (config.instantiate / instantiate_torch_optimizer): torch's foreach
  // AdamW unless the config says fused. DeepSpeed builds FusedAdam from its
  // config's optimizer block (engine._configure_basic_optimizer), else wraps
  // the Trainer's.
  const bool fused = s.optimizer == OptimizerKind::kAdamWFused;
  switch (Owner(s)) {
    case OptimizerOwner::kHfTrainer:
      return fused ? "torch.optim.AdamW(fused=True), the HF Trainer's default on torch >= 2.8; "
                     "the foreach implementation (torch's own default) is --optimizer adamw"
                   : "torch.optim.AdamW, foreach implementation (torch's default without "
                     "fused=True); the HF Trainer's default on torch >= 2.8 is the fused one: "
                     "--optimizer adamw-fused";
    case OptimizerOwner::kRecipe:
      return fused ? "torch.optim.AdamW(fused=True), as the recipe's optimizer config asks; "
                     "without fused: true it is the foreach implementation, --optimizer adamw"
                   : "torch.optim.AdamW, foreach implementation (torch's default, what the "
                     "recipe's optimizer config builds without fused: true; with it: "
                     "--optimizer adamw-fused)";
    case OptimizerOwner::kDeepSpeed:
      return fused ? "a fused AdamW: DeepSpeed's FusedAdam (the DeepSpeed config's optimizer "
                     "block, type Adam or AdamW) or torch.optim.AdamW(fused=True); the foreach "
                     "implementation is --optimizer adamw"
                   : "torch.optim.AdamW, foreach implementation, under the DeepSpeed engine (no "
                     "optimizer block in the DeepSpeed config); a fused one (DeepSpeed's "
                     "FusedAdam) is --optimizer adamw-fused";
    case OptimizerOwner::kMegatron:
      return fused ? "a fused AdamW (one kernel over many tensors); the foreach implementation is "
                     "--optimizer adamw"
                   : "AdamW, foreach implementation; a fused one is --optimizer adamw-fused";
  }
  return "";
}

std::string Optimizer(const TrainingSetup& s) {
  switch (s.optimizer) {
    case OptimizerKind::kAdamW:
    case OptimizerKind::kAdamWFused: return AdamW(s);
    case OptimizerKind::kAdamWForLoop:
      return "torch.optim.AdamW(foreach=False): one parameter at a time";
    case OptimizerKind::kAdamW8bit: return "bitsandbytes AdamW8bit: 8-bit blockwise state";
    case OptimizerKind::kPagedAdamW8bit:
      return "bitsandbytes PagedAdamW8bit: state in managed memory";
    case OptimizerKind::kPagedAdamW:
      return "bitsandbytes PagedAdamW: 32-bit state in managed memory";
    case OptimizerKind::kSgd: return "torch.optim.SGD without momentum: no state";
    case OptimizerKind::kSgdMomentum:
      return "torch.optim.SGD with momentum: one buffer per parameter";
    case OptimizerKind::kAdafactor: return "transformers Adafactor: factored second moments";
    case OptimizerKind::kLion: return "Lion: one momentum buffer per parameter";
    case OptimizerKind::kNone: return "no optimizer step (forward and backward only)";
  }
  return "";
}

std::string Attn(const TrainingSetup& s) {
  switch (s.attn) {
    case Attention::kSdpa:
      return "torch SDPA, causal, no padding: flash (16-bit) or memory-efficient (fp32) kernels, "
             "no b x heads x s x s scores";
    case Attention::kEager:
      return "eager attention: the b x heads x s x s scores and probabilities are materialized";
    case Attention::kFlash: return "the flash-attn 2 package";
  }
  return "";
}

std::string Loss(const TrainingSetup& s) {
  switch (s.loss) {
    case LossKind::kHf:
      return "transformers' loss: full [tokens, vocab] logits, upcast to fp32 before cross_entropy";
    case LossKind::kChunked: return "cross-entropy over vocabulary chunks";
    case LossKind::kFusedLinear: return "Liger-Kernel's fused linear cross-entropy: no full logits";
    case LossKind::kTorchtuneChunked:
      return "torchtune's CEWithChunkedOutputLoss: 8 chunks of logits together, each upcast in "
             "turn";
    case LossKind::kLitgptChunked:
      return "LitGPT's fine-tuning step: lm_head over 128-token chunks, chunked_cross_entropy in "
             "the logits' dtype, the logits kept until the next step's forward";
    case LossKind::kTrlFused:
      return "TRL 1.15+'s fused LM head (SFTTrainer): log-probabilities over 4096 x 32768 tiles, "
             "every position labelled";
  }
  return "";
}

// A diffusers UNet's weights: the two training scripts keep the UNet in fp32
// under accelerate's autocast (full fine-tuning, train_text_to_image.py) or
// cast it to the weight dtype (LoRA, train_text_to_image_lora.py).
std::string UNetWeights(const TrainingSetup& s) {
  const bool mixed = s.precision == Precision::kBf16Mixed || s.precision == Precision::kFp16Mixed;
  if (mixed && s.finetune == Finetune::kLora) {
    return fmt::format(
        "the UNet cast to {0} before add_adapter and run under accelerate's torch.autocast "
        "({1}), as train_text_to_image_lora.py does: GroupNorm and LayerNorm in fp32 on CUDA; "
        "{2} adapters",
        s.precision == Precision::kBf16Mixed ? "bf16" : "fp16",
        s.precision == Precision::kBf16Mixed ? "bfloat16" : "float16, with a GradScaler",
        s.precision == Precision::kBf16Mixed ? "bf16" : "fp32 (cast_training_params)");
  }
  switch (s.precision) {
    case Precision::kFp32: return "fp32 weights, gradients and optimizer state; no autocast";
    case Precision::kBf16Mixed:
    case Precision::kFp16Mixed:
      return fmt::format(
          "fp32 weights under accelerate's torch.autocast({}){}: GroupNorm and LayerNorm run in "
          "fp32 on CUDA, convolutions and attention in {}; the output is converted to fp32",
          s.precision == Precision::kBf16Mixed ? "bfloat16" : "float16",
          s.precision == Precision::kFp16Mixed ? " with a GradScaler" : "",
          s.precision == Precision::kBf16Mixed ? "bf16" : "fp16");
    case Precision::kBf16:
    case Precision::kFp16:
      return fmt::format("{} weights, gradients and optimizer state (no autocast)",
                         s.precision == Precision::kBf16 ? "bf16" : "fp16");
  }
  return "";
}

// What a diffusion step's inputs line says about the VAE (precomputed
// latents, or the frozen --vae encoding each micro-batch's pixels: lower/vae.h)
// and, without --text-encoder, the text encoders.
std::string OffTheGpu(const TrainingSetup& s, const char* encoders) {
  const bool text_on_gpu = !s.text_encoders.empty();
  if (!s.vae) {
    if (text_on_gpu)
      return "the VAE is not on the GPU (precomputed latents, or add its weights yourself)";
    return fmt::format(
        "the VAE and {} are not on the GPU (precomputed, or add their weights yourself)", encoders);
  }
  const std::string vae = fmt::format(
      "the VAE {} ({} frozen weights on the GPU in {}) encodes each micro-batch's fp32 pixels "
      "outside autocast before the forward",
      s.vae_name, s.vae->ParameterCount(),
      s.precision == Precision::kFp32 ? "fp32" : "the 16-bit weight dtype");
  if (text_on_gpu) return vae;
  return fmt::format("{}; {} not on the GPU (precomputed)", vae, encoders);
}

// --text-encoder: the frozen encoders on the GPU (lower/frozen_encoder.cc).
void AddTextEncoders(const TrainingSetup& s, bool flux, std::vector<Assumption>* out) {
  if (s.text_encoder_names.empty()) return;
  std::string names;
  for (const std::string& n : s.text_encoder_names) names += (names.empty() ? "" : ", ") + n;
  const char* scripts =
      flux ? "train_dreambooth_(lora_)flux.py with per-image captions: their pooled / T5 "
             "states replace the precomputed ones, a step's living until the next step's "
             "are encoded"
           : "train_text_to_image.py, train_text_to_image_lora_sdxl.py";
  out->push_back(
      {"text encoders",
       fmt::format("{}: frozen on the GPU in {}, each micro-batch's prompt encoded without "
                   "autocast and without a graph before the denoiser's forward ({})",
                   names, s.precision == Precision::kFp32 ? "fp32" : "the 16-bit weight dtype",
                   scripts),
       "--text-encoder"});
}

std::vector<Assumption> DescribeUNetAssumptions(const ModelSpec& model, const TrainingSetup& s,
                                                uint64_t latent) {
  const UNetSpec& u = model.unet;
  std::vector<Assumption> out;
  out.push_back({"weights", Defaulted(s, UNetWeights(s), ""), "--precision"});
  if (s.finetune != Finetune::kFull) {
    out.push_back({"adapters",
                   fmt::format("PEFT LoRA through diffusers' add_adapter, rank {}, on {} (to_q, "
                               "to_k, to_v, to_out.0 are q, k, v, o); adapters in the UNet's "
                               "dtype (fp32 under fp16 mixed precision); the rest frozen",
                               s.lora_rank, fmt::join(s.lora_targets, ",")),
                   "--lora-rank, --lora-targets"});
  }
  out.push_back({"optimizer", Optimizer(s), "--optimizer"});
  out.push_back(
      {"EMA",
       s.ema ? fmt::format("diffusers' EMAModel: an fp32 copy of every weight on the GPU, "
                           "stepped after the optimizer{}",
                           s.ema_foreach ? " with torch._foreach ops" : ", one tensor at a time")
             : "none (train_text_to_image.py without --use_ema)",
       s.ema ? "" : "--ema"});
  out.push_back({"inputs",
                 fmt::format("noisy latents {} x {} x {} x {} ({} px images / --vae-scale {}) and "
                             "text states {} x {} x {}, in {}; {}",
                             s.batch, u.in_channels, latent, latent, latent * s.vae_scale,
                             s.vae_scale, s.batch, TextLen(model, s), u.cross_attention_dim,
                             s.precision == Precision::kFp32 ? "fp32" : "the 16-bit weight dtype",
                             OffTheGpu(s, "the text encoder")),
                 "--image-size, --vae-scale, --text-len"});
  AddTextEncoders(s, false, &out);
  out.push_back({"attention",
                 "diffusers' AttnProcessor2_0: torch SDPA without a mask, flash (16-bit) or "
                 "memory-efficient (fp32) kernels, no b x heads x hw x hw scores",
                 ""});
  out.push_back({"loss",
                 "F.mse_loss(model_pred.float(), target.float()) as diffusers' training scripts "
                 "compute it; model_pred lives until backward has run",
                 ""});
  out.push_back({"cuDNN",
                 "cuDNN's workspace is not modelled: its size depends on the algorithm cuDNN picks "
                 "at run time",
                 ""});
  out.push_back({"libraries",
                 fmt::format("diffusers 0.42, peft 0.21 and torch {}.{} behaviour",
                             s.torch_version / 100, s.torch_version % 100),
                 "--torch-version"});
  out.push_back(
      {"steps", fmt::format("{} optimizer steps simulated; the peak is the worst of them", s.steps),
       "--steps"});
  return out;
}

}  // namespace

// ViTForImageClassification: the LLM lines that do not apply (the loss over a
// vocabulary, the token batch, the KV cache) replaced by the image's.
std::vector<Assumption> DescribeVitAssumptions(const ModelSpec& model, const TrainingSetup& s) {
  std::vector<Assumption> out;
  for (Assumption& a : DescribeAssumptions(s)) {
    if (a.what == "loss" || a.what == "batch" || a.what == "KV cache") continue;
    if (a.what == "attention" && s.attn == Attention::kSdpa) {
      a.assumed =
          "torch SDPA without a mask, not causal: flash (16-bit) or memory-efficient "
          "(fp32) kernels, no b x heads x s x s scores";
    }
    out.push_back(std::move(a));
  }
  const VitSpec& v = model.vit;
  out.push_back(
      {"inputs",
       fmt::format("pixel_values {} x {} x {} x {} in fp32 as an image processor gives "
                   "them ({} patches of {} px and the class token per image), and one "
                   "label each, kept until the step is over",
                   s.batch, v.num_channels, v.image_size, v.image_size, v.Patches(), v.patch_size),
       ""});
  out.push_back({"loss",
                 model.num_labels == 1
                     ? std::string("MSE on the class token's score (one label)")
                     : fmt::format("cross-entropy over {} labels on the class token's logits",
                                   model.num_labels),
                 ""});
  return out;
}

// CLIPModel's contrastive step (lower/clip.cc): the image and the text instead
// of a token batch, its own loss, no KV cache.
std::vector<Assumption> DescribeClipAssumptions(const ModelSpec& model, const TrainingSetup& s) {
  std::vector<Assumption> out;
  for (Assumption& a : DescribeAssumptions(s)) {
    if (a.what == "loss" || a.what == "batch" || a.what == "KV cache") continue;
    if (a.what == "attention" && s.attn == Attention::kSdpa) {
      a.assumed =
          "torch SDPA: the vision tower without a mask; the text tower causal (is_causal in "
          "transformers 5.x, an [s, s] float mask in 4.x)";
    }
    out.push_back(std::move(a));
  }
  const ClipSpec& c = model.clip;
  const uint64_t text_len = s.text_len ? s.text_len : c.max_positions;
  out.push_back(
      {"inputs",
       fmt::format("input_ids {} x {} (int64, padded to max_length) and pixel_values {} x {} x "
                   "{} x {} in fp32, made per micro-batch and kept until the step is over",
                   s.batch, text_len, s.batch, c.num_channels, c.image_size, c.image_size),
       "--text-len"});
  out.push_back({"loss",
                 "CLIPModel(return_loss=True): the mean of the two cross-entropies over the "
                 "batch x batch image-text similarities",
                 ""});
  return out;
}

namespace {

std::string FluxWeights(const TrainingSetup& s) {
  const bool mixed = s.precision == Precision::kBf16Mixed || s.precision == Precision::kFp16Mixed;
  if (mixed && s.finetune != Finetune::kFull) {
    return "the transformer cast to the 16-bit weight_dtype before add_adapter "
           "(train_dreambooth_lora_flux.py), still run under accelerate's autocast";
  }
  if (mixed) {
    return "fp32 weights under accelerate's torch.autocast (train_dreambooth_flux.py): linears "
           "and attention in 16-bit, the RMSNorms and RoPE in fp32; the output is converted to "
           "fp32";
  }
  return s.precision == Precision::kFp32 ? "fp32 weights, gradients and optimizer state"
                                         : "16-bit weights, gradients and optimizer state";
}

}  // namespace

// FluxTransformer2DModel through the dreambooth scripts' step (lower/flux.h).
std::vector<Assumption> DescribeFluxAssumptions(const ModelSpec& model, const TrainingSetup& s) {
  const uint64_t image = s.image_size ? s.image_size : 512;
  const uint64_t latent = s.vae_scale ? image / s.vae_scale : 0;
  const FluxSpec& f = model.flux;
  std::vector<Assumption> out;
  out.push_back({"weights", Defaulted(s, FluxWeights(s), ""), "--precision"});
  if (s.finetune != Finetune::kFull) {
    out.push_back({"adapters",
                   fmt::format("PEFT LoRA through diffusers' add_adapter, rank {}, on {} (to_q, "
                               "to_k, to_v, to_out.0 are q, k, v, o; the text stream's "
                               "projections are context_proj); adapters in the transformer's "
                               "dtype; the rest frozen",
                               s.lora_rank, fmt::join(s.lora_targets, ",")),
                   "--lora-rank, --lora-targets"});
  }
  out.push_back({"optimizer", Optimizer(s), "--optimizer"});
  out.push_back(
      {"inputs",
       fmt::format("{} x {} packed latent tokens of {} features ({} px images / --vae-scale {}, "
                   "2 x 2 latents per token) and T5 states {} x {} x {}, in {}; {}",
                   s.batch, (latent / 2) * (latent / 2), f.in_channels, image, s.vae_scale, s.batch,
                   TextLen(model, s), f.joint_attention_dim,
                   s.precision == Precision::kFp32 ? "fp32" : "the 16-bit weight dtype",
                   OffTheGpu(s, "the text encoders")),
       "--image-size, --vae-scale, --text-len"});
  AddTextEncoders(s, true, &out);
  out.push_back({"attention",
                 "diffusers' FluxAttnProcessor: torch SDPA over text + image tokens without a "
                 "mask, flash (16-bit) or memory-efficient (fp32) kernels, no scores matrix",
                 ""});
  out.push_back({"loss",
                 "the scripts' flow-matching MSE: mean((weighting * (pred.float() - "
                 "target.float()) ** 2).reshape(b, -1), 1).mean() on the unpacked prediction",
                 ""});
  out.push_back({"libraries",
                 fmt::format("diffusers 0.42, peft 0.21 and torch {}.{} behaviour",
                             s.torch_version / 100, s.torch_version % 100),
                 "--torch-version"});
  out.push_back(
      {"steps", fmt::format("{} optimizer steps simulated; the peak is the worst of them", s.steps),
       "--steps"});
  return out;
}

namespace {

// T5ForConditionalGeneration (lower/t5.cc): the causal-LM lines, with the
// seq2seq batch and T5's own loss in place of theirs.
std::vector<Assumption> DescribeT5Assumptions(const TrainingSetup& s) {
  std::vector<Assumption> out = DescribeAssumptions(s);
  for (Assumption& a : out) {
    if (a.what == "loss") {
      a.assumed =
          "T5ForConditionalGeneration's CrossEntropyLoss(ignore_index=-100) on the [batch x "
          "target, vocab] logits of lm_head (the shared embedding), as the model returns them";
    } else if (a.what == "batch") {
      a.assumed =
          "input_ids [batch, seq] and labels [batch, target_len], every row full length (an "
          "all-ones attention_mask is dropped for the encoder and the cross-attention)";
      a.flag = "--seq, --target-len";
    }
  }
  return out;
}

}  // namespace

std::vector<Assumption> DescribeAssumptions(const ModelSpec& model, const TrainingSetup& s) {
  if (model.is_vit) return DescribeVitAssumptions(model, s);
  if (model.is_t5) return DescribeT5Assumptions(s);
  if (model.is_clip) return DescribeClipAssumptions(model, s);
  if (model.is_flux) return DescribeFluxAssumptions(model, s);
  if (!model.is_unet) return DescribeAssumptions(s);
  const uint64_t image = s.image_size ? s.image_size : model.unet.sample_size * s.vae_scale;
  return DescribeUNetAssumptions(model, s, s.vae_scale ? image / s.vae_scale : 0);
}

std::vector<std::pair<std::string, std::string>> DescribeKnobs(const ModelSpec& model,
                                                               const TrainingSetup& s) {
  std::vector<std::pair<std::string, std::string>> knobs = DescribeSetup(s);
  if (model.is_clip) {
    // CLIP's sequence is --text-len and its loss its own.
    std::vector<std::pair<std::string, std::string>> out;
    for (auto& [key, value] : knobs) {
      if (key == "seq" || key == "loss") continue;
      out.emplace_back(std::move(key), std::move(value));
    }
    return out;
  }
  if (model.is_vit) {
    // A ViT's sequence is its patch grid and its loss its own.
    std::vector<std::pair<std::string, std::string>> out;
    for (auto& [key, value] : knobs) {
      if (key == "seq" || key == "loss") continue;
      out.emplace_back(std::move(key), std::move(value));
      if (out.back().first == "batch")
        out.emplace_back("image_size", std::to_string(model.vit.image_size));
    }
    return out;
  }
  if (model.is_t5) {
    // A T5's --seq is the source; the decoder's length follows it.
    for (size_t i = 0; i < knobs.size(); ++i) {
      if (knobs[i].first != "seq") continue;
      const uint64_t target = s.target_len ? s.target_len : s.seq;
      knobs.insert(knobs.begin() + static_cast<std::ptrdiff_t>(i) + 1,
                   {"target_len", std::to_string(target)});
      break;
    }
    return knobs;
  }
  if (!model.is_unet && !model.is_flux) return knobs;
  // A UNet or FLUX has no sequence, no transformers loss and no transformers
  // version: its knobs are the image, the latent scale and the text length.
  const uint64_t image = s.image_size    ? s.image_size
                         : model.is_flux ? 512
                                         : model.unet.sample_size * s.vae_scale;
  std::vector<std::pair<std::string, std::string>> out;
  for (auto& [key, value] : knobs) {
    if (key == "seq" || key == "loss" || key == "transformers_version" || key == "attn") continue;
    out.emplace_back(std::move(key), std::move(value));
    if (out.back().first == "batch") {
      out.emplace_back("image_size", std::to_string(image));
      out.emplace_back("vae_scale", std::to_string(s.vae_scale));
      out.emplace_back("text_len", std::to_string(TextLen(model, s)));
      if (s.vae) out.emplace_back("vae", s.vae_name);
    }
  }
  return out;
}

namespace {

// LoRA / QLoRA adapters as PEFT (or torchtune / LitGPT) make them.
std::string Adapters(const TrainingSetup& s) {
  std::string adapters =
      s.lora_dtype == LoraDtype::kModel
          ? fmt::format(
                "LoRA, rank {}, on {}; adapters in the model's dtype, made with it (torchtune's "
                "LoRALinear, LitGPT's lora.py); PEFT's fp32 adapters are --lora-dtype fp32",
                s.lora_rank, fmt::join(s.lora_targets, ","))
          : fmt::format(
                "PEFT LoRA, rank {}, on {}; adapters in fp32 (get_peft_model's "
                "autocast_adapter_dtype=True)",
                s.lora_rank, fmt::join(s.lora_targets, ","));
  if (s.finetune == Finetune::kQLora) {
    adapters +=
        "; base weights NF4 with double quantization, the rest cast to fp32 "
        "(prepare_model_for_kbit_training)";
  }
  return adapters;
}

// The data-parallel library's release and the timing it is assumed to have
// (docs/parallel.md): what a multi-GPU estimate rests on beyond the knobs.
void AppendParallelAssumptions(const TrainingSetup& s, std::vector<Assumption>* out_ptr) {
  std::vector<Assumption>& out = *out_ptr;
  const DataParallel dp = s.parallel.dp_mode;
  if ((dp == DataParallel::kZero1 || dp == DataParallel::kZero2 || dp == DataParallel::kZero3) &&
      !s.parallel.model_parallel()) {
    const uint32_t v = s.parallel.zero.deepspeed_version;
    out.push_back(
        {"DeepSpeed",
         fmt::format("DeepSpeed 0.{}.{}'s ZeRO (docs/parallel.md); the rules that changed "
                     "between releases follow the one given",
                     v / 100, v % 100),
         "--deepspeed-version"});
  }
  if (s.parallel.dp_mode == DataParallel::kZero3) {
    // Issue 39: without deepspeed.zero.Init the whole model is on every GPU
    // before DeepSpeed partitions it (engine.py _configure_distributed_model,
    // 0.19.8); the peak of the setup differs by the whole gathered model.
    out.push_back(
        {"zero.Init",
         s.parallel.zero.zero_init
             ? "the model is built under deepspeed.zero.Init (the HF Trainer does so when its "
               "DeepSpeed config exists before from_pretrained): each parameter is partitioned "
               "as it is made; a model loaded first is moved whole to every GPU before "
               "deepspeed.initialize partitions it: --no-zero-init"
             : "the model is loaded before DeepSpeed's config existed (no deepspeed.zero.Init): "
               "deepspeed.initialize moves the whole model to every GPU, then partitions it; "
               "without --no-zero-init it is built partitioned",
         "--no-zero-init"});
  }
  const bool side_streams =
      s.parallel.dp_mode == DataParallel::kZero3 ||
      (s.parallel.dp_mode == DataParallel::kFsdp && s.parallel.fsdp_version == 1);
  if (side_streams) {
    // docs/parallel.md "Side streams": FSDP1's limiter fixes it for the flat
    // parameters; for the rest it is the model's assumption.
    out.push_back({"GPU lag",
                   s.parallel.dp_mode == DataParallel::kZero3
                       ? "memory freed while a side stream still uses it (record_stream) is "
                         "reusable once the computation is two module fetches further "
                         "(DeepSpeed throttles its all-gather stream at two fetches in flight); "
                         "gradients once two reduces are in flight"
                       : "memory freed while a side stream still uses it (record_stream) is "
                         "reusable once the computation is two layers further: FSDP1's rate "
                         "limiter enforces this for gathered parameters, the rest is assumed",
                   ""});
  }
}

}  // namespace

std::vector<Assumption> DescribeAssumptions(const TrainingSetup& s) {
  std::vector<Assumption> out;
  out.push_back({"weights", Weights(s), "--precision"});
  if (s.finetune != Finetune::kFull)
    out.push_back({"adapters", Adapters(s), "--lora-rank, --lora-targets, --lora-dtype"});
  out.push_back({"optimizer", Optimizer(s), "--optimizer"});
  out.push_back({"attention", Attn(s), "--attn"});
  out.push_back({"loss", Loss(s), "--loss"});
  if (s.liger) {
    out.push_back({"kernels",
                   "liger-kernel 0.8.5 as use_liger_kernel=True applies it: LigerRMSNorm (fp32 "
                   "rstd saved, dX written into dY, a per-SM fp32 dW buffer), liger_rotary_pos_emb "
                   "in place on q and k, LigerSwiGLUMLP (gate and up saved, their gradients "
                   "written over them); Triton kernels, rules read from the code, not measured",
                   "--liger"});
  }
  out.push_back({"batch",
                 s.attention_mask
                     ? "every row full length, with an attention_mask as collators add one"
                     : "input_ids and labels only, no attention_mask",
                 s.attention_mask ? "--no-attention-mask" : ""});
  if (s.impl == ModelImpl::kTorchtune) {
    out.push_back({"modules",
                   "torchtune 0.6.1's own decoder: RMSNorm over x.float(), rotary embeddings "
                   "in fp32 from a max_position_embeddings-long cache, k / v copied to every "
                   "head, no KV cache; transformers' modules are --impl transformers",
                   "--impl"});
  } else if (s.impl == ModelImpl::kLitgpt) {
    out.push_back({"modules",
                   "LitGPT 0.5.13's own GPT: one fused qkv Linear, RMSNorm over x.float(), RoPE "
                   "from fp32 cos / sin buffers of the longest row, k / v repeated for grouped "
                   "queries, no KV cache; transformers' modules are --impl transformers",
                   "--impl"});
  } else if (s.grad_ckpt == GradCkpt::kNone && s.transformers_version >= 436 &&
             !s.parallel.model_parallel()) {
    // lower/transformer.cc MakesTrainingCache: the cost the ground-truth harness
    // and many scripts avoid with model.config.use_cache = False.
    out.push_back({"KV cache",
                   s.use_cache
                       ? "use_cache as config.json says: where it is on, transformers keeps "
                         "each layer's keys and values in a DynamicCache until the output "
                         "is dropped (no checkpointing)"
                       : "none: the script sets model.config.use_cache = False",
                   s.use_cache ? "--no-use-cache" : ""});
  }
  out.push_back(
      {"libraries",
       fmt::format("transformers {}.{} and torch {}.{} behaviour", s.transformers_version / 100,
                   s.transformers_version % 100, s.torch_version / 100, s.torch_version % 100),
       "--transformers-version, --torch-version"});
  out.push_back(
      {"steps", fmt::format("{} optimizer steps simulated; the peak is the worst of them", s.steps),
       "--steps"});
  AppendParallelAssumptions(s, &out);
  return out;
}

}  // namespace vramscope
