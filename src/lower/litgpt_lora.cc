#include "litgpt_lora.h"

#include <vector>

#include "ops.h"

namespace vramscope::lower {
namespace {

bool NeedsGrad(const Tape& tape, const Var& a, const Var& b) {
  return tape.grad_enabled && (a.requires_grad() || b.requires_grad());
}

// F.conv1d(input [b, r * groups, s], weight [channels, r, 1]) -> [b, channels, s]
// (a 1x1 convolution). ConvolutionBackward0 saves the input and the weight
// (derivatives.yaml) and makes grad_input, then grad_weight (torch 2.13 CPU
// trace). Autocast runs conv1d in the compute dtype; the weight is a view of
// lora_B (`unsqueeze`, `split`), not a leaf, so it is cast on every call.
// `copies_grad`: cuDNN's convolution_backward turns the incoming gradient
// into the input's memory format first (ConvShared.cpp
// cudnn_convolution_backward, `grad_output_t.to(input.suggest_memory_format())`):
// a copy when the gradient is a narrowed slice (the query-group split below).
// The CPU kernels make none (the CPU traces); the CUDA copy is read from the
// code, not yet measured.
Var Conv1d(Tape& tape, const Var& input, const Var& weight, uint64_t tokens, uint64_t channels,
           bool copies_grad) {
  const bool cast = tape.autocast && weight.elem_bytes != tape.compute_bytes;
  Var w = cast ? Cast(tape, weight, tape.compute_bytes) : tape.Share(weight);
  Var out =
      tape.New(tokens * channels, input.elem_bytes, Category::kTemporaries, "aten::convolution");
  if (NeedsGrad(tape, input, w)) {
    NodeId n = tape.Node("ConvolutionBackward0", &out);
    if (n != kNoNode) {
      tape.graph.Save(n, input.t);
      tape.graph.Save(n, w.t);
      if (copies_grad) tape.graph.Workspace(n, out.bytes());
      tape.graph.Edge(n, input, input.bytes());
      tape.graph.Edge(n, w, w.bytes());
    }
  }
  tape.Drop(w);
  return out;
}

// LoRAQKVLinear.conv1d: with as many query groups as heads, one grouped
// conv1d; otherwise `input.chunk(N, dim=1)` and `weight.split(qkv_shapes)`,
// one conv1d per adapted slice, and torch.cat of their outputs (the pieces go
// once it has run; CatBackward0 hands each a slice of its gradient).
// `after_a` is [b, s, r * N] transposed (a view); the result, `after_B`, is
// [b, adapted, s] (transposed back by the caller: a view).
Var QkvConv(Tape& tape, const LitgptQkvLora& qkv, const Var& after_a, const Var& lora_b,
            uint64_t tokens, uint64_t rank) {
  const uint64_t adapted = qkv.AdaptedOut();
  if (qkv.q_out == qkv.kv_out) return Conv1d(tape, after_a, lora_b, tokens, adapted, false);
  std::vector<uint64_t> channels;
  if (qkv.q) channels.push_back(qkv.q_out);
  if (qkv.k) channels.push_back(qkv.kv_out);
  if (qkv.v) channels.push_back(qkv.kv_out);
  std::vector<Var> inputs, weights;
  if (channels.size() == 1) {
    inputs.push_back(tape.Share(after_a));
    weights.push_back(tape.Share(lora_b));
  } else if (channels.size() == 2) {
    inputs = Split(tape, after_a, {tokens * rank, tokens * rank});
    weights = Split(tape, lora_b, {channels[0] * rank, channels[1] * rank});
  } else {
    inputs = Split(tape, after_a, {tokens * rank, tokens * rank, tokens * rank});
    weights = Split(tape, lora_b, {channels[0] * rank, channels[1] * rank, channels[2] * rank});
  }
  const bool copies_grad = !tape.cpu_rules && channels.size() > 1;
  std::vector<Var> outs;
  for (size_t i = 0; i < channels.size(); ++i)
    outs.push_back(Conv1d(tape, inputs[i], weights[i], tokens, channels[i], copies_grad));
  Var joined = tape.New(tokens * adapted, outs[0].elem_bytes, Category::kTemporaries, "aten::cat");
  if (tape.grad_enabled && after_a.requires_grad()) {
    NodeId n = tape.Node("CatBackward0", &joined);
    for (const Var& o : outs) tape.graph.EdgeSlice(n, o, o.bytes());
  }
  for (std::vector<Var>* vars : {&outs, &inputs, &weights}) {
    for (Var& v : *vars) tape.Drop(v);
  }
  return joined;
}

// LoRAQKVLinear.zero_pad: `x.new_zeros(..., out_features)`, then
// `index_copy_(dim=-1, index=self.lora_ind, source=x)`. `lora_ind` registers
// the slices' indices as a non-persistent int64 buffer at the first call and
// returns a clone each time; IndexCopyBackward0 saves the clone and the source
// (derivatives.yaml: `grad.index_select(dim, index).expand_as(source)`), so
// `after_B` lives until its backward (torch 2.13 CPU trace).
Var ZeroPad(Tape& tape, LitgptQkvLora& qkv, const Var& after_b, uint64_t tokens,
            uint64_t out_features) {
  Var padded = tape.New(tokens * out_features, after_b.elem_bytes, Category::kTemporaries,
                        "aten::new_zeros");
  const uint64_t adapted = qkv.AdaptedOut();
  if (!qkv.index_made) {
    // The buffer stays with the module (one reference, never dropped).
    tape.graph.Alloc(adapted * kI64, Category::kParameters, "litgpt::lora_ind", tape.module());
    qkv.index_made = true;
  }
  Var index = tape.New(adapted, kI64, Category::kTemporaries, "aten::clone");
  if (tape.grad_enabled && after_b.requires_grad()) {
    NodeId n = tape.Node("IndexCopyBackward0", &padded);
    tape.graph.Save(n, index.t);
    tape.graph.Save(n, after_b.t);
    tape.graph.Edge(n, after_b, after_b.bytes());
  }
  tape.Drop(index);
  return padded;
}

// LoRAQKVLinear.forward: `pretrained = self.linear(x)`;
// `after_A = F.linear(self.lora_dropout(x), self.lora_A)` [b, s, r * N];
// `after_B = self.conv1d(after_A.transpose(-2, -1), self.lora_B.unsqueeze(-1))
// .transpose(-2, -1)`; `lora = self.zero_pad(after_B) * self.scaling`;
// `return pretrained + lora`. Its locals go at the return, in that order.
Var LitgptLoraQkv(Tape& tape, const Var& x, Param& weight, Param* bias, uint64_t tokens,
                  uint64_t out_features) {
  LitgptQkvLora& qkv = weight.litgpt_qkv;
  Param& a = tape.params[weight.lora_a];
  Param& b = tape.params[weight.lora_b];
  const uint64_t rank = b.numel / qkv.AdaptedOut();
  Var pretrained = PlainLinear(tape, x, weight, bias, tokens, out_features);
  Var dropped = Dropout(tape, x, tape.lora_dropout);
  Var after_a = PlainLinear(tape, dropped, a, nullptr, tokens, rank * qkv.Parts());
  tape.Drop(dropped);
  // after_A's gradient arrives as the transpose of conv1d's [b, r * N, s]
  // grad_input; F.linear's folded matmul reshapes it to [b * s, r * N], a
  // copy when b > 1 (UnsafeViewBackward0: aten::clone in the CPU trace).
  if (after_a.fn != kNoNode && qkv.batch > 1) tape.graph.Workspace(after_a.fn, after_a.bytes());
  Var after_b = QkvConv(tape, qkv, after_a, b.var, tokens, rank);
  Var padded =
      qkv.Parts() == 3 ? tape.Share(after_b) : ZeroPad(tape, qkv, after_b, tokens, out_features);
  Var lora = Scale(tape, padded);
  tape.Drop(padded);
  Var sum = Add(tape, pretrained, lora);
  for (Var* local : {&pretrained, &after_a, &after_b, &lora}) tape.Drop(*local);
  return sum;
}

}  // namespace

// LoRALinear.forward: `pretrained = self.linear(x)`; `lora =
// (self.lora_dropout(x) @ self.lora_A.transpose(0, 1) @ self.lora_B.transpose(0, 1))
// * self.scaling`; `return pretrained + lora`. The adapters are made with the
// model, in its dtype (no casts of their own, unlike PEFT's layer); under
// autocast each transposed adapter is cast on every call (a view, not a leaf).
Var LitgptLoraLinear(Tape& tape, const Var& x, Param& weight, Param* bias, uint64_t tokens,
                     uint64_t out_features) {
  if (weight.litgpt_qkv.q_out != 0)
    return LitgptLoraQkv(tape, x, weight, bias, tokens, out_features);
  Param& a = tape.params[weight.lora_a];
  Param& b = tape.params[weight.lora_b];
  const uint64_t rank = a.numel / (x.numel / tokens);
  Var pretrained = PlainLinear(tape, x, weight, bias, tokens, out_features);
  Var dropped = Dropout(tape, x, tape.lora_dropout);
  Var down = PlainLinear(tape, dropped, a, nullptr, tokens, rank, /*cached_weight_cast=*/false);
  tape.Drop(dropped);
  Var up = PlainLinear(tape, down, b, nullptr, tokens, out_features, false);
  tape.Drop(down);
  Var lora = Scale(tape, up);
  tape.Drop(up);
  Var sum = Add(tape, pretrained, lora);
  tape.Drop(pretrained);
  tape.Drop(lora);
  return sum;
}

}  // namespace vramscope::lower
