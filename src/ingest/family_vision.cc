// The SigLIP vision tower and multimodal projector of Gemma 3
// (Gemma3ForConditionalGeneration, transformers 4.50+). Names are those of the
// google/gemma-3-*-pt checkpoints: vision_tower.vision_model.* and
// multi_modal_projector.*. Defaults are SiglipVisionConfig's.
#include <fmt/format.h>

#include "families.h"

namespace vramscope::ingest {

void ReadGemma3Vision(ConfigReader& r, ArchDetails& a) {
  static const nlohmann::json kEmpty = nlohmann::json::object();
  const nlohmann::json* vision = r.Object("vision_config");
  ConfigReader v(vision ? *vision : kEmpty, r.context() + ": vision_config");
  a.has_vision = true;
  a.vision_hidden = v.Uint("hidden_size", 768, 1, kMaxHidden);
  a.vision_intermediate = v.Uint("intermediate_size", 3072, 1, kMaxIntermediate);
  a.vision_layers = v.Uint("num_hidden_layers", 12, 1, kMaxLayers);
  a.vision_heads = v.Uint("num_attention_heads", 12, 1, kMaxHeads);
  a.vision_channels = v.Uint("num_channels", 3, 1, 64);
  a.vision_image = v.Uint("image_size", 224, 1, 1 << 16);
  a.vision_patch = v.Uint("patch_size", 16, 1, 1 << 16);
  a.vision_use_head = v.Bool("vision_use_head", true);
  if (v.ok() && a.vision_hidden % a.vision_heads != 0) {
    v.Fail("hidden_size", fmt::format("{} is not divisible by num_attention_heads {}",
                                      a.vision_hidden, a.vision_heads));
  }
  if (v.ok() &&
      (a.vision_image < a.vision_patch || (a.vision_image / a.vision_patch) > (1 << 12))) {
    v.Fail("image_size", fmt::format("{} with patch_size {} gives no sensible patch grid",
                                     a.vision_image, a.vision_patch));
  }
  r.Adopt(v);
}

void BuildGemma3Vision(const ModelSpec& s, const ArchDetails& a, ParamListBuilder& b) {
  const std::string p = "vision_tower.vision_model.";
  const uint64_t h = a.vision_hidden, inter = a.vision_intermediate;
  const uint64_t grid = a.vision_image / a.vision_patch;
  // SiglipVisionEmbeddings: Conv2d patch embedding and a learned position table.
  b.Tensor(p + "embeddings.patch_embedding.weight",
           {h, a.vision_channels, a.vision_patch, a.vision_patch}, -1,
           p + "embeddings.patch_embedding", ParamRole::kVision, false);
  b.Tensor(p + "embeddings.patch_embedding.bias", {h}, -1, p + "embeddings.patch_embedding",
           ParamRole::kVision, false);
  b.Tensor(p + "embeddings.position_embedding.weight", {grid * grid, h}, -1,
           p + "embeddings.position_embedding", ParamRole::kVision, false);
  auto linear = [&](const std::string& m, uint64_t out, uint64_t in) {
    b.Tensor(m + ".weight", {out, in}, -1, m, ParamRole::kVision, true);
    b.Tensor(m + ".bias", {out}, -1, m, ParamRole::kVision, false);
  };
  auto layer_norm = [&](const std::string& m) {
    b.Tensor(m + ".weight", {h}, -1, m, ParamRole::kVision, false);
    b.Tensor(m + ".bias", {h}, -1, m, ParamRole::kVision, false);
  };
  for (uint64_t layer = 0; layer < a.vision_layers && !b.overflowed(); ++layer) {
    // SiglipEncoderLayer: self_attn (k, v, q, out), layer_norm1, mlp, layer_norm2.
    const std::string l = fmt::format("{}encoder.layers.{}.", p, layer);
    linear(l + "self_attn.k_proj", h, h);
    linear(l + "self_attn.v_proj", h, h);
    linear(l + "self_attn.q_proj", h, h);
    linear(l + "self_attn.out_proj", h, h);
    layer_norm(l + "layer_norm1");
    linear(l + "mlp.fc1", inter, h);
    linear(l + "mlp.fc2", h, inter);
    layer_norm(l + "layer_norm2");
  }
  layer_norm(p + "post_layernorm");
  if (a.vision_use_head) {
    // SiglipMultiheadAttentionPoolingHead: probe, nn.MultiheadAttention, LayerNorm, MLP.
    const std::string hp = p + "head.";
    b.Tensor(hp + "probe", {1, 1, h}, -1, p + "head", ParamRole::kVision, false);
    b.Tensor(hp + "attention.in_proj_weight", {3 * h, h}, -1, hp + "attention", ParamRole::kVision,
             false);
    b.Tensor(hp + "attention.in_proj_bias", {3 * h}, -1, hp + "attention", ParamRole::kVision,
             false);
    linear(hp + "attention.out_proj", h, h);
    layer_norm(hp + "layernorm");
    linear(hp + "mlp.fc1", inter, h);
    linear(hp + "mlp.fc2", h, inter);
  }
  // Gemma3MultiModalProjector: a raw projection matrix and a Gemma RMSNorm.
  const std::string mp = "multi_modal_projector.";
  b.Tensor(mp + "mm_input_projection_weight", {h, s.hidden_size}, -1, "multi_modal_projector",
           ParamRole::kProjector, false);
  b.Tensor(mp + "mm_soft_emb_norm.weight", {h}, -1, mp + "mm_soft_emb_norm", ParamRole::kProjector,
           false);
}

}  // namespace vramscope::ingest
