// CLIP (transformers 5.24.0 models/clip/configuration_clip.py and
// modeling_clip.py; 4.57.6 registers the same tensors): model_type "clip"
// (CLIPModel: text_config, vision_config, projection_dim, logit_scale),
// "clip_text_model" (CLIPTextModel, or CLIPTextModelWithProjection by
// `architectures`: SDXL's text_encoder_2) and "clip_vision_model"
// (CLIPVisionModel / CLIPVisionModelWithProjection). Defaults are
// CLIPTextConfig's / CLIPVisionConfig's / CLIPConfig's. Parameter names are
// 5.24.0's named_parameters(): a standalone CLIPTextModel / CLIPVisionModel has
// no "text_model." / "vision_model." prefix there (4.57.6 wrapped a
// CLIPTextTransformer as `text_model`, as the checkpoints are named).
#include <fmt/format.h>

#include "families.h"
#include "vramscope/common/quote.h"

namespace vramscope::ingest {
namespace {

// The keys CLIPTextConfig and CLIPVisionConfig share (configuration_clip.py).
void ReadTower(ConfigReader& r, ClipTower& t, const ClipTower& def) {
  t.hidden = r.Uint("hidden_size", def.hidden, 1, kMaxHidden);
  t.intermediate = r.Uint("intermediate_size", def.intermediate, 1, kMaxIntermediate);
  t.layers = r.Uint("num_hidden_layers", def.layers, 1, kMaxLayers);
  t.heads = r.Uint("num_attention_heads", def.heads, 1, kMaxHeads);
  t.act = ReadActivation(r, "hidden_act", "quick_gelu");
  t.attention_dropout = r.Number("attention_dropout", 0.0, 0.0, 1.0);
  if (r.ok() && t.hidden % t.heads != 0) {
    r.Fail("hidden_size",
           fmt::format("{} is not divisible by num_attention_heads {}", t.hidden, t.heads));
  }
}

// CLIPTextConfig: 512 wide, 12 layers of 8 heads, 2048 intermediate, 77 positions.
void ReadTextTower(ConfigReader& r, ClipSpec& c) {
  c.has_text = true;
  ReadTower(r, c.text, ClipTower{512, 2048, 12, 8});
  c.vocab_size = r.Uint("vocab_size", 49408, 1, kMaxVocab);
  c.max_positions = r.Uint("max_position_embeddings", 77, 1, kMaxLearnedPositions);
  c.eos_token_id = r.Uint("eos_token_id", 49407, 0, kMaxVocab);
}

// CLIPVisionConfig: 768 wide, 12 layers of 12 heads, 3072 intermediate, 224 px in 32 px patches.
void ReadVisionTower(ConfigReader& r, ClipSpec& c) {
  c.has_vision = true;
  ReadTower(r, c.vision, ClipTower{768, 3072, 12, 12});
  c.image_size = r.Uint("image_size", 224, 1, 1 << 16);
  c.patch_size = r.Uint("patch_size", 32, 1, 1 << 16);
  c.num_channels = r.Uint("num_channels", 3, 1, 64);
  if (r.ok() && (c.image_size < c.patch_size || c.image_size / c.patch_size > (1u << 12))) {
    r.Fail("image_size", fmt::format("{} with patch_size {} gives no sensible patch grid",
                                     c.image_size, c.patch_size));
  }
}

// The ModelSpec fields the rest of vramscope reads (sizes, the LoRA rank bound)
// describe the text tower when there is one.
void FillSpecFromTowers(ModelSpec& s) {
  const ClipSpec& c = s.clip;
  const ClipTower& main = c.has_text ? c.text : c.vision;
  s.is_clip = true;
  s.hidden_size = main.hidden;
  s.intermediate_size = main.intermediate;
  s.num_heads = s.num_kv_heads = main.heads;
  s.head_dim = main.hidden / main.heads;
  s.num_layers = (c.has_text ? c.text.layers : 0) + (c.has_vision ? c.vision.layers : 0);
  s.vocab_size = c.has_text ? c.vocab_size : 0;
  s.max_position_embeddings = c.has_text ? c.max_positions : c.Patches() + 1;
  s.attention_dropout = main.attention_dropout;
  s.mlp = main.act;
  s.norm = NormKind::kLayerNorm;
  s.position = PositionKind::kLearned;
  s.qkv_bias = s.o_bias = s.mlp_bias = true;
  s.use_cache = false;
}

// The architectures this reader builds the parameters of, per model_type.
void CheckArchitecture(ConfigReader& r, ModelSpec& s, std::initializer_list<const char*> known) {
  for (const char* a : known) {
    if (s.architecture == a) return;
  }
  r.Fail("architectures", fmt::format("{} is not modelled for this model_type",
                                      common::QuoteForMessage(s.architecture)));
}

}  // namespace

namespace {

// A tower's config: `text_config` / `vision_config`, with the legacy
// `text_config_dict` / `vision_config_dict` over it (CLIPConfig.__init__,
// 5.24.0: the *_dict values take precedence, key by key).
nlohmann::json TowerConfig(ConfigReader& r, const char* key, const char* legacy_key) {
  nlohmann::json tower = nlohmann::json::object();
  if (const nlohmann::json* base = r.Object(key)) tower = *base;
  if (const nlohmann::json* legacy = r.Object(legacy_key)) {
    for (const auto& [k, v] : legacy->items()) tower[k] = v;
  }
  return tower;
}

}  // namespace

void ReadClip(ConfigReader& r, ModelSpec& s, ArchDetails&) {
  s.architecture = ReadArchitecture(r, "CLIPModel");
  CheckArchitecture(r, s, {"CLIPModel"});
  const nlohmann::json text = TowerConfig(r, "text_config", "text_config_dict");
  const nlohmann::json vision = TowerConfig(r, "vision_config", "vision_config_dict");
  ConfigReader t(text, r.context() + ": text_config");
  ConfigReader v(vision, r.context() + ": vision_config");
  ReadTextTower(t, s.clip);
  ReadVisionTower(v, s.clip);
  r.Adopt(t);
  r.Adopt(v);
  s.clip.projection_dim = r.Uint("projection_dim", 512, 1, kMaxHidden);
  s.clip.text_projection = s.clip.visual_projection = s.clip.logit_scale = true;
  s.torch_dtype = ReadTorchDtype(r);
  FillSpecFromTowers(s);
}

void ReadClipText(ConfigReader& r, ModelSpec& s, ArchDetails&) {
  s.architecture = ReadArchitecture(r, "CLIPTextModel");
  CheckArchitecture(r, s, {"CLIPTextModel", "CLIPTextModelWithProjection"});
  ReadTextTower(r, s.clip);
  s.clip.text_projection = s.architecture == "CLIPTextModelWithProjection";
  s.clip.projection_dim = r.Uint("projection_dim", 512, 1, kMaxHidden);
  s.torch_dtype = ReadTorchDtype(r);
  FillSpecFromTowers(s);
}

void ReadClipVision(ConfigReader& r, ModelSpec& s, ArchDetails&) {
  s.architecture = ReadArchitecture(r, "CLIPVisionModel");
  CheckArchitecture(r, s, {"CLIPVisionModel", "CLIPVisionModelWithProjection"});
  ReadVisionTower(r, s.clip);
  s.clip.visual_projection = s.architecture == "CLIPVisionModelWithProjection";
  s.clip.projection_dim = r.Uint("projection_dim", 512, 1, kMaxHidden);
  s.torch_dtype = ReadTorchDtype(r);
  FillSpecFromTowers(s);
}

namespace {

// CLIPEncoder's layers (CLIPEncoderLayer: self_attn k, v, q, out_proj;
// layer_norm1; mlp fc1, fc2; layer_norm2). `first_layer` numbers the layers
// across both towers of a CLIPModel (the text tower's first).
void BuildEncoder(const std::string& p, const ClipTower& t, int first_layer, ParamListBuilder& b) {
  const uint64_t h = t.hidden;
  for (uint64_t layer = 0; layer < t.layers && !b.overflowed(); ++layer) {
    const int i = first_layer + static_cast<int>(layer);
    const std::string l = fmt::format("{}encoder.layers.{}.", p, layer);
    b.Linear(l + "self_attn.k_proj", h, h, true, i, ParamRole::kK);
    b.Linear(l + "self_attn.v_proj", h, h, true, i, ParamRole::kV);
    b.Linear(l + "self_attn.q_proj", h, h, true, i, ParamRole::kQ);
    b.Linear(l + "self_attn.out_proj", h, h, true, i, ParamRole::kO);
    b.Norm(l + "layer_norm1", h, true, i);
    b.Linear(l + "mlp.fc1", t.intermediate, h, true, i, ParamRole::kUp);
    b.Linear(l + "mlp.fc2", h, t.intermediate, true, i, ParamRole::kDown);
    b.Norm(l + "layer_norm2", h, true, i);
  }
}

// CLIPTextModel: embeddings (token, position), the encoder, final_layer_norm.
void BuildTextTower(const std::string& p, const ClipSpec& c, ParamListBuilder& b) {
  const uint64_t h = c.text.hidden;
  b.Embedding(p + "embeddings.token_embedding", c.vocab_size, h, ParamRole::kEmbed);
  b.Embedding(p + "embeddings.position_embedding", c.max_positions, h, ParamRole::kPosEmbed);
  BuildEncoder(p, c.text, 0, b);
  b.Norm(p + "final_layer_norm", h, true, -1);
}

// CLIPVisionModel: class_embedding [h], a bias-free Conv2d patch embedding,
// position_embedding, pre_layrnorm, the encoder, post_layernorm.
void BuildVisionTower(const std::string& p, const ClipSpec& c, int first_layer,
                      ParamListBuilder& b) {
  const uint64_t h = c.vision.hidden, patch = c.patch_size;
  b.Tensor(p + "embeddings.class_embedding", {h}, -1, p + "embeddings", ParamRole::kTypeEmbed,
           false);
  b.Tensor(p + "embeddings.patch_embedding.weight", {h, c.num_channels, patch, patch}, -1,
           p + "embeddings.patch_embedding", ParamRole::kConv, false);
  b.Embedding(p + "embeddings.position_embedding", c.Patches() + 1, h, ParamRole::kPosEmbed);
  b.Norm(p + "pre_layrnorm", h, true, -1);
  BuildEncoder(p, c.vision, first_layer, b);
  b.Norm(p + "post_layernorm", h, true, -1);
}

}  // namespace

void BuildClip(const ModelSpec& s, const ArchDetails&, ParamListBuilder& b) {
  const ClipSpec& c = s.clip;
  if (c.has_text && c.has_vision) {
    // CLIPModel: logit_scale is its own parameter, yielded before the submodules'.
    // A 0-d scalar; no role fits, and none selects a code path for it.
    b.Tensor("logit_scale", {}, -1, "", ParamRole::kTypeEmbed, false);
    BuildTextTower("text_model.", c, b);
    BuildVisionTower("vision_model.", c, static_cast<int>(c.text.layers), b);
    b.Linear("visual_projection", c.projection_dim, c.vision.hidden, false, -1,
             ParamRole::kProjector);
    b.Linear("text_projection", c.projection_dim, c.text.hidden, false, -1, ParamRole::kProjector);
    return;
  }
  if (c.has_text) {
    // CLIPTextModelWithProjection wraps the tower as `text_model`.
    BuildTextTower(c.text_projection ? "text_model." : "", c, b);
    if (c.text_projection)
      b.Linear("text_projection", c.projection_dim, c.text.hidden, false, -1,
               ParamRole::kProjector);
    return;
  }
  BuildVisionTower(c.visual_projection ? "vision_model." : "", c, 0, b);
  if (c.visual_projection)
    b.Linear("visual_projection", c.projection_dim, c.vision.hidden, false, -1,
             ParamRole::kProjector);
}

const std::vector<Family>& ClipFamilies() {
  static const std::vector<Family> kFamilies = {
      {"clip", ReadClip, BuildClip},
      {"clip_text_model", ReadClipText, BuildClip},
      {"clip_vision_model", ReadClipVision, BuildClip},
  };
  return kFamilies;
}

}  // namespace vramscope::ingest
