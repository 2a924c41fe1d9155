#include "unet.h"

#include <fmt/format.h>

#include "attention.h"
#include "ops.h"
#include "unet_ops.h"

namespace vramscope::lower {

Result<UNetParams> IndexUNetParams(const ModelSpec& spec, std::vector<Param>& params) {
  UNetParams index;
  for (Param& p : params) {
    if (!p.name.empty()) index.emplace(p.name, &p);
  }
  for (const char* required : {"conv_in.weight", "time_embedding.linear_1.weight",
                               "conv_norm_out.weight", "conv_out.weight"}) {
    if (!index.contains(required)) {
      return MakeError(fmt::format("{}: the UNet's parameter list lacks {}", spec.name, required));
    }
  }
  return index;
}

Result<uint64_t> UNetLatentSide(const ModelSpec& spec, const TrainingSetup& setup) {
  const UNetSpec& u = spec.unet;
  if (setup.vae_scale == 0 || setup.vae_scale > 64) {
    return MakeError(fmt::format("--vae-scale: {} is outside 1..64", setup.vae_scale));
  }
  const uint64_t image = setup.image_size ? setup.image_size : u.sample_size * setup.vae_scale;
  const uint64_t factor = uint64_t{1} << (u.block_out_channels.size() - 1);
  // Without --image-size the side comes from the config: its key is named,
  // not a flag the user never typed.
  if (setup.image_size == 0 && (image > (uint64_t{1} << 16) || u.sample_size % factor != 0)) {
    return MakeError(fmt::format(
        "{}: sample_size: {} latents x {} pixels per latent = {} pixels {} (give --image-size)",
        spec.name, u.sample_size, setup.vae_scale, image,
        image > (uint64_t{1} << 16)
            ? std::string("is above the 65536 limit")
            : fmt::format("is not a multiple of {} (the UNet halves the latent {} times)", factor,
                          u.block_out_channels.size() - 1)));
  }
  if (image > (uint64_t{1} << 16)) {
    return MakeError(fmt::format("--image-size: {} pixels is above the 65536 limit", image));
  }
  if (image % setup.vae_scale != 0 || (image / setup.vae_scale) % factor != 0 || image == 0) {
    return MakeError(fmt::format(
        "--image-size: {} pixels must be a multiple of --vae-scale {} x {} (the UNet halves "
        "the latent {} times)",
        image, setup.vae_scale, factor, u.block_out_channels.size() - 1));
  }
  return image / setup.vae_scale;
}

namespace {

// The state one UNet forward threads through its blocks.
struct UNetRun {
  UNetRun(Tape& t, const UNetSpec& spec, UNetParams& p) : tape(t), u(spec), params(p) {}
  Tape& tape;
  const UNetSpec& u;
  UNetParams& params;
  uint64_t batch = 1;
  bool ckpt = false;
  Var temb;  // the time embedding (`emb`), every resnet's time input
  // Locals of UNet2DConditionModel.forward that live until it returns: t_emb
  // and (SDXL) aug_emb.
  Var t_emb, aug_emb;
  Var context;  // encoder_hidden_states [b, text_len, cross_attention_dim]
  uint64_t text_len = 77;

  Param& P(const std::string& name) { return *params.at(name); }
  Param* Bias(const std::string& module) {
    auto it = params.find(module + ".bias");
    return it == params.end() ? nullptr : it->second;
  }
  void Module(const std::string& path) { tape.SetModule(path); }
};

// TimestepEmbedding: linear_1, SiLU, linear_2.
Var TimeMlp(UNetRun& r, const std::string& m, const Var& x) {
  const uint64_t dim = r.u.time_embed_dim;
  r.Module(m + ".linear_1");
  Var h = Linear(r.tape, x, r.P(m + ".linear_1.weight"), r.Bias(m + ".linear_1"), r.batch, dim);
  r.Module(m + ".act");
  Var a = Silu(r.tape, h);
  r.tape.Drop(h);
  r.Module(m + ".linear_2");
  Var out = Linear(r.tape, a, r.P(m + ".linear_2.weight"), r.Bias(m + ".linear_2"), r.batch, dim);
  r.tape.Drop(a);
  return out;
}

// UNet2DConditionModel.get_time_embed + time_embedding (+ the SDXL text_time
// add_embedding, get_aug_embed): returns `emb`; t_emb (in the sample's dtype)
// and aug_emb stay in `r` as the forward's locals.
Var TimeEmbedding(UNetRun& r, uint8_t sample_bytes) {
  Tape& tape = r.tape;
  const uint64_t c0 = r.u.block_out_channels[0];
  r.Module("time_proj");
  Var t_emb_f32 = SinusoidalEmbedding(tape, r.batch, c0);
  // `t_emb = t_emb.to(dtype=sample.dtype)`; the local t_emb lives until forward returns.
  r.t_emb = Cast(tape, t_emb_f32, sample_bytes);
  tape.Drop(t_emb_f32);
  Var emb = TimeMlp(r, "time_embedding", r.t_emb);
  if (!r.u.text_time) return emb;
  // get_aug_embed "text_time": add_time_proj(time_ids.flatten()) reshaped to
  // [b, 6 * dim], torch.concat with text_embeds, .to(emb.dtype), add_embedding.
  const uint64_t atd = r.u.addition_time_embed_dim;
  const uint64_t text_dim = r.u.projection_class_embeddings_input_dim - 6 * atd;
  r.Module("add_time_proj");
  Var time_embeds = SinusoidalEmbedding(tape, r.batch * 6, atd);
  r.Module("");
  // fp32 time embeds promote the concatenation to fp32.
  Var add = tape.New(r.batch * (text_dim + 6 * atd), kF32, Category::kTemporaries, "aten::cat");
  tape.Drop(time_embeds);
  Var add_cast = Cast(tape, add, emb.elem_bytes);
  tape.Drop(add);
  r.aug_emb = TimeMlp(r, "add_embedding", add_cast);
  tape.Drop(add_cast);
  r.Module("");
  Var sum = Add(tape, emb, r.aug_emb);
  tape.Drop(emb);
  return sum;
}

// ResnetBlock2D.forward (resnet.py, time_embedding_norm "default",
// output_scale_factor 1): norm1, SiLU, conv1, + time_emb_proj(SiLU(temb)),
// norm2, SiLU, dropout, conv2, shortcut, (input + hidden) / scale. `x` stays
// the caller's.
Var Resnet(UNetRun& r, const std::string& m, const Var& x, uint64_t in_c, uint64_t out_c,
           uint64_t hw, bool checkpointed) {
  Tape& tape = r.tape;
  const uint64_t groups = r.u.norm_groups, b = r.batch;
  if (checkpointed) {
    tape.graph.BeginCheckpoint(/*reentrant=*/false);
    tape.graph.Keep(x.t);
    tape.graph.Keep(r.temb.t);
  }
  r.Module(m + ".norm1");
  Var h1 = GroupNorm(tape, x, r.P(m + ".norm1.weight"), r.P(m + ".norm1.bias"), b * groups);
  r.Module(m + ".nonlinearity");
  Var a1 = Silu(tape, h1);
  tape.Drop(h1);
  r.Module(m + ".conv1");
  Var c1 = Conv2d(tape, a1, r.P(m + ".conv1.weight"), r.Bias(m + ".conv1"), b * out_c * hw);
  tape.Drop(a1);
  r.Module(m + ".nonlinearity");
  Var ts = Silu(tape, r.temb);
  r.Module(m + ".time_emb_proj");
  Var tp =
      Linear(tape, ts, r.P(m + ".time_emb_proj.weight"), r.Bias(m + ".time_emb_proj"), b, out_c);
  tape.Drop(ts);
  r.Module(m);
  Var s = Add(tape, c1, tp);  // temb[:, :, None, None] broadcasts over H, W
  tape.Drop(c1);
  r.Module(m + ".norm2");
  Var h2 = GroupNorm(tape, s, r.P(m + ".norm2.weight"), r.P(m + ".norm2.bias"), b * groups);
  tape.Drop(s);
  r.Module(m + ".nonlinearity");
  Var a2 = Silu(tape, h2);
  tape.Drop(h2);
  r.Module(m + ".conv2");
  Var c2 = Conv2d(tape, a2, r.P(m + ".conv2.weight"), r.Bias(m + ".conv2"), b * out_c * hw);
  tape.Drop(a2);
  Var shortcut;
  if (in_c != out_c) {
    r.Module(m + ".conv_shortcut");
    shortcut = Conv2d(tape, x, r.P(m + ".conv_shortcut.weight"), r.Bias(m + ".conv_shortcut"),
                      b * out_c * hw);
  } else {
    shortcut = tape.Share(x);
  }
  r.Module(m);
  Var sum = Add(tape, shortcut, c2);
  Var out = DivScalar(tape, sum);  // / self.output_scale_factor
  // Returning drops the locals: temb's projection, conv2's output, the sum, the shortcut.
  tape.Drop(tp);
  tape.Drop(c2);
  tape.Drop(sum);
  tape.Drop(shortcut);
  if (checkpointed) tape.graph.EndCheckpoint();
  return out;
}

// A linear whose output gradient arrives with the channels-last strides of the
// permuted residual stream (conv projections): the folded matmul's backward
// copies it first (aten::clone, torch 2.13 CPU trace). A LoRA-wrapped linear
// ends in PEFT's sum, whose node is not the matmul: left out.
void CopiesItsGradientFirst(Tape& tape, const Var& out, const Param& weight, bool noncontiguous) {
  if (noncontiguous && weight.lora_a < 0 && out.fn != kNoNode) {
    tape.graph.Workspace(out.fn, out.bytes());
  }
}

// Attention with AttnProcessor2_0 (attention_processor.py): to_q on x, to_k /
// to_v on the context (x itself for self-attention), SDPA without a mask, to_out
// (Linear + Dropout(0)), / rescale_output_factor. Returns the division's result.
Var AttentionBlock(UNetRun& r, const std::string& m, const Var& x, const Var* context,
                   uint64_t tokens, uint64_t c, uint64_t heads, bool grad_noncontiguous) {
  Tape& tape = r.tape;
  const uint64_t kv_tokens = context ? r.batch * r.text_len : tokens;
  const Var& kv_in = context ? *context : x;
  r.Module(m + ".to_q");
  Var q = Linear(tape, x, r.P(m + ".to_q.weight"), nullptr, tokens, c);
  r.Module(m + ".to_k");
  Var k = Linear(tape, kv_in, r.P(m + ".to_k.weight"), nullptr, kv_tokens, c);
  r.Module(m + ".to_v");
  Var v = Linear(tape, kv_in, r.P(m + ".to_v.weight"), nullptr, kv_tokens, c);
  r.Module(m);
  TrainingSetup sdpa;
  sdpa.attn = Attention::kSdpa;
  sdpa.device_rules = tape.cpu_rules ? DeviceRules::kCpu : DeviceRules::kCuda;
  const AttnPlan plan = PlanAttention(sdpa, q.elem_bytes, heads, heads, false, 0);
  AttnShape shape{r.batch, tokens / r.batch, heads, heads, c / heads};
  shape.causal = false;
  Var o = Attend(tape, plan, shape, q, k, v, nullptr, 0);
  tape.Drop(q);
  tape.Drop(k);
  tape.Drop(v);
  r.Module(m + ".to_out.0");
  Param& w = r.P(m + ".to_out.0.weight");
  Var proj = Linear(tape, o, w, r.Bias(m + ".to_out.0"), tokens, c);
  CopiesItsGradientFirst(tape, proj, w, grad_noncontiguous);
  tape.Drop(o);
  r.Module(m);
  Var out = DivScalar(tape, proj);
  tape.Drop(proj);
  return out;
}

// FeedForward with GEGLU (attention.py, activations.py): proj to 2 x 4c,
// chunk, hidden * gelu(gate), Dropout(0), Linear back to c.
Var GegluFeedForward(UNetRun& r, const std::string& m, const Var& x, uint64_t tokens, uint64_t c,
                     bool grad_noncontiguous) {
  Tape& tape = r.tape;
  const uint64_t inner = 4 * c;
  r.Module(m + ".net.0.proj");
  Var proj =
      Linear(tape, x, r.P(m + ".net.0.proj.weight"), r.Bias(m + ".net.0.proj"), tokens, 2 * inner);
  r.Module(m + ".net.0");
  std::vector<Var> halves = Split(tape, proj, {tokens * inner, tokens * inner});
  tape.Drop(proj);
  Var g = Gelu(tape, halves[1]);
  Var act = Mul(tape, halves[0], g);
  tape.Drop(halves[0]);
  tape.Drop(halves[1]);
  tape.Drop(g);
  r.Module(m + ".net.2");
  Param& w = r.P(m + ".net.2.weight");
  Var out = Linear(tape, act, w, r.Bias(m + ".net.2"), tokens, c);
  CopiesItsGradientFirst(tape, out, w, grad_noncontiguous);
  tape.Drop(act);
  return out;
}

// BasicTransformerBlock.forward (attention.py, norm_type "layer_norm"):
// self-attention, cross-attention, feed-forward, each pre-normed and added to
// the residual. `x` stays the caller's.
Var TransformerBlock(UNetRun& r, const std::string& m, const Var& x, uint64_t tokens, uint64_t c,
                     uint64_t heads) {
  Tape& tape = r.tape;
  // With conv projections the residual stream's gradient comes back through
  // permute + contiguous: channels-last strides (see AttentionBlock).
  const bool noncontig = !r.u.linear_projection;
  if (r.ckpt) {
    tape.graph.BeginCheckpoint(/*reentrant=*/false);
    tape.graph.Keep(x.t);
    tape.graph.Keep(r.context.t);
  }
  r.Module(m + ".norm1");
  Var n1 = LayerNorm(tape, x, r.P(m + ".norm1.weight"), r.Bias(m + ".norm1"), tokens);
  Var attn1 = AttentionBlock(r, m + ".attn1", n1, nullptr, tokens, c, heads, noncontig);
  tape.Drop(n1);
  r.Module(m);
  Var h1 = Add(tape, attn1, x);
  r.Module(m + ".norm2");
  Var n2 = LayerNorm(tape, h1, r.P(m + ".norm2.weight"), r.Bias(m + ".norm2"), tokens);
  Var attn2 = AttentionBlock(r, m + ".attn2", n2, &r.context, tokens, c, heads, noncontig);
  tape.Drop(n2);
  tape.Drop(attn1);  // attn_output rebound
  r.Module(m);
  Var h2 = Add(tape, attn2, h1);
  tape.Drop(h1);
  r.Module(m + ".norm3");
  Var n3 = LayerNorm(tape, h2, r.P(m + ".norm3.weight"), r.Bias(m + ".norm3"), tokens);
  Var ff = GegluFeedForward(r, m + ".ff", n3, tokens, c, noncontig);
  tape.Drop(n3);
  r.Module(m);
  Var out = Add(tape, ff, h2);
  tape.Drop(h2);
  tape.Drop(attn2);
  tape.Drop(ff);
  if (r.ckpt) tape.graph.EndCheckpoint();
  return out;
}

// Transformer2DModel.forward on continuous inputs (transformer_2d.py): GroupNorm,
// proj_in (1x1 conv, or a Linear after the permute when use_linear_projection),
// the blocks, proj_out, + the residual. `x` stays the caller's.
Var SpatialTransformer(UNetRun& r, const std::string& m, const Var& x, uint64_t c, uint64_t hw,
                       uint64_t depth, uint64_t heads) {
  Tape& tape = r.tape;
  const uint64_t tokens = r.batch * hw;
  r.Module(m + ".norm");
  Var g =
      GroupNorm(tape, x, r.P(m + ".norm.weight"), r.P(m + ".norm.bias"), r.batch * r.u.norm_groups);
  r.Module(m + ".proj_in");
  Var h;
  if (r.u.linear_projection) {
    // The permuted [b, h*w, c] view is not contiguous: F.linear goes through
    // matmul, whose reshape copies it, then mm and an in-place bias add_.
    Var folded = Contiguous(tape, g);
    h = Linear(tape, folded, r.P(m + ".proj_in.weight"), r.Bias(m + ".proj_in"), tokens, c);
    tape.Drop(folded);
  } else {
    h = Conv2d(tape, g, r.P(m + ".proj_in.weight"), r.Bias(m + ".proj_in"), tokens * c);
  }
  tape.Drop(g);
  for (uint64_t i = 0; i < depth; ++i) {
    Var next =
        TransformerBlock(r, fmt::format("{}.transformer_blocks.{}", m, i), h, tokens, c, heads);
    tape.Drop(h);
    h = next;
  }
  r.Module(m + ".proj_out");
  Var out_proj;
  if (r.u.linear_projection) {
    Param& w = r.P(m + ".proj_out.weight");
    Var lin = Linear(tape, h, w, r.Bias(m + ".proj_out"), tokens, c);
    CopiesItsGradientFirst(tape, lin, w, /*noncontiguous=*/true);  // from the permute
    r.Module(m);
    out_proj = Contiguous(tape, lin);  // .permute(0, 3, 1, 2).contiguous()
    tape.Drop(lin);
  } else {
    r.Module(m);
    Var nchw = Contiguous(tape, h);  // reshape + permute(0, 3, 1, 2).contiguous()
    r.Module(m + ".proj_out");
    out_proj = Conv2d(tape, nchw, r.P(m + ".proj_out.weight"), r.Bias(m + ".proj_out"), tokens * c);
    tape.Drop(nchw);
  }
  r.Module(m);
  Var out = Add(tape, out_proj, x);
  tape.Drop(h);
  tape.Drop(out_proj);
  return out;
}

// The inputs of one training micro-batch, in the weight dtype the scripts give
// them (the frozen VAE's latents, the noise, the text encoder's states).
struct UNetInputs {
  Var sample, timesteps, context, target, text_embeds, time_ids;
};

UNetInputs MakeInputs(UNetRun& r, uint64_t latent, uint8_t bytes) {
  Tape& tape = r.tape;
  const UNetSpec& u = r.u;
  const uint64_t b = r.batch, hw = latent * latent;
  UNetInputs in;
  in.sample = tape.New(b * u.in_channels * hw, bytes, Category::kOther, "noisy_latents");
  in.timesteps = tape.New(b, kI64, Category::kOther, "timesteps");
  in.context = tape.New(b * r.text_len * u.cross_attention_dim, bytes, Category::kOther,
                        "encoder_hidden_states");
  in.target = tape.New(b * u.out_channels * hw, bytes, Category::kOther, "target");
  if (u.text_time) {
    const uint64_t text_dim =
        u.projection_class_embeddings_input_dim - 6 * u.addition_time_embed_dim;
    in.text_embeds = tape.New(b * text_dim, bytes, Category::kOther, "text_embeds");
    in.time_ids = tape.New(b * 6, bytes, Category::kOther, "time_ids");
  }
  return in;
}

void DropInputs(Tape& tape, UNetInputs& in) {
  for (Var* v :
       {&in.sample, &in.timesteps, &in.context, &in.target, &in.text_embeds, &in.time_ids}) {
    if (v->t != kNoTensor) tape.Drop(*v);
  }
}

// The down path: returns the last hidden state and appends every skip
// connection (down_block_res_samples) to `skips`.
Var DownPath(UNetRun& r, Var x, uint64_t latent, std::vector<Var>& skips) {
  const UNetSpec& u = r.u;
  const size_t n = u.block_out_channels.size();
  uint64_t side = latent, c = u.block_out_channels[0];
  for (size_t i = 0; i < n; ++i) {
    const std::string m = fmt::format("down_blocks.{}", i);
    // UNet2DConditionModel.forward's `sample` holds the block's input until it returns.
    Var block_input = r.tape.Share(x);
    const uint64_t in_c = c;
    c = u.block_out_channels[i];
    for (uint64_t j = 0; j < u.layers_per_block; ++j) {
      Var y = Resnet(r, fmt::format("{}.resnets.{}", m, j), x, j == 0 ? in_c : c, c, side * side,
                     r.ckpt);
      r.tape.Drop(x);
      x = y;
      if (u.down_cross[i]) {
        Var z = SpatialTransformer(r, fmt::format("{}.attentions.{}", m, j), x, c, side * side,
                                   u.transformer_layers[i], u.heads[i]);
        r.tape.Drop(x);
        x = z;
      }
      skips.push_back(r.tape.Share(x));
    }
    if (i + 1 < n) {
      side /= 2;
      r.Module(m + ".downsamplers.0.conv");
      Var y = Conv2d(r.tape, x, r.P(m + ".downsamplers.0.conv.weight"),
                     r.Bias(m + ".downsamplers.0.conv"), r.batch * c * side * side);
      r.tape.Drop(x);
      x = y;
      skips.push_back(r.tape.Share(x));
    }
    r.tape.Drop(block_input);
  }
  return x;
}

// UNetMidBlock2DCrossAttn: resnet, attention, resnet (only the second resnet is
// checkpointed).
Var MidBlock(UNetRun& r, Var x, uint64_t side) {
  const UNetSpec& u = r.u;
  const uint64_t c = u.block_out_channels.back(), hw = side * side;
  Var y = Resnet(r, "mid_block.resnets.0", x, c, c, hw, false);
  Var z = SpatialTransformer(r, "mid_block.attentions.0", y, c, hw, u.transformer_layers.back(),
                             u.heads.back());
  r.tape.Drop(y);
  Var out = Resnet(r, "mid_block.resnets.1", z, c, c, hw, r.ckpt);
  r.tape.Drop(z);
  r.tape.Drop(x);  // the caller's `sample`, until the block returns
  return out;
}

// One up block: per resnet, cat the last skip onto the channels, resnet,
// attention; then the upsampler. `skips` are this block's, consumed from the
// back; the caller drops the tuple after the block returns.
Var UpBlock(UNetRun& r, size_t i, Var x, uint64_t& side, std::vector<Var>& skips) {
  const UNetSpec& u = r.u;
  const size_t n = u.block_out_channels.size();
  const uint64_t out_c = u.block_out_channels[n - 1 - i];
  const std::string m = fmt::format("up_blocks.{}", i);
  const uint64_t hw = side * side;
  Var block_input = r.tape.Share(x);  // the caller's `sample`, until the block returns
  for (size_t j = 0; j < skips.size(); ++j) {
    const Var& skip = skips[skips.size() - 1 - j];
    r.Module(m);
    Var cat = CatChannels(r.tape, x, skip);
    r.tape.Drop(x);
    const uint64_t in_c = cat.numel / (r.batch * hw);
    x = Resnet(r, fmt::format("{}.resnets.{}", m, j), cat, in_c, out_c, hw, r.ckpt);
    r.tape.Drop(cat);
    if (u.up_cross[i]) {
      Var z = SpatialTransformer(r, fmt::format("{}.attentions.{}", m, j), x, out_c, hw,
                                 u.transformer_layers[n - 1 - i], u.heads[n - 1 - i]);
      r.tape.Drop(x);
      x = z;
    }
  }
  if (i + 1 < n) {
    r.Module(m + ".upsamplers.0");
    Var up = UpsampleNearest2x(r.tape, x);
    side *= 2;
    r.Module(m + ".upsamplers.0.conv");
    Var y = Conv2d(r.tape, up, r.P(m + ".upsamplers.0.conv.weight"),
                   r.Bias(m + ".upsamplers.0.conv"), r.batch * out_c * side * side);
    r.tape.Drop(up);
    r.tape.Drop(x);
    x = y;
  }
  r.tape.Drop(block_input);
  return x;
}

Var UpPath(UNetRun& r, Var x, uint64_t side, std::vector<Var>& skips) {
  const size_t n = r.u.block_out_channels.size();
  const size_t per_block = r.u.layers_per_block + 1;
  std::vector<Var> held;  // `res_samples` of the previous up block
  for (size_t i = 0; i < n; ++i) {
    std::vector<Var> block(skips.end() - static_cast<std::ptrdiff_t>(per_block), skips.end());
    skips.resize(skips.size() - per_block);
    for (Var& v : held) r.tape.Drop(v);  // rebinding `res_samples`
    held = block;
    Var y = UpBlock(r, i, x, side, held);
    x = y;
  }
  for (Var& v : held) r.tape.Drop(v);
  return x;
}

}  // namespace

ForwardOut UNetForward(Tape& tape, const ModelSpec& spec, UNetParams& params,
                       const TrainingSetup& setup) {
  const UNetSpec& u = spec.unet;
  UNetRun r(tape, u, params);
  r.batch = setup.batch;
  r.ckpt = setup.grad_ckpt != GradCkpt::kNone;
  r.text_len = TextLen(spec, setup);
  const uint64_t latent = *UNetLatentSide(spec, setup);
  // The scripts keep latents and text states in weight_dtype: half unless fp32.
  const uint8_t in_bytes = setup.precision == Precision::kFp32 ? kF32 : kHalf;
  tape.SetModule("");
  UNetInputs in = MakeInputs(r, latent, in_bytes);
  r.context = tape.Share(in.context);
  // Half inputs into an fp32 UNet outside autocast would fail in diffusers; the
  // model's dtype decides what t_emb is cast to (sample.dtype).
  r.temb = TimeEmbedding(r, in.sample.elem_bytes);
  r.Module("conv_in");
  Var x = Conv2d(tape, in.sample, r.P("conv_in.weight"), r.Bias("conv_in"),
                 r.batch * u.block_out_channels[0] * latent * latent);
  std::vector<Var> skips = {tape.Share(x)};
  x = DownPath(r, x, latent, skips);
  const uint64_t bottom = latent >> (u.block_out_channels.size() - 1);
  if (u.mid_block) x = MidBlock(r, x, bottom);
  x = UpPath(r, x, bottom, skips);
  r.Module("conv_norm_out");
  Var g = GroupNorm(tape, x, r.P("conv_norm_out.weight"), r.P("conv_norm_out.bias"),
                    r.batch * u.norm_groups);
  tape.Drop(x);
  r.Module("conv_act");
  Var a = Silu(tape, g);
  tape.Drop(g);
  r.Module("conv_out");
  Var pred = Conv2d(tape, a, r.P("conv_out.weight"), r.Bias("conv_out"),
                    r.batch * u.out_channels * latent * latent);
  tape.Drop(a);
  // Returning drops the forward's locals.
  for (Var* v : {&r.temb, &r.t_emb, &r.aug_emb, &r.context}) {
    if (v->t != kNoTensor) tape.Drop(*v);
  }
  tape.SetModule("");
  // Under mixed precision accelerate's prepare() wraps forward with
  // convert_outputs_to_fp32 (accelerate 1.15 utils/operations.py): the half
  // output is replaced by its fp32 copy as the forward returns.
  if (tape.autocast) {
    Var pred32 = Cast(tape, pred, kF32);
    tape.Drop(pred);
    pred = pred32;
  }
  // The script's `model_pred` lives past backward;
  // F.mse_loss(model_pred.float(), target.float(), reduction="mean").
  Var pred32 = Cast(tape, pred, kF32);
  Var target32 = Cast(tape, in.target, kF32);
  Var loss = MseLoss(tape, pred32, target32);
  tape.Drop(pred32);
  tape.Drop(target32);
  DropInputs(tape, in);
  ForwardOut out{loss, {}};
  out.held.push_back(pred);
  return out;
}

}  // namespace vramscope::lower
