// diffusers' UNet2DConditionModel (Stable Diffusion 1.x / 2.x, SDXL), from the
// config.json diffusers writes beside the weights (`_class_name`, no model_type).
// Keys, defaults and module layout are those of diffusers 0.42.1
// models/unets/unet_2d_condition.py (UNet2DConditionModel.__init__),
// unet_2d_blocks.py (CrossAttnDownBlock2D, DownBlock2D, UNetMidBlock2DCrossAttn,
// CrossAttnUpBlock2D, UpBlock2D), resnet.py (ResnetBlock2D), downsampling.py /
// upsampling.py, transformers/transformer_2d.py (Transformer2DModel),
// attention.py (BasicTransformerBlock, FeedForward, GEGLU) and embeddings.py
// (TimestepEmbedding). The parameter order is named_parameters()'s: conv_in,
// time_embedding, add_embedding, down_blocks, up_blocks, mid_block,
// conv_norm_out, conv_out; inside a block attentions, resnets, then samplers.
#include <fmt/format.h>

#include "families.h"

namespace vramscope::ingest {
namespace {

constexpr uint64_t kMaxBlocks = 8;
constexpr uint64_t kMaxLayersPerBlock = 64;
constexpr uint64_t kMaxTransformerLayers = 64;

// A key that is an int or a per-down-block list (diffusers broadcasts an int).
std::vector<uint64_t> PerBlock(ConfigReader& r, std::string_view key, uint64_t def, uint64_t blocks,
                               uint64_t max) {
  if (!r.IsArray(key)) return std::vector<uint64_t>(blocks, r.Uint(key, def, 1, max));
  std::vector<uint64_t> v = r.UintList(key, max);
  if (r.ok() && v.size() != blocks) {
    r.Fail(key, fmt::format("has {} entries for {} down blocks", v.size(), blocks));
  }
  for (uint64_t x : v) {
    if (r.ok() && x == 0) r.Fail(key, "entries must be at least 1");
  }
  return v;
}

// Block types: whether each has cross-attention; anything else is refused.
std::vector<bool> BlockKinds(ConfigReader& r, std::string_view key, std::string_view cross,
                             std::string_view plain) {
  std::vector<bool> out;
  for (const std::string& t : r.StringList(key)) {
    if (t != cross && t != plain) {
      r.Fail(key, fmt::format("{} is not lowered (only {} and {})", common::QuoteForMessage(t),
                              cross, plain));
      return {};
    }
    out.push_back(t == cross);
  }
  return out;
}

// Keys whose non-default values select code paths the lowering does not model:
// refused by name rather than estimated wrongly.
void RefuseUnmodelled(ConfigReader& r) {
  for (std::string_view key :
       {"class_embed_type", "encoder_hid_dim_type", "time_cond_proj_dim", "time_embedding_dim",
        "time_embedding_act_fn", "timestep_post_act", "reverse_transformer_layers_per_block",
        "num_class_embeds", "cross_attention_norm"}) {
    if (r.ok() && r.Has(key)) r.Fail(key, "is not lowered yet (only null / absent)");
  }
  auto require = [&](std::string_view key, std::string_view want, std::string def) {
    std::string got = r.String(key, std::move(def));
    if (r.ok() && got != want) {
      r.Fail(key,
             fmt::format("{} is not lowered yet (only {})", common::QuoteForMessage(got), want));
    }
  };
  require("act_fn", "silu", "silu");
  require("resnet_time_scale_shift", "default", "default");
  require("time_embedding_type", "positional", "positional");
  require("attention_type", "default", "default");
  for (std::string_view key : {"only_cross_attention", "dual_cross_attention",
                               "resnet_skip_time_act", "class_embeddings_concat"}) {
    if (r.ok() && !r.IsArray(key) && r.Bool(key, false)) r.Fail(key, "true is not lowered yet");
    if (r.ok() && r.IsArray(key)) r.Fail(key, "a list is not lowered yet");
  }
  for (std::string_view key : {"conv_in_kernel", "conv_out_kernel"}) {
    if (r.ok() && r.Uint(key, 3, 1, 15) != 3) r.Fail(key, "only 3 is lowered");
  }
  if (r.ok() && r.IsArray("cross_attention_dim")) {
    r.Fail("cross_attention_dim", "a per-block list is not lowered yet");
  }
}

void ReadAdditionEmbedding(ConfigReader& r, UNetSpec& u) {
  if (!r.Has("addition_embed_type")) return;
  const std::string type = r.String("addition_embed_type", "");
  if (r.ok() && type != "text_time") {
    r.Fail("addition_embed_type",
           fmt::format("{} is not lowered yet (only text_time)", common::QuoteForMessage(type)));
    return;
  }
  u.text_time = true;
  u.addition_time_embed_dim = r.Uint("addition_time_embed_dim", 0, 2, kMaxHidden);
  u.projection_class_embeddings_input_dim =
      r.Uint("projection_class_embeddings_input_dim", 0, 1, kMaxHidden);
  if (r.ok() && u.projection_class_embeddings_input_dim <= 6 * u.addition_time_embed_dim) {
    r.Fail("projection_class_embeddings_input_dim",
           "must exceed 6 x addition_time_embed_dim (the time ids) to leave room for text_embeds");
  }
}

void CheckDivisibility(ConfigReader& r, const UNetSpec& u) {
  for (size_t i = 0; i < u.block_out_channels.size() && r.ok(); ++i) {
    const uint64_t c = u.block_out_channels[i];
    if (c % u.norm_groups != 0) {
      r.Fail("block_out_channels",
             fmt::format("{} is not divisible by norm_num_groups {}", c, u.norm_groups));
    } else if ((u.down_cross[i] || u.up_cross[u.up_cross.size() - 1 - i]) && c % u.heads[i] != 0) {
      r.Fail("attention_head_dim",
             fmt::format("{} heads do not divide block {}'s {} channels", u.heads[i], i, c));
    }
  }
}

// Resnets and transformer blocks: the units the work budget counts as layers
// (each lowers to fewer events than a decoder layer). At most 8 blocks x 65
// resnets x 64 transformer layers: no overflow.
uint64_t UNetUnits(const UNetSpec& u) {
  const size_t n = u.block_out_channels.size();
  uint64_t units = 0;
  for (size_t i = 0; i < n; ++i) {
    units += u.layers_per_block * (1 + (u.down_cross[i] ? u.transformer_layers[i] : 0));
    units += (u.layers_per_block + 1) * (1 + (u.up_cross[i] ? u.transformer_layers[n - 1 - i] : 0));
  }
  if (u.mid_block) units += 2 + u.transformer_layers.back();
  return units;
}

void ReadUNet(ConfigReader& r, ModelSpec& spec, ArchDetails&) {
  UNetSpec& u = spec.unet;
  spec.is_unet = true;
  spec.architecture = "UNet2DConditionModel";
  spec.torch_dtype = ReadTorchDtype(r);
  u.block_out_channels = r.UintList("block_out_channels", kMaxHidden);
  if (!r.Has("block_out_channels")) u.block_out_channels = {320, 640, 1280, 1280};
  const uint64_t blocks = u.block_out_channels.size();
  if (r.ok() && (blocks == 0 || blocks > kMaxBlocks)) {
    r.Fail("block_out_channels", fmt::format("needs 1 to {} blocks", kMaxBlocks));
  }
  for (uint64_t c : u.block_out_channels) {
    if (r.ok() && c == 0) r.Fail("block_out_channels", "channels must be at least 1");
  }
  if (!r.ok()) return;
  u.down_cross = BlockKinds(r, "down_block_types", "CrossAttnDownBlock2D", "DownBlock2D");
  u.up_cross = BlockKinds(r, "up_block_types", "CrossAttnUpBlock2D", "UpBlock2D");
  if (r.ok() && (u.down_cross.size() != blocks || u.up_cross.size() != blocks)) {
    r.Fail("down_block_types", fmt::format("down and up block types must both list {} blocks "
                                           "(one per block_out_channels entry)",
                                           blocks));
  }
  const std::vector<uint64_t> layers =
      PerBlock(r, "layers_per_block", 2, blocks, kMaxLayersPerBlock);
  for (uint64_t l : layers) {
    if (r.ok() && l != layers[0]) r.Fail("layers_per_block", "a per-block list is not lowered yet");
  }
  u.layers_per_block = layers.empty() ? 2 : layers[0];
  u.transformer_layers =
      PerBlock(r, "transformer_layers_per_block", 1, blocks, kMaxTransformerLayers);
  if (r.ok() && r.Has("num_attention_heads")) {
    // UNet2DConditionModel.__init__ raises on it (diffusers issue 2011's naming).
    r.Fail("num_attention_heads", "diffusers refuses it; attention_head_dim holds the head count");
  }
  u.heads = PerBlock(r, "attention_head_dim", 8, blocks, kMaxHeads);
  const std::string mid = r.String("mid_block_type", "UNetMidBlock2DCrossAttn");
  u.mid_block = r.Has("mid_block_type") || !r.IsNull("mid_block_type");
  if (r.ok() && u.mid_block && mid != "UNetMidBlock2DCrossAttn") {
    r.Fail("mid_block_type", fmt::format("{} is not lowered yet (only UNetMidBlock2DCrossAttn)",
                                         common::QuoteForMessage(mid)));
  }
  u.in_channels = r.Uint("in_channels", 4, 1, 1024);
  u.out_channels = r.Uint("out_channels", 4, 1, 1024);
  u.sample_size = r.Uint("sample_size", 64, 1, 1 << 14);
  u.cross_attention_dim = r.Uint("cross_attention_dim", 1280, 1, kMaxHidden);
  u.norm_groups = r.Uint("norm_num_groups", 32, 1, kMaxHidden);
  u.linear_projection = r.Bool("use_linear_projection", false);
  ReadAdditionEmbedding(r, u);
  RefuseUnmodelled(r);
  if (!r.ok()) return;
  u.time_embed_dim = u.block_out_channels[0] * 4;  // _set_time_proj, "positional"
  CheckDivisibility(r, u);
  // Fields the shared code reads (reports, the work budget).
  spec.hidden_size = u.block_out_channels.back();
  spec.num_heads = u.heads.back();
  spec.num_layers = UNetUnits(u);
  spec.norm = NormKind::kLayerNorm;
}

// --- parameters -----------------------------------------------------------

void Conv(ParamListBuilder& b, const std::string& m, uint64_t out, uint64_t in, uint64_t k) {
  b.Tensor(m + ".weight", {out, in, k, k}, -1, m, ParamRole::kConv, false);
  b.Tensor(m + ".bias", {out}, -1, m, ParamRole::kBias, false);
}

void TimeMlp(ParamListBuilder& b, const std::string& m, uint64_t in, uint64_t dim) {
  b.Linear(m + ".linear_1", dim, in, true, -1, ParamRole::kTimeEmbed);
  b.Linear(m + ".linear_2", dim, dim, true, -1, ParamRole::kTimeEmbed);
}

void Resnet(ParamListBuilder& b, const std::string& m, uint64_t in, uint64_t out, uint64_t temb) {
  b.Norm(m + ".norm1", in, true, -1);
  Conv(b, m + ".conv1", out, in, 3);
  b.Linear(m + ".time_emb_proj", out, temb, true, -1, ParamRole::kTimeEmbed);
  b.Norm(m + ".norm2", out, true, -1);
  Conv(b, m + ".conv2", out, out, 3);
  if (in != out) Conv(b, m + ".conv_shortcut", out, in, 1);
}

// Attention(query_dim=dim, cross_attention_dim=ctx, bias=False, out_bias=True).
void Attn(ParamListBuilder& b, const std::string& m, uint64_t dim, uint64_t ctx) {
  b.Linear(m + ".to_q", dim, dim, false, -1, ParamRole::kQ);
  b.Linear(m + ".to_k", dim, ctx, false, -1, ParamRole::kK);
  b.Linear(m + ".to_v", dim, ctx, false, -1, ParamRole::kV);
  b.Linear(m + ".to_out.0", dim, dim, true, -1, ParamRole::kO);
}

// Transformer2DModel with BasicTransformerBlocks (self-attention, cross-attention,
// GEGLU feed-forward of 4 x dim).
void SpatialTransformer(ParamListBuilder& b, const UNetSpec& u, const std::string& m, uint64_t c,
                        uint64_t depth) {
  b.Norm(m + ".norm", c, true, -1);
  if (u.linear_projection) {
    b.Linear(m + ".proj_in", c, c, true, -1, ParamRole::kConv);
  } else {
    Conv(b, m + ".proj_in", c, c, 1);
  }
  for (uint64_t i = 0; i < depth && !b.overflowed(); ++i) {
    const std::string t = fmt::format("{}.transformer_blocks.{}", m, i);
    b.Norm(t + ".norm1", c, true, -1);
    Attn(b, t + ".attn1", c, c);
    b.Norm(t + ".norm2", c, true, -1);
    Attn(b, t + ".attn2", c, u.cross_attention_dim);
    b.Norm(t + ".norm3", c, true, -1);
    b.Linear(t + ".ff.net.0.proj", 8 * c, c, true, -1, ParamRole::kUp);
    b.Linear(t + ".ff.net.2", c, 4 * c, true, -1, ParamRole::kDown);
  }
  if (u.linear_projection) {
    b.Linear(m + ".proj_out", c, c, true, -1, ParamRole::kConv);
  } else {
    Conv(b, m + ".proj_out", c, c, 1);
  }
}

void DownBlocks(ParamListBuilder& b, const UNetSpec& u) {
  const size_t n = u.block_out_channels.size();
  uint64_t out = u.block_out_channels[0];
  for (size_t i = 0; i < n && !b.overflowed(); ++i) {
    const uint64_t in = out;
    out = u.block_out_channels[i];
    const std::string m = fmt::format("down_blocks.{}", i);
    for (uint64_t j = 0; u.down_cross[i] && j < u.layers_per_block; ++j) {
      SpatialTransformer(b, u, fmt::format("{}.attentions.{}", m, j), out, u.transformer_layers[i]);
    }
    for (uint64_t j = 0; j < u.layers_per_block; ++j) {
      Resnet(b, fmt::format("{}.resnets.{}", m, j), j == 0 ? in : out, out, u.time_embed_dim);
    }
    if (i + 1 < n) Conv(b, m + ".downsamplers.0.conv", out, out, 3);
  }
}

void UpBlocks(ParamListBuilder& b, const UNetSpec& u) {
  const size_t n = u.block_out_channels.size();
  auto rev = [&](size_t i) { return u.block_out_channels[n - 1 - i]; };
  uint64_t out = rev(0);
  for (size_t i = 0; i < n && !b.overflowed(); ++i) {
    const uint64_t prev = out;
    out = rev(i);
    const uint64_t in = rev(std::min(i + 1, n - 1));
    const uint64_t resnets = u.layers_per_block + 1;
    const std::string m = fmt::format("up_blocks.{}", i);
    for (uint64_t j = 0; u.up_cross[i] && j < resnets; ++j) {
      SpatialTransformer(b, u, fmt::format("{}.attentions.{}", m, j), out,
                         u.transformer_layers[n - 1 - i]);
    }
    for (uint64_t j = 0; j < resnets; ++j) {
      const uint64_t skip = j + 1 == resnets ? in : out;
      Resnet(b, fmt::format("{}.resnets.{}", m, j), (j == 0 ? prev : out) + skip, out,
             u.time_embed_dim);
    }
    if (i + 1 < n) Conv(b, m + ".upsamplers.0.conv", out, out, 3);
  }
}

void BuildUNet(const ModelSpec& spec, const ArchDetails&, ParamListBuilder& b) {
  const UNetSpec& u = spec.unet;
  const uint64_t c0 = u.block_out_channels[0];
  Conv(b, "conv_in", c0, u.in_channels, 3);
  TimeMlp(b, "time_embedding", c0, u.time_embed_dim);
  if (u.text_time)
    TimeMlp(b, "add_embedding", u.projection_class_embeddings_input_dim, u.time_embed_dim);
  DownBlocks(b, u);
  UpBlocks(b, u);
  if (u.mid_block) {
    const uint64_t c = u.block_out_channels.back();
    SpatialTransformer(b, u, "mid_block.attentions.0", c, u.transformer_layers.back());
    Resnet(b, "mid_block.resnets.0", c, c, u.time_embed_dim);
    Resnet(b, "mid_block.resnets.1", c, c, u.time_embed_dim);
  }
  b.Norm("conv_norm_out", c0, true, -1);
  Conv(b, "conv_out", u.out_channels, c0, 3);
}

}  // namespace

const std::vector<Family>& DiffusersFamilies() {
  static const std::vector<Family> kFamilies = {{kUNetModelType, ReadUNet, BuildUNet}};
  return kFamilies;
}

}  // namespace vramscope::ingest
