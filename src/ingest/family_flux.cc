// diffusers' FluxTransformer2DModel (FLUX.1-dev / schnell), from the
// transformer/config.json diffusers writes beside the weights (`_class_name`,
// no model_type). Keys, defaults and module layout are those of diffusers
// 0.42.1 models/transformers/transformer_flux.py (FluxTransformer2DModel.__init__,
// FluxTransformerBlock, FluxSingleTransformerBlock, FluxAttention),
// normalization.py (AdaLayerNormZero, AdaLayerNormZeroSingle,
// AdaLayerNormContinuous, RMSNorm) and embeddings.py
// (CombinedTimestepGuidanceTextProjEmbeddings, CombinedTimestepTextProjEmbeddings,
// TimestepEmbedding, PixArtAlphaTextProjection). The parameter order is
// named_parameters()'s: time_text_embed, context_embedder, x_embedder,
// transformer_blocks, single_transformer_blocks, norm_out, proj_out
// (pos_embed holds no parameters).
#include <fmt/format.h>

#include "families.h"

namespace vramscope::ingest {
namespace {

constexpr uint64_t kMaxFluxBlocks = 1024;
constexpr uint64_t kMaxChannels = 1 << 16;
// Timesteps(num_channels=256) in the combined embeddings (embeddings.py).
constexpr uint64_t kTimeProjChannels = 256;

// FluxPosEmbed rotates each head's features by three axes (the text / image
// ids' columns): the axes' widths must fill the head, each an even number of
// rotated pairs, or FluxTransformer2DModel.forward fails on the first step.
void ReadRopeAxes(ConfigReader& r, FluxSpec& f) {
  if (!r.Has("axes_dims_rope")) return;
  f.axes_dims_rope = r.UintList("axes_dims_rope", kMaxHeadDim);
  if (!r.ok()) return;
  if (f.axes_dims_rope.size() != 3) {
    r.Fail("axes_dims_rope",
           fmt::format("has {} entries; FluxPosEmbed rotates 3 axes", f.axes_dims_rope.size()));
    return;
  }
  uint64_t sum = 0;
  for (uint64_t d : f.axes_dims_rope) {
    if (d == 0 || d % 2 != 0) {
      r.Fail("axes_dims_rope", "entries must be even and at least 2 (rotated pairs)");
      return;
    }
    sum += d;
  }
  if (sum != f.attention_head_dim) {
    r.Fail("axes_dims_rope", fmt::format("sums to {}, not attention_head_dim {} (RoPE rotates "
                                         "the whole head)",
                                         sum, f.attention_head_dim));
  }
}

void ReadFlux(ConfigReader& r, ModelSpec& spec, ArchDetails&) {
  FluxSpec& f = spec.flux;
  spec.is_flux = true;
  spec.architecture = "FluxTransformer2DModel";
  spec.torch_dtype = ReadTorchDtype(r);
  f.patch_size = r.Uint("patch_size", 1, 1, 64);
  f.in_channels = r.Uint("in_channels", 64, 1, kMaxChannels);
  f.out_channels = r.Uint("out_channels", f.in_channels, 1, kMaxChannels);  // null: in_channels
  f.num_layers = r.Uint("num_layers", 19, 0, kMaxFluxBlocks);
  f.num_single_layers = r.Uint("num_single_layers", 38, 0, kMaxFluxBlocks);
  f.attention_head_dim = r.Uint("attention_head_dim", 128, 2, kMaxHeadDim);
  f.num_attention_heads = r.Uint("num_attention_heads", 24, 1, kMaxHeads);
  f.joint_attention_dim = r.Uint("joint_attention_dim", 4096, 1, kMaxHidden);
  f.pooled_projection_dim = r.Uint("pooled_projection_dim", 768, 1, kMaxHidden);
  f.guidance_embeds = r.Bool("guidance_embeds", false);
  if (!r.ok()) return;
  if (f.num_layers + f.num_single_layers == 0) {
    r.Fail("num_layers", "and num_single_layers are both 0: no transformer blocks");
    return;
  }
  const uint64_t inner = f.num_attention_heads * f.attention_head_dim;
  if (inner > kMaxHidden) {
    r.Fail("num_attention_heads",
           fmt::format("x attention_head_dim = {} is above the {} limit", inner, kMaxHidden));
    return;
  }
  ReadRopeAxes(r, f);
  if (!r.ok()) return;
  // Fields the shared code reads (reports, the work budget).
  spec.hidden_size = inner;
  spec.num_heads = f.num_attention_heads;
  spec.num_kv_heads = f.num_attention_heads;
  spec.head_dim = f.attention_head_dim;
  spec.num_layers = f.num_layers + f.num_single_layers;
  spec.intermediate_size = 4 * inner;  // FeedForward / proj_mlp, mlp_ratio 4
  spec.norm = NormKind::kLayerNorm;
}

// --- parameters -----------------------------------------------------------

// TimestepEmbedding / PixArtAlphaTextProjection: linear_1, act, linear_2.
void TwoLinears(ParamListBuilder& b, const std::string& m, uint64_t in, uint64_t dim) {
  b.Linear(m + ".linear_1", dim, in, true, -1, ParamRole::kTimeEmbed);
  b.Linear(m + ".linear_2", dim, dim, true, -1, ParamRole::kTimeEmbed);
}

// FluxAttention's to_q / to_k / to_v (bias=True) and its q / k RMSNorms
// (elementwise_affine: a weight per head feature), in registration order:
// norm_q, norm_k, to_q, to_k, to_v.
void JointQkv(ParamListBuilder& b, const std::string& m, uint64_t dim, uint64_t head_dim,
              int layer) {
  b.Tensor(m + ".norm_q.weight", {head_dim}, layer, m + ".norm_q", ParamRole::kNorm, false);
  b.Tensor(m + ".norm_k.weight", {head_dim}, layer, m + ".norm_k", ParamRole::kNorm, false);
  b.Linear(m + ".to_q", dim, dim, true, layer, ParamRole::kQ);
  b.Linear(m + ".to_k", dim, dim, true, layer, ParamRole::kK);
  b.Linear(m + ".to_v", dim, dim, true, layer, ParamRole::kV);
}

// FluxTransformerBlock: AdaLayerNormZero for the image and the text streams
// (a Linear to 6 x dim each; the LayerNorms have no affine), the joint
// attention (context_pre_only False: added projections and to_add_out), the
// GELU(tanh) feed-forwards of 4 x dim.
void DoubleBlock(ParamListBuilder& b, const std::string& m, uint64_t dim, uint64_t head_dim,
                 int layer) {
  b.Linear(m + ".norm1.linear", 6 * dim, dim, true, layer, ParamRole::kTimeEmbed);
  b.Linear(m + ".norm1_context.linear", 6 * dim, dim, true, layer, ParamRole::kTimeEmbed);
  const std::string a = m + ".attn";
  JointQkv(b, a, dim, head_dim, layer);
  b.Linear(a + ".to_out.0", dim, dim, true, layer, ParamRole::kO);
  b.Tensor(a + ".norm_added_q.weight", {head_dim}, layer, a + ".norm_added_q", ParamRole::kNorm,
           false);
  b.Tensor(a + ".norm_added_k.weight", {head_dim}, layer, a + ".norm_added_k", ParamRole::kNorm,
           false);
  b.Linear(a + ".add_q_proj", dim, dim, true, layer, ParamRole::kContextProj);
  b.Linear(a + ".add_k_proj", dim, dim, true, layer, ParamRole::kContextProj);
  b.Linear(a + ".add_v_proj", dim, dim, true, layer, ParamRole::kContextProj);
  b.Linear(a + ".to_add_out", dim, dim, true, layer, ParamRole::kContextProj);
  for (const char* ff : {".ff", ".ff_context"}) {
    b.Linear(m + ff + ".net.0.proj", 4 * dim, dim, true, layer, ParamRole::kUp);
    b.Linear(m + ff + ".net.2", dim, 4 * dim, true, layer, ParamRole::kDown);
  }
}

// FluxSingleTransformerBlock: AdaLayerNormZeroSingle (3 x dim), proj_mlp,
// proj_out over cat([attention, mlp]) and the attention (pre_only: no to_out).
void SingleBlock(ParamListBuilder& b, const std::string& m, uint64_t dim, uint64_t head_dim,
                 int layer) {
  b.Linear(m + ".norm.linear", 3 * dim, dim, true, layer, ParamRole::kTimeEmbed);
  b.Linear(m + ".proj_mlp", 4 * dim, dim, true, layer, ParamRole::kUp);
  b.Linear(m + ".proj_out", dim, 5 * dim, true, layer, ParamRole::kDown);
  JointQkv(b, m + ".attn", dim, head_dim, layer);
}

void BuildFlux(const ModelSpec& spec, const ArchDetails&, ParamListBuilder& b) {
  const FluxSpec& f = spec.flux;
  const uint64_t dim = spec.hidden_size;
  TwoLinears(b, "time_text_embed.timestep_embedder", kTimeProjChannels, dim);
  if (f.guidance_embeds) TwoLinears(b, "time_text_embed.guidance_embedder", kTimeProjChannels, dim);
  TwoLinears(b, "time_text_embed.text_embedder", f.pooled_projection_dim, dim);
  b.Linear("context_embedder", dim, f.joint_attention_dim, true, -1, ParamRole::kProjIn);
  b.Linear("x_embedder", dim, f.in_channels, true, -1, ParamRole::kProjIn);
  int layer = 0;
  for (uint64_t i = 0; i < f.num_layers && !b.overflowed(); ++i, ++layer) {
    DoubleBlock(b, fmt::format("transformer_blocks.{}", i), dim, f.attention_head_dim, layer);
  }
  for (uint64_t i = 0; i < f.num_single_layers && !b.overflowed(); ++i, ++layer) {
    SingleBlock(b, fmt::format("single_transformer_blocks.{}", i), dim, f.attention_head_dim,
                layer);
  }
  // AdaLayerNormContinuous(elementwise_affine=False): only its Linear to 2 x dim.
  b.Linear("norm_out.linear", 2 * dim, dim, true, -1, ParamRole::kTimeEmbed);
  b.Linear("proj_out", f.patch_size * f.patch_size * f.out_channels, dim, true, -1,
           ParamRole::kProjOut);
}

}  // namespace

const std::vector<Family>& FluxFamilies() {
  static const std::vector<Family> kFamilies = {{kFluxModelType, ReadFlux, BuildFlux}};
  return kFamilies;
}

}  // namespace vramscope::ingest
