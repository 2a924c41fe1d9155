// Shared by fuzz_diffusion_config and fuzz_checkpoint_header: what a command
// does with a model config it read (ingest) next, the lowering, on a small
// setup within a small work budget. A diffusion UNet or FLUX transformer, a
// T5 and a CLIP model are lowered as trained models; a CLIP text tower and an
// AutoencoderKL as the frozen text encoder and the VAE of the catalog's
// Stable Diffusion 1.5 UNet (whose lowering indexes their parameters by
// name: the T5 and CLIP checkpoint names were parsed with std::stoul).
//
// Aborts when an error is not one line; anything else the lowering says is
// a fine answer.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "vramscope/gpu.h"
#include "vramscope/lower.h"
#include "vramscope/model.h"

namespace fuzz_support {

inline void CheckOneLine(const char* target, const vramscope::Error& e) {
  if (e.message.find('\n') == std::string::npos && !e.message.empty()) return;
  std::fprintf(stderr, "%s: an error that is not one line:\n%s\n", target, e.message.c_str());
  std::abort();
}

inline void LowerWhatWasRead(const char* target, const vramscope::ModelSpec& spec) {
  using namespace vramscope;
  static const GpuSpec gpu = *FindGpu("h100-80g");
  TrainingSetup s;
  s.batch = 1;
  s.seq = 16;
  s.steps = 1;
  s.text_len = 8;
  s.image_size = 64;
  s.max_events = uint64_t{1} << 17;  // a few hundred milliseconds at most
  const ModelSpec* trained = &spec;
  static const ModelSpec sd = *LoadCatalogModel("sd-1.5-unet");
  const bool clip_text = spec.is_clip && spec.clip.has_text && !spec.clip.has_vision;
  if (clip_text || spec.is_vae) {
    trained = &sd;
    if (clip_text) {
      s.text_encoder_names = {spec.name};
      s.text_encoders = {std::make_shared<const ModelSpec>(spec)};
    } else {
      s.vae_name = spec.name;
      s.vae = std::make_shared<const ModelSpec>(spec);
      s.vae_scale = spec.vae.Downsampling();
    }
  } else if (spec.is_t5 && spec.t5.encoder_only) {
    return;  // FLUX's frozen encoder: the catalog's FLUX step is too large to lower per input
  }
  if (spec.is_t5) s.attn = Attention::kEager;
  auto lowered = LowerRankClasses(*trained, s, gpu);
  if (!lowered.ok()) CheckOneLine(target, lowered.error());
}

}  // namespace fuzz_support
