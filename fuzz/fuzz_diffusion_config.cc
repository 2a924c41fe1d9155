// libFuzzer target for the configs of the diffusion and encoder families:
// T5 (T5ForConditionalGeneration, T5EncoderModel), CLIP (CLIPModel and its
// towers), diffusers' UNet2DConditionModel, FluxTransformer2DModel and
// AutoencoderKL (src/ingest/family_{t5,clip,unet,flux,vae}.cc), then the
// lowering of what was read (lower_what_was_read.h). fuzz_model_config
// covers ParseModelConfig alone, for every family; this one follows these
// families into the lowering, where --text-encoder and --vae use them.
//
// Checks, beyond "no crash, no hang, no sanitizer report": every error is one
// line; the parameters sum to the model's count.
//
//   scripts/fuzz.sh fuzz_diffusion_config
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "lower_what_was_read.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto spec = vramscope::ParseModelConfig(text, "fuzz/config.json");
  if (!spec.ok()) {
    fuzz_support::CheckOneLine("fuzz_diffusion_config", spec.error());
    return 0;
  }
  uint64_t total = 0;
  for (const auto& p : spec->params) total += p.numel;
  if (total != spec->ParameterCount()) __builtin_trap();
  fuzz_support::LowerWhatWasRead("fuzz_diffusion_config", *spec);
  return 0;
}
