// Parameter lists: independent spot checks with the formulas written out, the
// names and shapes transformers uses, and invariants over every catalog model.
#include <map>
#include <set>

#include <gtest/gtest.h>

#include "vramscope/model.h"

namespace vramscope {
namespace {

ModelSpec Load(const std::string& alias) {
  Result<ModelSpec> spec = LoadCatalogModel(alias);
  EXPECT_TRUE(spec.ok()) << alias << ": " << (spec.ok() ? "" : spec.error().message);
  return spec.ok() ? spec.value() : ModelSpec{};
}

uint64_t LayerCount(const ModelSpec& s, int layer) {
  uint64_t total = 0;
  for (const ParamTensor& p : s.params) total += p.layer == layer ? p.numel : 0;
  return total;
}

const ParamTensor* Find(const ModelSpec& s, const std::string& name) {
  for (const ParamTensor& p : s.params) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

using Shape = std::vector<uint64_t>;

// Published figures, independent of the catalog files.
TEST(ParamSpotCheckTest, Llama3_8B) {
  ModelSpec s = Load("llama-3-8b");
  EXPECT_EQ(s.ParameterCount(), 8'030'261'248u);
  // hidden 4096, 32 heads x 128, 8 kv heads x 128, intermediate 14336.
  const uint64_t attention = 4096 * 4096 + 2 * (4096 * 1024) + 4096 * 4096;
  const uint64_t mlp = 3 * (4096 * 14336);
  const uint64_t norms = 2 * 4096;
  EXPECT_EQ(LayerCount(s, 0), attention + mlp + norms);
  EXPECT_EQ(LayerCount(s, 0), 218'112'000u);
  // embed_tokens + untied lm_head (128256 x 4096 each) + final norm.
  EXPECT_EQ(s.ParameterCount(), 32 * 218'112'000ull + 2 * 128256ull * 4096 + 4096);
  EXPECT_EQ(s.params.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(s.params.back().name, "lm_head.weight");
  EXPECT_EQ(s.params[1].name, "model.layers.0.self_attn.q_proj.weight");
  ASSERT_NE(Find(s, "model.layers.31.self_attn.k_proj.weight"), nullptr);
  EXPECT_EQ(Find(s, "model.layers.31.self_attn.k_proj.weight")->shape, (Shape{1024, 4096}));
  EXPECT_EQ(Find(s, "model.layers.31.mlp.down_proj.weight")->shape, (Shape{4096, 14336}));
}

TEST(ParamSpotCheckTest, Gpt2) {
  ModelSpec s = Load("gpt2");
  EXPECT_EQ(s.ParameterCount(), 124'439'808u);
  // ln_1 + ln_2 (weight+bias), c_attn [768, 2304] + bias, c_proj, c_fc [768, 3072], c_proj.
  const uint64_t layer = 2 * (2 * 768) + (768 * 2304 + 2304) + (768 * 768 + 768) +
                         (768 * 3072 + 3072) + (3072 * 768 + 768);
  EXPECT_EQ(LayerCount(s, 0), layer);
  EXPECT_EQ(layer, 7'087'872u);
  // wte 50257 x 768, wpe 1024 x 768, ln_f; lm_head tied to wte.
  EXPECT_EQ(s.ParameterCount(), 12 * layer + 50257ull * 768 + 1024 * 768 + 2 * 768);
  // Conv1D stores [in, out].
  EXPECT_EQ(Find(s, "transformer.h.0.attn.c_attn.weight")->shape, (Shape{768, 2304}));
  EXPECT_EQ(Find(s, "lm_head.weight"), nullptr);
}

TEST(ParamSpotCheckTest, MixtralLayer) {
  ModelSpec s = Load("mixtral-8x7b");
  // q, o: 4096x4096; k, v: 1024x4096; router 8x4096; 8 experts x (w1, w2, w3) of 14336x4096.
  const uint64_t attention = 2 * (4096 * 4096) + 2 * (1024 * 4096);
  const uint64_t router = 8 * 4096;
  const uint64_t experts = 8ull * 3 * 14336 * 4096;
  EXPECT_EQ(LayerCount(s, 0), attention + router + experts + 2 * 4096);
  const ParamTensor* w2 = Find(s, "model.layers.0.block_sparse_moe.experts.7.w2.weight");
  ASSERT_NE(w2, nullptr);
  EXPECT_EQ(w2->shape, (Shape{4096, 14336}));
  EXPECT_EQ(w2->role, ParamRole::kExpertDown);
  EXPECT_EQ(Find(s, "model.layers.0.block_sparse_moe.gate.weight")->role, ParamRole::kRouter);
}

TEST(ParamSpotCheckTest, Falcon7BLayer) {
  ModelSpec s = Load("falcon-7b");
  // multi_query: fused qkv is hidden + 2 x head_dim (64) wide; no biases; one LayerNorm.
  const uint64_t h = 4544;
  const uint64_t layer = h * (h + 2 * 64) + h * h + 2 * (h * 4 * h) + 2 * h;
  EXPECT_EQ(LayerCount(s, 0), layer);
  EXPECT_EQ(s.ParameterCount(), 32 * layer + 65024 * h + 2 * h);  // tied lm_head
}

TEST(ParamSpotCheckTest, Qwen2BiasesOnQkvOnly) {
  ModelSpec s = Load("qwen2.5-7b");
  ASSERT_NE(Find(s, "model.layers.0.self_attn.q_proj.bias"), nullptr);
  EXPECT_EQ(Find(s, "model.layers.0.self_attn.k_proj.bias")->shape, (Shape{512}));
  EXPECT_EQ(Find(s, "model.layers.0.self_attn.o_proj.bias"), nullptr);
  EXPECT_EQ(Find(s, "model.layers.0.mlp.up_proj.bias"), nullptr);
}

TEST(ParamSpotCheckTest, TiedEmbeddingsAreListedOnce) {
  ModelSpec s = Load("llama-3.2-1b");
  EXPECT_TRUE(s.tie_word_embeddings);
  EXPECT_EQ(Find(s, "lm_head.weight"), nullptr);
  EXPECT_EQ(s.params.back().name, "model.norm.weight");
  // Phi ties only the weight: its lm_head bias stays a parameter.
  Result<ModelSpec> phi = ParseModelConfig(R"({"model_type": "phi", "tie_word_embeddings": true,
      "num_hidden_layers": 1})",
                                           "phi");
  ASSERT_TRUE(phi.ok());
  EXPECT_EQ(phi->params.back().name, "lm_head.bias");
  EXPECT_EQ(Find(*phi, "lm_head.weight"), nullptr);
}

TEST(ParamSpotCheckTest, Qwen2MoeSharedExpert) {
  ModelSpec s = Load("qwen1.5-moe-a2.7b");
  EXPECT_EQ(Find(s, "model.layers.0.mlp.gate.weight")->shape, (Shape{60, 2048}));
  EXPECT_EQ(Find(s, "model.layers.0.mlp.experts.59.down_proj.weight")->shape, (Shape{2048, 1408}));
  EXPECT_EQ(Find(s, "model.layers.0.mlp.shared_expert.up_proj.weight")->shape, (Shape{5632, 2048}));
  const ParamTensor* gate = Find(s, "model.layers.23.mlp.shared_expert_gate.weight");
  ASSERT_NE(gate, nullptr);
  EXPECT_EQ(gate->shape, (Shape{1, 2048}));
  EXPECT_EQ(gate->role, ParamRole::kSharedExpertGate);
  // decoder_sparse_step / mlp_only_layers turn layers back into dense MLPs.
  Result<ModelSpec> mixed = ParseModelConfig(
      R"({"model_type": "qwen3_moe", "num_hidden_layers": 4, "decoder_sparse_step": 2,
          "mlp_only_layers": [3]})",
      "mixed");
  ASSERT_TRUE(mixed.ok());
  EXPECT_EQ(Find(*mixed, "model.layers.0.mlp.gate_proj.weight")->shape, (Shape{6144, 2048}));
  EXPECT_NE(Find(*mixed, "model.layers.1.mlp.gate.weight"), nullptr);
  EXPECT_EQ(Find(*mixed, "model.layers.2.mlp.gate.weight"), nullptr);
  EXPECT_EQ(Find(*mixed, "model.layers.3.mlp.gate.weight"), nullptr);
}

TEST(ParamSpotCheckTest, BertMaskedLmHasHeadButNoPooler) {
  ModelSpec s = Load("bert-base-uncased");
  EXPECT_NE(Find(s, "cls.predictions.bias"), nullptr);
  EXPECT_NE(Find(s, "cls.predictions.transform.dense.weight"), nullptr);
  EXPECT_NE(Find(s, "bert.embeddings.token_type_embeddings.weight"), nullptr);
  EXPECT_EQ(Find(s, "bert.pooler.dense.weight"), nullptr);
  EXPECT_EQ(Find(s, "cls.predictions.decoder.weight"), nullptr);  // tied
  // embeddings (30522 + 512 + 2 rows) + LayerNorm; 12 layers; MLM head.
  const uint64_t layer =
      4 * (768 * 768 + 768) + 2 * 768 + (768 * 3072 + 3072) + (3072 * 768 + 768) + 2 * 768;
  EXPECT_EQ(LayerCount(s, 0), layer);
  EXPECT_EQ(s.ParameterCount(), (30522 + 512 + 2) * 768ull + 2 * 768 + 12 * layer + 30522 +
                                    (768 * 768 + 768) + 2 * 768);
}

TEST(ParamSpotCheckTest, Gemma3FourBTextAndVision) {
  ModelSpec s = Load("gemma-3-4b");
  uint64_t vision = 0, projector = 0;
  for (const ParamTensor& p : s.params) {
    vision += p.role == ParamRole::kVision ? p.numel : 0;
    projector += p.role == ParamRole::kProjector ? p.numel : 0;
  }
  // SigLIP so400m at 896px / patch 14: 27 layers of width 1152, MLP 4304, 4096 positions.
  const uint64_t v_layer =
      4 * (1152 * 1152 + 1152) + 4 * 1152 + (1152 * 4304 + 4304) + (4304 * 1152 + 1152);
  EXPECT_EQ(vision, (1152 * 3 * 14 * 14 + 1152) + 4096 * 1152 + 27 * v_layer + 2 * 1152);
  EXPECT_EQ(projector, 1152 * 2560 + 1152u);
  EXPECT_EQ(s.ParameterCount() - vision - projector, 3'880'263'168u);
}

// Invariants every parameter list keeps.
TEST(ParamInvariantsTest, EveryCatalogModel) {
  for (const CatalogEntry& e : ModelCatalog()) {
    SCOPED_TRACE(e.alias);
    ModelSpec s = Load(e.alias);
    std::set<std::string> names;
    std::map<int, uint64_t> per_layer;
    for (const ParamTensor& p : s.params) {
      EXPECT_TRUE(names.insert(p.name).second) << "duplicate " << p.name;
      uint64_t numel = 1;
      for (uint64_t d : p.shape) numel *= d;
      EXPECT_EQ(p.numel, numel) << p.name;
      EXPECT_GE(p.layer, -1) << p.name;
      EXPECT_LT(p.layer, static_cast<int>(s.num_layers)) << p.name;
      if (p.module.empty()) {
        // The root module's own parameter (CLIPModel.logit_scale).
        EXPECT_EQ(p.name.find('.'), std::string::npos) << p.name;
      } else {
        EXPECT_EQ(p.name.rfind(p.module + ".", 0), 0u) << p.name << " / " << p.module;
      }
      EXPECT_NE(p.role, ParamRole::kUnknown) << p.name;
      if (p.is_linear_weight) {
        EXPECT_EQ(p.shape.size(), 2u) << p.name;
      }
      if (p.layer >= 0) per_layer[p.layer] += p.numel;
    }
    // No numbered layers: units of blocks (family_unet.cc, family_vae.cc).
    if (s.is_unet || s.is_vae) continue;
    // Every decoder layer is present.
    EXPECT_EQ(per_layer.size(), s.num_layers);
    EXPECT_GT(s.head_dim, 0u);
    EXPECT_EQ(s.num_heads % s.num_kv_heads, 0u);
  }
}

// Stable Diffusion 1.5's UNet, block by block, against diffusers 0.42.1's
// UNet2DConditionModel built from the same config (named_parameters() on the
// meta device): the totals, the order of the top-level modules and a few
// shapes that depend on the up blocks' skip channels.
TEST(UNetParamsTest, StableDiffusion15MatchesDiffusers) {
  ModelSpec s = Load("sd-1.5-unet");
  ASSERT_TRUE(s.is_unet);
  EXPECT_EQ(s.ParameterCount(), 859'520'964u);
  std::map<std::string, std::vector<uint64_t>> shape;
  std::vector<std::string> top;
  for (const ParamTensor& p : s.params) {
    shape[p.name] = p.shape;
    const std::string head = p.name.substr(0, p.name.find('.'));
    if (top.empty() || top.back() != head) top.push_back(head);
  }
  EXPECT_EQ(top, (std::vector<std::string>{"conv_in", "time_embedding", "down_blocks", "up_blocks",
                                           "mid_block", "conv_norm_out", "conv_out"}));
  using Shape = std::vector<uint64_t>;
  EXPECT_EQ(shape["conv_in.weight"], (Shape{320, 4, 3, 3}));
  EXPECT_EQ(shape["time_embedding.linear_1.weight"], (Shape{1280, 320}));
  // up_blocks.0 resnets take 1280 + the 1280-channel skips; the last resnet
  // of up_blocks.3 takes 320 + the 320-channel conv_in skip.
  EXPECT_EQ(shape["up_blocks.0.resnets.0.conv1.weight"], (Shape{1280, 2560, 3, 3}));
  EXPECT_EQ(shape["up_blocks.1.resnets.2.conv1.weight"], (Shape{1280, 1920, 3, 3}));
  EXPECT_EQ(shape["up_blocks.3.resnets.2.conv_shortcut.weight"], (Shape{320, 640, 1, 1}));
  EXPECT_EQ(shape["down_blocks.1.attentions.0.transformer_blocks.0.attn2.to_k.weight"],
            (Shape{640, 768}));
  EXPECT_EQ(shape["down_blocks.1.attentions.0.transformer_blocks.0.ff.net.0.proj.weight"],
            (Shape{5120, 640}));
  EXPECT_EQ(shape["mid_block.attentions.0.proj_in.weight"], (Shape{1280, 1280, 1, 1}));
  EXPECT_FALSE(shape.contains("down_blocks.3.downsamplers.0.conv.weight"));
}

// SDXL's base UNet: linear projections, 1/2/10 transformer layers, the
// text_time added embedding (diffusers 0.42.1: 2,567,463,684 parameters).
TEST(UNetParamsTest, StableDiffusionXlMatchesDiffusers) {
  ModelSpec s = Load("sdxl-base-unet");
  EXPECT_EQ(s.ParameterCount(), 2'567'463'684u);
  uint64_t blocks_in_down2 = 0, add_embedding = 0;
  for (const ParamTensor& p : s.params) {
    if (p.name.starts_with("down_blocks.2.attentions.0.transformer_blocks.") &&
        p.name.ends_with(".norm1.weight"))
      ++blocks_in_down2;
    if (p.name.starts_with("add_embedding.")) add_embedding += p.numel;
    if (p.name == "mid_block.attentions.0.proj_in.weight") {
      EXPECT_EQ(p.shape, (std::vector<uint64_t>{1280, 1280}));
      EXPECT_TRUE(p.is_linear_weight);
    }
  }
  EXPECT_EQ(blocks_in_down2, 10u);
  EXPECT_EQ(add_embedding, (2816u * 1280 + 1280) + (1280u * 1280 + 1280));
}

// FLUX.1-dev's transformer against diffusers 0.42.1's FluxTransformer2DModel
// built from the same config on the meta device: the total, the order of the
// top-level modules (named_parameters()) and the shapes of the joint blocks.
TEST(FluxParamsTest, Flux1DevMatchesDiffusers) {
  ModelSpec s = Load("flux.1-dev-transformer");
  ASSERT_TRUE(s.is_flux);
  EXPECT_EQ(s.ParameterCount(), 11'901'408'320u);
  EXPECT_EQ(s.params.size(), 1160u);
  std::map<std::string, std::vector<uint64_t>> shape;
  std::vector<std::string> top;
  for (const ParamTensor& p : s.params) {
    shape[p.name] = p.shape;
    const std::string head = p.name.substr(0, p.name.find('.'));
    if (top.empty() || top.back() != head) top.push_back(head);
  }
  EXPECT_EQ(top, (std::vector<std::string>{"time_text_embed", "context_embedder", "x_embedder",
                                           "transformer_blocks", "single_transformer_blocks",
                                           "norm_out", "proj_out"}));
  using Shape = std::vector<uint64_t>;
  EXPECT_EQ(shape["time_text_embed.guidance_embedder.linear_1.weight"], (Shape{3072, 256}));
  EXPECT_EQ(shape["context_embedder.weight"], (Shape{3072, 4096}));
  EXPECT_EQ(shape["transformer_blocks.18.norm1.linear.weight"], (Shape{18432, 3072}));
  EXPECT_EQ(shape["transformer_blocks.0.attn.norm_added_k.weight"], (Shape{128}));
  EXPECT_EQ(shape["single_transformer_blocks.37.proj_out.weight"], (Shape{3072, 15360}));
  EXPECT_EQ(shape["single_transformer_blocks.0.norm.linear.weight"], (Shape{9216, 3072}));
  EXPECT_EQ(shape["proj_out.weight"], (Shape{64, 3072}));
  EXPECT_FALSE(shape.contains("single_transformer_blocks.0.attn.to_out.0.weight"));
}

// Without guidance_embeds (FLUX.1-schnell) the guidance MLP is absent
// (diffusers 0.42.1: 11,891,178,560 parameters); patch_size and out_channels
// widen only proj_out (a small config: 139,424 parameters in 122 tensors).
TEST(FluxParamsTest, SchnellAndSmallConfigsMatchDiffusers) {
  Result<ModelSpec> schnell = ParseModelConfig(
      R"({"_class_name": "FluxTransformer2DModel", "guidance_embeds": false})", "schnell");
  ASSERT_TRUE(schnell.ok()) << schnell.error().message;
  EXPECT_EQ(schnell->ParameterCount(), 11'891'178'560u);
  Result<ModelSpec> small = ParseModelConfig(
      R"({"_class_name": "FluxTransformer2DModel", "patch_size": 2, "in_channels": 16,
          "out_channels": 8, "num_layers": 2, "num_single_layers": 3, "attention_head_dim": 16,
          "num_attention_heads": 2, "joint_attention_dim": 48, "pooled_projection_dim": 24,
          "axes_dims_rope": [4, 6, 6]})",
      "small");
  ASSERT_TRUE(small.ok()) << small.error().message;
  EXPECT_EQ(small->ParameterCount(), 139'424u);
  EXPECT_EQ(small->params.size(), 122u);
}

// The published VAEs against diffusers 0.42.1's AutoencoderKL built from the
// same vae/config.json on the meta device: totals, tensor counts and the
// order of the top-level modules; FLUX's has no quant_conv / post_quant_conv.
TEST(VaeParamsTest, PublishedVaesMatchDiffusers) {
  ModelSpec sd = Load("sd-1.5-vae");
  ASSERT_TRUE(sd.is_vae);
  EXPECT_EQ(sd.ParameterCount(), 83'653'863u);
  EXPECT_EQ(sd.params.size(), 248u);
  EXPECT_EQ(sd.vae.Downsampling(), 8u);
  EXPECT_EQ(Load("sdxl-vae").ParameterCount(), 83'653'863u);
  ModelSpec flux = Load("flux.1-dev-vae");
  EXPECT_EQ(flux.ParameterCount(), 83'819'683u);
  EXPECT_EQ(flux.params.size(), 244u);
  EXPECT_TRUE(flux.vae.has_shift_factor);
  std::vector<std::string> top;
  std::map<std::string, std::vector<uint64_t>> shape;
  for (const ParamTensor& p : sd.params) {
    shape[p.name] = p.shape;
    const std::string head = p.name.substr(0, p.name.find('.', p.name.find('.') + 1));
    if (top.empty() || top.back() != head) top.push_back(head);
  }
  EXPECT_EQ(top, (std::vector<std::string>{
                     "encoder.conv_in", "encoder.down_blocks", "encoder.mid_block",
                     "encoder.conv_norm_out", "encoder.conv_out", "decoder.conv_in",
                     "decoder.up_blocks", "decoder.mid_block", "decoder.conv_norm_out",
                     "decoder.conv_out", "quant_conv.weight", "quant_conv.bias",
                     "post_quant_conv.weight", "post_quant_conv.bias"}));
  using Shape = std::vector<uint64_t>;
  EXPECT_EQ(shape["encoder.down_blocks.1.resnets.0.conv_shortcut.weight"], (Shape{256, 128, 1, 1}));
  EXPECT_EQ(shape["encoder.mid_block.attentions.0.to_q.weight"], (Shape{512, 512}));
  EXPECT_EQ(shape["encoder.conv_out.weight"], (Shape{8, 512, 3, 3}));
  EXPECT_EQ(shape["decoder.up_blocks.3.resnets.0.conv_shortcut.weight"], (Shape{128, 256, 1, 1}));
  EXPECT_EQ(shape["decoder.up_blocks.0.upsamplers.0.conv.weight"], (Shape{512, 512, 3, 3}));
}

// Reduced configs (the fidelity grid's, tools/reference/vsref/models.py) and
// one without the mid attention, with two resnets per level and 8 latent
// channels: diffusers 0.42.1 makes 1,028,935 / 180, 1,028,843 / 176 and
// 1,373,515 / 224 parameters / tensors.
TEST(VaeParamsTest, ReducedConfigsMatchDiffusers) {
  const std::string common =
      R"("_class_name": "AutoencoderKL", "block_out_channels": [32, 32, 64, 64],
      "down_block_types": ["DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D"],
      "up_block_types": ["UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D"],
      "norm_num_groups": 8)";
  struct Case {
    std::string extra;
    uint64_t parameters, tensors;
  };
  for (const Case& c : {Case{R"("layers_per_block": 1)", 1'028'935, 180},
                        Case{R"("layers_per_block": 1, "use_quant_conv": false,
                                "use_post_quant_conv": false, "shift_factor": 0.1159)",
                             1'028'843, 176},
                        Case{R"("layers_per_block": 2, "latent_channels": 8,
                                "mid_block_add_attention": false)",
                             1'373'515, 224}}) {
    Result<ModelSpec> s = ParseModelConfig("{" + common + ", " + c.extra + "}", "vae");
    ASSERT_TRUE(s.ok()) << s.error().message;
    EXPECT_EQ(s->ParameterCount(), c.parameters) << c.extra;
    EXPECT_EQ(s->params.size(), c.tensors) << c.extra;
  }
}

// What the encode does not model is refused by name.
TEST(VaeParamsTest, RefusesUnmodelledKeysByName) {
  for (const auto& [config, key] : std::vector<std::pair<std::string, std::string>>{
           {R"({"_class_name": "AutoencoderKL", "down_block_types": ["DownBlock2D"]})",
            "down_block_types"},
           {R"({"_class_name": "AutoencoderKL", "latents_mean": [0.1, 0.2, 0.3, 0.4]})",
            "latents_mean"},
           {R"({"_class_name": "AutoencoderKL", "act_fn": "gelu"})", "act_fn"},
           {R"({"_class_name": "AutoencoderKL", "block_out_channels": [64, 128]})",
            "down_block_types"},
           {R"({"_class_name": "AutoencoderKL", "norm_num_groups": 48})", "block_out_channels"}}) {
    Result<ModelSpec> s = ParseModelConfig(config, "vae/config.json");
    ASSERT_FALSE(s.ok()) << config;
    EXPECT_NE(s.error().message.find("vae/config.json"), std::string::npos) << s.error().message;
    EXPECT_NE(s.error().message.find(key), std::string::npos) << s.error().message;
  }
}

}  // namespace
}  // namespace vramscope

namespace vramscope {
namespace {

// BertForSequenceClassification on bert-base-uncased's sizes: BertModel with its
// pooler (109,482,240 parameters: the catalog's BertForMaskedLM 109,514,298 minus
// the MLM head's 622,650 plus the pooler's 590,592) and a 768 x 3 classifier.
TEST(BertHeadsTest, SequenceClassificationHasPoolerAndClassifier) {
  const std::string config = R"({"model_type": "bert", "architectures":
      ["BertForSequenceClassification"], "id2label": {"0": "a", "1": "b", "2": "c"}})";
  Result<ModelSpec> s = ParseModelConfig(config, "bert-seqcls");
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ(s->num_labels, 3u);
  EXPECT_EQ(s->ParameterCount(), 109'482'240u + 768u * 3 + 3);
  EXPECT_EQ(s->params.back().name, "classifier.bias");
  bool has_mlm_head = false;
  for (const ParamTensor& p : s->params) has_mlm_head |= p.name.starts_with("cls.");
  EXPECT_FALSE(has_mlm_head);
  // One label is regression; a problem_type that disagrees is refused by name.
  Result<ModelSpec> reg = ParseModelConfig(R"({"model_type": "bert", "architectures":
      ["BertForSequenceClassification"], "num_labels": 1})",
                                           "bert-reg");
  ASSERT_TRUE(reg.ok()) << reg.error().message;
  EXPECT_EQ(reg->num_labels, 1u);
  Result<ModelSpec> multi = ParseModelConfig(R"({"model_type": "bert", "architectures":
      ["BertForSequenceClassification"], "problem_type": "multi_label_classification"})",
                                             "bert-multi");
  ASSERT_FALSE(multi.ok());
  EXPECT_NE(multi.error().message.find("problem_type"), std::string::npos);
}

}  // namespace
}  // namespace vramscope

namespace vramscope {
namespace {

// LlamaForSequenceClassification (GenericForSequenceClassification): the
// decoder and norm, then `score` [labels, hidden] without a bias, no lm_head.
TEST(DecoderHeadsTest, SequenceClassificationReplacesTheLmHead) {
  const std::string config = R"({"model_type": "llama", "architectures":
      ["LlamaForSequenceClassification"], "num_labels": 1, "pad_token_id": 0})";
  Result<ModelSpec> rm = ParseModelConfig(config, "reward");
  ASSERT_TRUE(rm.ok()) << rm.error().message;
  EXPECT_EQ(rm->num_labels, 1u);
  EXPECT_EQ(rm->params.back().name, "score.weight");
  EXPECT_EQ(rm->params.back().shape, (std::vector<uint64_t>{1, rm->hidden_size}));
  for (const ParamTensor& p : rm->params) EXPECT_NE(p.name, "lm_head.weight");
}

}  // namespace
}  // namespace vramscope

namespace vramscope {
namespace {

TEST(BertHeadsTest, TokenClassificationHasNoPooler) {
  Result<ModelSpec> s = ParseModelConfig(R"({"model_type": "bert", "architectures":
      ["BertForTokenClassification"], "num_labels": 9})",
                                         "bert-ner");
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_TRUE(s->token_classification);
  // BertModel without its pooler (the MaskedLM count less the MLM head) + 768 x 9 + 9.
  EXPECT_EQ(s->ParameterCount(), 109'482'240u - 590'592u + 768u * 9 + 9);
  for (const ParamTensor& p : s->params) EXPECT_FALSE(p.name.starts_with("bert.pooler"));
}

// CLIP (family_clip.cc): every name and shape, in named_parameters() order,
// as transformers 5.24.0's named_parameters() lists them for these one-layer
// configs (CLIPModel, CLIPTextModelWithProjection, CLIPVisionModel built on
// the meta device).
std::string NamesAndShapes(const ModelSpec& s) {
  std::string out;
  for (const ParamTensor& p : s.params) {
    if (!out.empty()) out += ";";
    out += p.name + ":";
    for (size_t i = 0; i < p.shape.size(); ++i) out += (i ? "x" : "") + std::to_string(p.shape[i]);
  }
  return out;
}

ModelSpec ParseClip(const std::string& json) {
  Result<ModelSpec> spec = ParseModelConfig(json, "clip.json");
  EXPECT_TRUE(spec.ok()) << (spec.ok() ? "" : spec.error().message);
  return spec.ok() ? spec.value() : ModelSpec{};
}

constexpr const char* kClipText =
    R"("hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
       "num_attention_heads": 2, "vocab_size": 10, "max_position_embeddings": 5,
       "projection_dim": 6)";
constexpr const char* kClipVision =
    R"("hidden_size": 4, "intermediate_size": 12, "num_hidden_layers": 1,
       "num_attention_heads": 2, "image_size": 8, "patch_size": 4, "projection_dim": 6)";

TEST(ParamNamesTest, ClipModel) {
  ModelSpec s =
      ParseClip(std::string(R"({"model_type": "clip", "projection_dim": 6, "text_config": {)") +
                kClipText + R"(}, "vision_config": {)" + kClipVision + "}}");
  EXPECT_EQ(NamesAndShapes(s),
            "logit_scale:;text_model.embeddings.token_embedding.weight:10x8;"
            "text_model.embeddings.position_embedding.weight:5x8;"
            "text_model.encoder.layers.0.self_attn.k_proj.weight:8x8;"
            "text_model.encoder.layers.0.self_attn.k_proj.bias:8;"
            "text_model.encoder.layers.0.self_attn.v_proj.weight:8x8;"
            "text_model.encoder.layers.0.self_attn.v_proj.bias:8;"
            "text_model.encoder.layers.0.self_attn.q_proj.weight:8x8;"
            "text_model.encoder.layers.0.self_attn.q_proj.bias:8;"
            "text_model.encoder.layers.0.self_attn.out_proj.weight:8x8;"
            "text_model.encoder.layers.0.self_attn.out_proj.bias:8;"
            "text_model.encoder.layers.0.layer_norm1.weight:8;"
            "text_model.encoder.layers.0.layer_norm1.bias:8;"
            "text_model.encoder.layers.0.mlp.fc1.weight:16x8;"
            "text_model.encoder.layers.0.mlp.fc1.bias:16;"
            "text_model.encoder.layers.0.mlp.fc2.weight:8x16;"
            "text_model.encoder.layers.0.mlp.fc2.bias:8;"
            "text_model.encoder.layers.0.layer_norm2.weight:8;"
            "text_model.encoder.layers.0.layer_norm2.bias:8;text_model.final_layer_norm.weight:8;"
            "text_model.final_layer_norm.bias:8;vision_model.embeddings.class_embedding:4;"
            "vision_model.embeddings.patch_embedding.weight:4x3x4x4;"
            "vision_model.embeddings.position_embedding.weight:5x4;"
            "vision_model.pre_layrnorm.weight:4;vision_model.pre_layrnorm.bias:4;"
            "vision_model.encoder.layers.0.self_attn.k_proj.weight:4x4;"
            "vision_model.encoder.layers.0.self_attn.k_proj.bias:4;"
            "vision_model.encoder.layers.0.self_attn.v_proj.weight:4x4;"
            "vision_model.encoder.layers.0.self_attn.v_proj.bias:4;"
            "vision_model.encoder.layers.0.self_attn.q_proj.weight:4x4;"
            "vision_model.encoder.layers.0.self_attn.q_proj.bias:4;"
            "vision_model.encoder.layers.0.self_attn.out_proj.weight:4x4;"
            "vision_model.encoder.layers.0.self_attn.out_proj.bias:4;"
            "vision_model.encoder.layers.0.layer_norm1.weight:4;"
            "vision_model.encoder.layers.0.layer_norm1.bias:4;"
            "vision_model.encoder.layers.0.mlp.fc1.weight:12x4;"
            "vision_model.encoder.layers.0.mlp.fc1.bias:12;"
            "vision_model.encoder.layers.0.mlp.fc2.weight:4x12;"
            "vision_model.encoder.layers.0.mlp.fc2.bias:4;"
            "vision_model.encoder.layers.0.layer_norm2.weight:4;"
            "vision_model.encoder.layers.0.layer_norm2.bias:4;vision_model.post_layernorm.weight:4;"
            "vision_model.post_layernorm.bias:4;visual_projection.weight:6x4;"
            "text_projection.weight:6x8");
}

TEST(ParamNamesTest, ClipTextModelWithProjection) {
  ModelSpec s = ParseClip(std::string(R"({"model_type": "clip_text_model",
      "architectures": ["CLIPTextModelWithProjection"], )") +
                          kClipText + "}");
  EXPECT_EQ(NamesAndShapes(s),
            "text_model.embeddings.token_embedding.weight:10x8;"
            "text_model.embeddings.position_embedding.weight:5x8;"
            "text_model.encoder.layers.0.self_attn.k_proj.weight:8x8;"
            "text_model.encoder.layers.0.self_attn.k_proj.bias:8;"
            "text_model.encoder.layers.0.self_attn.v_proj.weight:8x8;"
            "text_model.encoder.layers.0.self_attn.v_proj.bias:8;"
            "text_model.encoder.layers.0.self_attn.q_proj.weight:8x8;"
            "text_model.encoder.layers.0.self_attn.q_proj.bias:8;"
            "text_model.encoder.layers.0.self_attn.out_proj.weight:8x8;"
            "text_model.encoder.layers.0.self_attn.out_proj.bias:8;"
            "text_model.encoder.layers.0.layer_norm1.weight:8;"
            "text_model.encoder.layers.0.layer_norm1.bias:8;"
            "text_model.encoder.layers.0.mlp.fc1.weight:16x8;"
            "text_model.encoder.layers.0.mlp.fc1.bias:16;"
            "text_model.encoder.layers.0.mlp.fc2.weight:8x16;"
            "text_model.encoder.layers.0.mlp.fc2.bias:8;"
            "text_model.encoder.layers.0.layer_norm2.weight:8;"
            "text_model.encoder.layers.0.layer_norm2.bias:8;text_model.final_layer_norm.weight:8;"
            "text_model.final_layer_norm.bias:8;text_projection.weight:6x8");
}

TEST(ParamNamesTest, ClipVisionModel) {
  ModelSpec s =
      ParseClip(std::string(R"({"model_type": "clip_vision_model", )") + kClipVision + "}");
  EXPECT_EQ(NamesAndShapes(s),
            "embeddings.class_embedding:4;embeddings.patch_embedding.weight:4x3x4x4;"
            "embeddings.position_embedding.weight:5x4;pre_layrnorm.weight:4;pre_layrnorm.bias:4;"
            "encoder.layers.0.self_attn.k_proj.weight:4x4;encoder.layers.0.self_attn.k_proj.bias:4;"
            "encoder.layers.0.self_attn.v_proj.weight:4x4;encoder.layers.0.self_attn.v_proj.bias:4;"
            "encoder.layers.0.self_attn.q_proj.weight:4x4;encoder.layers.0.self_attn.q_proj.bias:4;"
            "encoder.layers.0.self_attn.out_proj.weight:4x4;"
            "encoder.layers.0.self_attn.out_proj.bias:4;encoder.layers.0.layer_norm1.weight:4;"
            "encoder.layers.0.layer_norm1.bias:4;encoder.layers.0.mlp.fc1.weight:12x4;"
            "encoder.layers.0.mlp.fc1.bias:12;encoder.layers.0.mlp.fc2.weight:4x12;"
            "encoder.layers.0.mlp.fc2.bias:4;encoder.layers.0.layer_norm2.weight:4;"
            "encoder.layers.0.layer_norm2.bias:4;post_layernorm.weight:4;post_layernorm.bias:4");
}

// CLIPConfig's legacy text_config_dict / vision_config_dict override
// text_config / vision_config key by key (configuration_clip.py, 5.24.0).
TEST(ParamNamesTest, ClipLegacyConfigDicts) {
  ModelSpec s = ParseClip(R"({"model_type": "clip", "text_config": {"hidden_size": 64,
      "num_attention_heads": 4}, "text_config_dict": {"hidden_size": 32},
      "vision_config_dict": {"num_hidden_layers": 3}})");
  EXPECT_EQ(s.clip.text.hidden, 32u);
  EXPECT_EQ(s.clip.text.heads, 4u);
  EXPECT_EQ(s.clip.vision.layers, 3u);
}

TEST(ParamNamesTest, ClipRefusesWhatItDoesNotModel) {
  EXPECT_FALSE(
      ParseModelConfig(R"({"model_type": "clip", "architectures": ["CLIPForImageClassification"]})",
                       "c.json")
          .ok());
  Result<ModelSpec> act =
      ParseModelConfig(R"({"model_type": "clip_text_model", "hidden_act": "swish"})", "c.json");
  ASSERT_FALSE(act.ok());
  EXPECT_NE(act.error().message.find("hidden_act"), std::string::npos) << act.error().message;
  Result<ModelSpec> heads = ParseModelConfig(
      R"({"model_type": "clip", "vision_config": {"hidden_size": 10, "num_attention_heads": 3}})",
      "c.json");
  ASSERT_FALSE(heads.ok());
  EXPECT_NE(heads.error().message.find("vision_config"), std::string::npos)
      << heads.error().message;
}

}  // namespace
}  // namespace vramscope

namespace vramscope {
namespace {

// T5 against transformers 5.24.0 built from the same configs on the meta
// device (named_parameters()): totals, tensor counts, the last name, and the
// shapes that depend on d_kv, the gated feed-forward and the relative bias.
// 5.24.0 ties lm_head to `shared` even for flan (tie_word_embeddings false).
TEST(T5ParamsTest, CatalogMatchesTransformers) {
  struct Want {
    const char* alias;
    uint64_t params, tensors;
    const char* last;
  };
  for (const Want& w :
       {Want{"t5-base", 222'903'552u, 257u, "decoder.final_layer_norm.weight"},
        Want{"flan-t5-large", 750'251'008u, 557u, "decoder.final_layer_norm.weight"},
        Want{"t5-v1_1-xxl-encoder", 4'762'310'656u, 219u, "encoder.final_layer_norm.weight"}}) {
    ModelSpec s = Load(w.alias);
    ASSERT_TRUE(s.is_t5) << w.alias;
    EXPECT_EQ(s.ParameterCount(), w.params) << w.alias;
    EXPECT_EQ(s.params.size(), w.tensors) << w.alias;
    EXPECT_EQ(s.params.front().name, "shared.weight") << w.alias;
    EXPECT_EQ(s.params.back().name, w.last) << w.alias;
  }
  ModelSpec flan = Load("flan-t5-large");
  std::map<std::string, std::vector<uint64_t>> shape;
  for (const ParamTensor& p : flan.params) shape[p.name] = p.shape;
  using Shape = std::vector<uint64_t>;
  EXPECT_EQ(shape["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"],
            (Shape{32, 16}));
  EXPECT_EQ(shape["encoder.block.0.layer.1.DenseReluDense.wi_1.weight"], (Shape{2816, 1024}));
  EXPECT_EQ(shape["decoder.block.1.layer.1.EncDecAttention.q.weight"], (Shape{1024, 1024}));
  EXPECT_FALSE(shape.contains("lm_head.weight"));
  EXPECT_FALSE(
      shape.contains("decoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight"));
  EXPECT_TRUE(flan.t5.gated);
  EXPECT_FALSE(flan.t5.scale_decoder_outputs);
  EXPECT_TRUE(Load("t5-base").t5.scale_decoder_outputs);
}

}  // namespace
}  // namespace vramscope
