#include "vae.h"

#include <fmt/format.h>

#include "attention.h"
#include "ops.h"
#include "unet_ops.h"

// The encode follows diffusers 0.42.1 models/autoencoders/autoencoder_kl.py
// (AutoencoderKL.encode / _encode), autoencoders/vae.py (Encoder.forward,
// DiagonalGaussianDistribution), unets/unet_2d_blocks.py (DownEncoderBlock2D,
// UNetMidBlock2D), resnet.py (ResnetBlock2D), downsampling.py (Downsample2D)
// and attention_processor.py (AttnProcessor2_0). Every lifetime below is
// that of a torch 2.13 CPU trace of the real encode (tools/reference/vsref/
// unet.py's VAE points): a caller's reference keeps a block's input until the
// block returns, and a function's locals go as it returns.
namespace vramscope::lower {
namespace {

struct VaeRun {
  VaeRun(Tape& t, VaeWeights& weights) : tape(t), w(weights), v(weights.spec->vae) {}
  Tape& tape;
  VaeWeights& w;
  const VaeSpec& v;
  uint64_t b = 1;

  Param& P(const std::string& name) { return *w.index.at(name); }
  Param* Bias(const std::string& module) {
    auto it = w.index.find(module + ".bias");
    return it == w.index.end() ? nullptr : it->second;
  }
  void Module(const std::string& path) { tape.SetModule("vae." + path); }
  Var Conv(const std::string& m, const Var& x, uint64_t out_numel) {
    Module(m);
    return Conv2d(tape, x, P(m + ".weight"), Bias(m), out_numel);
  }
  Var Norm(const std::string& m, const Var& x) {
    Module(m);
    return GroupNorm(tape, x, P(m + ".weight"), P(m + ".bias"), b * v.norm_groups);
  }
};

// ResnetBlock2D.forward with temb None: norm1, SiLU, conv1, norm2, SiLU,
// dropout (p 0: the input itself), conv2, the 1x1 conv_shortcut when the
// channels change, (input + hidden) / output_scale_factor (a new tensor even
// for 1). `x` stays the caller's.
Var Resnet(VaeRun& r, const std::string& m, const Var& x, uint64_t out_c, uint64_t hw) {
  Tape& tape = r.tape;
  Var h1 = r.Norm(m + ".norm1", x);
  r.Module(m + ".nonlinearity");
  Var a1 = Silu(tape, h1);
  tape.Drop(h1);
  Var c1 = r.Conv(m + ".conv1", a1, r.b * out_c * hw);
  tape.Drop(a1);
  Var h2 = r.Norm(m + ".norm2", c1);
  tape.Drop(c1);
  r.Module(m + ".nonlinearity");
  Var a2 = Silu(tape, h2);
  tape.Drop(h2);
  Var c2 = r.Conv(m + ".conv2", a2, r.b * out_c * hw);
  tape.Drop(a2);
  const bool shortcut = r.w.index.contains(m + ".conv_shortcut.weight");
  Var input = shortcut ? r.Conv(m + ".conv_shortcut", x, r.b * out_c * hw) : tape.Share(x);
  r.Module(m);
  Var sum = Add(tape, input, c2);
  Var out = DivScalar(tape, sum);
  tape.Drop(sum);
  tape.Drop(c2);
  tape.Drop(input);
  return out;
}

// DownEncoderBlock2D.forward: the resnets, then Downsample2D (padding 0):
// F.pad(x, (0, 1, 0, 1)) to [c, s+1, s+1] and a stride-2 conv. `x` stays the
// caller's (Encoder.forward's `sample` until the block returns).
Var DownBlock(VaeRun& r, size_t i, const Var& x, uint64_t out_c, uint64_t& side) {
  Tape& tape = r.tape;
  const std::string m = fmt::format("encoder.down_blocks.{}", i);
  Var h = tape.Share(x);
  for (uint64_t j = 0; j < r.v.layers_per_block; ++j) {
    Var y = Resnet(r, fmt::format("{}.resnets.{}", m, j), h, out_c, side * side);
    tape.Drop(h);
    h = y;
  }
  if (i + 1 == r.v.block_out_channels.size()) return h;
  r.Module(m + ".downsamplers.0");
  Var padded = tape.New(r.b * out_c * (side + 1) * (side + 1), h.elem_bytes, Category::kTemporaries,
                        "aten::constant_pad_nd");
  side /= 2;
  Var down = r.Conv(m + ".downsamplers.0.conv", padded, r.b * out_c * side * side);
  tape.Drop(padded);
  tape.Drop(h);
  return down;
}

// to_q / to_k / to_v on the group norm's output seen as [b, h*w, c]
// (`.transpose(1, 2)` of a contiguous [b, c, h*w]): torch 2.13's linear
// (aten/src/ATen/native/Linear.cpp) sends a non-contiguous 3-D input through
// matmul, which does not fold it (aten::bmm), then adds the bias in place
// (`output.add_(bias)`) unless isTensorSubclassLike, which any
// TorchDispatchMode makes true (TensorSubclassLikeUtils.h): under the trace
// recorder the sum is a new tensor (at::add).
Var ProjectTransposed(VaeRun& r, const std::string& m, uint64_t tokens, uint64_t c, uint8_t bytes) {
  r.Module(m);
  Var out = r.tape.New(tokens * c, bytes, Category::kTemporaries, "aten::bmm");
  if (!r.tape.graph.under_dispatch_mode) return out;
  Var sum = r.tape.New(tokens * c, bytes, Category::kTemporaries, "aten::add");
  r.tape.Drop(out);
  return sum;
}

// Attention (heads 1 of dim c, group_norm, residual_connection) through
// AttnProcessor2_0: group norm, q / k / v, SDPA, to_out (its input is
// contiguous: addmm), + residual, / rescale_output_factor. The processor's
// locals (the normed input, q, k, v) go as it returns. `x` stays the caller's.
Var MidAttention(VaeRun& r, const std::string& m, const Var& x, uint64_t c, uint64_t hw) {
  Tape& tape = r.tape;
  const uint64_t tokens = r.b * hw;
  Var g = r.Norm(m + ".group_norm", x);
  Var q = ProjectTransposed(r, m + ".to_q", tokens, c, x.elem_bytes);
  Var k = ProjectTransposed(r, m + ".to_k", tokens, c, x.elem_bytes);
  Var v = ProjectTransposed(r, m + ".to_v", tokens, c, x.elem_bytes);
  r.Module(m);
  TrainingSetup sdpa;
  sdpa.attn = Attention::kSdpa;
  sdpa.device_rules = tape.cpu_rules ? DeviceRules::kCpu : DeviceRules::kCuda;
  const AttnPlan plan = PlanAttention(sdpa, q.elem_bytes, 1, 1, false, 0);
  AttnShape shape{r.b, hw, 1, 1, c};
  shape.causal = false;
  Var o = Attend(tape, plan, shape, q, k, v, nullptr, 0);
  r.Module(m + ".to_out.0");
  Var proj = Linear(tape, o, r.P(m + ".to_out.0.weight"), r.Bias(m + ".to_out.0"), tokens, c);
  tape.Drop(o);
  r.Module(m);
  Var sum = Add(tape, proj, x);
  tape.Drop(proj);
  Var out = DivScalar(tape, sum);
  for (Var* t : {&sum, &g, &q, &k, &v}) tape.Drop(*t);
  return out;
}

// UNetMidBlock2D.forward: resnet, attention, resnet. `x` stays the caller's.
Var MidBlock(VaeRun& r, const Var& x, uint64_t side) {
  const uint64_t c = r.v.block_out_channels.back(), hw = side * side;
  Var h = Resnet(r, "encoder.mid_block.resnets.0", x, c, hw);
  if (r.v.mid_attention) {
    Var a = MidAttention(r, "encoder.mid_block.attentions.0", h, c, hw);
    r.tape.Drop(h);
    h = a;
  }
  Var out = Resnet(r, "encoder.mid_block.resnets.1", h, c, hw);
  r.tape.Drop(h);
  return out;
}

// Encoder.forward and quant_conv: the moments [b, 2 x latent_channels, s, s].
// `x` stays the caller's.
Var Encoder(VaeRun& r, const Var& x, uint64_t image) {
  Tape& tape = r.tape;
  uint64_t side = image;
  const std::vector<uint64_t>& chans = r.v.block_out_channels;
  Var sample = r.Conv("encoder.conv_in", x, r.b * chans[0] * side * side);
  for (size_t i = 0; i < chans.size(); ++i) {
    Var next = DownBlock(r, i, sample, chans[i], side);
    tape.Drop(sample);
    sample = next;
  }
  Var mid = MidBlock(r, sample, side);
  tape.Drop(sample);
  Var normed = r.Norm("encoder.conv_norm_out", mid);
  tape.Drop(mid);
  r.Module("encoder.conv_act");
  Var act = Silu(tape, normed);
  tape.Drop(normed);
  const uint64_t moments = r.b * 2 * r.v.latent_channels * side * side;
  Var enc = r.Conv("encoder.conv_out", act, moments);
  tape.Drop(act);
  if (!r.v.quant_conv) return enc;
  Var quant = r.Conv("quant_conv", enc, moments);
  tape.Drop(enc);
  return quant;
}

// DiagonalGaussianDistribution(moments): mean and logvar are chunks (views);
// clamp(logvar), exp(0.5 * logvar) (std), exp(logvar) (var).
struct Posterior {
  Var moments, logvar, std_dev, var;
};

Posterior MakePosterior(Tape& tape, Var moments) {
  const uint64_t half = moments.numel / 2;
  auto make = [&](std::string_view op) {
    return tape.New(half, moments.elem_bytes, Category::kTemporaries, op);
  };
  tape.SetModule("vae");
  Posterior p;
  p.moments = moments;
  p.logvar = make("aten::clamp");
  Var half_logvar = make("aten::mul");
  p.std_dev = make("aten::exp");
  tape.Drop(half_logvar);
  p.var = make("aten::exp");
  return p;
}

// .sample(): randn_tensor like the mean, std * noise, mean + that. The
// posterior goes as the script's statement ends; returns the sample.
Var SamplePosterior(Tape& tape, Posterior& p) {
  const uint64_t half = p.moments.numel / 2;
  auto make = [&](std::string_view op) {
    return tape.New(half, p.moments.elem_bytes, Category::kTemporaries, op);
  };
  Var noise = make("aten::randn");
  Var scaled = make("aten::mul");
  Var sample = make("aten::add");
  for (Var* t : {&scaled, &noise, &p.moments, &p.logvar, &p.std_dev, &p.var}) tape.Drop(*t);
  return sample;
}

}  // namespace

Status PlaceVaeWeights(Tape& tape, const ModelSpec& vae, const TrainingSetup& setup,
                       VaeWeights* out) {
  VaeWeights& w = *out;
  w.spec = &vae;
  // weight_dtype: fp32, or the half type of mixed precision.
  const uint8_t bytes = setup.precision == Precision::kFp32 ? kF32 : kHalf;
  w.params.reserve(vae.params.size());
  for (const ParamTensor& pt : vae.params) {
    Param p;
    p.name = pt.name;
    p.module = tape.out()->Intern("vae." + pt.module);
    p.numel = pt.numel;
    p.elem_bytes = bytes;
    p.storage_bytes = pt.numel * bytes;
    p.trainable = false;
    p.var.numel = pt.numel;
    p.var.elem_bytes = bytes;
    p.var.t = tape.graph.Alloc(p.storage_bytes, Category::kParameters, "vae.to", p.module);
    w.params.push_back(std::move(p));
  }
  for (Param& p : w.params) w.index.emplace(p.name, &p);
  for (const char* required :
       {"encoder.conv_in.weight", "encoder.conv_norm_out.weight", "encoder.conv_out.weight"}) {
    if (!w.index.contains(required)) {
      return MakeError(fmt::format("{}: the VAE's parameter list lacks {}", vae.name, required));
    }
  }
  return Ok{};
}

Var MakePixelValues(Tape& tape, const VaeWeights& vae, const TrainingSetup& setup, uint64_t image) {
  tape.SetModule("batch");
  return tape.New(setup.batch * vae.spec->vae.in_channels * image * image, kF32, Category::kOther,
                  "pixel_values");
}

Var VaeEncode(Tape& tape, VaeWeights& vae, const TrainingSetup& setup, VaeScript script,
              const Var& pixels, uint64_t image, std::vector<Var>* held) {
  VaeRun r(tape, vae);
  r.b = setup.batch;
  // accelerate's autocast wraps the prepared denoiser's forward only.
  const bool autocast = tape.autocast;
  tape.autocast = false;
  const uint8_t bytes = vae.params.front().elem_bytes;
  tape.SetModule("vae");
  Var input = Cast(tape, pixels, bytes);
  if (script == VaeScript::kDreamboothFlux) held->push_back(tape.Share(input));
  Posterior posterior = MakePosterior(tape, Encoder(r, input, image));
  tape.Drop(input);  // AutoencoderKL.encode returns: its argument goes
  Var sample = SamplePosterior(tape, posterior);
  tape.SetModule("");
  Var latents;
  if (script == VaeScript::kDreamboothFlux) {
    // (model_input - shift_factor) * scaling_factor; `.to(weight_dtype)` is the
    // VAE's own dtype already.
    Var shifted = UnaryOp(tape, sample, "aten::sub", "SubBackward1", false);
    latents = Scale(tape, shifted);
    tape.Drop(shifted);
  } else {
    latents = Scale(tape, sample);  // latents * scaling_factor
  }
  tape.Drop(sample);
  tape.autocast = autocast;
  return latents;
}

}  // namespace vramscope::lower
