#include "frozen_encoder.h"

#include <fmt/format.h>

#include "ops.h"
#include "vramscope/common/quote.h"

namespace vramscope::lower {
namespace {

Status Bad(std::string msg) { return Status(MakeError(std::move(msg))); }

// A CLIP text tower (CLIPTextModel, CLIPTextModelWithProjection): the text
// encoders of Stable Diffusion 1.x / 2.x, SDXL and FLUX.
bool IsClipText(const ModelSpec& m) { return m.is_clip && m.clip.has_text && !m.clip.has_vision; }

// The tokens each encoder reads. The UNet scripts tokenize to the
// tokenizer's model_max_length (77), which cross-attention then reads
// (--text-len); FluxPipeline._get_clip_prompt_embeds (diffusers 0.42.1)
// always pads CLIP's prompt to 77 (max_length=self.tokenizer_max_length),
// while --text-len is T5's (max_sequence_length).
uint64_t EncoderTextLen(const ModelSpec& denoiser, const ModelSpec& encoder,
                        const TrainingSetup& setup) {
  if (denoiser.is_flux && encoder.is_clip) return encoder.clip.max_positions;
  return TextLen(denoiser, setup);
}

// A T5EncoderModel: FLUX's text_encoder_2 (FluxPipeline, diffusers 0.42.1).
bool IsT5Encoder(const ModelSpec& m) { return m.is_t5 && m.t5.encoder_only; }

// One encoder of a validated denoiser: its family, the denoiser it may serve,
// its text length and dtype.
Status ValidateEncoder(const ModelSpec& denoiser, const ModelSpec& e, const TrainingSetup& setup) {
  if (IsT5Encoder(e)) {
    if (!denoiser.is_flux)
      return Bad(fmt::format(
          "--text-encoder: {} is a T5 encoder, which FLUX pipelines use; the UNet scripts use "
          "CLIP text encoders",
          e.name));
    // T5Block clamps float16 hidden states after every sublayer
    // (modeling_t5.py, 5.24.0): temporaries not modelled.
    if (setup.precision == Precision::kFp16 || setup.precision == Precision::kFp16Mixed)
      return Bad(
          fmt::format("--text-encoder: {} in float16 is not modelled (T5Block's float16 "
                      "clamps); use bf16 or fp32",
                      e.name));
    if (e.hidden_size != denoiser.flux.joint_attention_dim)
      return Bad(fmt::format("--text-encoder: {}'s d_model {} is not {}'s joint_attention_dim {}",
                             e.name, e.hidden_size, denoiser.name,
                             denoiser.flux.joint_attention_dim));
    return Ok{};
  }
  if (!IsClipText(e))
    return Bad(fmt::format(
        "--text-encoder: {} is model_type {} ({}); the modelled text encoders are CLIP text "
        "towers (clip_text_model: CLIPTextModel, CLIPTextModelWithProjection) and, for FLUX, "
        "T5EncoderModel",
        e.name, common::QuoteForMessage(e.model_type, common::kQuotedBytes, '\''), e.architecture));
  // FLUX's pooled_projections are CLIP's pooler_output (or its projection).
  const uint64_t pooled = e.clip.text_projection ? e.clip.projection_dim : e.clip.text.hidden;
  if (denoiser.is_flux && pooled != denoiser.flux.pooled_projection_dim)
    return Bad(
        fmt::format("--text-encoder: {}'s pooled output is {} wide, not {}'s "
                    "pooled_projection_dim {}",
                    e.name, pooled, denoiser.name, denoiser.flux.pooled_projection_dim));
  const uint64_t len = EncoderTextLen(denoiser, e, setup);
  if (len > e.clip.max_positions)
    return Bad(
        fmt::format("--text-len: {} tokens are past {}'s {} positions (CLIPTextEmbeddings "
                    "raises)",
                    len, e.name, e.clip.max_positions));
  return Ok{};
}

}  // namespace

Status ValidateFrozenEncoders(const ModelSpec& denoiser, const TrainingSetup& setup) {
  if (setup.text_encoders.empty()) return Ok{};
  if (!denoiser.is_unet && !denoiser.is_flux)
    return Bad(fmt::format(
        "--text-encoder: frozen text encoders are modelled for diffusion UNets and FLUX "
        "transformers, not for {}",
        denoiser.name));
  if (setup.text_encoders.size() > 4)
    return Bad("--text-encoder: at most 4 text encoders are modelled");
  for (const std::shared_ptr<const ModelSpec>& e : setup.text_encoders) {
    if (!e) return Bad("--text-encoder: an encoder was not resolved");
    if (Status one = ValidateEncoder(denoiser, *e, setup); !one.ok()) return one;
  }
  return Ok{};
}

namespace {

// The weights of one encoder: frozen leaves (requires_grad_(False)) in
// weight_dtype, allocated by `.to(accelerator.device, dtype=weight_dtype)`.
std::vector<Param> PlaceWeights(Tape& tape, const ModelSpec& e, uint8_t bytes,
                                const std::string& module) {
  tape.SetModule(module);
  std::vector<Param> params;
  params.reserve(e.params.size());
  for (const ParamTensor& pt : e.params) {
    Param p;
    p.name = module + "." + pt.name;
    p.module = tape.module();
    p.numel = pt.numel;
    p.elem_bytes = bytes;
    p.storage_bytes = pt.numel * bytes;
    p.trainable = false;
    p.var.numel = pt.numel;
    p.var.elem_bytes = bytes;
    p.var.t =
        tape.graph.Alloc(p.storage_bytes, Category::kParameters, "text_encoder.to", tape.module());
    params.push_back(std::move(p));
  }
  // CLIPTextEmbeddings' position_ids buffer (int64, non-persistent) moves
  // too; T5EncoderModel registers no buffer.
  if (e.is_clip)
    tape.graph.Alloc(e.clip.max_positions * kI64, Category::kParameters, "register_buffer",
                     tape.module());
  return params;
}

}  // namespace

Result<std::vector<FrozenEncoder>> PlaceFrozenEncoders(Tape& tape, const ModelSpec& denoiser,
                                                       const TrainingSetup& setup) {
  std::vector<FrozenEncoder> out;
  const uint8_t bytes = setup.precision == Precision::kFp32 ? kF32 : kHalf;
  for (size_t i = 0; i < setup.text_encoders.size(); ++i) {
    const std::shared_ptr<const ModelSpec>& spec = setup.text_encoders[i];
    FrozenEncoder e;
    e.spec = spec;
    e.params = PlaceWeights(tape, *spec, bytes,
                            i == 0 ? "text_encoder" : fmt::format("text_encoder_{}", i + 1));
    if (IsT5Encoder(*spec)) {
      VS_TRY(indexed, IndexT5Params(*spec, e.params));
      e.t5 = std::move(indexed);
    } else {
      VS_TRY(indexed, IndexClipParams(*spec, e.params));
      e.clip = std::move(indexed);
    }
    // SDXL (the UNet's "text_time" additional embedding) hands on the
    // penultimate layer's states (StableDiffusionXLPipeline.encode_prompt).
    e.penultimate = denoiser.is_unet && denoiser.unet.text_time;
    e.text_len = EncoderTextLen(denoiser, *spec, setup);
    e.flux = denoiser.is_flux;
    out.push_back(std::move(e));
  }
  return out;
}

namespace {

// `embeds.repeat(...)` of the FLUX scripts' _encode_prompt_with_clip /
// _encode_prompt_with_t5 (num_images_per_prompt 1: still a copy); the copy is
// what they hand on, the original goes when the function returns.
Var RepeatCopy(Tape& tape, const Var& states) {
  return tape.New(states.numel, states.elem_bytes, Category::kOther, "aten::repeat");
}

// A CLIP text tower's forward (clip.h): its states and pooled state; a
// CLIPTextModelWithProjection projects the pooled state. FLUX hands on the
// pooled state's copy.
Var RunClip(Tape& tape, const TrainingSetup& es, FrozenEncoder& e) {
  Var ids = tape.New(es.batch * e.text_len, kI64, Category::kOther, "input_ids");
  ClipTextOut out = ClipTextForward(tape, *e.spec, e.clip, es, es.batch, ids, e.penultimate);
  if (e.spec->clip.text_projection && e.clip.text_proj) {
    Var projected =
        Linear(tape, out.pooled, *e.clip.text_proj, nullptr, es.batch, e.spec->clip.projection_dim);
    tape.Drop(out.pooled);
    out.pooled = projected;
  }
  Var handed;
  if (e.flux) {
    // FLUX keeps only pooler_output (`prompt_embeds = prompt_embeds.pooler_output`
    // drops the rest of the output), then repeats it.
    for (Var* v : {&out.last_hidden, &out.penultimate}) {
      if (v->t != kNoTensor) tape.Drop(*v);
    }
    handed = RepeatCopy(tape, out.pooled);
  }
  for (Var* v : {&out.last_hidden, &out.penultimate, &out.pooled}) {
    if (v->t != kNoTensor) tape.Drop(*v);
  }
  tape.Drop(ids);
  return handed;
}

// FLUX's text_encoder_2: `text_encoder(text_input_ids)[0]` (t5.h), then the
// repeat, handed on.
Var RunT5(Tape& tape, const TrainingSetup& es, FrozenEncoder& e) {
  Var out = T5EncoderNoGrad(tape, *e.spec, e.t5, es, es.batch, e.text_len);
  Var handed = RepeatCopy(tape, out);
  tape.Drop(out);
  return handed;
}

// Puts `v` in `*slot`, releasing what a previous encoder put there.
void Fill(Tape& tape, Var* slot, Var v) {
  if (v.t == kNoTensor) return;
  if (slot->t != kNoTensor) tape.Drop(*slot);
  *slot = v;
}

}  // namespace

FluxTextFromEncoders FluxTextSources(const ModelSpec& denoiser, const TrainingSetup& setup) {
  FluxTextFromEncoders out;
  if (!denoiser.is_flux) return out;
  for (const std::shared_ptr<const ModelSpec>& e : setup.text_encoders) {
    if (e && IsT5Encoder(*e)) out.states = true;
    if (e && IsClipText(*e)) out.pooled = true;
  }
  return out;
}

HandedOn RunFrozenEncoders(Tape& tape, const TrainingSetup& setup,
                           std::vector<FrozenEncoder>& encoders) {
  HandedOn handed;
  if (encoders.empty()) return handed;
  const bool autocast = tape.autocast, grad = tape.grad_enabled;
  tape.autocast = false;
  tape.grad_enabled = false;
  for (size_t i = 0; i < encoders.size(); ++i) {
    FrozenEncoder& e = encoders[i];
    // The encoder as from_pretrained builds it: SDPA attention, no
    // checkpointing or adapters, the prompt's own length.
    TrainingSetup es = setup;
    es.attn = Attention::kSdpa;
    es.grad_ckpt = GradCkpt::kNone;
    es.finetune = Finetune::kFull;
    es.text_len = e.text_len;
    tape.SetModule(i == 0 ? "text_encoder" : fmt::format("text_encoder_{}", i + 1));
    if (IsT5Encoder(*e.spec)) {
      Fill(tape, &handed.states, RunT5(tape, es, e));
    } else {
      Fill(tape, &handed.pooled, RunClip(tape, es, e));
    }
  }
  tape.autocast = autocast;
  tape.grad_enabled = grad;
  return handed;
}

}  // namespace vramscope::lower
