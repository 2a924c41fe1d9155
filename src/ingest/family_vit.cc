// ViTForImageClassification (transformers 5.24.0 models/vit/modeling_vit.py;
// 4.57.6 computes the same tensors under other module names). Defaults are
// ViTConfig's. The parameter names are 5.x's, in named_parameters() order.
#include <fmt/format.h>

#include "families.h"
#include "vramscope/common/quote.h"

namespace vramscope::ingest {

void ReadVit(ConfigReader& r, ModelSpec& s, ArchDetails&) {
  s.architecture = ReadArchitecture(r, "ViTForImageClassification");
  if (s.architecture != "ViTForImageClassification") {
    // A backbone checkpoint (google/vit-base-patch16-224-in21k is "ViTModel")
    // is fine-tuned as ViTForImageClassification with a new classifier.
    s.notes.push_back(fmt::format(
        "vit: estimated as ViTForImageClassification (the config says {}), with the classifier "
        "a fine-tuning script adds",
        common::QuoteForMessage(s.architecture)));
  }
  s.is_vit = true;
  s.hidden_size = ReadSize(r, s, {"hidden_size"}, 768, kMaxHidden);
  s.num_layers = ReadSize(r, s, {"num_hidden_layers"}, 12, kMaxLayers);
  s.num_heads = ReadSize(r, s, {"num_attention_heads"}, 12, kMaxHeads);
  s.intermediate_size = ReadSize(r, s, {"intermediate_size"}, 3072, kMaxIntermediate);
  s.num_kv_heads = s.num_heads;
  s.head_dim = DerivedHeadDim(r, s, "hidden_size", "num_attention_heads");
  s.vit.image_size = r.Uint("image_size", 224, 1, 1 << 16);
  s.vit.patch_size = r.Uint("patch_size", 16, 1, 1 << 16);
  s.vit.num_channels = r.Uint("num_channels", 3, 1, 64);
  if (r.ok() &&
      (s.vit.image_size < s.vit.patch_size || s.vit.image_size / s.vit.patch_size > (1u << 12))) {
    r.Fail("image_size", fmt::format("{} with patch_size {} gives no sensible patch grid",
                                     s.vit.image_size, s.vit.patch_size));
  }
  s.qkv_bias = r.Bool("qkv_bias", true);
  s.o_bias = s.mlp_bias = true;
  s.attention_dropout = r.Number("attention_probs_dropout_prob", 0.0, 0.0, 1.0);
  s.hidden_dropout = r.Number("hidden_dropout_prob", 0.0, 0.0, 1.0);
  s.torch_dtype = ReadTorchDtype(r);
  s.norm = NormKind::kLayerNorm;
  s.mlp = ReadActivation(r, "hidden_act", "gelu");
  s.position = PositionKind::kLearned;
  s.use_cache = false;
  ReadSequenceClassification(r, s);
  // ViTForImageClassification has no classifier dropout.
  s.classifier_dropout = 0;
  s.max_position_embeddings = s.vit.Patches() + 1;
}

void BuildVit(const ModelSpec& s, const ArchDetails&, ParamListBuilder& b) {
  const uint64_t h = s.hidden_size, p = s.vit.patch_size;
  b.Tensor("vit.embeddings.cls_token", {1, 1, h}, -1, "vit.embeddings", ParamRole::kTypeEmbed,
           false);
  b.Tensor("vit.embeddings.position_embeddings", {1, s.vit.Patches() + 1, h}, -1, "vit.embeddings",
           ParamRole::kPosEmbed, false);
  b.Tensor("vit.embeddings.patch_embeddings.projection.weight", {h, s.vit.num_channels, p, p}, -1,
           "vit.embeddings.patch_embeddings.projection", ParamRole::kConv, false);
  b.Tensor("vit.embeddings.patch_embeddings.projection.bias", {h}, -1,
           "vit.embeddings.patch_embeddings.projection", ParamRole::kBias, false);
  for (uint64_t layer = 0; layer < s.num_layers && !b.overflowed(); ++layer) {
    const int i = static_cast<int>(layer);
    const std::string l = fmt::format("vit.layers.{}.", layer);
    b.Linear(l + "attention.q_proj", h, h, s.qkv_bias, i, ParamRole::kQ);
    b.Linear(l + "attention.k_proj", h, h, s.qkv_bias, i, ParamRole::kK);
    b.Linear(l + "attention.v_proj", h, h, s.qkv_bias, i, ParamRole::kV);
    b.Linear(l + "attention.o_proj", h, h, true, i, ParamRole::kO);
    b.Norm(l + "layernorm_before", h, true, i);
    b.Norm(l + "layernorm_after", h, true, i);
    b.Linear(l + "mlp.fc1", s.intermediate_size, h, true, i, ParamRole::kUp);
    b.Linear(l + "mlp.fc2", h, s.intermediate_size, true, i, ParamRole::kDown);
  }
  b.Norm("vit.layernorm", h, true, -1);
  b.Linear("classifier", s.num_labels, h, true, -1, ParamRole::kLmHead);
}

}  // namespace vramscope::ingest
