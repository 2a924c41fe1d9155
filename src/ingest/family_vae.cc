// diffusers' AutoencoderKL (the VAE of Stable Diffusion 1.x / 2.x, SDXL and
// FLUX), from the vae/config.json diffusers writes beside the weights
// (`_class_name`, no model_type). Keys, defaults and module layout are those
// of diffusers 0.42.1 models/autoencoders/autoencoder_kl.py
// (AutoencoderKL.__init__), autoencoders/vae.py (Encoder, Decoder),
// unets/unet_2d_blocks.py (DownEncoderBlock2D, UpDecoderBlock2D, UNetMidBlock2D),
// resnet.py (ResnetBlock2D with temb_channels=None), downsampling.py /
// upsampling.py and attention_processor.py (Attention with group_norm and
// biased projections). The parameter order is named_parameters()'s: encoder
// (conv_in, down_blocks, mid_block, conv_norm_out, conv_out), decoder (conv_in,
// up_blocks, mid_block, conv_norm_out, conv_out: Decoder.__init__ assigns
// up_blocks before it builds mid_block), quant_conv, post_quant_conv; inside a
// mid block attentions before resnets. AutoencoderKL holds no buffers.
#include <fmt/format.h>

#include "families.h"

namespace vramscope::ingest {
namespace {

constexpr uint64_t kMaxVaeBlocks = 8;
constexpr uint64_t kMaxVaeLayers = 64;
constexpr uint64_t kMaxVaeChannels = 1 << 16;

// Every entry of `key` must be `only` (the one block type the lowering knows),
// one per block_out_channels entry.
void RequireBlockTypes(ConfigReader& r, std::string_view key, std::string_view only,
                       uint64_t blocks) {
  std::vector<std::string> types = r.StringList(key);
  if (!r.Has(key)) types.assign(1, std::string(only));  // the config class's default
  for (const std::string& t : types) {
    if (r.ok() && t != only) {
      r.Fail(key, fmt::format("{} is not lowered (only {})", common::QuoteForMessage(t), only));
    }
  }
  if (r.ok() && types.size() != blocks) {
    r.Fail(key,
           fmt::format("lists {} blocks for {} block_out_channels entries", types.size(), blocks));
  }
}

// Keys whose values select code paths the lowering does not model: refused
// by name rather than estimated wrongly.
void RefuseUnmodelledVae(ConfigReader& r) {
  const std::string act = r.String("act_fn", "silu");
  if (r.ok() && act != "silu") {
    r.Fail("act_fn",
           fmt::format("{} is not lowered yet (only silu)", common::QuoteForMessage(act)));
  }
  // Pipelines that read latents_mean / latents_std normalize per channel
  // (more ops than `* scaling_factor`): not the scripts modelled here.
  for (std::string_view key : {"latents_mean", "latents_std"}) {
    if (r.ok() && r.Has(key)) r.Fail(key, "is not lowered yet (only null / absent)");
  }
  if (r.ok() && r.IsArray("sample_size")) r.Fail("sample_size", "a list is not lowered yet");
}

void CheckVaeGroups(ConfigReader& r, const VaeSpec& v) {
  for (uint64_t c : v.block_out_channels) {
    if (r.ok() && c % v.norm_groups != 0) {
      r.Fail("block_out_channels",
             fmt::format("{} is not divisible by norm_num_groups {}", c, v.norm_groups));
    }
  }
}

void ReadVae(ConfigReader& r, ModelSpec& spec, ArchDetails&) {
  VaeSpec& v = spec.vae;
  spec.is_vae = true;
  spec.architecture = "AutoencoderKL";
  spec.torch_dtype = ReadTorchDtype(r);
  if (r.Has("block_out_channels"))
    v.block_out_channels = r.UintList("block_out_channels", kMaxVaeChannels);
  const uint64_t blocks = v.block_out_channels.size();
  if (r.ok() && (blocks == 0 || blocks > kMaxVaeBlocks)) {
    r.Fail("block_out_channels", fmt::format("needs 1 to {} blocks", kMaxVaeBlocks));
  }
  for (uint64_t c : v.block_out_channels) {
    if (r.ok() && c == 0) r.Fail("block_out_channels", "channels must be at least 1");
  }
  if (!r.ok()) return;
  RequireBlockTypes(r, "down_block_types", "DownEncoderBlock2D", blocks);
  RequireBlockTypes(r, "up_block_types", "UpDecoderBlock2D", blocks);
  v.in_channels = r.Uint("in_channels", 3, 1, 1024);
  v.out_channels = r.Uint("out_channels", 3, 1, 1024);
  v.layers_per_block = r.Uint("layers_per_block", 1, 1, kMaxVaeLayers);
  v.latent_channels = r.Uint("latent_channels", 4, 1, 1024);
  v.norm_groups = r.Uint("norm_num_groups", 32, 1, kMaxVaeChannels);
  v.sample_size = r.Uint("sample_size", 32, 1, 1 << 16);
  v.scaling_factor = r.Number("scaling_factor", 0.18215, -1e6, 1e6);
  v.has_shift_factor = r.Has("shift_factor");
  v.shift_factor = r.Number("shift_factor", 0, -1e6, 1e6);
  v.force_upcast = r.Bool("force_upcast", true);
  v.quant_conv = r.Bool("use_quant_conv", true);
  v.post_quant_conv = r.Bool("use_post_quant_conv", true);
  v.mid_attention = r.Bool("mid_block_add_attention", true);
  RefuseUnmodelledVae(r);
  if (!r.ok()) return;
  CheckVaeGroups(r, v);
  // Fields the shared code reads (`vramscope models`, the work budget): the
  // resnets of both halves count as layers.
  spec.hidden_size = v.block_out_channels.back();
  spec.num_heads = 1;
  spec.num_layers = blocks * (2 * v.layers_per_block + 1) + 4;
  spec.norm = NormKind::kLayerNorm;
}

// --- parameters -----------------------------------------------------------

void VaeConv(ParamListBuilder& b, const std::string& m, uint64_t out, uint64_t in, uint64_t k) {
  b.Tensor(m + ".weight", {out, in, k, k}, -1, m, ParamRole::kConv, false);
  b.Tensor(m + ".bias", {out}, -1, m, ParamRole::kBias, false);
}

// ResnetBlock2D(temb_channels=None): no time_emb_proj; a 1x1 conv_shortcut
// when the channels change.
void VaeResnet(ParamListBuilder& b, const std::string& m, uint64_t in, uint64_t out) {
  b.Norm(m + ".norm1", in, true, -1);
  VaeConv(b, m + ".conv1", out, in, 3);
  b.Norm(m + ".norm2", out, true, -1);
  VaeConv(b, m + ".conv2", out, out, 3);
  if (in != out) VaeConv(b, m + ".conv_shortcut", out, in, 1);
}

// UNetMidBlock2D: Attention(c, heads=1, dim_head=c, norm_num_groups, bias=True)
// between two resnets.
void VaeMidBlock(ParamListBuilder& b, const VaeSpec& v, const std::string& m) {
  const uint64_t c = v.block_out_channels.back();
  if (v.mid_attention) {
    const std::string a = m + ".attentions.0";
    b.Norm(a + ".group_norm", c, true, -1);
    b.Linear(a + ".to_q", c, c, true, -1, ParamRole::kQ);
    b.Linear(a + ".to_k", c, c, true, -1, ParamRole::kK);
    b.Linear(a + ".to_v", c, c, true, -1, ParamRole::kV);
    b.Linear(a + ".to_out.0", c, c, true, -1, ParamRole::kO);
  }
  VaeResnet(b, m + ".resnets.0", c, c);
  VaeResnet(b, m + ".resnets.1", c, c);
}

void VaeEncoder(ParamListBuilder& b, const VaeSpec& v) {
  const size_t n = v.block_out_channels.size();
  uint64_t out = v.block_out_channels[0];
  VaeConv(b, "encoder.conv_in", out, v.in_channels, 3);
  for (size_t i = 0; i < n && !b.overflowed(); ++i) {
    const uint64_t in = out;
    out = v.block_out_channels[i];
    const std::string m = fmt::format("encoder.down_blocks.{}", i);
    for (uint64_t j = 0; j < v.layers_per_block; ++j) {
      VaeResnet(b, fmt::format("{}.resnets.{}", m, j), j == 0 ? in : out, out);
    }
    if (i + 1 < n) VaeConv(b, m + ".downsamplers.0.conv", out, out, 3);
  }
  VaeMidBlock(b, v, "encoder.mid_block");
  b.Norm("encoder.conv_norm_out", out, true, -1);
  VaeConv(b, "encoder.conv_out", 2 * v.latent_channels, out, 3);  // double_z
}

void VaeDecoder(ParamListBuilder& b, const VaeSpec& v) {
  const size_t n = v.block_out_channels.size();
  auto rev = [&](size_t i) { return v.block_out_channels[n - 1 - i]; };
  VaeConv(b, "decoder.conv_in", rev(0), v.latent_channels, 3);
  uint64_t out = rev(0);
  for (size_t i = 0; i < n && !b.overflowed(); ++i) {
    const uint64_t prev = out;
    out = rev(i);
    const std::string m = fmt::format("decoder.up_blocks.{}", i);
    for (uint64_t j = 0; j <= v.layers_per_block; ++j) {  // layers_per_block + 1 resnets
      VaeResnet(b, fmt::format("{}.resnets.{}", m, j), j == 0 ? prev : out, out);
    }
    if (i + 1 < n) VaeConv(b, m + ".upsamplers.0.conv", out, out, 3);
  }
  VaeMidBlock(b, v, "decoder.mid_block");
  b.Norm("decoder.conv_norm_out", v.block_out_channels[0], true, -1);
  VaeConv(b, "decoder.conv_out", v.out_channels, v.block_out_channels[0], 3);
}

void BuildVae(const ModelSpec& spec, const ArchDetails&, ParamListBuilder& b) {
  const VaeSpec& v = spec.vae;
  VaeEncoder(b, v);
  VaeDecoder(b, v);
  const uint64_t l = v.latent_channels;
  if (v.quant_conv) VaeConv(b, "quant_conv", 2 * l, 2 * l, 1);
  if (v.post_quant_conv) VaeConv(b, "post_quant_conv", l, l, 1);
}

}  // namespace

const std::vector<Family>& VaeFamilies() {
  static const std::vector<Family> kFamilies = {{kVaeModelType, ReadVae, BuildVae}};
  return kFamilies;
}

}  // namespace vramscope::ingest
