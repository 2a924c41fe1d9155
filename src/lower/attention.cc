#include "attention.h"

#include "ops.h"

namespace vramscope::lower {

AttnPlan PlanAttention(const TrainingSetup& setup, uint8_t compute_bytes, uint64_t heads,
                       uint64_t kv_heads, bool sliding_window_mask) {
  AttnPlan plan;
  const bool gqa = kv_heads != heads;
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
    case Attention::kSdpa:
      break;
  }
  // SDPA. With a sliding-window mask transformers passes an explicit mask, and
  // SDPA uses the memory-efficient kernel (still O(s) saved memory, plus the
  // mask); without one, is_causal=True.
  const bool mask = sliding_window_mask;
  const bool enable_gqa = setup.torch_version >= 205 && !mask;
  plan.repeat_kv = gqa && !enable_gqa;
  plan.causal_mask_tensor = mask;
  // PyTorch's flash kernel needs fp16/bf16; fp32 goes to the memory-efficient
  // kernel, which does not take enable_gqa: GQA then falls back to math.
  if (compute_bytes == kF32 && gqa && enable_gqa) {
    plan.kernel = AttnKernel::kMath;
    plan.repeat_kv = true;  // the math path repeat_interleaves k and v
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
  // repeat_kv: expand + reshape materializes [b, heads, s, d].
  Var out = tape.New(shape.tokens() * shape.heads * shape.head_dim, kv.elem_bytes,
                     Category::kTemporaries, "aten::repeat_kv");
  if (kv.requires_grad() && tape.grad_enabled) {
    NodeId n = tape.Node("ViewBackward0", &out);
    // The backward of expand sums over the repeats into a kv-sized gradient.
    tape.graph.Edge(n, kv, kv.bytes());
  }
  return out;
}

Var FlashKernel(Tape& tape, const AttnPlan& plan, const AttnShape& shape, const Var& q,
                const Var& k, const Var& v) {
  const uint8_t e = q.elem_bytes;
  const uint64_t q_numel = shape.tokens() * shape.heads * shape.head_dim;
  Var out = tape.New(q_numel, e, Category::kTemporaries, "aten::_scaled_dot_product_flash_attention");
  // logsumexp: fp32 [b, heads, s].
  Var lse = tape.New(shape.batch * shape.heads * shape.seq, kF32, Category::kActivations,
                     "aten::_scaled_dot_product_flash_attention");
  if (tape.grad_enabled && (q.requires_grad() || k.requires_grad() || v.requires_grad())) {
    NodeId n = tape.Node("ScaledDotProductFlashAttentionBackward0", &out);
    for (const Var* t : {&q, &k, &v, static_cast<const Var*>(&out), static_cast<const Var*>(&lse)}) tape.graph.Save(n, t->t);
    // Backward: dq accumulator in fp32 and softmax_d (flash-attn mha_bwd); for
    // GQA the kernel writes dk/dv for every query head, then sums them.
    tape.graph.Workspace(n, q_numel * kF32);
    tape.graph.Workspace(n, shape.batch * shape.heads * shape.seq * kF32);
    if (plan.gqa_native && shape.kv_heads != shape.heads) {
      tape.graph.Workspace(n, q_numel * e);
      tape.graph.Workspace(n, q_numel * e);
    }
    tape.graph.Edge(n, q, q.bytes());
    tape.graph.Edge(n, k, k.bytes());
    tape.graph.Edge(n, v, v.bytes());
  }
  tape.Drop(lse);
  // The kernel writes [b, s, heads, d]: transpose(1, 2).reshape is a view.
  return out;
}

Var MathKernel(Tape& tape, const AttnPlan& plan, const AttnShape& shape, const Var& q,
               const Var& k, const Var& v, const Var* mask, double dropout) {
  const uint8_t e = q.elem_bytes;
  const uint64_t scores = shape.batch * shape.heads * shape.seq * shape.seq;
  const uint64_t q_numel = shape.tokens() * shape.heads * shape.head_dim;
  const bool grad = tape.grad_enabled;
  // attn_weights = torch.matmul(query, key.transpose(2, 3)) * scaling
  Var qk = tape.New(scores, e, Category::kTemporaries, "aten::bmm");
  if (grad && (q.requires_grad() || k.requires_grad())) {
    NodeId n = tape.Node("BmmBackward0", &qk);
    tape.graph.Save(n, q.t);
    tape.graph.Save(n, k.t);
    tape.graph.Edge(n, q, q.bytes());
    tape.graph.Edge(n, k, k.bytes());
  }
  Var w = Scale(tape, qk);
  tape.Drop(qk);
  if (mask) {
    Var masked = Add(tape, w, *mask);
    tape.Drop(w);
    w = masked;
  }
  // softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype):
  // _softmax saves its fp32 output.
  Var probs;
  if (plan.fp32_softmax && e != kF32) {
    Var w32 = Cast(tape, w, kF32);
    tape.Drop(w);
    Var p32 = tape.New(scores, kF32, Category::kTemporaries, "aten::_softmax");
    if (grad && w32.requires_grad()) {
      NodeId n = tape.Node("SoftmaxBackward0", &p32);
      tape.graph.Save(n, p32.t);
      tape.graph.Edge(n, w32, w32.bytes());
    }
    tape.Drop(w32);
    probs = Cast(tape, p32, e);
    tape.Drop(p32);
  } else {
    probs = tape.New(scores, w.elem_bytes, Category::kTemporaries, "aten::_softmax");
    if (grad && w.requires_grad()) {
      NodeId n = tape.Node("SoftmaxBackward0", &probs);
      tape.graph.Save(n, probs.t);
      tape.graph.Edge(n, w, w.bytes());
    }
    tape.Drop(w);
  }
  Var dropped = Dropout(tape, probs, dropout);
  tape.Drop(probs);
  // attn_output = torch.matmul(attn_weights, value)
  Var ctx = tape.New(q_numel, e, Category::kTemporaries, "aten::bmm");
  if (grad && (dropped.requires_grad() || v.requires_grad())) {
    NodeId n = tape.Node("BmmBackward0", &ctx);
    tape.graph.Save(n, dropped.t);
    tape.graph.Save(n, v.t);
    tape.graph.Edge(n, dropped, dropped.bytes());
    tape.graph.Edge(n, v, v.bytes());
  }
  tape.Drop(dropped);
  // attn_output.transpose(1, 2).contiguous(): a copy into [b, s, heads, d].
  Var out = tape.New(q_numel, e, Category::kTemporaries, "aten::clone");
  if (grad && ctx.requires_grad()) {
    NodeId n = tape.Node("CloneBackward0", &out);
    tape.graph.EdgePass(n, ctx);
  }
  tape.Drop(ctx);
  return out;
}

}  // namespace

Var Attend(Tape& tape, const AttnPlan& plan, const AttnShape& shape, const Var& q,
           const Var& k, const Var& v, const Var* mask, double dropout) {
  Var kk = plan.repeat_kv ? RepeatKv(tape, k, shape) : tape.Share(k);
  Var vv = plan.repeat_kv ? RepeatKv(tape, v, shape) : tape.Share(v);
  Var out = plan.kernel == AttnKernel::kFlash
                ? FlashKernel(tape, plan, shape, q, kk, vv)
                : MathKernel(tape, plan, shape, q, kk, vv, mask, dropout);
  tape.Drop(kk);
  tape.Drop(vv);
  return out;
}

}  // namespace vramscope::lower
