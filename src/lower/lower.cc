#include "vramscope/lower.h"

#include <algorithm>
#include <memory>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "clip.h"
#include "encoder.h"
#include "flux.h"
#include "frozen_encoder.h"
#include "ops.h"
#include "optimizer.h"
#include "placement.h"
#include "rank_classes.h"
#include "schedule.h"
#include "sharding.h"
#include "t5.h"
#include "tape.h"
#include "transformer.h"
#include "unet.h"
#include "vae.h"
#include "vit.h"
#include "vramscope/common/checked.h"
#include "vramscope/common/quote.h"

namespace vramscope {
namespace lower {
namespace {

// The library versions whose code the lowering's rules were read from
// (docs/lowering.md): transformers 4.36 (the DynamicCache) to 5.24, torch 2.0
// to 2.13.
constexpr int kOldestTransformers = 436, kNewestTransformers = 524;
constexpr int kOldestTorch = 200, kNewestTorch = 213;

std::string VersionText(int v) { return fmt::format("{}.{}", v / 100, v % 100); }

// What the model and the parallel layout must agree on.
Status ValidateDistributed(const ModelSpec& m, const TrainingSetup& s) {
  auto bad = [](std::string msg) { return Status(MakeError(std::move(msg))); };
  const ParallelLayout& l = s.parallel;
  const bool distributed = l.multi_gpu() || l.dp_mode != DataParallel::kNone;
  if (distributed && s.optimizer_in_backward)
    return bad(
        "--optimizer-in-backward: not modelled with several GPUs (DDP, ZeRO, FSDP and Megatron "
        "hook the gradients themselves)");
  if (distributed && s.activation_offload && l.model_parallel())
    return bad("--activation-offload: not modelled with Megatron-style --tp/--pp/--cp/--ep");
  if (m.is_encoder && (l.dp_mode == DataParallel::kZero3 || l.dp_mode == DataParallel::kFsdp))
    return bad(fmt::format("--{}: parameter sharding is modelled for decoder models, not for {}",
                           l.dp_mode == DataParallel::kFsdp ? "fsdp" : "zero 3", m.name));
  if (l.sp && m.num_experts > 0)
    return bad("--sp: sequence parallelism with mixture-of-experts layers is not modelled yet");
  if (l.sp && (s.batch * s.seq / l.cp) % l.tp != 0)
    return bad(fmt::format("--sp: {} tokens per micro-batch per rank do not split over tp = {}",
                           s.batch * s.seq / l.cp, l.tp));
  if (l.cp > 1 && s.attn == Attention::kEager)
    return bad(
        "--cp: context parallelism needs --attn sdpa or flash (ring attention over flash kernels)");
  if (l.cp > 1 && s.seq % (2 * l.cp) != 0)
    return bad(
        fmt::format("--cp: --seq {} is not a multiple of 2 x cp = {} (Megatron splits the sequence "
                    "into 2 x cp chunks)",
                    s.seq, 2 * l.cp));
  if (m.num_heads == 0 || m.hidden_size == 0 || m.num_layers == 0 || m.vocab_size == 0)
    return bad(
        fmt::format("{}: the model config lacks hidden size, heads, layers or vocabulary", m.name));
  return Ok{};
}

// What a diffusers UNet's lowering covers (unet.h): one GPU, diffusers'
// default attention processor (AttnProcessor2_0: SDPA), the MSE loss.
Status ValidateUNet(const ModelSpec& m, const TrainingSetup& s) {
  auto bad = [](std::string msg) { return Status(MakeError(std::move(msg))); };
  const ParallelLayout& l = s.parallel;
  if (l.multi_gpu() || l.dp_mode != DataParallel::kNone)
    return bad(fmt::format("{}: diffusion UNets are modelled on one GPU only for now", m.name));
  if (s.finetune == Finetune::kQLora)
    return bad("--finetune qlora: not modelled for diffusion UNets (use lora or full)");
  if (s.attn != Attention::kSdpa)
    return bad(
        "--attn: diffusion UNets run diffusers' default AttnProcessor2_0 (SDPA); only sdpa is "
        "modelled");
  if (s.loss != LossKind::kHf)
    return bad(
        "--loss: diffusion UNets train on the MSE loss; chunked and fused losses do not apply");
  if (s.ema_foreach && !s.ema) return bad("--ema-foreach: needs --ema");
  if (TextLen(m, s) > 4096)
    return bad(fmt::format("--text-len: {} is outside 1..4096", s.text_len));
  VS_TRY(side, UNetLatentSide(m, s));
  // The largest tensor is a feed-forward projection of 8 x channels per latent
  // pixel (GEGLU), in fp32 at most: bounded so that no size or sum wraps.
  uint64_t widest = 0;
  for (uint64_t c : m.unet.block_out_channels) widest = std::max(widest, c);
  std::optional<uint64_t> bytes = common::CheckedMul(s.batch, side);
  if (bytes) bytes = common::CheckedMul(*bytes, side);
  if (bytes) bytes = common::CheckedMul(*bytes, widest * 8 * 4);
  constexpr uint64_t kMaxTensorBytes = uint64_t{1} << 56;
  if (!bytes || *bytes > kMaxTensorBytes)
    return bad(fmt::format(
        "--batch x --image-size: one activation of {} x {} x {} latents x {} channels would exceed "
        "2^56 bytes",
        s.batch, side, side, 8 * widest));
  return Ok{};
}

// --vae (vae.h): an AutoencoderKL whose latents the UNet or FLUX step takes,
// at the downsampling --vae-scale says (the CLI sets it from the VAE).
Status ValidateVae(const ModelSpec& m, const TrainingSetup& s) {
  auto bad = [](std::string msg) { return Status(MakeError(std::move(msg))); };
  const ModelSpec& vae = *s.vae;
  if (!m.is_unet && !m.is_flux)
    return bad(
        fmt::format("--vae: only the diffusion UNet and FLUX steps encode images, not {}", m.name));
  if (!vae.is_vae)
    return bad(fmt::format("--vae: {} is not a diffusers AutoencoderKL config", s.vae_name));
  const VaeSpec& v = vae.vae;
  if (s.vae_scale != v.Downsampling())
    return bad(
        fmt::format("--vae-scale: {} disagrees with --vae {}, which downsamples by {} "
                    "(2 ** (len(block_out_channels) - 1))",
                    s.vae_scale, s.vae_name, v.Downsampling()));
  // The denoiser takes the latents as they are (UNet) or packed 2 x 2 (FLUX).
  const uint64_t takes = m.is_flux ? m.flux.in_channels : m.unet.in_channels;
  const uint64_t gives = m.is_flux ? 4 * v.latent_channels : v.latent_channels;
  if (takes != gives)
    return bad(fmt::format(
        "--vae: {}'s {} latent channels do not fit {}'s in_channels {} (extra conditioning "
        "channels, as inpainting's, are not modelled)",
        s.vae_name, v.latent_channels, m.name, takes));
  // The largest encode tensor: the padded first level, [b, c, image+1, image+1].
  uint64_t widest = 0;
  for (uint64_t c : v.block_out_channels) widest = std::max(widest, c);
  const uint64_t image = s.image_size ? s.image_size : 1024;
  std::optional<uint64_t> bytes = common::CheckedMul(s.batch, image + 1);
  if (bytes) bytes = common::CheckedMul(*bytes, image + 1);
  if (bytes) bytes = common::CheckedMul(*bytes, widest * 4);
  if (!bytes || *bytes > (uint64_t{1} << 56))
    return bad("--batch x --image-size: one activation of the VAE encode would exceed 2^56 bytes");
  return Ok{};
}

// An AutoencoderKL is estimated only as the --vae of a UNet or FLUX step.
Status ValidateVaeUse(const ModelSpec& m, const TrainingSetup& s) {
  if (m.is_vae)
    return MakeError(fmt::format(
        "{}: an AutoencoderKL is not trained on its own here; give it to a UNet or FLUX "
        "estimate as --vae {}",
        m.name, m.name));
  return s.vae ? ValidateVae(m, s) : Status(Ok{});
}

// TRL's fused LM head (loss_trl.cc) reads lm_head.weight directly, past the
// module's forward: PEFT adapters on lm_head are skipped, and the sharded
// modes' per-module gathers never run for it (FSDP2 gathers it with
// full_tensor(), ZeRO-3 with GatheredParameters): not modelled yet.
Status ValidateTrlFused(const ModelSpec& m, const TrainingSetup& s) {
  auto bad = [](std::string msg) { return Status(MakeError(std::move(msg))); };
  if (s.finetune != Finetune::kFull &&
      std::find(s.lora_targets.begin(), s.lora_targets.end(), "lm_head") != s.lora_targets.end())
    return bad(
        "--loss trl-fused: TRL's fused head reads lm_head's base weight; LoRA on lm_head is "
        "not modelled with it");
  if (s.dpo && s.loss != LossKind::kTrlFused)
    return bad(
        "--dpo: models TRL 1.15+'s DPOTrainer, whose log-probabilities come from its fused "
        "head: add --loss trl-fused");
  if (s.dpo && (m.is_encoder || m.is_unet || m.num_labels > 0))
    return bad("--dpo: needs a causal language model");
  if (s.dpo && 2 * s.batch * s.seq > kMaxTokensPerMicroBatch)
    return bad(
        fmt::format("--dpo: 2 x --batch x --seq = {} tokens per micro-batch is above the {} "
                    "limit",
                    2 * s.batch * s.seq, kMaxTokensPerMicroBatch));
  const DataParallel dp = s.parallel.dp_mode;
  if (dp == DataParallel::kZero3 || dp == DataParallel::kFsdp || s.parallel.model_parallel())
    return bad(
        "--loss trl-fused: modelled on one GPU, DDP and ZeRO-1/2 only (the fused head "
        "gathers a sharded lm_head weight itself)");
  if (s.device_rules == DeviceRules::kCpu && m.final_logit_softcapping > 0)
    return bad("--loss trl-fused: CPU rules do not model the softcap's tanh temporaries");
  return Ok{};
}

// ViTForImageClassification: one GPU, the transformers loss, the image the
// model was built for (another needs interpolate_pos_encoding, not modelled).
Status ValidateVit(const ModelSpec& m, const TrainingSetup& s) {
  auto bad = [](std::string msg) { return Status(MakeError(std::move(msg))); };
  const ParallelLayout& l = s.parallel;
  if (l.multi_gpu() || l.dp_mode != DataParallel::kNone)
    return bad(fmt::format("{}: ViT is modelled on one GPU only for now", m.name));
  if (s.finetune == Finetune::kQLora)
    return bad("--finetune qlora: not modelled for ViT (use lora or full)");
  if (s.attn == Attention::kFlash)
    return bad("--attn flash: ViT runs eager or sdpa attention here");
  if (s.loss != LossKind::kHf || s.dpo || s.packed || s.ema)
    return bad("--loss, --dpo, --packing, --ema: a ViT classifier trains on its own loss");
  if (s.image_size != 0 && s.image_size != m.vit.image_size)
    return bad(
        fmt::format("--image-size: {} is not the model's {} (interpolate_pos_encoding is "
                    "not modelled)",
                    s.image_size, m.vit.image_size));
  // The largest activation: the MLP's [batch, patches + 1, intermediate] in fp32.
  std::optional<uint64_t> bytes =
      common::CheckedMul(s.batch, (m.vit.Patches() + 1) * m.intermediate_size * 4);
  if (!bytes || *bytes > (uint64_t{1} << 56))
    return bad("--batch: one activation of the ViT would exceed 2^56 bytes");
  return Ok{};
}

// T5ForConditionalGeneration (t5.h; transformers 5.24.0 models/t5): one GPU,
// eager attention, transformers' own loss, full or LoRA. T5EncoderModel has
// no head to train.
Status ValidateT5(const ModelSpec& m, const TrainingSetup& s) {
  auto bad = [](std::string msg) { return Status(MakeError(std::move(msg))); };
  if (m.t5.encoder_only)
    return bad(fmt::format(
        "{}: T5EncoderModel has no head to train (a frozen text encoder's forward is not a "
        "training step; estimate T5ForConditionalGeneration instead)",
        m.name));
  // transformers 4.57.6 modeling_t5.py T5Attention.forward adds the masked
  // bias in place (`scores += position_bias_masked`) and runs
  // `softmax(scores.float()).type_as(scores)`; its T5Config keeps an untied
  // lm_head when tie_word_embeddings is false: other tensors, not modelled.
  if (s.transformers_version < 500)
    return bad(
        "--transformers-version: T5 is modelled for transformers 5.x (4.x's T5Attention and "
        "untied lm_head differ)");
  const ParallelLayout& l = s.parallel;
  if (l.multi_gpu() || l.dp_mode != DataParallel::kNone)
    return bad(fmt::format("{}: T5 is modelled on one GPU only for now", m.name));
  if (s.finetune == Finetune::kQLora)
    return bad("--finetune qlora: not modelled for T5 (use lora or full)");
  if (s.attn != Attention::kEager)
    return bad(
        "--attn: T5 is modelled with eager attention only (pass --attn eager; transformers "
        "5.24's sdpa path folds the position bias into a float mask, not modelled)");
  if (s.precision == Precision::kFp16 || s.precision == Precision::kFp16Mixed)
    return bad(
        "--precision: fp16 is not modelled for T5 (wo kept in fp32 by _keep_in_fp32_modules, "
        "the fp16 clamps); use fp32, bf16 or bf16-mixed");
  if (s.loss != LossKind::kHf || s.dpo || s.packed || s.ema)
    return bad("--loss, --dpo, --packing, --ema: T5 trains on its own cross-entropy loss");
  if (s.activation_offload || s.optimizer_in_backward)
    return bad("--activation-offload, --optimizer-in-backward: not modelled for T5");
  if (s.impl != ModelImpl::kTransformers)
    return bad("--impl: T5 is modelled with transformers' modules only");
  const uint64_t tgt = T5TargetLen(s);
  if (tgt == 0 || tgt > kMaxSeq)
    return bad(fmt::format("--target-len: {} is outside 1..{}", tgt, kMaxSeq));
  // The largest activation: eager scores [b, heads, max len, max len] in fp32,
  // or the logits [b, tgt, vocab].
  const uint64_t len = std::max(s.seq, tgt);
  std::optional<uint64_t> bytes = common::CheckedMul(s.batch * m.num_heads, len * len * 4);
  std::optional<uint64_t> logits = common::CheckedMul(s.batch * tgt, m.vocab_size * 4);
  if (!bytes || !logits || *bytes > (uint64_t{1} << 56) || *logits > (uint64_t{1} << 56))
    return bad("--batch x --seq / --target-len: one activation of the T5 would exceed 2^56 bytes");
  return Ok{};
}

// CLIPModel's contrastive step (clip.h): one GPU, the model's own loss, the
// image it was built for. A tower without CLIPModel's head has no loss in
// transformers (CLIPTextModel, CLIPVisionModel): refused here, used frozen by
// --text-encoder instead.
Status ValidateClip(const ModelSpec& m, const TrainingSetup& s) {
  auto bad = [](std::string msg) { return Status(MakeError(std::move(msg))); };
  const ClipSpec& c = m.clip;
  if (!c.has_text || !c.has_vision || !c.logit_scale)
    return bad(fmt::format(
        "{}: {} has no training loss in transformers (only CLIPModel's contrastive step is "
        "lowered); use it as a diffusion step's frozen --text-encoder",
        m.name, m.architecture));
  const ParallelLayout& l = s.parallel;
  if (l.multi_gpu() || l.dp_mode != DataParallel::kNone)
    return bad(fmt::format("{}: CLIP is modelled on one GPU only for now", m.name));
  if (s.finetune == Finetune::kQLora)
    return bad("--finetune qlora: not modelled for CLIP (use lora or full)");
  if (s.attn == Attention::kFlash)
    return bad("--attn flash: CLIP runs eager or sdpa attention here");
  if (s.loss != LossKind::kHf || s.dpo || s.packed || s.ema)
    return bad("--loss, --dpo, --packing, --ema: CLIPModel trains on its contrastive loss");
  if (s.image_size != 0 && s.image_size != c.image_size)
    return bad(fmt::format(
        "--image-size: {} is not the model's {} (interpolate_pos_encoding is not modelled)",
        s.image_size, c.image_size));
  if (ClipTextLen(m, s) > c.max_positions)
    return bad(fmt::format("--text-len: {} is above the text tower's {} positions",
                           ClipTextLen(m, s), c.max_positions));
  // transformers 4.57.6's CLIPModel has no get_input_embeddings(), which
  // PEFT's enable_input_require_grads calls when the model checkpoints.
  if (s.finetune != Finetune::kFull && s.grad_ckpt != GradCkpt::kNone &&
      s.transformers_version < 500)
    return bad(
        "--finetune lora with --grad-ckpt: transformers 4.57's CLIPModel raises "
        "NotImplementedError in get_input_embeddings (PEFT's enable_input_require_grads)");
  // The largest activation: an MLP's [batch, tokens, intermediate] in fp32,
  // or eager's [batch, heads, tokens, tokens] scores.
  const uint64_t tokens = std::max(c.Patches() + 1, ClipTextLen(m, s));
  const uint64_t widest = std::max({c.text.intermediate, c.vision.intermediate,
                                    tokens * std::max(c.text.heads, c.vision.heads)});
  std::optional<uint64_t> bytes = common::CheckedMul(s.batch, tokens * widest * 4);
  if (!bytes || *bytes > (uint64_t{1} << 56))
    return bad("--batch: one activation of the CLIP model would exceed 2^56 bytes");
  return Ok{};
}

// diffusers' FluxTransformer2DModel (flux.h): one GPU, the dreambooth
// scripts' knobs (non-reentrant checkpointing per block, the default
// FluxAttnProcessor's SDPA, full fine-tuning or PEFT LoRA, the flow-matching MSE).
Status ValidateFlux(const ModelSpec& m, const TrainingSetup& s) {
  auto bad = [](std::string msg) { return Status(MakeError(std::move(msg))); };
  const ParallelLayout& l = s.parallel;
  if (l.multi_gpu() || l.dp_mode != DataParallel::kNone)
    return bad(fmt::format("{}: FLUX transformers are modelled on one GPU only for now", m.name));
  if (s.finetune == Finetune::kQLora)
    return bad("--finetune qlora: not modelled for FLUX transformers (use lora or full)");
  if (s.attn != Attention::kSdpa)
    return bad(
        "--attn: FLUX runs diffusers' FluxAttnProcessor (torch SDPA); only sdpa is modelled");
  if (s.grad_ckpt == GradCkpt::kReentrant)
    return bad("--grad-ckpt reentrant: diffusers checkpoints with use_reentrant=False (use full)");
  if (s.loss != LossKind::kHf || s.dpo || s.packed)
    return bad("--loss, --dpo, --packing: FLUX trains on the flow-matching MSE loss");
  if (s.ema || s.ema_foreach)
    return bad("--ema: the FLUX dreambooth scripts keep no EMA of the transformer");
  if (s.activation_offload || s.optimizer_in_backward)
    return bad("--activation-offload, --optimizer-in-backward: not modelled for FLUX");
  if (m.flux.patch_size != 1)
    return bad(
        fmt::format("{}: patch_size {} (FluxPipeline packs 2 x 2 latents for "
                    "patch_size 1 only)",
                    m.name, m.flux.patch_size));
  if (TextLen(m, s) > 4096)
    return bad(fmt::format("--text-len: {} is outside 1..4096", s.text_len));
  VS_TRY(side, FluxLatentSide(s));
  // The largest activation: a single block's cat([attn, mlp]) of 5 x dim per
  // token, or the fp64 RoPE table, in 8 bytes at most.
  std::optional<uint64_t> bytes =
      common::CheckedMul(s.batch, (side / 2) * (side / 2) + TextLen(m, s));
  if (bytes) bytes = common::CheckedMul(*bytes, 5 * m.hidden_size * 8);
  if (!bytes || *bytes > (uint64_t{1} << 56))
    return bad(
        "--batch x --image-size: one activation of the FLUX transformer would exceed "
        "2^56 bytes");
  return Ok{};
}

Status ValidatePacking(const ModelSpec& m, const TrainingSetup& s) {
  auto bad = [](std::string msg) { return Status(MakeError(std::move(msg))); };
  if (m.is_encoder || m.is_unet || m.num_labels > 0)
    return bad("--packing: padding-free packing is modelled for causal language models");
  if (s.dpo) return bad("--packing: not modelled with --dpo");
  if (s.parallel.model_parallel())
    return bad("--packing: not modelled with Megatron-style model parallelism");
  if (s.batch * s.seq > kMaxSeq)
    return bad(
        fmt::format("--packing: the packed row of --batch x --seq = {} tokens is above the "
                    "{} limit of --seq",
                    s.batch * s.seq, kMaxSeq));
  return Ok{};
}

// The checks that depend on what the model is and which trainer runs it.
Status ValidateByKind(const ModelSpec& m, const TrainingSetup& s) {
  auto bad = [](std::string msg) { return Status(MakeError(std::move(msg))); };
  if (m.is_flux) return ValidateFlux(m, s);
  if (m.is_t5) return ValidateT5(m, s);
  if (s.packed) {
    Status packed = ValidatePacking(m, s);
    if (!packed.ok()) return packed;
  }
  if (m.is_unet) return ValidateUNet(m, s);
  if (s.loss == LossKind::kTrlFused || s.dpo) {
    Status trl = ValidateTrlFused(m, s);
    if (!trl.ok()) return trl;
  }
  if (s.ema)
    return bad("--ema: diffusers' EMAModel is modelled for diffusion UNets, not for " + m.name);
  return ValidateDistributed(m, s);
}

// --impl litgpt: LitGPT 0.5.13's GPT as a llama-style Config builds it
// (litgpt/model.py: RMSNorm, LLaMAMLP, full RoPE, no biases but Qwen2's
// attn_bias on the qkv, a separate
// lm_head, which LitGPT never ties). Other families (GptNeoxMLP, GemmaMLP, LayerNorm, MoE, parallel
// residual, softcapping) are refused. LoRA is litgpt/lora.py's (litgpt_lora.cc);
// its 4-bit quantization is not modelled.
Status ValidateLitgpt(const ModelSpec& m, const TrainingSetup& s) {
  const bool llama_style =
      (m.model_type == "llama" || m.model_type == "mistral" || m.model_type == "qwen2") &&
      !m.is_encoder && !m.is_vit && !m.is_unet && !m.is_flux && m.num_labels == 0 &&
      m.position == PositionKind::kRope && m.norm == NormKind::kRmsNorm && !m.fused_qkv &&
      !m.o_bias && !m.mlp_bias && m.num_experts == 0 && m.partial_rotary_factor == 1.0 &&
      (m.sliding_window == 0 || s.seq <= m.sliding_window);
  if (!llama_style)
    return MakeError(fmt::format(
        "--impl litgpt: LitGPT's own GPT is modelled for the llama-style family (RMSNorm, "
        "LLaMAMLP, no MoE), not {} (model_type {}); --impl transformers estimates it with "
        "transformers' modules",
        m.name, common::QuoteForMessage(m.model_type, common::kQuotedBytes, '\'')));
  if (s.finetune == Finetune::kQLora)
    return MakeError(
        "--impl litgpt: LitGPT's --quantize (bitsandbytes layers through Fabric's "
        "BitsandbytesPrecision) is not modelled; --finetune lora, or --impl transformers "
        "--finetune qlora");
  if (s.parallel.model_parallel() || s.dpo || s.packed)
    return MakeError(
        "--impl litgpt: modelled for one process or data parallelism, without --dpo or "
        "--packing");
  return Ok{};
}

// --liger (liger-kernel 0.8.5): what `use_liger_kernel=True` patches and
// this lowering models. transformers calls _apply_liger_kernel_to_instance
// (transformers/monkey_patch.py), which picks apply_liger_kernel_to_<model_type>
// from MODEL_TYPE_TO_APPLY_LIGER_FN; llama, mistral and qwen2 swap in the same
// three modules with their defaults (rope, rms_norm, swiglu and
// fused_linear_cross_entropy True; LigerRMSNorm with casting_mode "llama",
// in_place True). Gemma's (offset, "gemma" casting, GeGLU), the MoE and the
// vision families patch other kernels: refused rather than guessed.
Status ValidateLiger(const ModelSpec& m, const TrainingSetup& s) {
  if (!s.liger) return Ok{};
  auto bad = [](std::string msg) { return Status(MakeError(std::move(msg))); };
  if (s.impl != ModelImpl::kTransformers)
    return bad(
        "--liger: Liger patches transformers' modules; --impl torchtune / litgpt run their own");
  if (s.device_rules == DeviceRules::kCpu)
    return bad("--liger: Liger's kernels are Triton (GPU only); --device-rules cpu has none");
  const bool family =
      m.model_type == "llama" || m.model_type == "mistral" || m.model_type == "qwen2";
  if (!family || m.is_encoder || m.is_vit || m.is_clip || m.is_unet || m.is_flux || m.is_t5 ||
      m.num_labels > 0 || m.norm != NormKind::kRmsNorm || m.mlp != MlpKind::kGatedSilu ||
      m.position != PositionKind::kRope || m.partial_rotary_factor != 1.0 || m.num_experts > 0)
    return bad(
        fmt::format("--liger: modelled for Llama, Mistral and Qwen2 causal LMs (LigerRMSNorm, "
                    "LigerSwiGLUMLP, full RoPE), not {} (model_type {})",
                    m.name, common::QuoteForMessage(m.model_type, common::kQuotedBytes, '\'')));
  if (s.loss != LossKind::kFusedLinear && s.loss != LossKind::kTrlFused)
    return bad(
        "--liger: the model's loss is Liger's fused linear cross-entropy (--loss fused-linear, "
        "or TRL's own --loss trl-fused)");
  if (s.dpo) return bad("--liger: TRL's DPO with Liger (LigerFusedLinearDPOLoss) is not modelled");
  if (s.parallel.model_parallel())
    return bad("--liger: not modelled with Megatron-style model parallelism (DTensor paths)");
  return Ok{};
}

// Which library's modules (--impl) and which activation offloading.
Status ValidateImplAndOffload(const ModelSpec& m, const TrainingSetup& s) {
  auto bad = [](std::string msg) { return Status(MakeError(std::move(msg))); };
  // Under --impl torchtune, --activation-offload is the recipes'
  // enable_activation_offloading: OffloadActivations, which they allow only with
  // (non-reentrant) activation checkpointing. Otherwise it is save_on_cpu,
  // modelled without checkpointing.
  if (s.activation_offload && s.impl == ModelImpl::kTorchtune && s.grad_ckpt != GradCkpt::kFull)
    return bad(
        "--activation-offload with --impl torchtune: torchtune's recipes offload only with "
        "activation checkpointing (--grad-ckpt full)");
  if (s.activation_offload && s.impl != ModelImpl::kTorchtune && s.grad_ckpt != GradCkpt::kNone)
    return bad(
        "--activation-offload: save_on_cpu is not modelled together with --grad-ckpt (use one "
        "or the other; torchtune's OffloadActivations with checkpointing is --impl torchtune)");
  if (s.impl == ModelImpl::kTorchtune &&
      (m.is_encoder || m.is_vit || m.is_clip || m.is_unet || m.is_flux ||
       (m.model_type != "llama" && m.model_type != "mistral" && m.model_type != "qwen2") ||
       m.num_labels > 0 || m.position != PositionKind::kRope || s.parallel.model_parallel()))
    return bad(fmt::format(
        "--impl torchtune: torchtune's own decoder is modelled for Llama, Mistral and Qwen2 causal "
        "LMs "
        "without Megatron-style parallelism, not {} (model_type {})",
        m.name, common::QuoteForMessage(m.model_type, common::kQuotedBytes, '\'')));
  if (s.impl == ModelImpl::kLitgpt) {
    if (Status st = ValidateLitgpt(m, s); !st.ok()) return st;
  }
  return Ok{};
}

Status Validate(const ModelSpec& m, const TrainingSetup& s) {
  auto bad = [](std::string msg) { return Status(MakeError(std::move(msg))); };
  if (Status encoders = ValidateFrozenEncoders(m, s); !encoders.ok()) return encoders;
  if (Status vae = ValidateVaeUse(m, s); !vae.ok()) return vae;
  if (s.batch == 0 || s.batch > kMaxBatch)
    return bad(fmt::format("--batch: {} is outside 1..{}", s.batch, kMaxBatch));
  if (s.seq == 0 || s.seq > kMaxSeq)
    return bad(fmt::format("--seq: {} is outside 1..{}", s.seq, kMaxSeq));
  // A ViT's sequence is its patch grid (ValidateVit bounds it); --seq is unused.
  if (!m.is_vit && !m.is_clip && s.batch * s.seq > kMaxTokensPerMicroBatch)
    return bad(fmt::format("--batch x --seq: {} tokens per micro-batch is above the {} limit",
                           s.batch * s.seq, kMaxTokensPerMicroBatch));
  if (s.grad_accum == 0 || s.grad_accum > kMaxGradAccum)
    return bad(fmt::format("--grad-accum: {} is outside 1..{}", s.grad_accum, kMaxGradAccum));
  if (s.steps == 0 || s.steps > kMaxSteps)
    return bad(fmt::format("--steps: {} is outside 1..{}", s.steps, kMaxSteps));
  if (s.finetune != Finetune::kFull) {
    if (s.lora_rank == 0 || s.lora_rank > m.hidden_size)
      return bad(fmt::format("--lora-rank: {} must be between 1 and the hidden size {}",
                             s.lora_rank, m.hidden_size));
    if (!(s.lora_dropout >= 0 && s.lora_dropout < 1))  // NaN fails too
      return bad(fmt::format("--lora-dropout: {} is outside [0, 1)", s.lora_dropout));
  }
  if (s.attn == Attention::kFlash && s.precision == Precision::kFp32)
    return bad(
        "--attn flash: flash-attn 2 runs in fp16 / bf16 only; with --precision fp32 use sdpa or "
        "eager, or a 16-bit precision");
  if (s.optimizer_in_backward && s.optimizer == OptimizerKind::kNone)
    return bad("--optimizer-in-backward: needs an optimizer (--optimizer is none)");
  if (s.optimizer_in_backward && s.grad_accum > 1)
    return bad(
        "--optimizer-in-backward: steps at every backward, so it cannot accumulate gradients "
        "(--grad-accum must be 1)");
  if (Status st = ValidateImplAndOffload(m, s); !st.ok()) return st;
  if (Status st = ValidateLiger(m, s); !st.ok()) return st;
  if (m.is_vit) return ValidateVit(m, s);
  if (m.is_clip) return ValidateClip(m, s);
  if (m.is_encoder && m.model_type != "bert")
    return bad(fmt::format("{}: encoder models other than bert (model_type {}) are not lowered yet",
                           m.name,
                           common::QuoteForMessage(m.model_type, common::kQuotedBytes, '\'')));
  if (m.num_labels > 0 && s.loss != LossKind::kHf)
    return bad(
        "--loss: chunked and fused-linear losses apply to a language-model head, not to a "
        "sequence-classification head");
  if (m.num_labels > 0 && s.parallel.model_parallel())
    return bad(
        "--tp/--pp/--cp/--ep: a sequence-classification head is modelled without "
        "Megatron-style model parallelism");
  if (m.is_encoder && s.loss != LossKind::kHf)
    return bad(
        "--loss: chunked and fused-linear losses are modelled for causal LMs only, not for bert");
  if (!(s.moe_capacity_factor == 0 ||
        (s.moe_capacity_factor >= 0.01 && s.moe_capacity_factor <= 64)))
    return bad(fmt::format("--moe-capacity-factor: {} is outside 0 (dropless) or 0.01..64",
                           s.moe_capacity_factor));
  if (!(s.moe_imbalance >= 1 && s.moe_imbalance <= 1024))
    return bad(fmt::format("--moe-imbalance: {} is outside 1..1024", s.moe_imbalance));
  if (s.moe_capacity_factor > 0 && s.moe_imbalance != 1)
    return bad(
        "--moe-imbalance: with --moe-capacity-factor every expert is capped (drop the imbalance or "
        "the capacity)");
  return ValidateByKind(m, s);
}

// torch.amp.GradScaler (torch 2.x, fp16 autocast only): scale() creates the
// fp32 `_scale` and int32 `_growth_tracker` lazily at its first call and
// keeps them; each scale() returns loss * scale (MulBackward0 saves the scale
// tensor, not a copy). step() -> unscale_ makes found_inf, kept until update().
class GradScalerModel {
 public:
  explicit GradScalerModel(bool enabled) : enabled_(enabled) {}

  // scaler.scale(loss).
  void ScaleLoss(Tape& tape, Var* loss) {
    if (!enabled_) return;
    tape.SetModule("grad_scaler");
    if (scale_.t == kNoTensor) {
      scale_ = tape.New(1, kF32, Category::kOther, "GradScaler._scale");
      growth_tracker_ = tape.New(1, 4, Category::kOther, "GradScaler._growth_tracker");
    }
    Var scaled = Mul(tape, *loss, scale_, "aten::mul");
    tape.Drop(*loss);
    *loss = scaled;
  }

  // scaler.step -> unscale_: found_inf = torch.full((), 0.0); inv_scale =
  // _scale.double().reciprocal().float(); grads unscaled in place by
  // _amp_foreach_non_finite_check_and_unscale_.
  void Unscale(Tape& tape) {
    if (!enabled_) return;
    tape.SetModule("grad_scaler");
    found_inf_ = tape.New(1, kF32, Category::kOther, "aten::full");
    Var as_double = tape.New(1, 8, Category::kTemporaries, "aten::_to_copy");
    Var recip = tape.New(1, 8, Category::kTemporaries, "aten::reciprocal");
    tape.Drop(as_double);
    Var inv_scale = tape.New(1, kF32, Category::kTemporaries, "aten::_to_copy");
    tape.Drop(recip);
    tape.Drop(inv_scale);
  }

  // scaler.update() works in place; found_inf goes with it.
  void Update(Tape& tape) {
    if (enabled_) tape.Drop(found_inf_);
  }

 private:
  bool enabled_;
  Var scale_, growth_tracker_, found_inf_;
};

// One rank class lowered: setup (parameters, adapters, sharding), then
// `setup.steps` optimizer steps of forward / backward passes in the
// schedule's order, each step ending with the optimizer and zero_grad.
class RankLowerer {
 public:
  RankLowerer(const ModelSpec& model, const TrainingSetup& setup, const GpuSpec& gpu,
              const RankClassPlan& plan)
      : model_(model),
        setup_(setup),
        gpu_(gpu),
        plan_(plan),
        tape_(&result_.stream),
        in_flight_(plan.chunks.size()) {}

  Result<Lowered> Run() {
    result_.stream.metadata()["source"] = "vramscope lower";
    result_.stream.metadata()["model"] = model_.name;
    MakeSharding();
    VS_TRY(lora_params, PlaceModel());
    if (dp_) dp_->OnAdaptersPlaced(&tape_.params);
    if (Status s = IndexModel(); !s.ok()) return s.error();
    CountParameters(lora_params);
    PlaceEma();
    if (Status s = PlaceVae(); !s.ok()) return s.error();
    PlaceDpoReference();
    scaler_ = GradScalerModel(setup_.precision == Precision::kFp16Mixed && !half_model_);
    InstallOptimizerInBackward();
    if (dp_) dp_->Setup();
    const uint64_t micro_batches = SimulatedMicroBatches();
    for (step_ = 1; step_ <= setup_.steps; ++step_) {
      for (const Pass& pass :
           PipelineSchedule(micro_batches, plan_.chunks.size(), plan_.warmup, setup_.parallel.pp)) {
        if (pass.forward) {
          ForwardPass(pass.chunk);
        } else {
          BackwardPass(pass.chunk);
        }
      }
      OptimizerPhase();
    }
    AddNotes();
    return std::move(result_);
  }

 private:
  // The data-parallel side's rules (DDP, ZeRO, FSDP, Megatron), when there is one.
  void MakeSharding() {
    const ParallelLayout& layout = setup_.parallel;
    if (layout.multi_gpu() || layout.dp_mode != DataParallel::kNone) {
      const uint32_t world =
          layout.dp_mode == DataParallel::kFsdp && layout.fsdp == FsdpSharding::kHybrid
              ? std::min(layout.dp(), layout.gpus_per_node)
              : layout.dp();
      dp_ = ShardingStrategy::Make(&tape_, setup_, world, layout.model_parallel(),
                                   model_.hidden_size, static_cast<int>(model_.num_layers),
                                   plan_.dp_rank, lower::SimulatedMicroBatches(setup_, plan_));
    }
    if (dp_) dp_->SetTiedEmbeddings(model_.tie_word_embeddings);
    half_model_ = dp_ && dp_->casts_model_to_half();
  }

  // Parameters, buffers and adapters; returns the adapters' elements.
  Result<uint64_t> PlaceModel() {
    const ParallelLayout& layout = setup_.parallel;
    const bool qlora = setup_.finetune == Finetune::kQLora;
    PlacementRules rules;
    rules.param_bytes = half_model_ ? kHalf : ParamBytes(setup_.precision);
    // diffusers' train_text_to_image_lora.py casts the UNet to weight_dtype
    // (fp16 / bf16 under mixed precision) before add_adapter, and accelerate
    // still runs its forward under autocast (diffusers 0.42.1 examples).
    const bool mixed =
        setup_.precision == Precision::kBf16Mixed || setup_.precision == Precision::kFp16Mixed;
    // train_dreambooth_lora_flux.py does the same with the FLUX transformer.
    if ((model_.is_unet || model_.is_flux) && setup_.finetune == Finetune::kLora && mixed)
      rules.param_bytes = kHalf;
    // QLoRA over FSDP / ZeRO-3 ("sharded QLoRA"): the 4-bit weights are loaded
    // with a 16-bit quant storage and the trainers never call
    // prepare_model_for_kbit_training ("one should never call
    // peft_module_casting_to_bf16 or prepare_model_for_kbit_training when doing
    // QLoRA + FSDP / DS-Zero3", TRL SFTTrainer / prepare_peft_model, 0.9-0.2x):
    // the other weights keep their 16-bit dtype, so the residual stream does too.
    rules.sharded_qlora =
        qlora && dp_ &&
        (layout.dp_mode == DataParallel::kFsdp || layout.dp_mode == DataParallel::kZero3);
    rules.storage = [this](const Param& p) { return dp_ ? dp_->StorageBytes(p) : p.storage_bytes; };
    tape_.autocast = !half_model_ && (setup_.precision == Precision::kBf16Mixed ||
                                      setup_.precision == Precision::kFp16Mixed);
    tape_.compute_bytes = setup_.precision == Precision::kFp32 ? kF32 : kHalf;
    tape_.lora_dropout = setup_.lora_dropout;
    tape_.torchtune_modules = setup_.impl == ModelImpl::kTorchtune;
    tape_.litgpt_modules = setup_.impl == ModelImpl::kLitgpt;
    tape_.liger = setup_.liger;
    tape_.liger_sm_count = gpu_.sm_count > 0 ? gpu_.sm_count : 1;
    tape_.torch_version = setup_.torch_version;
    tape_.cpu_rules = setup_.device_rules == DeviceRules::kCpu;
    tape_.graph.under_dispatch_mode = tape_.cpu_rules;
    tape_.graph.SetCublasWorkspaces(tape_.cpu_rules ? 0 : gpu_.cublas_workspace_bytes);
    // --text-encoder: the frozen encoders' weights, moved to the GPU before the
    // denoiser is prepared (train_text_to_image.py).
    VS_TRY(encoders, PlaceFrozenEncoders(tape_, model_, setup_));
    encoders_ = std::move(encoders);
    PlaceParameters(tape_, model_, setup_, plan_.chunks, rules);
    if (setup_.finetune == Finetune::kFull) return uint64_t{0};
    const std::vector<StageSpan>& chunks = plan_.chunks;
    const bool whole_model =
        chunks.size() == 1 && chunks[0].first_layer == 0 && chunks[0].embed && chunks[0].head;
    return AttachLoraAdapters(tape_, model_, setup_, whole_model, rules.storage);
  }

  // The forward's view of the parameters, checked for what every layer needs.
  Status IndexModel() {
    if (model_.is_clip) {
      VS_TRY(indexed, IndexClipParams(model_, tape_.params));
      cp_ = std::move(indexed);
      return Ok{};
    }
    if (model_.is_vit) {
      VS_TRY(indexed, IndexVitParams(model_, tape_.params));
      vp_ = std::move(indexed);
      return Ok{};
    }
    if (model_.is_unet) {
      VS_TRY(indexed, IndexUNetParams(model_, tape_.params));
      up_ = std::move(indexed);
      return Ok{};
    }
    if (model_.is_flux) {
      VS_TRY(indexed, IndexFluxParams(model_, tape_.params));
      fp_ = std::move(indexed);
      return Ok{};
    }
    if (model_.is_t5) {
      VS_TRY(indexed, IndexT5Params(model_, tape_.params));
      tp_ = std::move(indexed);
      return Ok{};
    }
    if (model_.is_encoder) {
      VS_TRY(indexed, IndexEncoderParams(model_, tape_.params));
      ep_ = indexed;
    } else {
      mp_ = IndexParams(model_, tape_.params);
    }
    if (!model_.is_encoder && (!mp_.embed || mp_.layers.empty())) {
      return MakeError(fmt::format(
          "{}: could not find the embedding and layers in its parameter list", model_.name));
    }
    for (const StageSpan& span : plan_.chunks) {
      const size_t end_layer = std::min<size_t>(span.end_layer, mp_.layers.size());
      for (size_t i = model_.is_encoder ? end_layer : span.first_layer; i < end_layer; ++i) {
        const LayerParams& lp = mp_.layers[i];
        const bool attn_ok = lp.qkv || (lp.q && lp.k && lp.v);
        if (!attn_ok || !lp.o || !lp.norm1) {
          return MakeError(
              fmt::format("{}: layer {} lacks attention or norm parameters", model_.name, i));
        }
      }
    }
    return Ok{};
  }

  // TRL's DPO reference under full fine-tuning (trl 1.16.0 DPOTrainer.__init__:
  // create_model_from_path with the policy's dtype, frozen, on the GPU; under
  // DDP prepared for evaluation, not wrapped): a second copy of every weight,
  // whose leaves still require grad, so autocast caches their casts too.
  // Under PEFT, or with precomputed reference log-probabilities, there is none.
  void PlaceDpoReference() {
    if (!setup_.dpo || setup_.dpo_precompute_ref || setup_.finetune != Finetune::kFull) return;
    tape_.SetModule("ref_model");
    ref_params_.reserve(model_.params.size());
    for (size_t i = 0; i < model_.params.size(); ++i) {
      const Param& p = tape_.params[i];
      Param ref;
      ref.name = "ref_model." + p.name;
      ref.module = p.module;
      ref.numel = p.numel;
      ref.elem_bytes = p.elem_bytes;
      ref.storage_bytes = p.numel * p.elem_bytes;
      ref.trainable = false;
      ref.requires_grad = true;
      ref.var.numel = p.numel;
      ref.var.elem_bytes = p.elem_bytes;
      ref.var.t = tape_.graph.Alloc(ref.storage_bytes, Category::kParameters,
                                    "ref_model.from_pretrained", p.module);
      ref_params_.push_back(ref);
    }
    ref_mp_ = IndexParams(model_, ref_params_);
    tape_.other_params = &ref_params_;
  }

  void CountParameters(uint64_t lora_params) {
    uint64_t stage_params = 0;
    for (const Param& p : tape_.params)
      stage_params += p.unit >= 0 && !p.name.empty() ? p.numel : 0;
    stage_params -= lora_params;
    result_.parameters = stage_params + lora_params;
    result_.trainable_parameters = setup_.finetune != Finetune::kFull ? lora_params : stage_params;
  }

  // Optimizer in backward (PyTorch tutorial "fuse the optimizer step into
  // the backward pass", torch >= 2.1): one single-parameter optimizer per
  // parameter, stepped and zeroed from register_post_accumulate_grad_hook, so
  // each .grad dies as soon as it is complete.
  void InstallOptimizerInBackward() {
    if (!setup_.optimizer_in_backward) return;
    for (Param& p : tape_.params) param_of_grad_[&p.grad] = &p;
    tape_.graph.post_accumulate_hook = [this](TensorId* slot) {
      auto it = param_of_grad_.find(slot);
      if (it == param_of_grad_.end() || *slot == kNoTensor) return;
      OptimizerStepParams(tape_, setup_, {it->second}, &extras_);
      tape_.graph.Drop(*slot);  // optimizer.zero_grad(set_to_none=True)
      *slot = kNoTensor;
    };
  }

  // Micro-batches per step: a pipeline's --microbatches, else --grad-accum. A
  // pipeline stage in 1F1B steady state repeats one forward + one backward
  // with the same micro-batches in flight; after the warm-up, two such pairs
  // show every memory state the rest would repeat (the cooldown drains the
  // same way whatever the count).
  uint64_t SimulatedMicroBatches() {
    const ParallelLayout& layout = setup_.parallel;
    const uint64_t requested =
        layout.pp > 1 && layout.microbatches > 0 ? layout.microbatches : setup_.grad_accum;
    const uint64_t simulated = lower::SimulatedMicroBatches(setup_, plan_);
    if (simulated < requested) {
      result_.notes.push_back(
          fmt::format("pipeline: {} of {} micro-batches per step simulated on each stage; 1F1B "
                      "repeats the same memory "
                      "pattern after its warm-up",
                      simulated, requested));
    }
    return simulated;
  }

  // The loop's batch variables go as the next iteration rebinds them. The
  // text states a FLUX step's encoders made are rebound only when
  // compute_text_embeddings returns the next ones (train_dreambooth_flux.py),
  // so they wait in prev_text_ for that (or for the run's end).
  void ReleaseBatch() {
    const FluxTextFromEncoders text = FluxTextSources(model_, setup_);
    for (size_t i = 0; i < step_batch_.size(); ++i) {
      const bool encoded = model_.is_flux && ((i == kFluxPooledSlot && text.pooled) ||
                                              (i == kFluxStatesSlot && text.states));
      if (encoded && step_batch_[i].t != kNoTensor) {
        prev_text_.push_back(step_batch_[i]);
      } else {
        tape_.Drop(step_batch_[i]);
      }
    }
    step_batch_.clear();
  }

  // The text encoders' forwards; a FLUX step's states take their batch slots
  // and release the previous step's.
  void EncodePrompt() {
    HandedOn text = RunFrozenEncoders(tape_, setup_, encoders_);
    for (Var& v : prev_text_) tape_.Drop(v);
    prev_text_.clear();
    if (!model_.is_flux) return;
    if (text.pooled.t != kNoTensor) step_batch_[kFluxPooledSlot] = text.pooled;
    if (text.states.t != kNoTensor) step_batch_[kFluxStatesSlot] = text.states;
  }

  // A ViT's batch is the data loader's: made before the forward (after the
  // previous micro-batch's is released, as the loop rebinds its variable) and
  // kept until the next one or the end of the step.
  void LoadBatch() {
    if (!model_.is_vit && !model_.is_flux && !model_.is_clip && !vae_) return;
    ReleaseBatch();
    if (model_.is_clip) {
      const ClipBatch batch = MakeClipBatch(tape_, model_, setup_);
      step_batch_ = {batch.input_ids, batch.pixels};
      return;
    }
    if (model_.is_flux) {
      const FluxTextFromEncoders text = FluxTextSources(model_, setup_);
      step_batch_ = MakeFluxBatch(tape_, model_, setup_, text.pooled, text.states);
    } else if (model_.is_vit) {
      const VitBatch batch = MakeVitBatch(tape_, model_, setup_);
      step_batch_ = {batch.pixels, batch.labels};
    }
    // The images the frozen VAE encodes, after the step's other inputs.
    if (vae_) step_batch_.push_back(MakePixelValues(tape_, *vae_, setup_, VaeImageSide()));
  }

  // --vae: the frozen AutoencoderKL's weights (vae.h), after the denoiser's
  // and the EMA copy: the scripts move the VAE to the GPU after
  // accelerator.prepare (train_text_to_image.py, diffusers examples).
  Status PlaceVae() {
    if (!setup_.vae) return Ok{};
    vae_ = std::make_unique<VaeWeights>();
    return PlaceVaeWeights(tape_, *setup_.vae, setup_, vae_.get());
  }

  uint64_t VaeImageSide() const {
    const uint64_t latent =
        model_.is_flux ? *FluxLatentSide(setup_) : *UNetLatentSide(model_, setup_);
    return latent * setup_.vae_scale;
  }

  // The VAE encode of this micro-batch's pixels (the last batch entry), in the
  // forward phase before the denoiser runs; the latents (and FLUX's cast
  // pixels) stay with the batch until the step is over.
  void EncodeImages() {
    if (!vae_) return;
    const VaeScript script = model_.is_flux ? VaeScript::kDreamboothFlux : VaeScript::kTextToImage;
    const Var pixels = step_batch_.back();
    std::vector<Var> held;
    Var latents = VaeEncode(tape_, *vae_, setup_, script, pixels, VaeImageSide(), &held);
    held.push_back(latents);
    step_batch_.insert(step_batch_.end(), held.begin(), held.end());
  }

  void ForwardPass(size_t chunk) {
    const StageSpan& span = plan_.chunks[chunk];
    LoadBatch();
    // The scripts encode the prompt before calling the denoiser, whose call
    // starts the forward (as the recorder marks it).
    EncodePrompt();
    result_.stream.BeginPhase(step_, Phase::kForward);
    if (dp_) dp_->BeginForward();
    EncodeImages();
    // torchtune's recipes: `with self.activations_handling_ctx: logits = self._model(...)`
    // (OffloadActivations); otherwise torch.autograd.graph.save_on_cpu.
    const bool torchtune_offload =
        setup_.activation_offload && setup_.impl == ModelImpl::kTorchtune;
    tape_.graph.offload_saved = setup_.activation_offload && !torchtune_offload;
    tape_.graph.offload_activations = torchtune_offload;
    ForwardOut f =
        model_.is_clip
            ? ClipForward(tape_, model_, cp_, setup_, ClipBatch{step_batch_[0], step_batch_[1]})
        : model_.is_vit
            ? VitForward(tape_, model_, vp_, setup_, VitBatch{step_batch_[0], step_batch_[1]})
        : model_.is_unet ? UNetForward(tape_, model_, up_, setup_)
        : model_.is_flux ? FluxForward(tape_, model_, fp_, setup_, step_batch_)
        : model_.is_t5   ? T5Forward(tape_, model_, tp_, setup_)
        : model_.is_encoder
            ? EncoderForward(tape_, model_, ep_, setup_)
            : Forward(tape_, model_, mp_, setup_, span, ref_params_.empty() ? nullptr : &ref_mp_);
    ClearAutocastCache(tape_);
    tape_.graph.offload_saved = false;
    tape_.graph.offload_activations = false;

    scaler_.ScaleLoss(tape_, &f.loss);
    if (!span.head) {
      // Megatron deallocate_output_tensor (core 0.x, deallocate_pipeline_outputs):
      // once sent, the output's storage is freed; its grad_fn stays.
      tape_.graph.Drop(f.loss.t);
      f.loss.t = kNoTensor;
    }
    in_flight_[chunk].push_back(f);
  }

  void BackwardPass(size_t chunk) {
    const StageSpan& span = plan_.chunks[chunk];
    ForwardOut f = in_flight_[chunk].front();
    in_flight_[chunk].erase(in_flight_[chunk].begin());
    result_.stream.BeginPhase(step_, Phase::kBackward);
    if (span.head) {
      tape_.graph.Backward(f.loss);
      tape_.Drop(f.loss);
      for (Var& v : f.held) tape_.Drop(v);
    } else {
      // The gradient received from the next stage seeds this stage's backward.
      tape_.SetModule("pipeline");
      tape_.graph.Backward(f.loss, "pp::recv_grad", Category::kTemporaries);
    }
    DropInputLeaves();
    if (dp_) dp_->EndBackward();
  }

  // The graph goes: leaves made by enable_input_require_grads and their .grad.
  // Only this micro-batch's leaves: theirs have a .grad now. (Slots stay:
  // micro-batches still in flight hold their addresses.)
  void DropInputLeaves() {
    for (size_t i = 0; i < tape_.input_grads.size(); ++i) {
      if (tape_.input_grads[i] == kNoTensor) continue;
      tape_.graph.Drop(tape_.input_grads[i]);
      tape_.input_grads[i] = kNoTensor;
      tape_.graph.Drop(tape_.input_leaves[i]);
      tape_.input_leaves[i] = kNoTensor;
    }
  }

  void OptimizerPhase() {
    result_.stream.BeginPhase(step_, Phase::kOptimizer);
    scaler_.Unscale(tape_);
    if (dp_) {
      dp_->Step(setup_, &extras_);
    } else if (!setup_.optimizer_in_backward) {
      OptimizerStep(tape_, setup_, step_ == 1, &extras_);
    }
    scaler_.Update(tape_);
    if (dp_) {
      dp_->ZeroGrad();
    } else {
      ZeroGrad(tape_);
    }
    EmaStep();
    // The loop's next iteration rebinds its batch variable: this step's go.
    ReleaseBatch();
    if (step_ == setup_.steps) {
      for (Var& v : prev_text_) tape_.Drop(v);
      prev_text_.clear();
    }
    // LitGPT's loop keeps `logits` into the next step (loss.cc); after the
    // last one the script returns.
    if (step_ == setup_.steps) {
      for (Var& v : tape_.loop_logits) tape_.Drop(v);
      tape_.loop_logits.clear();
    }
  }

  // diffusers' EMAModel (training_utils.py, 0.42.1): `shadow_params = [p.clone()
  // for p in parameters]` of an fp32 copy of the UNet, moved to the GPU
  // (train_text_to_image.py --use_ema), one per parameter.
  void PlaceEma() {
    if (!setup_.ema) return;
    tape_.SetModule("ema_unet");
    for (const Param& p : tape_.params) {
      ema_shadow_.push_back(tape_.graph.Alloc(p.numel * kF32, Category::kOptimizerState,
                                              "EMAModel.shadow_params", tape_.module()));
    }
  }

  // EMAModel.step after the optimizer step and zero_grad: per trainable
  // parameter `s_param.sub_(one_minus_decay * (s_param - param))` (two fp32
  // temporaries, one at a time); with foreach, `torch._foreach_sub(s, params)`
  // for all of them at once; a frozen parameter is copied in place.
  void EmaStep() {
    if (!setup_.ema) return;
    tape_.SetModule("ema_unet");
    std::vector<TensorId> differences;
    for (const Param& p : tape_.params) {
      if (!p.trainable) continue;
      const uint64_t bytes = p.numel * kF32;
      const TensorId diff =
          tape_.graph.Alloc(bytes, Category::kTemporaries, "aten::sub", tape_.module());
      if (setup_.ema_foreach) {
        differences.push_back(diff);
        continue;
      }
      const TensorId scaled =
          tape_.graph.Alloc(bytes, Category::kTemporaries, "aten::mul", tape_.module());
      tape_.graph.Drop(diff);
      tape_.graph.Drop(scaled);
    }
    for (TensorId t : differences) tape_.graph.Drop(t);
  }

  void AddNotes() {
    result_.managed_bytes = extras_.managed_state_bytes;
    result_.host_peak_bytes = tape_.graph.host_peak_bytes() + (dp_ ? dp_->host_bytes() : 0);
    if (setup_.finetune != Finetune::kFull) {
      result_.notes.push_back(
          "LoRA adapters are counted; their forward is modelled as part of the frozen linear "
          "(detailed PEFT paths: see docs/lowering.md).");
    }
    if (setup_.finetune == Finetune::kQLora) AddUnquantizedExpertsNote();
    if (dp_) {
      for (const std::string& n : dp_->notes()) result_.notes.push_back(n);
    }
  }

  // transformers 5.x stacks each MoE layer's experts into 3-D parameters;
  // replace_with_bnb_linear (integrations/bitsandbytes.py, 5.24.0) swaps only
  // nn.Linear / Conv1D modules for bnb ones, so the experts stay 16-bit.
  void AddUnquantizedExpertsNote() {
    uint64_t expert_bytes = 0;  // as this rank holds them
    for (size_t i = 0; i < model_.params.size() && i < tape_.params.size(); ++i) {
      if (IsStackedExpert(model_.params[i], setup_.transformers_version))
        expert_bytes += tape_.params[i].storage_bytes;
    }
    if (expert_bytes == 0) return;
    result_.notes.push_back(fmt::format(
        "QLoRA under transformers 5.x does not quantize this model's experts: they are stacked 3-D "
        "parameters, "
        "and bitsandbytes replaces nn.Linear layers only (integrations/bitsandbytes.py), so {:.2f} "
        "GiB of experts "
        "stay unquantized (fp32 after prepare_model_for_kbit_training). transformers 4.x "
        "(--transformers-version 4.57) keeps one nn.Linear per expert, which is quantized.",
        static_cast<double>(expert_bytes) / static_cast<double>(uint64_t{1} << 30)));
  }

  const ModelSpec& model_;
  const TrainingSetup& setup_;
  const GpuSpec& gpu_;
  const RankClassPlan& plan_;
  Lowered result_;
  Tape tape_;                             // writes result_.stream
  std::unique_ptr<ShardingStrategy> dp_;  // null: one GPU, nothing sharded
  bool half_model_ = false;
  ModelParams mp_;
  std::vector<Param> ref_params_;  // TRL's DPO reference copy (PlaceDpoReference)
  ModelParams ref_mp_;
  EncoderParams ep_;
  UNetParams up_;
  FluxParams fp_;
  T5Params tp_;
  VitParams vp_;
  ClipParams cp_;
  std::vector<FrozenEncoder> encoders_;  // --text-encoder (frozen_encoder.h)
  std::vector<Var> step_batch_;          // the data loader's current batch (LoadBatch)
  std::vector<Var> prev_text_;           // the last step's encoded text states (ReleaseBatch)
  std::unique_ptr<VaeWeights> vae_;      // --vae: the frozen AutoencoderKL (PlaceVae)
  std::vector<TensorId> ema_shadow_;     // EMAModel.shadow_params, for the whole run
  OptimizerExtras extras_;
  GradScalerModel scaler_{false};
  std::unordered_map<TensorId*, Param*> param_of_grad_;
  std::vector<std::vector<ForwardOut>>
      in_flight_;  // forwards whose backward has not run, per chunk
  uint32_t step_ = 1;
};

}  // namespace
}  // namespace lower

// TRL's DPOTrainer runs chosen and rejected rows as one batch
// (DataCollatorForPreference, trl 1.16.0) and disables dropout in its models
// (DPOConfig.disable_dropout, default true: every nn.Dropout, PEFT's too, gets
// p = 0, which torch's dropout returns as its input).
void ForDpo(ModelSpec* local, TrainingSetup* setup) {
  setup->batch *= 2;
  setup->lora_dropout = 0;
  local->attention_dropout = 0;
  local->hidden_dropout = 0;
  local->residual_dropout = 0;
  local->classifier_dropout = 0;
}

// Padding-free packing: one row of every token, no attention_mask.
void ForPacking(TrainingSetup* setup) {
  setup->seq *= setup->batch;
  setup->batch = 1;
  setup->attention_mask = false;
}

// LitGPT's GPT (litgpt/model.py 0.5.13): CausalSelfAttention's one `qkv`
// Linear [(n_head + 2 n_query_groups) head_size, n_embd] where transformers
// has q_proj / k_proj / v_proj (in the q position of the list), and its own
// lm_head even where the checkpoint ties it to the embeddings (GPT.__init__
// makes nn.Linear(n_embd, padded_vocab_size) unconditionally).
void ForLitgpt(ModelSpec* local) {
  std::vector<ParamTensor> params;
  for (ParamTensor& pt : local->params) {
    const ParamRole r = pt.role;
    if (r == ParamRole::kK || r == ParamRole::kV) continue;
    if (r == ParamRole::kQ) {
      // Qwen2's q / k / v biases (Config attn_bias) become the fused one's.
      const bool bias = pt.name.ends_with(".bias");
      const uint64_t rows = (local->num_heads + 2 * local->num_kv_heads) * local->head_dim;
      const std::string prefix = fmt::format("transformer.h.{}.attn.qkv", pt.layer);
      pt.name = prefix + (bias ? ".bias" : ".weight");
      pt.module = prefix;
      pt.role = ParamRole::kQkv;
      pt.shape =
          bias ? std::vector<uint64_t>{rows} : std::vector<uint64_t>{rows, local->hidden_size};
      pt.numel = bias ? rows : rows * local->hidden_size;
    }
    params.push_back(std::move(pt));
  }
  if (local->tie_word_embeddings) {
    ParamTensor head;
    head.name = "lm_head.weight";
    head.module = "lm_head";
    head.role = ParamRole::kLmHead;
    head.is_linear_weight = true;
    head.shape = {local->vocab_size, local->hidden_size};
    head.numel = local->vocab_size * local->hidden_size;
    params.push_back(std::move(head));
    local->tie_word_embeddings = false;
  }
  local->params = std::move(params);
}

Result<std::vector<LoweredRank>> LowerRankClasses(const ModelSpec& model,
                                                  const TrainingSetup& setup, const GpuSpec& gpu,
                                                  const RankClassCallback& each) {
  using namespace lower;
  // A knob a config file set is blamed on that file's key, not its flag.
  const auto& sources = setup.knob_sources;
  if (Status s = Validate(model, setup); !s.ok()) return AttributeKnobError(s.error(), sources);
  if (Status s = ValidateLayout(setup.parallel); !s.ok())
    return AttributeKnobError(s.error(), sources);
  auto sharded = ShardModel(model, setup);
  if (!sharded.ok()) return AttributeKnobError(sharded.error(), sources);
  ModelSpec& local = *sharded;
  TrainingSetup local_setup = setup;
  // Context parallelism: each rank holds seq / cp tokens of every sample
  // (Megatron-LM / Transformer Engine ring attention).
  local_setup.seq = setup.seq / setup.parallel.cp;
  if (setup.dpo) ForDpo(&local, &local_setup);
  if (setup.packed) ForPacking(&local_setup);
  if (setup.impl == ModelImpl::kLitgpt) ForLitgpt(&local);
  VS_TRY(plans, PlanRankClasses(local, local_setup));
  // Before anything is lowered: the events this will produce (lower.h),
  // frozen encoders and the VAE included; the refusal names the model.
  if (Status s = CheckWorkBudget(WorkOf(local, local_setup, plans), setup.max_events); !s.ok())
    return MakeError(fmt::format("{}: {}", model.name, s.error().message));
  // Rank classes share nothing mutable: lowered concurrently, one thread each,
  // and each handed to `each` on its own thread as soon as it is lowered.
  std::vector<LoweredRank> out(plans.size());
  std::vector<Status> status(plans.size(), Ok{});
  auto work = [&](size_t i) {
    const RankClassPlan& plan = plans[i];
    auto lowered = RankLowerer(local, local_setup, gpu, plan).Run();
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
        if (std::find(model.notes.begin(), model.notes.end(), n) == model.notes.end())
          r.lowered.notes.push_back(n);
      }
      // The report counts the whole model's parameters, not one rank's.
      uint64_t adapters = 0;
      for (const ParamTensor& pt : model.params) adapters += LoraAdapterParams(pt, setup);
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
  if (!model.is_vit && !model.is_clip && model.max_position_embeddings > 0 &&
      setup.seq > model.max_position_embeddings) {
    if (model.position == PositionKind::kLearned) {
      out.push_back(
          fmt::format("--seq {} is beyond {}'s {} learned positions: the real model would fail "
                      "(position index out of range); estimated as asked",
                      setup.seq, model.name, model.max_position_embeddings));
    } else {
      out.push_back(
          fmt::format("--seq {} is beyond {}'s max_position_embeddings {}: estimated as asked, "
                      "but the model was not trained on positions that far",
                      setup.seq, model.name, model.max_position_embeddings));
    }
  }
  const int tv = setup.transformers_version, pv = setup.torch_version;
  if (tv < lower::kOldestTransformers || tv > lower::kNewestTransformers) {
    out.push_back(fmt::format(
        "--transformers-version {} is outside {}..{}, the releases the lowering's rules "
        "were read from: estimated with the nearest behaviour",
        lower::VersionText(tv), lower::VersionText(lower::kOldestTransformers),
        lower::VersionText(lower::kNewestTransformers)));
  }
  if (pv < lower::kOldestTorch || pv > lower::kNewestTorch) {
    out.push_back(
        fmt::format("--torch-version {} is outside {}..{}, the releases the lowering's rules were "
                    "read from: estimated with the nearest behaviour",
                    lower::VersionText(pv), lower::VersionText(lower::kOldestTorch),
                    lower::VersionText(lower::kNewestTorch)));
  }
  // A sharding mode with one GPU is a real setup (ZeRO-Offload or FSDP offload
  // on one card) but nothing is sharded: say so rather than let --zero 3 alone
  // read as "the sharded estimate".
  const DataParallel dp = setup.parallel.dp_mode;
  if (setup.parallel.gpus == 1 && dp != DataParallel::kNone && dp != DataParallel::kDdp) {
    out.push_back(fmt::format(
        "--{} on one GPU (no --gpus): world size 1, nothing is sharded across ranks; pass --gpus N "
        "for N ranks",
        dp == DataParallel::kFsdp ? "fsdp" : "zero"));
  }
  return out;
}

Result<Lowered> LowerTraining(const ModelSpec& model, const TrainingSetup& setup,
                              const GpuSpec& gpu) {
  VS_TRY(ranks, LowerRankClasses(model, setup, gpu));
  return std::move(ranks.front().lowered);
}

}  // namespace vramscope
