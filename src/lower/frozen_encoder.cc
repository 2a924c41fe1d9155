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
// while --text-len is T5's.
uint64_t EncoderTextLen(const ModelSpec& denoiser, const ModelSpec& encoder,
                        const TrainingSetup& setup) {
  if (denoiser.is_flux) return encoder.clip.max_positions;
  return TextLen(denoiser, setup);
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
    if (!IsClipText(*e))
      return Bad(fmt::format(
          "--text-encoder: {} is model_type {} ({}); only CLIP text encoders (clip_text_model: "
          "CLIPTextModel, CLIPTextModelWithProjection) are modelled so far",
          e->name, common::QuoteForMessage(e->model_type, common::kQuotedBytes, '\''),
          e->architecture));
    const uint64_t len = EncoderTextLen(denoiser, *e, setup);
    if (len > e->clip.max_positions)
      return Bad(fmt::format(
          "--text-len: {} tokens are past {}'s {} positions (CLIPTextEmbeddings raises)", len,
          e->name, e->clip.max_positions));
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
  // CLIPTextEmbeddings' position_ids buffer (int64, non-persistent) moves too.
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
    VS_TRY(indexed, IndexClipParams(*spec, e.params));
    e.clip = std::move(indexed);
    // SDXL (the UNet's "text_time" additional embedding) hands on the
    // penultimate layer's states (StableDiffusionXLPipeline.encode_prompt).
    e.penultimate = denoiser.is_unet && denoiser.unet.text_time;
    e.text_len = EncoderTextLen(denoiser, *spec, setup);
    out.push_back(std::move(e));
  }
  return out;
}

void RunFrozenEncoders(Tape& tape, const TrainingSetup& setup,
                       std::vector<FrozenEncoder>& encoders) {
  if (encoders.empty()) return;
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
    Var ids = tape.New(setup.batch * e.text_len, kI64, Category::kOther, "input_ids");
    ClipTextOut out = ClipTextForward(tape, *e.spec, e.clip, es, setup.batch, ids, e.penultimate);
    if (e.spec->clip.text_projection && e.clip.text_proj) {
      Var projected = Linear(tape, out.pooled, *e.clip.text_proj, nullptr, setup.batch,
                             e.spec->clip.projection_dim);
      tape.Drop(out.pooled);
      out.pooled = projected;
    }
    for (Var* v : {&out.last_hidden, &out.penultimate, &out.pooled}) {
      if (v->t != kNoTensor) tape.Drop(*v);
    }
    tape.Drop(ids);
  }
  tape.autocast = autocast;
  tape.grad_enabled = grad;
}

}  // namespace vramscope::lower
