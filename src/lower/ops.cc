#include "ops.h"

#include <algorithm>
#include <string>

#include "litgpt_lora.h"

namespace vramscope::lower {
namespace {

void SaveIf(Tape& tape, NodeId n, const Var& v) {
  if (n != kNoNode) tape.graph.Save(n, v.t);
}
void EdgeIf(Tape& tape, NodeId n, const Var& input) {
  if (n != kNoNode) tape.graph.Edge(n, input, input.bytes());
}
bool AnyGrad(const Tape& tape, const Var& a) { return tape.grad_enabled && a.requires_grad(); }
bool AnyGrad(const Tape& tape, const Var& a, const Var& b) {
  return tape.grad_enabled && (a.requires_grad() || b.requires_grad());
}

}  // namespace

Var Cast(Tape& tape, const Var& x, uint8_t to_bytes) {
  if (x.elem_bytes == to_bytes) return tape.Share(x);
  Var out = tape.New(x.numel, to_bytes, Category::kTemporaries, "aten::_to_copy");
  if (AnyGrad(tape, x)) {
    // ToCopyBackward0 saves nothing; its gradient is cast back to x's dtype.
    NodeId n = tape.Node("ToCopyBackward0", &out);
    EdgeIf(tape, n, x);
  }
  return out;
}

Var AutocastParam(Tape& tape, Param& p) {
  // Params4bit are uint8 storage, never autocast-eligible.
  if (p.nf4 || !tape.autocast || p.elem_bytes == tape.compute_bytes || p.elem_bytes != kF32) {
    return tape.Share(p.var);
  }
  // autocast_mode.cpp cached_cast: fp32, requires_grad, leaf (grad mode aside).
  const bool cacheable = p.trainable || p.requires_grad;
  if (cacheable && p.cast.t != kNoTensor) return tape.Share(p.cast);
  Var out = Cast(tape, p.var, tape.compute_bytes);
  if (cacheable) p.cast = tape.Share(out);  // the cache's reference
  return out;
}

void ClearAutocastCache(Tape& tape) {
  for (Param& p : tape.params) {
    if (p.cast.t != kNoTensor) tape.Drop(p.cast);
  }
  if (!tape.other_params) return;
  for (Param& p : *tape.other_params) {
    if (p.cast.t != kNoTensor) tape.Drop(p.cast);
  }
}

namespace {
// peft LoraLayer Linear.forward (peft 0.10-0.17): result = base_layer(x);
// x = x.to(lora_A.weight.dtype); result = result + lora_B(lora_A(dropout(x))) * scaling;
// result.to(previous dtype). Adapters are fp32 (autocast_adapter_dtype=True).
// The cast input replaces the local `x`, so it lives until forward returns
// (peft 0.21.2 tuners/lora/layer.py Linear.forward). The cast
// (_cast_input_dtype) happens under autocast too: a half input (a diffusers
// UNet's activations, an attention output) is copied to the adapters' fp32
// before lora_A's autocast casts it back (CPU fidelity trace, UNet LoRA
// bf16-mixed).
// Over a 4-bit base (peft 0.21.2 tuners/lora/bnb.py Linear4bit.forward) the
// base layer's result is cloned first ("defensively", a transient copy), and
// the input and the adapters' output are cast only without autocast
// (`requires_conversion = not torch.is_autocast_enabled()`), the output to
// the result's dtype. That call without a device type asks about CUDA's
// autocast (torch 2.13: False inside a CPU autocast region), so under CPU
// rules both casts happen as without autocast (the CPU QLoRA traces).
Var LoraLinear(Tape& tape, const Var& x, Param& weight, Param* bias, uint64_t tokens,
               uint64_t out_features) {
  // PEFT's LoRA Linear calls its modules in this order: base_layer, the
  // adapter's lora_dropout, lora_A, lora_B (each an nn.Module ZeRO-3 hooks).
  const std::string name(ModuleOf(tape, weight));
  std::vector<Param*> base_params = {&weight};
  if (bias) base_params.push_back(bias);
  Var result = InModule(tape, name + ".base_layer", base_params, x, [&](const Var& in) {
    return PlainLinear(tape, in, weight, bias, tokens, out_features);
  });
  const bool bnb = weight.nf4;
  if (bnb) {
    Var copy = tape.New(result.numel, result.elem_bytes, Category::kTemporaries, "aten::clone");
    if (AnyGrad(tape, result)) tape.graph.EdgePass(tape.Node("CloneBackward0", &copy), result);
    tape.Drop(result);
    result = copy;
  }
  const bool converts = !bnb || !tape.autocast || tape.cpu_rules;
  Param& a = tape.params[weight.lora_a];
  Param& b = tape.params[weight.lora_b];
  const uint8_t peft_bytes = a.peft_view_bytes ? a.peft_view_bytes : a.elem_bytes;
  Var xin = converts ? Cast(tape, x, peft_bytes) : tape.Share(x);
  Var dropped = InModule(tape, name + ".lora_dropout.default", {}, xin,
                         [&](const Var& in) { return Dropout(tape, in, tape.lora_dropout); });
  if (dropped.elem_bytes != a.var.elem_bytes && !tape.autocast) {
    // The adapter computes in another dtype than PEFT cast to (FSDP's
    // gathered half weights under accelerate's autocast): lora_A's autocast
    // casts the input again, and that copy is what it saves.
    Var cast = Cast(tape, dropped, a.var.elem_bytes);
    tape.Drop(dropped);
    dropped = cast;
  }
  const uint64_t rank = a.numel / (x.numel / tokens);
  Var down = InModule(tape, name + ".lora_A.default", {&a}, dropped, [&](const Var& in) {
    return PlainLinear(tape, in, a, nullptr, tokens, rank);
  });
  tape.Drop(dropped);
  Var up = InModule(tape, name + ".lora_B.default", {&b}, down, [&](const Var& in) {
    return PlainLinear(tape, in, b, nullptr, tokens, out_features);
  });
  tape.Drop(down);
  Var scaled = Scale(tape, up);
  tape.Drop(up);
  if (bnb && converts) {
    Var cast = Cast(tape, scaled, result.elem_bytes);
    tape.Drop(scaled);
    scaled = cast;
  }
  Var sum = Add(tape, result, scaled);
  tape.Drop(result);
  tape.Drop(scaled);
  Var out = bnb ? tape.Share(sum) : Cast(tape, sum, tape.autocast ? sum.elem_bytes : x.elem_bytes);
  tape.Drop(xin);
  tape.Drop(sum);
  return out;
}
}  // namespace

std::string_view ModuleOf(Tape& tape, const Param& p) { return tape.out()->String(p.module); }

Var Linear(Tape& tape, const Var& x, Param& weight, Param* bias, uint64_t tokens,
           uint64_t out_features) {
  if (weight.lora_a >= 0 && !tape.adapters_disabled) {
    if (tape.litgpt_modules) return LitgptLoraLinear(tape, x, weight, bias, tokens, out_features);
    return InModule(tape, ModuleOf(tape, weight), {}, x, [&](const Var& in) {
      return LoraLinear(tape, in, weight, bias, tokens, out_features);
    });
  }
  std::vector<Param*> params = {&weight};
  if (bias) params.push_back(bias);
  // A tied lm_head is its own module over the embedding's weight.
  const std::string_view name =
      tape.out()->String(tape.module()) == "lm_head" ? "lm_head" : ModuleOf(tape, weight);
  return InModule(tape, name, params, x, [&](const Var& in) {
    return PlainLinear(tape, in, weight, bias, tokens, out_features);
  });
}

namespace {
// bitsandbytes Linear4bit.forward: x.to(compute_dtype), then MatMul4Bit,
// which saves nothing but the quantized weight; the result is cast back to
// x's dtype. bitsandbytes 0.50.2's forward runs gemm_4bit: for training's
// token counts the dequantize-then-F.linear path (backends/cuda/ops.py
// _dequant_linear_fallback; the CPU backend's default impl): the nested fp32
// absmax is dequantized (`dequantize_blockwise`, one fp32 per 64 weights),
// the offset added into a new tensor, the whole weight dequantized into a
// compute-dtype temporary, and F.linear run, all of them alive until it
// returns; the CPU impl's dequantized absmax is an expression temporary,
// freed once the offset is added. Backward (F.dequantize_4bit) makes the fp32
// absmax and the dequantized weight again for grad_A; the absmax goes when
// the dequantization returns, the weight after the matmul. (0.43-0.45
// dequantized in Python and freed the absmax before F.linear.)
Var Nf4Linear(Tape& tape, const Var& x, Param& weight, Param* bias, uint64_t tokens,
              uint64_t out_features) {
  Var xin = Cast(tape, x, tape.compute_bytes);
  const uint64_t absmax_bytes = (weight.numel + 63) / 64 * kF32;
  Var absmax_dq =
      tape.New(absmax_bytes / kF32, kF32, Category::kTemporaries, "bnb::dequantize_blockwise");
  Var absmax = tape.New(absmax_bytes / kF32, kF32, Category::kTemporaries, "aten::add");
  if (tape.cpu_rules) tape.Drop(absmax_dq);
  Var deq =
      tape.New(weight.numel, tape.compute_bytes, Category::kTemporaries, "bnb::dequantize_4bit");
  Var out = tape.New(tokens * out_features, tape.compute_bytes, Category::kTemporaries,
                     "bnb::matmul_4bit");
  tape.graph.ForwardGemm();
  tape.Drop(deq);
  tape.Drop(absmax);
  if (absmax_dq.t != kNoTensor) tape.Drop(absmax_dq);
  if (AnyGrad(tape, xin) || (bias && AnyGrad(tape, bias->var))) {
    NodeId n = tape.Node("MatMul4BitBackward", &out);
    tape.graph.Gemm(n, false);
    if (n != kNoNode && xin.requires_grad()) {
      tape.graph.Workspace(n, weight.numel * tape.compute_bytes);
      tape.graph.Scratch(n, absmax_bytes);
    }
    EdgeIf(tape, n, xin);
    if (bias) EdgeIf(tape, n, bias->var);
  }
  tape.Drop(xin);
  Var result = Cast(tape, out, x.elem_bytes);
  tape.Drop(out);
  return result;
}

}  // namespace

Var PlainLinear(Tape& tape, const Var& x, Param& weight, Param* bias, uint64_t tokens,
                uint64_t out_features, bool cached_weight_cast) {
  if (weight.nf4) return Nf4Linear(tape, x, weight, bias, tokens, out_features);
  // Autocast's wrapper casts linear's arguments right to left, as GCC evaluates
  // a call's arguments (torch 2.13's profiler: bias, weight, input).
  Var bin = bias ? AutocastParam(tape, *bias) : Var{};
  const bool uncached = !cached_weight_cast && tape.autocast && weight.elem_bytes == kF32 &&
                        weight.elem_bytes != tape.compute_bytes;
  Var win = uncached ? Cast(tape, weight.var, tape.compute_bytes) : AutocastParam(tape, weight);
  Var xin = tape.autocast ? Cast(tape, x, tape.compute_bytes) : tape.Share(x);
  const uint8_t out_bytes = tape.autocast ? tape.compute_bytes : x.elem_bytes;
  Var out = tape.New(tokens * out_features, out_bytes, Category::kTemporaries,
                     bias ? "aten::addmm" : "aten::mm");
  tape.graph.ForwardGemm();
  if (AnyGrad(tape, xin, win) || (bias && AnyGrad(tape, bin))) {
    NodeId n = tape.Node(bias ? "AddmmBackward0" : "MmBackward0", &out);
    tape.graph.Gemm(n, /*second_input_first=*/!bias);  // mm: mat2 (the weight) first
    if (win.requires_grad() || tape.zero3_linear) SaveIf(tape, n, xin);
    if (xin.requires_grad()) SaveIf(tape, n, win);
    // A 3-D x's gradient is the folded matmul's, reshaped back to [b, s, in]: a view.
    if (n != kNoNode) {
      tape.graph.Edge(n, xin, xin.bytes(), Category::kTemporaries, !tape.flat_linear_inputs);
    }
    EdgeIf(tape, n, win);
    if (bias) EdgeIf(tape, n, bin);
  }
  if (bias) tape.Drop(bin);
  tape.Drop(xin);
  tape.Drop(win);
  return out;
}

std::vector<Var> Split(Tape& tape, const Var& whole, std::initializer_list<uint64_t> numels) {
  std::vector<Var> views;
  views.reserve(numels.size());
  NodeId n = kNoNode;
  if (AnyGrad(tape, whole)) {
    n = tape.graph.AddNode("SplitWithSizesBackward0", static_cast<uint32_t>(numels.size()));
    tape.graph.Edge(n, whole, whole.bytes());
  }
  uint32_t slot = 0;
  for (uint64_t numel : numels) {
    Var v = tape.Share(whole);
    v.numel = numel;
    if (n != kNoNode) {
      v.fn = n;
      v.slot = slot;
    }
    ++slot;
    views.push_back(v);
  }
  return views;
}

namespace {
// a * b; `reduce_broadcast`: a broadcast input's gradient is made at the
// output's size and summed down afterwards (the engine's validate_outputs,
// sum_to), a full-size transient while the node runs.
Var MulImpl(Tape& tape, const Var& a, const Var& b, std::string_view op, bool reduce_broadcast) {
  const uint8_t bytes = std::max(a.elem_bytes, b.elem_bytes);
  Var out = tape.New(std::max(a.numel, b.numel), bytes, Category::kTemporaries, op);
  if (AnyGrad(tape, a, b)) {
    NodeId n = tape.Node("MulBackward0", &out);
    if (a.requires_grad()) SaveIf(tape, n, b);
    if (b.requires_grad()) SaveIf(tape, n, a);
    for (const Var* in : {&a, &b}) {
      if (reduce_broadcast && n != kNoNode && in->requires_grad() && in->numel < out.numel) {
        tape.graph.Workspace(n, out.numel * bytes);
      }
    }
    EdgeIf(tape, n, a);
    EdgeIf(tape, n, b);
  }
  return out;
}
}  // namespace

Var Mul(Tape& tape, const Var& a, const Var& b, std::string_view op) {
  return MulImpl(tape, a, b, op, false);
}

Var MulBroadcast(Tape& tape, const Var& a, const Var& b) {
  return MulImpl(tape, a, b, "aten::mul", /*reduce_broadcast=*/true);
}

Var Add(Tape& tape, const Var& a, const Var& b) {
  const uint8_t bytes = std::max(a.elem_bytes, b.elem_bytes);
  Var out = tape.New(std::max(a.numel, b.numel), bytes, Category::kTemporaries, "aten::add");
  if (AnyGrad(tape, a, b)) {
    NodeId n = tape.Node("AddBackward0", &out);
    // The gradient passes through unchanged to a same-typed input; the engine
    // casts it for an input of another dtype (engine.cpp validate_outputs).
    for (const Var* in : {&a, &b}) {
      if (in->elem_bytes == bytes && in->numel == out.numel) {
        tape.graph.EdgePass(n, *in);
      } else {
        EdgeIf(tape, n, *in);
      }
    }
  }
  return out;
}

Var AddInPlace(Tape& tape, const Var& a, const Var& b) {
  Var out = a;
  if (AnyGrad(tape, a, b)) {
    NodeId n = tape.Node("AddBackward0", &out);
    for (const Var* in : {&a, &b}) {
      if (in->elem_bytes == out.elem_bytes && in->numel == out.numel) {
        tape.graph.EdgePass(n, *in);
      } else {
        EdgeIf(tape, n, *in);
      }
    }
  }
  return out;
}

namespace {
// An elementwise op with a scalar into a new tensor; its backward saves nothing.
Var ScalarOp(Tape& tape, const Var& a, std::string_view op, std::string_view backward) {
  Var out = tape.New(a.numel, a.elem_bytes, Category::kTemporaries, op);
  if (AnyGrad(tape, a)) {
    NodeId n = tape.Node(backward, &out);
    EdgeIf(tape, n, a);
  }
  return out;
}
}  // namespace

Var Scale(Tape& tape, const Var& a) { return ScalarOp(tape, a, "aten::mul", "MulBackward1"); }

Var DivScalar(Tape& tape, const Var& a) { return ScalarOp(tape, a, "aten::div", "DivBackward1"); }

Var MulParam(Tape& tape, const Var& x, Param& w, bool gemma_offset) {
  Var wv = tape.Share(w.var);
  if (gemma_offset) {
    // (1.0 + weight.float()): a fresh vector, tiny.
    Var one_plus = tape.New(w.numel, kF32, Category::kTemporaries, "aten::add");
    if (AnyGrad(tape, w.var)) {
      NodeId n = tape.Node("AddBackward1", &one_plus);
      tape.graph.EdgePass(n, w.var);
    }
    tape.Drop(wv);
    wv = one_plus;
  }
  const uint8_t bytes = std::max(x.elem_bytes, wv.elem_bytes);
  Var out = tape.New(x.numel, bytes, Category::kTemporaries, "aten::mul");
  if (AnyGrad(tape, x, wv)) {
    NodeId n = tape.Node("MulBackward0", &out);
    if (x.requires_grad()) SaveIf(tape, n, wv);
    if (wv.requires_grad()) SaveIf(tape, n, x);
    EdgeIf(tape, n, x);
    if (wv.requires_grad() && n != kNoNode) {
      // grad * x summed over tokens: a full-size product, then the reduction.
      tape.graph.Workspace(n, x.numel * bytes);
      tape.graph.Edge(n, wv, wv.bytes());
    }
  }
  tape.Drop(wv);
  return out;
}

Var UnaryOp(Tape& tape, const Var& x, std::string_view op, std::string_view node,
            bool save_result) {
  Var out = tape.New(x.numel, x.elem_bytes, Category::kTemporaries, op);
  if (AnyGrad(tape, x)) {
    NodeId n = tape.Node(node, &out);
    SaveIf(tape, n, save_result ? out : x);
    EdgeIf(tape, n, x);
  }
  return out;
}

Var Silu(Tape& tape, const Var& x) {
  return UnaryOp(tape, x, "aten::silu", "SiluBackward0", false);
}
Var Gelu(Tape& tape, const Var& x) {
  return UnaryOp(tape, x, "aten::gelu", "GeluBackward0", false);
}
Var Relu(Tape& tape, const Var& x) { return UnaryOp(tape, x, "aten::relu", "ReluBackward0", true); }

Var AddScalar(Tape& tape, const Var& a) {
  Var out = tape.New(a.numel, a.elem_bytes, Category::kTemporaries, "aten::add");
  if (AnyGrad(tape, a)) {
    NodeId n = tape.Node("AddBackward1", &out);
    tape.graph.EdgePass(n, a);
  }
  return out;
}

namespace {

// torch.pow(x, 3.0): PowBackward0 saves x; its backward computes
// grad * (3 * x.pow(2)), two x-sized temporaries beside the result.
// CUDA autocast runs pow in fp32 (pow.Tensor_Scalar is in AT_FORALL_FP32,
// ATen/autocast_mode.h, torch 2.13): a half x is copied to fp32 first, and
// that copy is what PowBackward0 saves; the fp32 result then promotes the
// rest of the expression (gelu_new's tanh, its sum and product) to fp32.
// CPU autocast has no pow in its fp32 list (the fidelity grid's CPU traces).
Var Cube(Tape& tape, const Var& x_in) {
  const bool upcast = tape.autocast && !tape.cpu_rules;
  Var x = upcast ? Cast(tape, x_in, kF32) : tape.Share(x_in);
  Var out = tape.New(x.numel, x.elem_bytes, Category::kTemporaries, "aten::pow");
  if (AnyGrad(tape, x)) {
    NodeId n = tape.Node("PowBackward0", &out);
    SaveIf(tape, n, x);
    tape.graph.Workspace(n, x.bytes());
    tape.graph.Workspace(n, x.bytes());
    EdgeIf(tape, n, x);
  }
  tape.Drop(x);
  return out;
}

// 0.5 * x * (1.0 + tanh(inner)): the common tail of gelu_new and gelu_fast.
// Takes `inner` (a temporary of the expression, gone once tanh has run).
Var HalfXTimesOnePlusTanh(Tape& tape, const Var& half_x, Var inner) {
  Var t = UnaryOp(tape, inner, "aten::tanh", "TanhBackward0", true);
  tape.Drop(inner);
  Var one_plus = AddScalar(tape, t);
  tape.Drop(t);
  Var out = Mul(tape, half_x, one_plus);
  tape.Drop(one_plus);
  return out;
}

// NewGELUActivation: 0.5 * input * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) *
// (input + 0.044715 * torch.pow(input, 3.0)))), evaluated left to right.
Var GeluNew(Tape& tape, const Var& x) {
  Var half_x = Scale(tape, x);
  Var cube = Cube(tape, x);
  Var scaled_cube = Scale(tape, cube);
  tape.Drop(cube);
  Var sum = Add(tape, x, scaled_cube);
  tape.Drop(scaled_cube);
  Var inner = Scale(tape, sum);
  tape.Drop(sum);
  Var out = HalfXTimesOnePlusTanh(tape, half_x, inner);
  tape.Drop(half_x);
  return out;
}

// FastGELUActivation: 0.5 * input * (1.0 + torch.tanh(input * 0.7978845608 *
// (1.0 + 0.044715 * input * input))).
Var GeluFast(Tape& tape, const Var& x) {
  Var half_x = Scale(tape, x);
  Var x_c = Scale(tape, x);
  Var k_x = Scale(tape, x);
  Var k_x2 = Mul(tape, k_x, x);
  tape.Drop(k_x);
  Var poly = AddScalar(tape, k_x2);
  tape.Drop(k_x2);
  Var inner = Mul(tape, x_c, poly);
  tape.Drop(x_c);
  tape.Drop(poly);
  Var out = HalfXTimesOnePlusTanh(tape, half_x, inner);
  tape.Drop(half_x);
  return out;
}

// QuickGELUActivation: input * torch.sigmoid(1.702 * input).
Var QuickGelu(Tape& tape, const Var& x) {
  Var scaled = Scale(tape, x);
  Var sig = UnaryOp(tape, scaled, "aten::sigmoid", "SigmoidBackward0", true);
  tape.Drop(scaled);
  Var out = Mul(tape, x, sig);
  tape.Drop(sig);
  return out;
}
}  // namespace

Var MlpActivation(Tape& tape, MlpKind kind, const Var& x) {
  switch (kind) {
    case MlpKind::kRelu: return Relu(tape, x);
    case MlpKind::kGeluNew: return GeluNew(tape, x);
    case MlpKind::kGeluFast: return GeluFast(tape, x);
    case MlpKind::kQuickGelu: return QuickGelu(tape, x);
    default: return Gelu(tape, x);
  }
}

Var Dropout(Tape& tape, const Var& x, double p) {
  if (p <= 0) return tape.Share(x);
  // CUDA: native_dropout (is_fused_kernel_acceptable) makes a bool mask, then
  // the output (dropout_cuda in Dropout.cu: the H100 snapshots show the mask's
  // block before the output's). CPU rules (aten/src/ATen/native/Dropout.cpp
  // _dropout_impl, no fused kernel): noise = empty_like(input).bernoulli_(1 - p)
  // .div_(1 - p), then input * noise; the noise, in the input's dtype, is what
  // MulBackward0 saves. Either way the mask comes first.
  const bool cpu = tape.cpu_rules;
  Var mask = tape.New(x.numel, cpu ? x.elem_bytes : kBool, Category::kActivations,
                      cpu ? "aten::empty_like" : "aten::native_dropout");
  Var out = tape.New(x.numel, x.elem_bytes, Category::kTemporaries,
                     cpu ? "aten::mul" : "aten::native_dropout");
  if (AnyGrad(tape, x)) {
    NodeId n = tape.Node(cpu ? "MulBackward0" : "NativeDropoutBackward0", &out);
    SaveIf(tape, n, mask);
    EdgeIf(tape, n, x);
  }
  tape.Drop(mask);
  return out;
}

namespace {
// rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) of an fp32 `h`. transformers'
// RMSNorms add eps out of place (`variance + eps`) and drop the squares after
// the mean; torch's rms_norm_composite (C++) adds it in place
// (`.add_(eps_val)`), and its temporaries live to the end of the expression,
// after the rsqrt.
Var RsqrtMeanSquare(Tape& tape, const Var& h, uint64_t tokens, bool composite) {
  // variance = hidden_states.pow(2).mean(-1, keepdim=True): PowBackward0 saves
  // self; MeanBackward1 saves only sizes (torch >= 2.0).
  Var sq = tape.New(h.numel, kF32, Category::kTemporaries, "aten::pow");
  if (AnyGrad(tape, h)) {
    NodeId n = tape.Node("PowBackward0", &sq);
    SaveIf(tape, n, h);
    // pow_backward: grad * (2 * self.pow(1)): self.pow(1) and the product
    // are full-size temporaries beside the result (seen in the reference trace).
    tape.graph.Workspace(n, h.numel * kF32);
    tape.graph.Workspace(n, h.numel * kF32);
    EdgeIf(tape, n, h);
  }
  Var var = tape.New(tokens, kF32, Category::kTemporaries, "aten::mean");
  if (AnyGrad(tape, sq)) {
    NodeId n = tape.Node("MeanBackward1", &var);
    EdgeIf(tape, n, sq);  // grad.expand(...) / N: a full-size tensor
  }
  Var var_eps = var;
  if (!composite) {
    tape.Drop(sq);
    var_eps = tape.New(tokens, kF32, Category::kTemporaries, "aten::add");
    if (AnyGrad(tape, var)) {
      NodeId n = tape.Node("AddBackward1", &var_eps);
      tape.graph.EdgePass(n, var);
    }
    tape.Drop(var);
  }
  Var rs = tape.New(tokens, kF32, Category::kTemporaries, "aten::rsqrt");
  if (AnyGrad(tape, var_eps)) {
    NodeId n = tape.Node("RsqrtBackward0", &rs);
    SaveIf(tape, n, rs);
    EdgeIf(tape, n, var_eps);
  }
  if (composite) tape.Drop(sq);
  tape.Drop(var_eps);
  return rs;
}
}  // namespace

Var RmsNorm(Tape& tape, const Var& x, Param& w, uint64_t tokens, uint64_t hidden,
            bool gemma_style) {
  // hidden_states = hidden_states.to(torch.float32)
  Var h = Cast(tape, x, kF32);
  Var rs = RsqrtMeanSquare(tape, h, tokens, /*composite=*/false);
  // hidden_states * torch.rsqrt(variance + eps)
  // The full-size transient of rs's gradient: the H100 snapshot of Qwen2.5
  // shows it before h's. (Applied here only: the MoE lowering's broadcast
  // products do not show it in the CPU reference traces.)
  Var normed = MulImpl(tape, h, rs, "aten::mul", /*reduce_broadcast=*/true);
  tape.Drop(rs);
  tape.Drop(h);
  Var out;
  if (gemma_style) {
    // output * (1.0 + self.weight.float()), then .type_as(x)
    Var scaled = MulParam(tape, normed, w, true);
    tape.Drop(normed);
    out = Cast(tape, scaled, x.elem_bytes);
    tape.Drop(scaled);
  } else {
    // return self.weight * hidden_states.to(input_dtype): the fp32 `hidden_states`
    // stays bound until the function returns, after the product (the H100
    // snapshot of Qwen2.5 in bf16 frees it after the product, not after the cast).
    Var back = Cast(tape, normed, x.elem_bytes);
    out = MulParam(tape, back, w, false);
    tape.Drop(back);
    tape.Drop(normed);
  }
  (void)hidden;
  return out;
}

// liger-kernel 0.8.5 ops/rms_norm.py, LigerRMSNorm.forward ->
// LigerRMSNormFunction.apply(X, W, eps, 0.0, "llama", True):
// - rms_norm_forward: X.view(-1, dim) (no copy: @ensure_contiguous sees a
//   contiguous X), `Y = torch.empty((n_rows, n_cols), dtype=X.dtype)`, `RSTD =
//   torch.empty(n_rows, dtype=torch.float32)` (llama casting); one Triton
//   kernel, nothing else;
// - forward saves (X, W, RSTD): ctx.save_for_backward;
// - rms_norm_backward: `_dW = torch.empty((sm_count, n_cols),
//   dtype=torch.float32)` when W needs a gradient (sm_count:
//   multi_processor_count), `dX = dY` (in_place True: the kernel writes dX
//   over dY, no new tensor), then `dW = _dW.sum(dim=0).to(W.dtype)`: an fp32
//   [n_cols] sum and, for a 16-bit W, its cast ([n_cols] in W's dtype);
//   _dW goes when the function returns.
// Not autocast-eligible (a custom Function): X and W keep their dtypes, so Y
// has X's (fp32 for the fp32 residual stream of mixed precision).
Var LigerRmsNorm(Tape& tape, const Var& x, Param& w, uint64_t hidden) {
  const uint64_t rows = x.numel / hidden;
  Var y = tape.New(x.numel, x.elem_bytes, Category::kTemporaries, "liger::rms_norm");
  Var rstd = tape.New(rows, kF32, Category::kTemporaries, "liger::rms_norm_rstd");
  if (AnyGrad(tape, x, w.var)) {
    NodeId n = tape.Node("LigerRMSNormFunctionBackward", &y);
    tape.graph.Save(n, x.t);
    tape.graph.Save(n, w.var.t);
    tape.graph.Save(n, rstd.t);
    tape.graph.EdgePass(n, x);  // dX is dY, written in place
    if (w.var.requires_grad()) {
      tape.graph.Workspace(n, tape.liger_sm_count * hidden * kF32);  // _dW
      // _dW.sum(0) in fp32, cast to a 16-bit W's dtype (an fp32 W: the sum is dW).
      if (w.var.elem_bytes != kF32) tape.graph.Workspace(n, hidden * kF32);
      tape.graph.Edge(n, w.var, w.numel * w.var.elem_bytes);
    }
  }
  tape.Drop(rstd);
  return y;
}

// torchtune 0.6.1 modules/rms_norm.py RMSNorm.forward:
// F.rms_norm(x.float(), normalized_shape, weight=self.scale, eps).to(x.dtype).
// torch 2.13 rms_norm_symint (aten/src/ATen/native/layer_norm.cpp): a weight
// whose dtype differs from the input's (a bf16 scale against the fp32 input)
// warns and takes rms_norm_composite: rsqrt of the mean square, input * rstd,
// then * weight (fp32 by promotion; saved for the weight's gradient when it
// trains), cast back. Same dtypes (fp32 weights) dispatch to _fused_rms_norm,
// whose CUDA kernel (torch >= 2.8) saves the input and rstd only; CPU builds
// register it as the composite. Both paths: TorchRmsNorm.
// T5LayerNorm.forward (transformers 5.24.0 / 4.57.6 models/t5/modeling_t5.py):
// `variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)`
// (pow saves the fp32 copy, or x itself when x is fp32), then
// `hidden_states * torch.rsqrt(variance + eps)` multiplies the input as it is
// by the fp32 rsqrt (an fp32 product whose node saves both), a cast back to the
// weight's dtype only when the weight is fp16 / bf16, and `self.weight *
// hidden_states`.
Var T5LayerNorm(Tape& tape, const Var& x, Param& w, uint64_t tokens) {
  Var h32 = Cast(tape, x, kF32);
  Var rs = RsqrtMeanSquare(tape, h32, tokens, /*composite=*/false);
  tape.Drop(h32);
  Var normed = MulImpl(tape, x, rs, "aten::mul", /*reduce_broadcast=*/true);
  tape.Drop(rs);
  Var back = w.elem_bytes == kF32 ? tape.Share(normed) : Cast(tape, normed, w.elem_bytes);
  tape.Drop(normed);
  Var out = MulParam(tape, back, w, false);
  tape.Drop(back);
  return out;
}

Var RmsNormTorchtune(Tape& tape, const Var& x, Param& w, uint64_t tokens) {
  Var h = Cast(tape, x, kF32);
  const bool fused = w.elem_bytes == kF32 && !tape.cpu_rules && tape.torch_version >= 208;
  Var out32 = TorchRmsNorm(tape, h, w, tokens, fused);
  tape.Drop(h);
  Var out = Cast(tape, out32, x.elem_bytes);
  tape.Drop(out32);
  return out;
}

// LitGPT 0.5.13 litgpt/model.py RMSNorm.forward: `x = x.float()`,
// `norm_x = torch.mean(x * x, ...)`, `x_normed = x * torch.rsqrt(norm_x +
// self.eps)`, `(x_normed * self.weight.float()).to(dtype=dtype)`: plain ops,
// no F.rms_norm; fp32 x, rsqrt and x_normed saved (the last for the weight's
// gradient), an fp32 copy of a half weight.
Var RmsNormLitgpt(Tape& tape, const Var& x, Param& w, uint64_t tokens) {
  Var h = Cast(tape, x, kF32);
  Var rs = RsqrtMeanSquare(tape, h, tokens, /*composite=*/false);
  Var normed = MulImpl(tape, h, rs, "aten::mul", /*reduce_broadcast=*/true);
  tape.Drop(rs);
  Var w32 = Cast(tape, w.var, kF32);
  Var out32 = MulImpl(tape, normed, w32, "aten::mul", /*reduce_broadcast=*/true);
  tape.Drop(w32);
  tape.Drop(normed);
  tape.Drop(h);
  Var out = Cast(tape, out32, x.elem_bytes);
  tape.Drop(out32);
  return out;
}

Var LayerNorm(Tape& tape, const Var& x, Param& w, Param* b, uint64_t tokens) {
  return LayerNorm(tape, x, &w, b, tokens);
}

Var LayerNorm(Tape& tape, const Var& x, Param* w, Param* b, uint64_t tokens) {
  // CUDA autocast runs layer_norm in fp32 (autocast_mode.cpp fp32 list); CPU
  // autocast's fp32 list has no layer_norm, so it keeps the input's dtype.
  Var xin = tape.autocast && !tape.cpu_rules ? Cast(tape, x, kF32) : tape.Share(x);
  Var out = tape.New(x.numel, xin.elem_bytes, Category::kTemporaries, "aten::native_layer_norm");
  Var mean = tape.New(tokens, kF32, Category::kActivations, "aten::native_layer_norm");
  Var rstd = tape.New(tokens, kF32, Category::kActivations, "aten::native_layer_norm");
  const bool wgrad = (w && AnyGrad(tape, w->var)) || (b && AnyGrad(tape, b->var));
  if (AnyGrad(tape, xin) || wgrad) {
    NodeId n = tape.Node("NativeLayerNormBackward0", &out);
    SaveIf(tape, n, xin);
    SaveIf(tape, n, mean);
    SaveIf(tape, n, rstd);
    EdgeIf(tape, n, xin);
    if (w) EdgeIf(tape, n, w->var);
    if (b) EdgeIf(tape, n, b->var);
  }
  tape.Drop(mean);
  tape.Drop(rstd);
  tape.Drop(xin);
  return out;
}

Var TorchRmsNorm(Tape& tape, const Var& x, Param& w, uint64_t rows, bool fused) {
  if (fused) {
    // _fused_rms_norm: the output in x's dtype and rstd [rows] in fp32; its
    // backward (_fused_rms_norm_backward) reads x, rstd and the weight.
    Var out = tape.New(x.numel, x.elem_bytes, Category::kTemporaries, "aten::_fused_rms_norm");
    Var rstd = tape.New(rows, kF32, Category::kActivations, "aten::_fused_rms_norm");
    if (AnyGrad(tape, x) || AnyGrad(tape, w.var)) {
      NodeId n = tape.Node("FusedRmsNormBackward0", &out);
      SaveIf(tape, n, x);
      SaveIf(tape, n, rstd);
      EdgeIf(tape, n, x);
      EdgeIf(tape, n, w.var);
    }
    tape.Drop(rstd);
    return out;
  }
  // Half inputs are upcast (opmath); the fp32 copy is what pow and mul save.
  Var h = Cast(tape, x, kF32);
  // mean(-1, keepdim=True).add_(eps): the eps goes in place.
  Var rs = RsqrtMeanSquare(tape, h, rows, /*composite=*/true);
  Var normed = MulImpl(tape, h, rs, "aten::mul", /*reduce_broadcast=*/true);
  tape.Drop(rs);
  // normed * weight in fp32 (the weight promotes or is promoted), then type_as(input).
  Var scaled = MulParam(tape, normed, w, false);
  tape.Drop(normed);
  Var out = Cast(tape, scaled, x.elem_bytes);
  tape.Drop(scaled);
  tape.Drop(h);
  return out;
}

bool InputsRequireGrad(const TrainingSetup& setup) {
  // PEFT / transformers' enable_input_require_grads; torchtune 0.6.1's recipes
  // never call it (its checkpointing is non-reentrant, which needs none).
  return setup.finetune != Finetune::kFull && setup.grad_ckpt != GradCkpt::kNone &&
         setup.impl != ModelImpl::kTorchtune;
}

Var RequireInputGrad(Tape& tape, Var x) {
  if (!tape.grad_enabled || x.requires_grad()) return x;
  tape.input_grads.push_back(kNoTensor);
  x.fn = tape.graph.AddAccumulateGrad(x.bytes(), &tape.input_grads.back());
  // AccumulateGrad holds the leaf itself: alive until the graph goes.
  tape.graph.Ref(x.t);
  tape.input_leaves.push_back(x.t);
  x.slot = 0;
  return x;
}

namespace {

Var EmbeddingOp(Tape& tape, const Var& ids, Param& w, uint64_t tokens, uint64_t dim) {
  Var out = tape.New(tokens * dim, w.elem_bytes, Category::kTemporaries, "aten::embedding");
  if (AnyGrad(tape, w.var)) {
    NodeId n = tape.Node("EmbeddingBackward0", &out);
    SaveIf(tape, n, ids);
    // embedding_dense_backward_cuda sorts the indices: a few index-sized buffers.
    tape.graph.Workspace(n, tokens * kI64 * 4);
    EdgeIf(tape, n, w.var);
  }
  return out;
}

}  // namespace

Var Embedding(Tape& tape, const Var& ids, Param& w, uint64_t tokens, uint64_t dim,
              bool require_grad) {
  // The module name differs from a tied lm_head's (Linear) over the same weight.
  const std::string name = std::string(ModuleOf(tape, w)) + ":embedding";
  return InModule(tape, name, {&w}, ids, [&](const Var& in) {
    Var out = EmbeddingOp(tape, in, w, tokens, dim);
    return require_grad ? RequireInputGrad(tape, out) : out;
  });
}

}  // namespace vramscope::lower
