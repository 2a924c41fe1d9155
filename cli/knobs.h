// The knob flags of DESIGN.md, shared by estimate / fit / plan / sweep.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "from_config.h"
#include "parallel_flags.h"
#include "vramscope/model.h"
#include "vramscope/model_io.h"
#include "vramscope/report.h"
#include "vramscope/setup.h"

namespace vramscope::cli {

// Flag values as typed; ToSetup() validates them into a TrainingSetup.
struct KnobArgs {
  uint64_t batch = 1, seq = 2048, grad_accum = 1;
  uint64_t image_size = 0, vae_scale = 8, text_len = 0;  // text_len 0: the model's default
  uint64_t target_len = 0;                               // T5 decoder tokens; 0: --seq
  std::string vae;  // --vae NAME|FILE (empty: latents precomputed)
  uint32_t steps = 3;
  std::string precision = "bf16-mixed", optimizer = "adamw", finetune = "full";
  uint64_t lora_rank = 16;
  std::string lora_targets = "q,v";
  double lora_dropout = 0.05;
  std::string grad_ckpt = "none", attn = "sdpa", loss = "hf";
  std::string transformers_version = "5.24", torch_version = "2.13";
  std::string gpu = "h100-80g", alloc_conf, device_rules = "cuda", lora_dtype = "fp32",
              impl = "transformers";
  bool optimizer_in_backward = false;
  bool no_attention_mask = false;
  bool no_use_cache = false;
  bool built_on_gpu = false;
  bool activation_offload = false;
  bool dpo = false;
  bool dpo_precompute_ref = false;
  bool packing = false;
  bool liger = false;
  bool ema = false, ema_foreach = false;
  double moe_capacity_factor = 0, moe_imbalance = 1;
  uint64_t max_events = kDefaultMaxEvents;
  ParallelArgs parallel;
  // --from FILE (repeatable): knobs read from a DeepSpeed config or
  // TrainingArguments JSON; a flag given on the command line wins.
  std::vector<std::string> from_files;
  // Flags whose value a --from file set (no flag given overrode it), with
  // "FILE: KEY": TrainingSetup::knob_sources, so errors blame the file.
  std::vector<std::pair<std::string, std::string>> file_sources;
  // --text-encoder NAME|FILE (repeatable): a diffusion step's frozen text
  // encoders, resolved like MODEL by ResolveTextEncoders.
  std::vector<std::string> text_encoders;
  // Which flags were given: `app` (set by AddKnobFlags) while it lives, else
  // `given`, filled by KeepGiven() before a short-lived app goes away.
  CLI::App* app = nullptr;
  std::vector<std::string> given;
  void KeepGiven();
  bool Given(const char* flag) const;
  // Given on the command line or set by a --from file.
  bool GivenOrRead(const char* flag) const;
  // With `from`, also the knobs the --from files set (those no flag overrode)
  // and the keys they hold that vramscope does not model.
  Result<TrainingSetup> ToSetup(FromConfig* from = nullptr) const;
  // These flags with the knobs of already-read `config` applied (a flag given
  // on the command line wins); the knobs applied go to *applied when given.
  // ToSetup's second half, public for the --from fuzz target.
  KnobArgs WithConfig(FromConfig config, FromConfig* applied) const;
  // Defers one warning (DeferWarning) per knob that is allowed but likely not
  // meant (SetupWarnings, LoRA flags without LoRA).
  void Warn(const ModelSpec& model, const TrainingSetup& setup) const;
  // Resolves --text-encoder's names through `io` (as MODEL is) into `setup`.
  Status ResolveTextEncoders(const ModelIo& io, TrainingSetup* setup) const;

 private:
  Result<TrainingSetup> Convert() const;
  Result<KnobArgs> WithFiles(FromConfig* from) const;
  void SetFromFile(const FileKnob& knob);
};

void AddKnobFlags(CLI::App* sub, KnobArgs* knobs);
// --vae NAME|FILE: the AutoencoderKL resolved through `io` (catalog alias,
// vae/config.json path or directory, Hub id) into setup->vae; --vae-scale
// follows the VAE's downsampling unless given (a given one that disagrees is
// refused by the lowering's validation).
Status ResolveVae(const KnobArgs& knobs, const ModelIo& io, TrainingSetup* setup);
// --from FILE, for the commands that read config files (estimate, fit, sweep, plan).
void AddFromFlag(CLI::App* sub, KnobArgs* knobs);
// One "Assumed" line per knob a --from file set and per key it holds that is
// not modelled, so that a report says where each knob came from.
void AddFromAssumptions(const FromConfig& from, Report* report);
// Whether a --from file set `flag`.
bool FromSets(const FromConfig& from, std::string_view flag);

}  // namespace vramscope::cli
