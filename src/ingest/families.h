// Per-architecture knowledge: how a config.json of one model_type maps onto
// ModelSpec (with the defaults of that transformers config class) and which
// parameter tensors the transformers model class creates from it.
//
// Module names and registration order follow transformers 4.5x modeling files
// (the names the published safetensors checkpoints use). transformers 5 fuses
// MoE expert weights into 3-D tensors; the element counts are the same.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "config_reader.h"
#include "param_list.h"
#include "vramscope/model.h"

namespace vramscope::ingest {

// Upper bounds past which a value is "absurd" rather than merely large.
inline constexpr uint64_t kMaxHidden = 1ULL << 20;        // 1,048,576
inline constexpr uint64_t kMaxIntermediate = 1ULL << 22;  // 4,194,304
inline constexpr uint64_t kMaxLayers = 10'000;
inline constexpr uint64_t kMaxVocab = 100'000'000;
inline constexpr uint64_t kMaxHeads = 1ULL << 16;
inline constexpr uint64_t kMaxHeadDim = 1ULL << 14;
inline constexpr uint64_t kMaxExperts = 1ULL << 14;
inline constexpr uint64_t kMaxLearnedPositions = 1ULL << 24;  // rows of a position table
inline constexpr uint64_t kMaxPositions = 1ULL << 34;         // RoPE context length

// Architecture facts that ModelSpec has no field for but the parameter list
// depends on. Filled by a family's reader, consumed by its builder.
struct ArchDetails {
  std::string prefix = "model.";    // decoder stack prefix
  std::string lm_head = "lm_head";  // lm_head module name
  // falcon
  bool new_decoder_architecture = false;
  bool multi_query = false;
  uint64_t num_ln_in_parallel_attn = 0;  // 0 = None
  // opt
  uint64_t word_embed_proj_dim = 0;
  bool final_layer_norm = true;
  bool layer_norm_affine = true;
  // bert
  uint64_t type_vocab_size = 2;
  bool relative_position = false;
  // gemma3 (multimodal): a SigLIP vision tower and projector before the text model
  bool has_vision = false;
  uint64_t vision_hidden = 0, vision_intermediate = 0, vision_layers = 0, vision_heads = 0,
           vision_channels = 0, vision_image = 0, vision_patch = 0;
  bool vision_use_head = false;
};

struct Family {
  std::string_view model_type;
  void (*read)(ConfigReader& r, ModelSpec& spec, ArchDetails& arch);
  void (*build)(const ModelSpec& spec, const ArchDetails& arch, ParamListBuilder& b);
};

// llama, mistral, mixtral, qwen2, qwen2_moe, qwen3, qwen3_moe, gemma, gemma2,
// gemma3_text, gemma3, phi3, stablelm (family_decoder.cc).
const std::vector<Family>& DecoderFamilies();
// gpt2, gpt_neox, opt, falcon, phi, bert (family_classic.cc), vit (family_vit.cc).
const std::vector<Family>& ClassicFamilies();
void ReadVit(ConfigReader& r, ModelSpec& s, ArchDetails& a);
void BuildVit(const ModelSpec& s, const ArchDetails& a, ParamListBuilder& b);
// t5 (family_t5.cc): T5ForConditionalGeneration and T5EncoderModel.
void ReadT5(ConfigReader& r, ModelSpec& s, ArchDetails& a);
void BuildT5(const ModelSpec& s, const ArchDetails& a, ParamListBuilder& b);

// The diffusers UNet2DConditionModel (family_unet.cc). Its config.json has no
// model_type: `_class_name` names it, and the spec gets this internal type.
inline constexpr std::string_view kUNetModelType = "unet_2d_condition";
inline constexpr std::string_view kUNetClassName = "UNet2DConditionModel";
const std::vector<Family>& DiffusersFamilies();
// The diffusers FluxTransformer2DModel (family_flux.cc), likewise named by
// `_class_name`; its training step is lowered by src/lower/flux.cc.
inline constexpr std::string_view kFluxModelType = "flux_transformer_2d";
inline constexpr std::string_view kFluxClassName = "FluxTransformer2DModel";
const std::vector<Family>& FluxFamilies();
// The diffusers AutoencoderKL (family_vae.cc), likewise named by `_class_name`:
// a frozen component of the UNet and FLUX steps (--vae), never trained itself.
inline constexpr std::string_view kVaeModelType = "autoencoder_kl";
inline constexpr std::string_view kVaeClassName = "AutoencoderKL";
const std::vector<Family>& VaeFamilies();

// clip, clip_text_model, clip_vision_model (family_clip.cc): CLIPModel and
// its towers; ModelSpec::clip holds them.
const std::vector<Family>& ClipFamilies();

// Shared reading helpers (family_common.cc).
// Reads a core size: the first present key of `keys`; when all are absent,
// `def` and a note naming the assumed default.
uint64_t ReadSize(ConfigReader& r, ModelSpec& spec, std::initializer_list<std::string_view> keys,
                  uint64_t def, uint64_t max);
// head_dim = hidden / heads, failing when it does not divide.
uint64_t DerivedHeadDim(ConfigReader& r, const ModelSpec& spec, std::string_view hidden_key,
                        std::string_view heads_key);
// Fails unless kv heads divide attention heads.
void CheckKvHeads(ConfigReader& r, const ModelSpec& spec, std::string_view kv_key);
// "architectures"[0], or `def`.
std::string ReadArchitecture(ConfigReader& r, std::string def);
// partial_rotary_factor from the top level or from rope_parameters / rope_scaling.
double ReadPartialRotary(ConfigReader& r, std::string_view key, double def);
// torch_dtype (transformers 4) or dtype (transformers 5).
std::string ReadTorchDtype(ConfigReader& r);
// The MLP activation of a non-gated family, an ACT2FN name (transformers
// activations.py); an unknown name fails rather than guessing.
MlpKind ReadActivation(ConfigReader& r, std::string_view key, std::string_view def);
// num_labels (len(id2label)), classifier_dropout and a problem_type that must
// agree with num_labels, for an XForSequenceClassification architecture.
void ReadSequenceClassification(ConfigReader& r, ModelSpec& spec);
// A float key where JSON null means "disabled" (0).
double ReadOptionalCap(ConfigReader& r, std::string_view key, double def);

// SigLIP vision tower + Gemma 3 projector parameters (family_vision.cc).
void ReadGemma3Vision(ConfigReader& r, ArchDetails& arch);
void BuildGemma3Vision(const ModelSpec& spec, const ArchDetails& arch, ParamListBuilder& b);

}  // namespace vramscope::ingest
