#include "unet_ops.h"

#include "ops.h"

namespace vramscope::lower {
namespace {

bool NeedsGrad(const Tape& tape, const Var& v) { return tape.grad_enabled && v.requires_grad(); }

}  // namespace

Var Conv2d(Tape& tape, const Var& x, Param& weight, Param* bias, uint64_t out_numel) {
  // Autocast's wrapper casts right to left: bias, weight, input (as BaseLinear).
  Var bin = bias ? AutocastParam(tape, *bias) : Var{};
  Var win = AutocastParam(tape, weight);
  Var xin = tape.autocast ? Cast(tape, x, tape.compute_bytes) : tape.Share(x);
  const uint8_t out_bytes = tape.autocast ? tape.compute_bytes : x.elem_bytes;
  Var out = tape.New(out_numel, out_bytes, Category::kTemporaries, "aten::convolution");
  const bool bias_grad = bias && NeedsGrad(tape, bin);
  if (NeedsGrad(tape, xin) || NeedsGrad(tape, win) || bias_grad) {
    NodeId n = tape.Node("ConvolutionBackward0", &out);
    tape.graph.Save(n, xin.t);
    tape.graph.Save(n, win.t);
    tape.graph.Edge(n, xin, xin.bytes());
    tape.graph.Edge(n, win, win.bytes());
    if (bias) tape.graph.Edge(n, bin, bin.bytes());
  }
  if (bias) tape.Drop(bin);
  tape.Drop(win);
  tape.Drop(xin);
  return out;
}

Var GroupNorm(Tape& tape, const Var& x, Param& weight, Param& bias, uint64_t rows) {
  Var xin = tape.autocast && !tape.cpu_rules ? Cast(tape, x, kF32) : tape.Share(x);
  const uint8_t stat_bytes = xin.elem_bytes != weight.elem_bytes ? kF32 : xin.elem_bytes;
  Var out = tape.New(x.numel, xin.elem_bytes, Category::kTemporaries, "aten::native_group_norm");
  Var mean = tape.New(rows, stat_bytes, Category::kActivations, "aten::native_group_norm");
  Var rstd = tape.New(rows, stat_bytes, Category::kActivations, "aten::native_group_norm");
  if (NeedsGrad(tape, xin) || NeedsGrad(tape, weight.var) || NeedsGrad(tape, bias.var)) {
    NodeId n = tape.Node("NativeGroupNormBackward0", &out);
    tape.graph.Save(n, xin.t);
    tape.graph.Save(n, mean.t);
    tape.graph.Save(n, rstd.t);
    tape.graph.Edge(n, xin, xin.bytes());
    tape.graph.Edge(n, weight.var, weight.var.bytes());
    tape.graph.Edge(n, bias.var, bias.var.bytes());
  }
  tape.Drop(mean);
  tape.Drop(rstd);
  tape.Drop(xin);
  return out;
}

Var UpsampleNearest2x(Tape& tape, const Var& x) {
  Var out = tape.New(x.numel * 4, x.elem_bytes, Category::kTemporaries, "aten::upsample_nearest2d");
  if (NeedsGrad(tape, x)) {
    NodeId n = tape.Node("UpsampleNearest2DBackward0", &out);
    tape.graph.Edge(n, x, x.bytes());
  }
  return out;
}

Var CatChannels(Tape& tape, const Var& a, const Var& b) {
  Var out = tape.New(a.numel + b.numel, a.elem_bytes, Category::kTemporaries, "aten::cat");
  if (NeedsGrad(tape, a) || NeedsGrad(tape, b)) {
    NodeId n = tape.Node("CatBackward0", &out);
    tape.graph.EdgeSlice(n, a, a.bytes());
    tape.graph.EdgeSlice(n, b, b.bytes());
  }
  return out;
}

Var Contiguous(Tape& tape, const Var& x) {
  Var out = tape.New(x.numel, x.elem_bytes, Category::kTemporaries, "aten::clone");
  if (NeedsGrad(tape, x)) {
    NodeId n = tape.Node("CloneBackward0", &out);
    tape.graph.EdgePass(n, x);
  }
  return out;
}

Var MseLoss(Tape& tape, const Var& pred, const Var& target) {
  // aten::mse_loss (Loss.cpp, torch 2.13) computes the elementwise loss into a
  // pred-sized buffer and reduces it in place: the 0-d result keeps that
  // storage (untyped_storage().nbytes() is the buffer's; checked in
  // tools/reference/tests/test_torch_facts.py).
  Var loss = tape.New(pred.numel, pred.elem_bytes, Category::kLoss, "aten::mse_loss");
  loss.numel = 1;
  if (NeedsGrad(tape, pred)) {
    NodeId n = tape.Node("MseLossBackward0", &loss);
    tape.graph.Save(n, pred.t);
    tape.graph.Save(n, target.t);
    tape.graph.Edge(n, pred, pred.bytes());
  }
  return loss;
}

Var SinusoidalEmbedding(Tape& tape, uint64_t n, uint64_t dim, bool copy_steps) {
  const uint64_t half = dim / 2;
  auto f32 = [&](uint64_t numel, std::string_view op) {
    return tape.New(numel, kF32, Category::kTemporaries, op);
  };
  Var arange = f32(half, "aten::arange");
  Var scaled = f32(half, "aten::mul");
  tape.Drop(arange);
  Var exponent = f32(half, "aten::div");
  tape.Drop(scaled);
  Var freqs = f32(half, "aten::exp");
  // timesteps[:, None].float(): a copy unless the timesteps are fp32 already.
  Var steps = copy_steps ? f32(n, "aten::_to_copy") : Var{};
  Var emb = f32(n * half, "aten::mul");
  tape.Drop(freqs);
  if (copy_steps) tape.Drop(steps);
  Var emb_scaled = f32(n * half, "aten::mul");  // scale * emb
  tape.Drop(emb);
  Var sin = f32(n * half, "aten::sin");
  Var cos = f32(n * half, "aten::cos");
  Var cat = f32(n * 2 * half, "aten::cat");
  tape.Drop(emb_scaled);
  tape.Drop(sin);
  tape.Drop(cos);
  Var flipped = f32(n * 2 * half, "aten::cat");  // flip_sin_to_cos
  tape.Drop(exponent);
  tape.Drop(cat);
  return flipped;
}

}  // namespace vramscope::lower
