#include "attention.h"

#include "ops.h"

namespace vramscope::lower {

AttnPlan PlanAttention(const TrainingSetup& setup, uint8_t compute_bytes, uint64_t heads,
                       uint64_t kv_heads, bool sliding_window_mask, double dropout,
                       KvSharing sharing) {
  AttnPlan plan;
  if (kv_heads != heads && sharing == KvSharing::kExpanded) {
    // The model already copied k/v to every head: the kernels see plain MHA
    // after that copy (modelled as repeat_kv).
    plan = PlanAttention(setup, compute_bytes, heads, heads, sliding_window_mask, dropout);
    plan.repeat_kv = true;
    plan.gqa_native = false;
    return plan;
  }
  const bool gqa = kv_heads != heads;
  if (gqa && sharing == KvSharing::kBroadcast &&
      (setup.attn == Attention::kSdpa || setup.attn == Attention::kEager)) {
    // Fused SDPA kernels (flash, memory-efficient, cuDNN, the CPU flash kernel)
    // need equal head counts without enable_gqa (sdp_utils
    // check_batch_size_and_num_heads_dense): SDPA falls back to its math path.
    // Eager attention's matmul broadcasts the same way.
    plan.kernel = setup.attn == Attention::kEager ? AttnKernel::kMath : AttnKernel::kSdpaMath;
    plan.kv_broadcast = true;
    plan.gqa_native = false;
    plan.fp32_softmax = setup.attn == Attention::kEager;
    plan.causal_mask_tensor = setup.attn == Attention::kEager;
    return plan;
  }
  switch (setup.attn) {
    case Attention::kFlash:
      // flash_attn_func handles GQA natively and needs no mask (causal=True,
      // window_size for sliding windows).
      plan.kernel = AttnKernel::kFlash;
      plan.gqa_native = true;
      return plan;
    case Attention::kEager:
      plan.kernel = AttnKernel::kMath;
      plan.repeat_kv = gqa;
      plan.gqa_native = false;
      plan.causal_mask_tensor = true;
      return plan;
    case Attention::kSdpa: break;
  }
  // SDPA. With a sliding-window mask transformers passes an explicit mask, and
  // SDPA uses the memory-efficient kernel (still O(s) saved memory, plus the
  // mask); without one, is_causal=True.
  const bool mask = sliding_window_mask;
  const bool enable_gqa = setup.torch_version >= 205 && !mask;
  plan.repeat_kv = gqa && !enable_gqa;
  plan.causal_mask_tensor = mask;
  if (setup.device_rules == DeviceRules::kCpu) {
    // The CPU row (torch 2.13 CPU, measured with the profiler over fp32 / bf16 /
    // fp16, GQA and masks): select_sdp_backend_cpp takes
    // _scaled_dot_product_flash_attention_for_cpu, which reads GQA and masks
    // natively, unless dropout_p > 0 (check_for_dropout): then the math path.
    plan.kernel = dropout > 0 ? AttnKernel::kSdpaMath : AttnKernel::kCpuFlash;
    plan.gqa_native = !plan.repeat_kv;
    plan.fp32_softmax = false;
    return plan;
  }
  // PyTorch's flash kernel needs fp16/bf16; fp32 goes to the memory-efficient
  // kernel, which does not take enable_gqa: GQA then falls back to math.
  if (compute_bytes == kF32 && gqa && enable_gqa) {
    plan.kernel = AttnKernel::kSdpaMath;  // it repeat_interleaves k and v itself
    plan.gqa_native = false;
    plan.fp32_softmax = false;
    return plan;
  }
  plan.kernel = AttnKernel::kFlash;
  plan.gqa_native = !plan.repeat_kv;
  return plan;
}

namespace {

Var RepeatKv(Tape& tape, const Var& kv, const AttnShape& shape) {
  // repeat_kv: x[:, :, None].expand(b, kv, n_rep, s, d).reshape(b, heads, s, d)
  // (transformers 4.57 / 5.x). The reshape copies, except with a single kv
  // head: kv (size 1) and n_rep (stride 0) then merge, and the result is a
  // stride-0 view (checked with torch 2.13).
  const uint64_t numel = shape.tokens() * shape.heads * shape.head_dim;
  Var out;
  if (shape.kv_heads == 1) {
    out = tape.Share(kv);
    out.numel = numel;
  } else {
    out = tape.New(numel, kv.elem_bytes, Category::kTemporaries, "aten::repeat_kv");
  }
  if (kv.requires_grad() && tape.grad_enabled) {
    NodeId n = tape.Node("ViewBackward0", &out);
    // The backward of expand sums over the repeats into a kv-sized gradient.
    tape.graph.Edge(n, kv, kv.bytes());
  }
  return out;
}

// torch.matmul on 4-D operands reshapes each to [b * heads, rows, cols]
// (aten/src/ATen/native/LinearAlgebra.cpp _matmul_impl: expand + reshape). A
// transposed view of a [b, s, heads * d] projection cannot merge b and heads,
// so reshape copies it (clone + _unsafe_view; the gradient passes through), and
// bmm saves the copy: the projection's storage can go. Head-major tensors
// (cache copies, repeat_kv) reshape as views.
Var MatmulOperand(Tape& tape, const Var& x, bool head_major, uint64_t broadcast_numel = 0) {
  if (head_major && broadcast_numel == 0) return tape.Share(x);
  // Broadcast over heads (kv_broadcast): expand, then the reshape copies.
  const uint64_t numel = broadcast_numel ? broadcast_numel : x.numel;
  Var out = tape.New(numel, x.elem_bytes, Category::kTemporaries, "aten::clone");
  if (x.requires_grad() && tape.grad_enabled) {
    NodeId n = tape.Node("CloneBackward0", &out);
    tape.graph.EdgePass(n, x);
  }
  return out;
}

// A matmul operand of the attention itself. With one row per micro-batch the
// reshape to [b * heads, rows, cols] only drops the size-1 batch dimension, a
// view whatever the strides: no copy, broadcast or not (the fidelity grid's
// packed points, torch 2.13: eager attention over one packed row makes no
// q / k / v copies).
Var AttnOperand(Tape& tape, const AttnShape& shape, const Var& x, bool head_major,
                uint64_t broadcast_numel = 0) {
  if (shape.batch == 1) return tape.Share(x);
  return MatmulOperand(tape, x, head_major, broadcast_numel);
}

// torch.bmm of two operands (each gets a gradient of its own size): the
// output, [numel] elements of `bytes`. BmmBackward0 saves each operand only
// for the other's gradient (derivatives.yaml, bmm: self's formula reads mat2,
// mat2's reads self; the generated VariableType saves an input under
// `grad_fn->should_compute_output(...)` of the output that needs it, torch
// 2.x tools/autograd/gen_variable_type.py): with a frozen key (LoRA on q/v,
// layer inputs without grad) the query operand is not saved (torch 2.13 CPU
// trace, BERT tf4/tf5 LoRA bf16-mixed: layer 0's q clone is freed at once).
Var Bmm(Tape& tape, const Var& a, const Var& b, uint64_t numel, uint8_t bytes) {
  Var out = tape.New(numel, bytes, Category::kTemporaries, "aten::bmm");
  tape.graph.ForwardGemm();
  if (tape.grad_enabled && (a.requires_grad() || b.requires_grad())) {
    NodeId n = tape.Node("BmmBackward0", &out);
    tape.graph.Gemm(n, /*second_input_first=*/true);
    if (b.requires_grad()) tape.graph.Save(n, a.t);
    if (a.requires_grad()) tape.graph.Save(n, b.t);
    tape.graph.Edge(n, a, a.bytes());
    tape.graph.Edge(n, b, b.bytes());
  }
  return out;
}

Var FlashKernel(Tape& tape, const AttnPlan& plan, const AttnShape& shape, const Var& q,
                const Var& k, const Var& v, const Var* mask) {
  const uint8_t e = q.elem_bytes;
  const uint64_t q_numel = shape.tokens() * shape.heads * shape.head_dim;
  const std::string_view op = plan.kernel == AttnKernel::kFlash
                                  ? "aten::_scaled_dot_product_flash_attention"
                                  : "aten::_scaled_dot_product_flash_attention_for_cpu";
  // A bool mask becomes an additive one in q's dtype first
  // (scaled_dot_product_attention: convert_boolean_attn_mask, torch 2.x), which
  // the kernel's backward keeps.
  Var bias;
  if (mask && mask->elem_bytes == kBool) {
    bias = tape.New(mask->numel, e, Category::kTemporaries, "aten::where");
  }
  Var out = tape.New(q_numel, e, Category::kTemporaries, op);
  // logsumexp: fp32 [b, heads, s].
  Var lse = tape.New(shape.batch * shape.heads * shape.seq, kF32, Category::kActivations, op);
  if (tape.grad_enabled && (q.requires_grad() || k.requires_grad() || v.requires_grad())) {
    NodeId n = tape.Node(plan.kernel == AttnKernel::kFlash
                             ? "ScaledDotProductFlashAttentionBackward0"
                             : "ScaledDotProductFlashAttentionForCpuBackward0",
                         &out);
    if (bias.t != kNoTensor) tape.graph.Save(n, bias.t);
    if (plan.save_float_mask && mask && mask->elem_bytes != kBool) tape.graph.Save(n, mask->t);
    for (const Var* t : {&q, &k, &v, static_cast<const Var*>(&out), static_cast<const Var*>(&lse)})
      tape.graph.Save(n, t->t);
    // Backward: dq accumulator in fp32 and softmax_d (flash-attn mha_bwd); for
    // GQA the kernel writes dk/dv for every query head, then sums them. The CPU
    // kernel's buffers are internal to one dispatched op: not modelled.
    const bool cuda = plan.kernel == AttnKernel::kFlash;
    if (cuda) {
      tape.graph.Workspace(n, q_numel * kF32);
      tape.graph.Workspace(n, shape.batch * shape.heads * shape.seq * kF32);
    }
    if (cuda && plan.gqa_native && shape.kv_heads != shape.heads) {
      tape.graph.Workspace(n, q_numel * e);
      tape.graph.Workspace(n, q_numel * e);
    }
    tape.graph.Edge(n, q, q.bytes());
    tape.graph.Edge(n, k, k.bytes());
    tape.graph.Edge(n, v, v.bytes());
  }
  tape.Drop(lse);
  if (bias.t != kNoTensor) tape.Drop(bias);
  // The kernels allocate the output like q (empty_like): for a transposed view
  // of the projection that is [b, s, heads, d] and the caller's
  // transpose(1, 2).contiguous() is free; a head-major q makes it a copy.
  if (!shape.q_head_major) return out;
  Var copy = MatmulOperand(tape, out, false);
  tape.Drop(out);
  return copy;
}

// softmax(x, dim=-1) without a dtype. CUDA autocast gives it one: softmax.int
// is in AT_FORALL_FP32_SET_OPT_DTYPE (ATen/autocast_mode.h, torch 2.13), so a
// half input is copied to fp32 (at::softmax's toType) and _softmax saves an
// fp32 result. CPU autocast has no such rule (the fidelity grid's CPU traces).
Var SoftmaxNoDtype(Tape& tape, const Var& w) {
  if (!tape.autocast || tape.cpu_rules || w.elem_bytes == kF32) {
    return UnaryOp(tape, w, "aten::_softmax", "SoftmaxBackward0", true);
  }
  Var w32 = Cast(tape, w, kF32);
  Var probs = UnaryOp(tape, w32, "aten::_softmax", "SoftmaxBackward0", true);
  tape.Drop(w32);
  return probs;
}

Var MathKernel(Tape& tape, const AttnPlan& plan, const AttnShape& shape, const Var& q_in,
               const Var& k_in, const Var& v_in, const Var* mask, double dropout, Var* weights) {
  const bool kv_head_major = shape.kv_head_major;
  const uint8_t e = q_in.elem_bytes;
  const uint64_t scores = shape.batch * shape.heads * shape.seq * shape.seq;
  const uint64_t q_numel = shape.tokens() * shape.heads * shape.head_dim;
  const uint64_t broadcast = plan.kv_broadcast ? q_numel : 0;
  Var q = AttnOperand(tape, shape, q_in, shape.q_head_major);
  Var k = AttnOperand(tape, shape, k_in, kv_head_major || shape.k_head_major, broadcast);
  const bool grad = tape.grad_enabled;
  // attn_weights = torch.matmul(query, key.transpose(2, 3)) * scaling
  Var qk = Bmm(tape, q, k, scores, e);
  tape.Drop(q);
  tape.Drop(k);
  Var w = plan.legacy_bert ? DivScalar(tape, qk) : Scale(tape, qk);
  tape.Drop(qk);
  if (plan.softcap) {
    // tanh saves its result: one more [b, heads, s, s] tensor kept per layer.
    Var divided = Scale(tape, w);
    tape.Drop(w);
    Var capped = UnaryOp(tape, divided, "aten::tanh", "TanhBackward0", true);
    tape.Drop(divided);
    w = Scale(tape, capped);
    tape.Drop(capped);
  }
  if (mask && plan.legacy_stablelm) {
    w = AddInPlace(tape, w, *mask);
  } else if (mask) {
    Var masked = Add(tape, w, *mask);
    tape.Drop(w);
    w = masked;
  }
  // softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype):
  // _softmax saves its fp32 output. The statement rebinds attn_weights only
  // once .to() has run, so the masked scores live until then (the CPU trace of
  // a Llama sequence classifier, LoRA + checkpointing + eager + bf16, where no
  // lm_head logits hide this peak).
  Var probs;
  if (plan.fp32_softmax && e != kF32) {
    Var w32 = Cast(tape, w, kF32);
    Var p32 = UnaryOp(tape, w32, "aten::_softmax", "SoftmaxBackward0", true);
    tape.Drop(w32);
    probs = Cast(tape, p32, e);
    tape.Drop(p32);
    tape.Drop(w);
  } else {
    probs = SoftmaxNoDtype(tape, w);
    if (!plan.legacy_bert) tape.Drop(w);
  }
  if (plan.probs_to_v_dtype) {
    // GPT-2: attn_weights.type(value.dtype) (4.57.6 / 5.24.0 eager_attention_forward).
    Var back = Cast(tape, probs, e);
    tape.Drop(probs);
    probs = back;
  }
  Var dropped = Dropout(tape, probs, dropout);
  tape.Drop(probs);
  // attn_output = torch.matmul(attn_weights, value). matmul is on both autocast
  // lower-precision lists (ATen/autocast_mode.h and autocast_mode.cpp, torch
  // 2.13): fp32 probabilities (BERT's, or scores promoted by an fp32 mask) are
  // cast to the compute dtype, and the cast is what the matmul saves.
  Var v = AttnOperand(tape, shape, v_in, kv_head_major, broadcast);
  Var lhs = tape.autocast ? Cast(tape, dropped, e) : tape.Share(dropped);
  Var ctx = Bmm(tape, lhs, v, q_numel, e);
  tape.Drop(lhs);
  if (weights) *weights = tape.Share(dropped);  // eager_attention_forward returns it
  tape.Drop(dropped);
  tape.Drop(v);
  // attn_output.transpose(1, 2).contiguous(): a copy into [b, s, heads, d].
  Var out = tape.New(q_numel, e, Category::kTemporaries, "aten::clone");
  if (grad && ctx.requires_grad()) {
    NodeId n = tape.Node("CloneBackward0", &out);
    tape.graph.EdgePass(n, ctx);
  }
  tape.Drop(ctx);
  if (plan.legacy_bert) tape.Drop(w);  // `attention_scores` goes when the function returns
  return out;
}

// x * scalar into a new tensor (MulBackward1 saves nothing).
Var ScaleInto(Tape& tape, const Var& x, uint8_t bytes, std::string_view op) {
  Var out = tape.New(x.numel, bytes, Category::kTemporaries, op);
  if (x.requires_grad() && tape.grad_enabled) {
    NodeId n = tape.Node("MulBackward1", &out);
    tape.graph.Edge(n, x, x.bytes());
  }
  return out;
}

// at::_safe_softmax (aten/src/ATen/native/transformers/attention.cpp,
// CompositeExplicitAutograd): softmax, then a bool mask of the -inf scores
// (one byte per score) and its all() over the last dim, which zero the fully
// masked rows; both go before it returns (torch 2.13's profiler on CPU:
// softmax's output, then isneginf's bool of numel bytes and all's small one;
// where writes no new tensor). Kernel scratch below the op: an op-level
// recorder (the CPU reference, docs/trace-recorder.md) never sees it, so the
// CPU rules leave it out. The H100 measurements of falcon-7b (SDPA's math
// path) showed it in the forward peak.
void SafeSoftmaxScratch(Tape& tape, uint64_t scores, uint64_t keys) {
  if (tape.cpu_rules) return;
  Var neg_inf = tape.New(scores, kBool, Category::kTemporaries, "aten::isneginf");
  Var rows =
      tape.New(scores / std::max<uint64_t>(keys, 1), kBool, Category::kTemporaries, "aten::all");
  tape.Drop(neg_inf);
  tape.Drop(rows);
}

// _scaled_dot_product_attention_math (aten/src/ATen/native/transformers/
// attention.cpp, torch 2.x; CompositeImplicit, so autograd records its ops):
// fp16/bf16 inputs are copied to fp32 first; q and k^T are each scaled by
// sqrt(scale); is_causal builds ones(s, s).tril() and turns it into a float
// mask; GQA repeat_interleaves k and v; attn = matmul(q, k^T) gets the mask
// added in place; _safe_softmax saves its result; dropout; matmul with v; the
// output and the (discarded) weights are cast back to the input dtype.
// transformers then makes the output [b, s, heads, d] contiguous: a copy.
Var SdpaMathKernel(Tape& tape, const AttnPlan& plan, const AttnShape& shape, const Var& q_in,
                   const Var& k_in, const Var& v_in, const Var* mask, double dropout) {
  const uint8_t e = q_in.elem_bytes;
  const uint8_t acc = kF32;  // fp16 / bf16 inputs are upcast; fp32 stays
  const uint64_t scores = shape.batch * shape.heads * shape.seq * shape.seq;
  const uint64_t q_numel = shape.tokens() * shape.heads * shape.head_dim;
  const bool grad = tape.grad_enabled;
  // C++ locals of the function (query_acc, key_acc, value_acc, query, the
  // mask, the GQA-expanded key and value) live until it returns; temporaries
  // of an expression die with it.
  std::vector<Var> locals;
  Var q_acc = Cast(tape, q_in, acc);
  Var k_acc = Cast(tape, k_in, acc);
  Var v_acc = Cast(tape, v_in, acc);
  Var q_s = ScaleInto(tape, q_acc, acc, "aten::mul");
  locals.insert(locals.end(), {q_acc, k_acc, v_acc, q_s});
  if (!mask && shape.causal) {
    Var ones = tape.New(shape.seq * shape.seq, kBool, Category::kTemporaries, "aten::ones");
    Var tril = tape.New(shape.seq * shape.seq, kBool, Category::kTemporaries, "aten::tril");
    tape.Drop(ones);
    locals.push_back(tape.New(shape.seq * shape.seq, acc, Category::kTemporaries, "aten::where"));
    tape.Drop(tril);
  }
  // enable_gqa: repeat_interleave; broadcast k/v are copied by matmul instead.
  const bool expand = shape.kv_heads != shape.heads && !plan.kv_broadcast;
  const uint64_t broadcast = plan.kv_broadcast ? q_numel : 0;
  bool head_major = shape.kv_head_major;
  Var k_x = k_acc, v_x = v_acc;
  if (expand) {
    // repeat_interleave on the head dimension: new head-major tensors.
    for (Var* kv : {&k_x, &v_x}) {
      Var rep = tape.New(q_numel, acc, Category::kTemporaries, "aten::repeat_interleave");
      if (kv->requires_grad() && grad) {
        NodeId n = tape.Node("RepeatInterleaveBackward0", &rep);
        tape.graph.Edge(n, *kv, kv->bytes());
      }
      *kv = rep;
      locals.push_back(rep);
    }
    head_major = true;
  }
  // matmul(query, key.transpose(-2, -1) * scaling_factor): the scaled key and
  // the operands' reshape copies are temporaries of the expression.
  Var k_s = ScaleInto(tape, k_x, acc, "aten::mul");
  Var q_op = AttnOperand(tape, shape, q_s, shape.q_head_major);
  Var k_op = AttnOperand(tape, shape, k_s, head_major || shape.k_head_major, broadcast);
  Var attn = Bmm(tape, q_op, k_op, scores, acc);
  tape.Drop(k_s);
  tape.Drop(q_op);
  tape.Drop(k_op);
  // The mask is added in place; _safe_softmax and dropout each replace `attn`.
  Var probs = UnaryOp(tape, attn, "aten::_safe_softmax", "SafeSoftmaxBackward0", true);
  SafeSoftmaxScratch(tape, scores, shape.seq);
  tape.Drop(attn);
  Var dropped = Dropout(tape, probs, dropout);
  tape.Drop(probs);
  // return {matmul(attn, value).to(origin_dtype), attn.to(origin_dtype)}: the
  // weights' copy is made (and discarded by the caller), the fp32 product and
  // its cast coexist until the tuple is built.
  Var weights_out = Cast(tape, dropped, e);
  Var v_op = AttnOperand(tape, shape, v_x, head_major, broadcast);
  Var ctx = Bmm(tape, dropped, v_op, q_numel, acc);
  tape.Drop(v_op);
  Var ctx_e = Cast(tape, ctx, e);
  tape.Drop(ctx);
  tape.Drop(dropped);
  tape.Drop(weights_out);
  for (Var& v : locals) tape.Drop(v);
  // attn_output.transpose(1, 2).contiguous() (sdpa_attention.py).
  Var out = MatmulOperand(tape, ctx_e, false);
  tape.Drop(ctx_e);
  return out;
}

}  // namespace

Var Attend(Tape& tape, const AttnPlan& plan, const AttnShape& shape, const Var& q_in,
           const Var& k_in, const Var& v_in, const Var* mask, double dropout, Var* weights) {
  // Autocast runs scaled_dot_product_attention and matmul in the lower
  // precision (autocast_mode.cpp, CUDA and CPU lists): fp32 q / k (RoPE against
  // fp32 tables) or v (the 4.x cache) are cast, uncached, on the way in.
  // repeat_kv runs first (transformers' attention functions), so a stride-0
  // view is cast at full size.
  const uint8_t to = tape.autocast ? tape.compute_bytes : 0;
  Var kr = plan.repeat_kv ? RepeatKv(tape, k_in, shape) : tape.Share(k_in);
  Var vr = plan.repeat_kv ? RepeatKv(tape, v_in, shape) : tape.Share(v_in);
  Var kk = to ? Cast(tape, kr, to) : tape.Share(kr);
  Var vv = to ? Cast(tape, vr, to) : tape.Share(vr);
  Var q = to ? Cast(tape, q_in, to) : tape.Share(q_in);
  tape.Drop(kr);
  tape.Drop(vr);
  // After repeat_kv the kernels see every head; a stride-0 view (one kv head)
  // is not head-major, so matmul's reshape copies it at full size.
  AttnShape seen = shape;
  if (plan.repeat_kv) {
    seen.kv_heads = shape.heads;
    seen.kv_head_major = shape.kv_heads != 1;
  }
  Var out;
  switch (plan.kernel) {
    case AttnKernel::kFlash:
    case AttnKernel::kCpuFlash: out = FlashKernel(tape, plan, seen, q, kk, vv, mask); break;
    case AttnKernel::kMath:
      out = MathKernel(tape, plan, seen, q, kk, vv, mask, dropout, weights);
      break;
    case AttnKernel::kSdpaMath:
      out = SdpaMathKernel(tape, plan, seen, q, kk, vv, mask, dropout);
      break;
  }
  tape.Drop(kk);
  tape.Drop(vv);
  tape.Drop(q);
  return out;
}

}  // namespace vramscope::lower

namespace vramscope::lower {

Var AttnBmm(Tape& tape, const Var& a, const Var& b, uint64_t numel, uint8_t bytes) {
  return Bmm(tape, a, b, numel, bytes);
}

Var AttnMatmulOperand(Tape& tape, const Var& x, bool head_major, uint64_t batch) {
  if (batch == 1) return tape.Share(x);
  return MatmulOperand(tape, x, head_major);
}

Var AttnSoftmaxNoDtype(Tape& tape, const Var& w) { return SoftmaxNoDtype(tape, w); }

}  // namespace vramscope::lower
