#include "flux.h"

#include <fmt/format.h>

#include "attention.h"
#include "ops.h"
#include "unet_ops.h"

namespace vramscope::lower {

// The dreambooth scripts' --resolution default (train_dreambooth_flux.py,
// train_dreambooth_lora_flux.py, diffusers 0.42.1).
constexpr uint64_t kFluxDefaultImage = 512;
// Timesteps(num_channels=256) in CombinedTimestep*Embeddings (embeddings.py).
constexpr uint64_t kFluxTimeChannels = 256;

Result<FluxParams> IndexFluxParams(const ModelSpec& spec, std::vector<Param>& params) {
  FluxParams index;
  for (Param& p : params) {
    if (!p.name.empty()) index.emplace(p.name, &p);
  }
  for (const char* required : {"x_embedder.weight", "context_embedder.weight",
                               "time_text_embed.timestep_embedder.linear_1.weight",
                               "norm_out.linear.weight", "proj_out.weight"}) {
    if (!index.contains(required)) {
      return MakeError(
          fmt::format("{}: the FLUX transformer's parameter list lacks {}", spec.name, required));
    }
  }
  return index;
}

Result<uint64_t> FluxLatentSide(const TrainingSetup& setup) {
  if (setup.vae_scale == 0 || setup.vae_scale > 64) {
    return MakeError(fmt::format("--vae-scale: {} is outside 1..64", setup.vae_scale));
  }
  const uint64_t image = setup.image_size ? setup.image_size : kFluxDefaultImage;
  if (image > (uint64_t{1} << 16)) {
    return MakeError(fmt::format("--image-size: {} pixels is above the 65536 limit", image));
  }
  // FluxPipeline._pack_latents folds 2 x 2 latent pixels into one token.
  if (image == 0 || image % (2 * setup.vae_scale) != 0) {
    return MakeError(fmt::format(
        "--image-size: {} pixels must be a multiple of 2 x --vae-scale {} (the latents are "
        "packed 2 x 2 into tokens)",
        image, setup.vae_scale));
  }
  return image / setup.vae_scale;
}

namespace {

// The state one FLUX forward threads through its blocks.
struct FluxRun {
  FluxRun(Tape& t, const FluxSpec& spec, FluxParams& p) : tape(t), f(spec), params(p) {}
  Tape& tape;
  const FluxSpec& f;
  FluxParams& params;
  uint64_t b = 1, n = 1, t = 1, s = 2;  // batch, image tokens, text tokens, both
  uint64_t dim = 1, heads = 1, hd = 1;
  bool ckpt = false;
  bool fp16 = false;  // fp16 / fp16-mixed: the blocks clip their fp16 outputs
  // torch.nn.RMSNorm runs CUDA's fused kernel (torch >= 2.8), else the
  // composite rms_norm (the CPU traces).
  bool fused_rms_norm = false;
  AttnPlan plan;
  Var temb;      // the conditioning embedding every block reads
  Var cos, sin;  // FluxPosEmbed's freqs_cos / freqs_sin [s, head_dim] fp32

  Param& P(const std::string& name) { return *params.at(name); }
  Param* Bias(const std::string& module) {
    auto it = params.find(module + ".bias");
    return it == params.end() ? nullptr : it->second;
  }
  void Module(const std::string& path) { tape.SetModule(path); }
  Var Lin(const std::string& m, const Var& x, uint64_t tokens, uint64_t out) {
    Module(m);
    return Linear(tape, x, P(m + ".weight"), Bias(m), tokens, out);
  }
};

// TimestepEmbedding (linear_1, SiLU, linear_2) and PixArtAlphaTextProjection
// (linear_1, SiLU act_1, linear_2) alike.
Var TwoLinears(FluxRun& r, const std::string& m, const std::string& act, const Var& x) {
  Var h = r.Lin(m + ".linear_1", x, r.b, r.dim);
  r.Module(m + "." + act);
  Var a = Silu(r.tape, h);
  r.tape.Drop(h);
  Var out = r.Lin(m + ".linear_2", a, r.b, r.dim);
  r.tape.Drop(a);
  return out;
}

// time_proj (get_timestep_embedding, fp32), `.to(pooled_projection.dtype)`, an MLP.
Var TimeEmbedder(FluxRun& r, const std::string& m, const Var& steps, uint8_t pooled_bytes) {
  r.Module("time_text_embed.time_proj");
  Var proj = SinusoidalEmbedding(r.tape, r.b, kFluxTimeChannels, steps.elem_bytes != kF32);
  Var cast = Cast(r.tape, proj, pooled_bytes);
  r.tape.Drop(proj);
  Var emb = TwoLinears(r, m, "act", cast);
  r.tape.Drop(cast);
  return emb;
}

// FluxTransformer2DModel.forward's `timestep.to(hidden_states.dtype) * 1000`
// (and the guidance's), then CombinedTimestep(Guidance)TextProjEmbeddings:
// the timestep's and guidance's embeddings summed, plus the pooled text
// projection. The function's locals go as it returns.
Var TimeTextEmbed(FluxRun& r, const Var& timestep, const Var& guidance, const Var& pooled,
                  uint8_t x_bytes, std::vector<Var>& forward_locals) {
  Tape& tape = r.tape;
  r.Module("");
  Var t_cast = Cast(tape, timestep, x_bytes);
  Var t = Scale(tape, t_cast);
  tape.Drop(t_cast);
  forward_locals.push_back(t);
  Var g;
  if (r.f.guidance_embeds) {
    // The scripts' guidance is a [1] tensor expanded to the batch: .to() and
    // * 1000 make [b] tensors.
    Var expanded = tape.Share(guidance);
    expanded.numel = r.b;
    Var g_cast = Cast(tape, expanded, x_bytes);
    tape.Drop(expanded);
    g = Scale(tape, g_cast);
    tape.Drop(g_cast);
    forward_locals.push_back(g);
  }
  Var t_emb = TimeEmbedder(r, "time_text_embed.timestep_embedder", t, pooled.elem_bytes);
  Var sum = tape.Share(t_emb);
  Var g_emb;
  if (r.f.guidance_embeds) {
    g_emb = TimeEmbedder(r, "time_text_embed.guidance_embedder", g, pooled.elem_bytes);
    r.Module("time_text_embed");
    tape.Drop(sum);
    sum = Add(tape, t_emb, g_emb);
  }
  Var text = TwoLinears(r, "time_text_embed.text_embedder", "act_1", pooled);
  r.Module("time_text_embed");
  Var conditioning = Add(tape, sum, text);
  for (Var* v : {&t_emb, &g_emb, &sum, &text}) {
    if (v->t != kNoTensor) tape.Drop(*v);
  }
  return conditioning;
}

// FluxPosEmbed.forward over cat(txt_ids, img_ids): per axis,
// get_1d_rotary_pos_embed (float64 on CPU and CUDA: maybe_adjust_dtype_for_device)
// makes the outer product of positions and frequencies, cos / sin,
// repeat_interleave(2) (a clone) and .float(); then torch.cat of the three
// axes' cos and of their sin. Returns freqs_cos in r.cos and freqs_sin in r.sin.
void PosEmbed(FluxRun& r, const Var& ids) {
  Tape& tape = r.tape;
  r.Module("pos_embed");
  Var pos = Cast(tape, ids, kF32);  // ids.float()
  constexpr uint8_t kF64 = 8;
  std::vector<Var> parts;
  for (uint64_t d : r.f.axes_dims_rope) {
    // freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: dim // 2] / dim)): [d / 2] temporaries.
    Var arange = tape.New(d / 2, kF64, Category::kTemporaries, "aten::arange");
    Var ratio = tape.New(d / 2, kF64, Category::kTemporaries, "aten::div");
    tape.Drop(arange);
    Var power = tape.New(d / 2, kF64, Category::kTemporaries, "aten::pow");
    tape.Drop(ratio);
    Var inverse = tape.New(d / 2, kF64, Category::kTemporaries, "aten::reciprocal");
    Var scaled = tape.New(d / 2, kF64, Category::kTemporaries, "aten::mul");
    tape.Drop(power);
    tape.Drop(inverse);
    Var base = tape.New(d / 2, kF64, Category::kTemporaries, "aten::div");  // / linear_factor
    tape.Drop(scaled);
    // torch.outer(pos, freqs)
    Var freqs = tape.New(r.s * d / 2, kF64, Category::kTemporaries, "aten::mul");
    tape.Drop(base);
    for (const char* op : {"aten::cos", "aten::sin"}) {
      Var trig = tape.New(r.s * d / 2, kF64, Category::kTemporaries, op);
      Var repeated = tape.New(r.s * d, kF64, Category::kTemporaries, "aten::clone");
      tape.Drop(trig);
      parts.push_back(tape.New(r.s * d, kF32, Category::kTemporaries, "aten::_to_copy"));
      if (std::string_view(op) == "aten::sin") tape.Drop(freqs);
      tape.Drop(repeated);
    }
  }
  r.cos = tape.New(r.s * r.hd, kF32, Category::kActivations, "aten::cat");
  r.sin = tape.New(r.s * r.hd, kF32, Category::kActivations, "aten::cat");
  for (Var& v : parts) tape.Drop(v);
  tape.Drop(pos);
}

// The AdaLayerNorm family's `emb = linear(silu(temb))` chunks, the
// LayerNorm without affine, and `norm(x) * (1 + scale[:, None]) + shift[:, None]`.
struct AdaNorm {
  Var x;                    // the modulated output
  Var emb;                  // linear's output, whose chunks (views) the caller uses
  std::vector<Var> chunks;  // views of emb, in chunk order
};

// `k` chunks; scale and shift are chunks `shift_at` and `shift_at + 1`
// (AdaLayerNormZero, AdaLayerNormZeroSingle: shift, scale, gate, ...), or the
// reverse for AdaLayerNormContinuous (scale, shift).
AdaNorm AdaLayerNorm(FluxRun& r, const std::string& m, const Var& x, uint64_t rows, uint64_t k,
                     bool scale_first) {
  Tape& tape = r.tape;
  r.Module(m + ".silu");
  Var act = Silu(tape, r.temb);
  AdaNorm out;
  out.emb = r.Lin(m + ".linear", act, r.b, k * r.dim);
  tape.Drop(act);
  r.Module(m);
  std::vector<uint64_t> sizes(k, r.b * r.dim);
  switch (k) {
    case 6:
      out.chunks =
          Split(tape, out.emb, {sizes[0], sizes[1], sizes[2], sizes[3], sizes[4], sizes[5]});
      break;
    case 3: out.chunks = Split(tape, out.emb, {sizes[0], sizes[1], sizes[2]}); break;
    default: out.chunks = Split(tape, out.emb, {sizes[0], sizes[1]}); break;
  }
  r.Module(m + ".norm");
  Var normed = LayerNorm(tape, x, nullptr, nullptr, rows);
  r.Module(m);
  const Var& scale = out.chunks[scale_first ? 0 : 1];
  const Var& shift = out.chunks[scale_first ? 1 : 0];
  Var one_plus = AddScalar(tape, scale);
  Var scaled = MulBroadcast(tape, normed, one_plus);
  tape.Drop(normed);
  tape.Drop(one_plus);
  out.x = Add(tape, scaled, shift);
  tape.Drop(scaled);
  return out;
}

void DropAdaNorm(Tape& tape, AdaNorm& a) {
  for (Var& v : a.chunks) tape.Drop(v);
  tape.Drop(a.emb);
}

// apply_rotary_emb(use_real=True, use_real_unbind_dim=-1, sequence_dim=1)
// (embeddings.py): x_rotated = stack([-x_imag, x_real]).flatten(3), then
// (x.float() * cos + x_rotated.float() * sin).to(x.dtype). The stack's
// backward hands x a new gradient (unbind's stack of the neg's gradient, a
// half-size transient, and a view of the other half).
Var Rotary(FluxRun& r, const Var& x) {
  Tape& tape = r.tape;
  Var neg = tape.New(x.numel / 2, x.elem_bytes, Category::kTemporaries, "aten::neg");
  Var stacked = tape.New(x.numel, x.elem_bytes, Category::kTemporaries, "aten::stack");
  if (tape.grad_enabled && x.requires_grad()) {
    NodeId n = tape.Node("StackBackward0", &stacked);
    tape.graph.Workspace(n, x.bytes() / 2);
    tape.graph.Edge(n, x, x.bytes());
  }
  tape.Drop(neg);
  Var xf = Cast(tape, x, kF32);
  Var a = Mul(tape, xf, r.cos);
  tape.Drop(xf);
  Var rf = Cast(tape, stacked, kF32);
  Var c = Mul(tape, rf, r.sin);
  tape.Drop(rf);
  Var sum = Add(tape, a, c);
  tape.Drop(a);
  tape.Drop(c);
  Var out = Cast(tape, sum, x.elem_bytes);
  tape.Drop(stacked);
  tape.Drop(sum);
  return out;
}

// A [b, tokens, dim] slice of the sequence dimension, as a view: `.contiguous()`
// copies it unless the batch is 1.
Var ContiguousPart(FluxRun& r, const Var& part) {
  return r.b > 1 ? Contiguous(r.tape, part) : r.tape.Share(part);
}

// FluxAttention with FluxAttnProcessor (transformer_flux.py): to_q / to_k /
// to_v (then add_q_proj / add_k_proj / add_v_proj on the text stream), the
// per-head RMSNorms, torch.cat([text, image]) of q, k and v, RoPE on q and k,
// dispatch_attention_fn's SDPA over the permuted views (no mask), and for the
// double blocks split_with_sizes back into the streams, to_out / to_add_out on
// contiguous copies. The text stream's q / k / v stay locals until the
// processor returns. `ctx` null: a single block's attention (pre_only), which
// returns the attention output itself; else `*ctx_out` receives to_add_out's.
Var JointAttention(FluxRun& r, const std::string& m, const Var& x, const Var* ctx, Var* ctx_out) {
  Tape& tape = r.tape;
  const uint64_t x_tokens = ctx ? r.b * r.n : r.b * r.s;
  Var q = r.Lin(m + ".to_q", x, x_tokens, r.dim);
  Var k = r.Lin(m + ".to_k", x, x_tokens, r.dim);
  Var v = r.Lin(m + ".to_v", x, x_tokens, r.dim);
  Var eq, ek, ev;
  if (ctx) {
    eq = r.Lin(m + ".add_q_proj", *ctx, r.b * r.t, r.dim);
    ek = r.Lin(m + ".add_k_proj", *ctx, r.b * r.t, r.dim);
    ev = r.Lin(m + ".add_v_proj", *ctx, r.b * r.t, r.dim);
  }
  auto norm = [&](const char* name, Var& y, uint64_t tokens) {
    r.Module(m + "." + name);
    Var out =
        TorchRmsNorm(tape, y, r.P(m + "." + name + ".weight"), tokens * r.heads, r.fused_rms_norm);
    tape.Drop(y);
    y = out;
  };
  norm("norm_q", q, x_tokens);
  norm("norm_k", k, x_tokens);
  r.Module(m);
  if (ctx) {
    norm("norm_added_q", eq, r.b * r.t);
    norm("norm_added_k", ek, r.b * r.t);
    r.Module(m);
    for (auto [text, image] : {std::pair{&eq, &q}, {&ek, &k}, {&ev, &v}}) {
      Var joined = CatChannels(tape, *text, *image);
      tape.Drop(*image);
      *image = joined;
    }
  }
  for (Var* y : {&q, &k}) {
    Var rotated = Rotary(r, *y);
    tape.Drop(*y);
    *y = rotated;
  }
  AttnShape shape{r.b, r.s, r.heads, r.heads, r.hd};
  shape.causal = false;
  Var o = Attend(tape, r.plan, shape, q, k, v, nullptr, 0);
  for (Var* y : {&q, &k, &v}) tape.Drop(*y);
  if (!ctx) return o;
  std::vector<Var> parts = Split(tape, o, {r.b * r.t * r.dim, r.b * r.n * r.dim});
  tape.Drop(o);
  Var image = ContiguousPart(r, parts[1]);
  Var out = r.Lin(m + ".to_out.0", image, r.b * r.n, r.dim);
  tape.Drop(image);
  r.Module(m);
  Var text = ContiguousPart(r, parts[0]);
  *ctx_out = r.Lin(m + ".to_add_out", text, r.b * r.t, r.dim);
  tape.Drop(text);
  for (Var* y : {&parts[0], &parts[1], &ev, &eq, &ek}) tape.Drop(*y);
  return out;
}

// FeedForward(activation_fn="gelu-approximate") (attention.py): GELU's proj,
// F.gelu(approximate="tanh") (one aten::gelu, which saves its input),
// Dropout(0), Linear back to dim.
Var FeedForward(FluxRun& r, const std::string& m, const Var& x, uint64_t tokens) {
  Var proj = r.Lin(m + ".net.0.proj", x, tokens, 4 * r.dim);
  r.Module(m + ".net.0");
  Var act = Gelu(r.tape, proj);
  r.tape.Drop(proj);
  Var out = r.Lin(m + ".net.2", act, tokens, r.dim);
  r.tape.Drop(act);
  return out;
}

void BeginBlock(FluxRun& r, const Var& a, const Var& b) {
  if (!r.ckpt) return;
  // diffusers' _gradient_checkpointing_func: torch.utils.checkpoint with
  // use_reentrant=False (ModelMixin.enable_gradient_checkpointing); the
  // recompute closure holds the block's arguments.
  r.tape.graph.BeginCheckpoint(/*reentrant=*/false);
  for (TensorId t : {a.t, b.t, r.temb.t, r.cos.t, r.sin.t}) r.tape.graph.Keep(t);
}

// `x.clip(-65504, 65504)` when x is fp16 (FluxTransformerBlock's text stream,
// FluxSingleTransformerBlock's output): a new tensor; ClampBackward1 saves x.
// Replaces *x (the old binding goes).
void ClipFp16(FluxRun& r, Var* x) {
  if (!r.fp16) return;
  Var clipped = UnaryOp(r.tape, *x, "aten::clamp", "ClampBackward1", false);
  r.tape.Drop(*x);
  *x = clipped;
}

// One stream's second half in FluxTransformerBlock.forward: `x + gate_msa *
// attn`, norm2, the modulation, the feed-forward, `+ gate_mlp * ff`. `mod`
// holds norm1's chunks (shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp,
// gate_mlp). `held` receives the locals that live until the block returns.
Var StreamTail(FluxRun& r, const std::string& m, const std::string& suffix, const Var& x,
               const Var& attn, const AdaNorm& mod, uint64_t tokens, std::vector<Var>& held) {
  Tape& tape = r.tape;
  r.Module(m);
  Var gated = MulBroadcast(tape, mod.chunks[2], attn);
  held.push_back(gated);
  Var h = Add(tape, x, gated);
  r.Module(m + ".norm2" + suffix);
  Var normed = LayerNorm(tape, h, nullptr, nullptr, tokens);
  r.Module(m);
  Var one_plus = AddScalar(tape, mod.chunks[4]);
  Var scaled = MulBroadcast(tape, normed, one_plus);
  tape.Drop(normed);
  tape.Drop(one_plus);
  Var modulated = Add(tape, scaled, mod.chunks[3]);
  tape.Drop(scaled);
  held.push_back(modulated);
  Var ff = FeedForward(r, m + ".ff" + suffix, modulated, tokens);
  r.Module(m);
  Var ff_gated = MulBroadcast(tape, mod.chunks[5], ff);
  Var out = Add(tape, h, ff_gated);
  tape.Drop(h);
  // The image stream rebinds ff_output to the gated product (a local); the
  // text stream's product is a temporary and context_ff_output the local.
  held.push_back(suffix.empty() ? ff_gated : ff);
  tape.Drop(suffix.empty() ? ff : ff_gated);
  return out;
}

// FluxTransformerBlock.forward: AdaLayerNormZero on each stream, the joint
// attention, each stream's tail. Returns (text, image).
std::pair<Var, Var> DoubleBlock(FluxRun& r, uint64_t i, const Var& hs, const Var& ehs) {
  Tape& tape = r.tape;
  const std::string m = fmt::format("transformer_blocks.{}", i);
  BeginBlock(r, hs, ehs);
  AdaNorm n1 = AdaLayerNorm(r, m + ".norm1", hs, r.b * r.n, 6, false);
  AdaNorm n1c = AdaLayerNorm(r, m + ".norm1_context", ehs, r.b * r.t, 6, false);
  Var ctx;
  Var attn = JointAttention(r, m + ".attn", n1.x, &n1c.x, &ctx);
  std::vector<Var> held;
  // norm_hidden_states is rebound by norm2's line, its context twin likewise.
  tape.Drop(n1.x);
  Var h = StreamTail(r, m, "", hs, attn, n1, r.b * r.n, held);
  tape.Drop(n1c.x);
  Var e = StreamTail(r, m, "_context", ehs, ctx, n1c, r.b * r.t, held);
  ClipFp16(r, &e);
  // Returning drops the locals: the attention outputs, the gated products,
  // the modulated inputs of the feed-forwards, norm1's chunks.
  for (Var& v : held) tape.Drop(v);
  tape.Drop(attn);
  tape.Drop(ctx);
  DropAdaNorm(tape, n1);
  DropAdaNorm(tape, n1c);
  if (r.ckpt) tape.graph.EndCheckpoint();
  return {e, h};
}

// hidden_states[:, :t] or [:, t:]: a view; SliceBackward0 makes a zero
// gradient of the whole tensor and copies the slice's into it.
Var SliceView(Tape& tape, const Var& whole, uint64_t numel) {
  Var v = tape.Share(whole);
  v.numel = numel;
  if (tape.grad_enabled && whole.requires_grad()) {
    NodeId n = tape.Node("SliceBackward0", &v);
    tape.graph.Edge(n, whole, whole.bytes());
  }
  return v;
}

// FluxSingleTransformerBlock.forward: cat([text, image]), AdaLayerNormZeroSingle,
// proj_mlp + GELU(tanh), the attention, cat([attn, mlp]), proj_out gated, the
// residual; returns the output's text and image slices (views).
std::pair<Var, Var> SingleBlock(FluxRun& r, uint64_t i, const Var& hs, const Var& ehs) {
  Tape& tape = r.tape;
  const std::string m = fmt::format("single_transformer_blocks.{}", i);
  BeginBlock(r, hs, ehs);
  r.Module(m);
  Var x = CatChannels(tape, ehs, hs);  // also `residual`
  AdaNorm mod = AdaLayerNorm(r, m + ".norm", x, r.b * r.s, 3, false);
  Var mlp_in = r.Lin(m + ".proj_mlp", mod.x, r.b * r.s, 4 * r.dim);
  r.Module(m + ".act_mlp");
  Var mlp = Gelu(tape, mlp_in);
  tape.Drop(mlp_in);
  Var attn = JointAttention(r, m + ".attn", mod.x, nullptr, nullptr);
  r.Module(m);
  Var joined = CatChannels(tape, attn, mlp);
  Var proj = r.Lin(m + ".proj_out", joined, r.b * r.s, r.dim);
  r.Module(m);
  // `hidden_states = gate * self.proj_out(hidden_states)`: the concatenation
  // is rebound once the product exists.
  Var gated = MulBroadcast(tape, mod.chunks[2], proj);
  tape.Drop(joined);
  tape.Drop(proj);
  Var y = Add(tape, x, gated);
  tape.Drop(gated);
  ClipFp16(r, &y);
  std::pair<Var, Var> out{SliceView(tape, y, r.b * r.t * r.dim),
                          SliceView(tape, y, r.b * r.n * r.dim)};
  for (Var* v : {&y, &mod.x, &mlp, &attn, &x}) tape.Drop(*v);
  DropAdaNorm(tape, mod);
  if (r.ckpt) tape.graph.EndCheckpoint();
  return out;
}

// The scripts' loss on the unpacked prediction:
// torch.mean((weighting.float() * (model_pred.float() - target.float()) ** 2)
// .reshape(b, -1), 1).mean(). PowBackward0 saves the difference; its backward
// makes two full-size temporaries beside its result.
Var FlowMatchingLoss(Tape& tape, const Var& pred, const Var& target, const Var& weighting,
                     uint64_t batch) {
  Var p = Cast(tape, pred, kF32);
  Var t = Cast(tape, target, kF32);
  Var diff = tape.New(p.numel, kF32, Category::kLoss, "aten::sub");
  if (tape.grad_enabled && p.requires_grad()) {
    NodeId n = tape.Node("SubBackward0", &diff);
    tape.graph.EdgePass(n, p);
  }
  tape.Drop(p);
  tape.Drop(t);
  Var sq = tape.New(diff.numel, kF32, Category::kTemporaries, "aten::pow");
  if (tape.grad_enabled && diff.requires_grad()) {
    NodeId n = tape.Node("PowBackward0", &sq);
    tape.graph.Save(n, diff.t);
    tape.graph.Workspace(n, diff.bytes());
    tape.graph.Workspace(n, diff.bytes());
    tape.graph.Edge(n, diff, diff.bytes());
  }
  tape.Drop(diff);
  Var w = Cast(tape, weighting, kF32);
  Var weighted = Mul(tape, w, sq);
  tape.Drop(w);
  tape.Drop(sq);
  Var per_sample = tape.New(batch, kF32, Category::kTemporaries, "aten::mean");
  if (tape.grad_enabled && weighted.requires_grad()) {
    NodeId n = tape.Node("MeanBackward1", &per_sample);
    tape.graph.Edge(n, weighted, weighted.bytes());
  }
  tape.Drop(weighted);
  Var loss = tape.New(1, kF32, Category::kLoss, "aten::mean");
  if (tape.grad_enabled && per_sample.requires_grad()) {
    NodeId n = tape.Node("MeanBackward0", &loss);
    tape.graph.Edge(n, per_sample, per_sample.bytes());
  }
  tape.Drop(per_sample);
  return loss;
}

}  // namespace

std::vector<Var> MakeFluxBatch(Tape& tape, const ModelSpec& spec, const TrainingSetup& setup,
                               bool pooled_from_encoder, bool states_from_encoder) {
  const FluxSpec& f = spec.flux;
  const uint64_t b = setup.batch, side = *FluxLatentSide(setup);
  const uint64_t n = (side / 2) * (side / 2), t = TextLen(spec, setup);
  // The scripts keep latents, text states and ids in weight_dtype (half unless
  // fp32); the scheduler's timesteps and the guidance scale are fp32.
  const uint8_t bytes = setup.precision == Precision::kFp32 ? kF32 : kHalf;
  tape.SetModule("batch");
  auto make = [&](uint64_t numel, uint8_t elem, std::string_view op) {
    return tape.New(numel, elem, Category::kOther, op);
  };
  std::vector<Var> batch = {make(b * n * f.in_channels, bytes, "packed_noisy_model_input"),
                            make(b, kF32, "timesteps"),
                            make(1, kF32, "guidance")};  // torch.tensor([scale]).expand(b)
  batch.push_back(pooled_from_encoder
                      ? Var{}
                      : make(b * f.pooled_projection_dim, bytes, "pooled_prompt_embeds"));
  batch.push_back(
      states_from_encoder ? Var{} : make(b * t * f.joint_attention_dim, bytes, "prompt_embeds"));
  for (Var v : {make(t * 3, bytes, "text_ids"), make(n * 3, bytes, "latent_image_ids"),
                make(b * n * f.in_channels, bytes, "target"), make(b, bytes, "weighting")})
    batch.push_back(v);
  return batch;
}

namespace {

// The blocks over the image stream `x` and the text stream `ctx` (both
// consumed); returns the last single block's image slice, and the text one in
// `*ctx`.
Var Blocks(FluxRun& r, Var x, Var* ctx) {
  Tape& tape = r.tape;
  for (uint64_t i = 0; i < r.f.num_layers; ++i) {
    auto [e, h] = DoubleBlock(r, i, x, *ctx);
    tape.Drop(x);  // the loop rebinds both streams after the block returns
    tape.Drop(*ctx);
    x = h;
    *ctx = e;
  }
  for (uint64_t i = 0; i < r.f.num_single_layers; ++i) {
    auto [e, h] = SingleBlock(r, i, x, *ctx);
    tape.Drop(x);
    tape.Drop(*ctx);
    x = h;
    *ctx = e;
  }
  return x;
}

}  // namespace

ForwardOut FluxForward(Tape& tape, const ModelSpec& spec, FluxParams& params,
                       const TrainingSetup& setup, const std::vector<Var>& batch) {
  FluxRun r(tape, spec.flux, params);
  const uint64_t side = *FluxLatentSide(setup);
  r.b = setup.batch;
  r.n = (side / 2) * (side / 2);
  r.t = TextLen(spec, setup);
  r.s = r.n + r.t;
  r.dim = spec.hidden_size;
  r.heads = spec.flux.num_attention_heads;
  r.hd = spec.flux.attention_head_dim;
  r.ckpt = setup.grad_ckpt != GradCkpt::kNone;
  r.fp16 = setup.precision == Precision::kFp16 || setup.precision == Precision::kFp16Mixed;
  r.fused_rms_norm = !tape.cpu_rules && setup.torch_version >= 208;
  Var x = r.Lin("x_embedder", batch[0], r.b * r.n, r.dim);
  // SDPA through dispatch_attention_fn's native backend, in the compute dtype.
  TrainingSetup sdpa;
  sdpa.attn = Attention::kSdpa;
  sdpa.device_rules = tape.cpu_rules ? DeviceRules::kCpu : DeviceRules::kCuda;
  r.plan = PlanAttention(sdpa, x.elem_bytes, r.heads, r.heads, false, 0);
  std::vector<Var> locals;  // FluxTransformer2DModel.forward's, until it returns
  r.temb = TimeTextEmbed(r, batch[1], batch[2], batch[3], x.elem_bytes, locals);
  Var ctx = r.Lin("context_embedder", batch[4], r.b * r.t, r.dim);
  r.Module("");
  // ids = torch.cat((txt_ids, img_ids), dim=0)
  locals.push_back(tape.New(r.s * 3, batch[5].elem_bytes, Category::kTemporaries, "aten::cat"));
  PosEmbed(r, locals.back());
  Var h = Blocks(r, x, &ctx);
  // norm_out (AdaLayerNormContinuous: scale, shift; its linear's output is not
  // saved and goes as it returns), proj_out.
  AdaNorm out = AdaLayerNorm(r, "norm_out", h, r.b * r.n, 2, true);
  DropAdaNorm(tape, out);
  tape.Drop(h);
  Param& proj_w = r.P("proj_out.weight");
  Var pred = r.Lin("proj_out", out.x, r.b * r.n, r.f.out_channels);
  tape.Drop(out.x);
  // The unpacked prediction's gradient reaches proj_out permuted: the folded
  // matmul's backward copies it first (aten::clone, torch 2.13 CPU trace).
  if (pred.fn != kNoNode && proj_w.lora_a < 0) tape.graph.Workspace(pred.fn, pred.bytes());
  for (Var* v : {&r.temb, &r.cos, &r.sin, &ctx}) tape.Drop(*v);
  for (Var& v : locals) tape.Drop(v);
  tape.SetModule("");
  // accelerate's convert_outputs_to_fp32 under mixed precision (accelerate 1.15
  // utils/operations.py): the half output is replaced by its fp32 copy.
  if (tape.autocast) {
    Var pred32 = Cast(tape, pred, kF32);
    tape.Drop(pred);
    pred = pred32;
  }
  // FluxPipeline._unpack_latents: view, permute, reshape (a copy).
  Var unpacked = Contiguous(tape, pred);
  tape.Drop(pred);
  Var loss = FlowMatchingLoss(tape, unpacked, batch[7], batch[8], r.b);
  tape.Drop(unpacked);
  return ForwardOut{loss, {}};
}

}  // namespace vramscope::lower
