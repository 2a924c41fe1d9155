#include "t5.h"

#include <string>

#include <fmt/format.h>

#include "attention.h"
#include "loss.h"
#include "ops.h"
#include "vramscope/common/decimal.h"

// Every rule here reads transformers 5.24.0 models/t5/modeling_t5.py (T5Stack,
// T5Block, T5LayerSelfAttention / CrossAttention / FF, T5Attention,
// eager_attention_forward, T5DenseActDense / T5DenseGatedActDense,
// T5LayerNorm, T5ForConditionalGeneration.forward) unless it says otherwise.
namespace vramscope::lower {
namespace {

// The slot of a block parameter named `rest` (after "<stack>.block.N.layer.").
void PlaceBlockParam(T5Params::Block& b, const std::string& rest, bool decoder, Param* p) {
  const std::string ff = decoder ? "2." : "1.";
  const std::pair<std::string, Param**> slots[] = {
      {"0.SelfAttention.q.weight", &b.self.q},
      {"0.SelfAttention.k.weight", &b.self.k},
      {"0.SelfAttention.v.weight", &b.self.v},
      {"0.SelfAttention.o.weight", &b.self.o},
      {"0.SelfAttention.relative_attention_bias.weight", &b.rel_bias},
      {"0.layer_norm.weight", &b.norm_self},
      {"1.EncDecAttention.q.weight", &b.cross.q},
      {"1.EncDecAttention.k.weight", &b.cross.k},
      {"1.EncDecAttention.v.weight", &b.cross.v},
      {"1.EncDecAttention.o.weight", &b.cross.o},
      {ff + "layer_norm.weight", &b.norm_ff},
      {ff + "DenseReluDense.wi.weight", &b.wi},
      {ff + "DenseReluDense.wi_0.weight", &b.wi_0},
      {ff + "DenseReluDense.wi_1.weight", &b.wi_1},
      {ff + "DenseReluDense.wo.weight", &b.wo}};
  // The decoder's cross-attention norm is layer.1's; the encoder has none.
  if (decoder && rest == "1.layer_norm.weight") {
    b.norm_cross = p;
    return;
  }
  for (const auto& [name, slot] : slots) {
    if (rest == name) *slot = p;
  }
}

// "encoder.block.12.layer.0..." -> block 12 and the rest; false if not a block param.
bool SplitBlockName(const std::string& name, const std::string& stack, size_t* block,
                    std::string* rest) {
  const std::string prefix = stack + ".block.";
  if (!name.starts_with(prefix)) return false;
  const size_t dot = name.find('.', prefix.size());
  if (dot == std::string::npos) return false;
  // A checkpoint's name, not a number the config vouched for: "block.x." or a
  // 30-digit index is simply not a block parameter (std::stoul threw).
  const auto index = common::ParseDecimal(
      std::string_view(name).substr(prefix.size(), dot - prefix.size()), UINT32_MAX);
  if (!index) return false;
  *block = static_cast<size_t>(*index);
  const std::string layer = ".layer.";
  if (name.compare(dot, layer.size(), layer) != 0) return false;
  *rest = name.substr(dot + layer.size());
  return true;
}

Status CheckBlocks(const ModelSpec& spec, const std::vector<T5Params::Block>& blocks,
                   bool decoder) {
  for (size_t i = 0; i < blocks.size(); ++i) {
    const T5Params::Block& b = blocks[i];
    const bool ff = b.wo && (spec.t5.gated ? (b.wi_0 && b.wi_1) : b.wi != nullptr);
    const bool cross =
        !decoder || (b.cross.q && b.cross.k && b.cross.v && b.cross.o && b.norm_cross);
    if (!b.self.q || !b.self.k || !b.self.v || !b.self.o || !b.norm_self || !b.norm_ff || !ff ||
        !cross || (i == 0) != (b.rel_bias != nullptr)) {
      return MakeError(
          fmt::format("{}: T5 {} block {} lacks attention, feed-forward or norm "
                      "parameters",
                      spec.name, decoder ? "decoder" : "encoder", i));
    }
  }
  return Ok{};
}

}  // namespace

Result<T5Params> IndexT5Params(const ModelSpec& spec, std::vector<Param>& params) {
  T5Params tp;
  tp.encoder.resize(spec.t5.encoder_layers);
  tp.decoder.resize(spec.t5.decoder_layers);
  for (size_t i = 0; i < spec.params.size(); ++i) {
    const std::string& name = spec.params[i].name;
    size_t block = 0;
    std::string rest;
    if (name == "shared.weight") tp.shared = &params[i];
    if (name == "encoder.final_layer_norm.weight") tp.encoder_norm = &params[i];
    if (name == "decoder.final_layer_norm.weight") tp.decoder_norm = &params[i];
    if (SplitBlockName(name, "encoder", &block, &rest) && block < tp.encoder.size())
      PlaceBlockParam(tp.encoder[block], rest, false, &params[i]);
    if (SplitBlockName(name, "decoder", &block, &rest) && block < tp.decoder.size())
      PlaceBlockParam(tp.decoder[block], rest, true, &params[i]);
  }
  if (!tp.shared || !tp.encoder_norm || (!spec.t5.encoder_only && !tp.decoder_norm)) {
    return MakeError(
        fmt::format("{}: could not find the shared embedding and final norms in its parameter list",
                    spec.name));
  }
  for (bool decoder : {false, true}) {
    Status blocks = CheckBlocks(spec, decoder ? tp.decoder : tp.encoder, decoder);
    if (!blocks.ok()) return blocks.error();
  }
  return tp;
}

uint64_t T5TargetLen(const TrainingSetup& setup) {
  return setup.target_len != 0 ? setup.target_len : setup.seq;
}

namespace {

struct T5Dims {
  uint64_t b = 1, src = 1, tgt = 1, h = 1, heads = 1, dkv = 1, inner = 1, ff = 1;
};

T5Dims DimsOf(const ModelSpec& spec, uint64_t batch, uint64_t src, uint64_t tgt) {
  T5Dims d;
  d.b = batch;
  d.src = src;
  d.tgt = tgt;
  d.h = spec.hidden_size;
  d.heads = spec.num_heads;
  d.dkv = spec.head_dim;
  d.inner = d.heads * d.dkv;
  d.ff = spec.intermediate_size;
  return d;
}

// What a stack's forward shares between its blocks.
struct StackState {
  bool decoder = false;
  bool training = true;  // dropout on
  bool ckpt = false;     // GradientCheckpointingLayer around every block
  bool reentrant = false;
  const Var* mask = nullptr;          // the decoder's causal mask [b, 1, tgt, tgt]
  const Var* encoder_out = nullptr;   // the encoder's last hidden state (decoder only)
  Var position_bias;                  // block 0's self-attention bias, then handed on
  Var cross_bias;                     // block 0's cross-attention zeros, then handed on
  std::vector<Var>* cache = nullptr;  // the EncoderDecoderCache's tensors (no checkpointing)
  // SDPA (sdpa_attention_forward) for the encoder's self-attention; eager
  // attention when null.
  const AttnPlan* sdpa = nullptr;
  uint64_t q_len = 1;
  double p = 0;  // dropout_rate while training
};

// `a op b` of two [q, k] int64 / float temporaries of compute_bias's bucket
// arithmetic (nothing requires grad: no nodes).
Var Temp(Tape& tape, uint64_t numel, uint8_t bytes, std::string_view op) {
  return tape.New(numel, bytes, Category::kTemporaries, op);
}

// T5Attention._relative_position_bucket over `rp` [q, k] int64: the
// bidirectional (encoder) or causal (decoder) bucketing, each step a new
// [q, k] tensor rebound as it goes. Returns the int64 buckets.
Var RelativeBuckets(Tape& tape, uint64_t n, bool decoder) {
  Var buckets, rp;
  if (!decoder) {
    // (relative_position > 0).to(torch.long) * num_buckets, then 0 + that.
    Var gt = Temp(tape, n, kBool, "aten::gt");
    Var as_long = Temp(tape, n, kI64, "aten::_to_copy");
    tape.Drop(gt);
    Var scaled = Temp(tape, n, kI64, "aten::mul");
    tape.Drop(as_long);
    buckets = Temp(tape, n, kI64, "aten::add");
    tape.Drop(scaled);
    rp = Temp(tape, n, kI64, "aten::abs");
  } else {
    // -torch.min(relative_position, torch.zeros_like(relative_position))
    Var zeros = Temp(tape, n, kI64, "aten::zeros_like");
    Var mn = Temp(tape, n, kI64, "aten::minimum");
    tape.Drop(zeros);
    rp = Temp(tape, n, kI64, "aten::neg");
    tape.Drop(mn);
  }
  Var is_small = Temp(tape, n, kBool, "aten::lt");
  // max_exact + (log(rp.float() / max_exact) / log(...) * (nb - max_exact)).to(long)
  Var f = Temp(tape, n, kF32, "aten::_to_copy");
  Var div = Temp(tape, n, kF32, "aten::div");
  tape.Drop(f);
  Var lg = Temp(tape, n, kF32, "aten::log");
  tape.Drop(div);
  Var div2 = Temp(tape, n, kF32, "aten::div");
  tape.Drop(lg);
  Var mul = Temp(tape, n, kF32, "aten::mul");
  tape.Drop(div2);
  Var as_long = Temp(tape, n, kI64, "aten::_to_copy");
  tape.Drop(mul);
  Var large = Temp(tape, n, kI64, "aten::add");
  tape.Drop(as_long);
  Var full = Temp(tape, n, kI64, "aten::full_like");
  Var capped = Temp(tape, n, kI64, "aten::minimum");
  tape.Drop(large);
  tape.Drop(full);
  Var chosen = Temp(tape, n, kI64, "aten::where");
  if (decoder) {
    buckets = Temp(tape, n, kI64, "aten::add");  // 0 + where(...): a new tensor
  }                                              // else: relative_buckets += where(...) in place
  tape.Drop(chosen);
  tape.Drop(capped);
  tape.Drop(is_small);
  tape.Drop(rp);
  return buckets;
}

// T5Attention.compute_bias(q, k): aranges, relative_position [q, k] (a local
// until it returns), the buckets, relative_attention_bias(buckets) [q, k,
// heads] in the table's dtype (EmbeddingBackward0 saves the buckets), then a
// permuted view [1, heads, q, k].
Var ComputeBias(Tape& tape, Param& table, const T5Dims& d, uint64_t q, uint64_t k, bool decoder) {
  Var ctx = Temp(tape, q, kI64, "aten::arange");
  Var mem = Temp(tape, k, kI64, "aten::arange");
  Var rp = Temp(tape, q * k, kI64, "aten::sub");
  Var buckets = RelativeBuckets(tape, q * k, decoder);
  Var values = Embedding(tape, buckets, table, q * k, d.heads);
  tape.Drop(buckets);
  tape.Drop(rp);
  tape.Drop(mem);
  tape.Drop(ctx);
  return values;
}

// The cross-attention's position_bias in block 0: torch.zeros((1, heads, q,
// k), dtype=query's), a leaf that requires grad when the module checkpoints
// in training (T5Attention.gradient_checkpointing, which 5.24.0's
// _set_gradient_checkpointing sets on every module having the attribute).
Var CrossZeros(Tape& tape, const StackState& st, const T5Dims& d, uint8_t q_bytes) {
  Var zeros = tape.New(d.heads * st.q_len * d.src, q_bytes, Category::kOther, "aten::zeros");
  if (st.ckpt && st.training) zeros = RequireInputGrad(tape, zeros);
  return zeros;
}

// DynamicLayer.update in training (use_cache, no checkpointing; 5.24.0
// cache_utils.py): torch.cat([empty, states]), a head-major copy the cache
// holds until the model's output goes.
Var CacheCopy(Tape& tape, std::vector<Var>* cache, Var states) {
  Var copy = tape.New(states.numel, states.elem_bytes, Category::kTemporaries, "aten::cat");
  if (states.requires_grad() && tape.grad_enabled) {
    NodeId n = tape.Node("CatBackward0", &copy);
    tape.graph.Edge(n, states, states.bytes());
  }
  tape.Drop(states);
  cache->push_back(tape.Share(copy));
  return copy;
}

// eager_attention_forward: matmul(q, k^T) * scaling (scaling 1.0: still a new
// tensor), + position_bias, + the mask, softmax without a dtype, dropout,
// matmul with v, transpose(1, 2).contiguous(). `weights` receives the
// returned (post-dropout) weights.
Var EagerKernel(Tape& tape, const T5Dims& d, uint64_t q_len, uint64_t k_len, const Var& q,
                const Var& k, const Var& v, bool kv_head_major, const Var& bias, const Var* mask,
                double p, Var* weights) {
  const uint8_t e = q.elem_bytes;
  Var qop = AttnMatmulOperand(tape, q, false, d.b);
  Var kop = AttnMatmulOperand(tape, k, kv_head_major, d.b);
  Var qk = AttnBmm(tape, qop, kop, d.b * d.heads * q_len * k_len, e);
  tape.Drop(qop);
  tape.Drop(kop);
  Var w = Scale(tape, qk);
  tape.Drop(qk);
  Var biased = Add(tape, w, bias);
  tape.Drop(w);
  if (mask) {
    Var masked = Add(tape, biased, *mask);
    tape.Drop(biased);
    biased = masked;
  }
  Var probs = AttnSoftmaxNoDtype(tape, biased);
  tape.Drop(biased);
  Var dropped = Dropout(tape, probs, p);
  tape.Drop(probs);
  // matmul autocasts fp32 probabilities (an fp32 bias promoted the scores) to
  // the compute dtype; the cast is what it saves.
  Var vop = AttnMatmulOperand(tape, v, kv_head_major, d.b);
  Var lhs = tape.autocast ? Cast(tape, dropped, v.elem_bytes) : tape.Share(dropped);
  const uint64_t out_numel = d.b * q_len * d.inner;
  Var ctx = AttnBmm(tape, lhs, vop, out_numel, lhs.elem_bytes);
  tape.Drop(lhs);
  tape.Drop(vop);
  *weights = dropped;
  Var out = tape.New(out_numel, ctx.elem_bytes, Category::kTemporaries, "aten::clone");
  if (tape.grad_enabled && ctx.requires_grad()) {
    NodeId n = tape.Node("CloneBackward0", &out);
    tape.graph.EdgePass(n, ctx);
  }
  tape.Drop(ctx);
  return out;
}

// sdpa_attention_forward for the encoder's self-attention (transformers
// 5.24.0 integrations/sdpa_attention.py): without an attention mask and not
// causal, create_position_bias_mask returns `position_bias.contiguous()`, a
// [1, heads, q, q] copy of the permuted bias view in its dtype in every layer,
// which scaled_dot_product_attention takes as a float attn_mask (the kernel
// PlanAttention picks; the CPU flash kernel reads it broadcast over the
// batch). The output comes back [b, q, heads, d]-contiguous, so the
// transposes and .contiguous() after it copy nothing. Not modelled: the
// memory-efficient kernel's padded copy of a mask whose last dimension is not
// aligned (CUDA only; FLUX's 256 and 512 tokens are aligned).
Var SdpaKernel(Tape& tape, const AttnPlan& plan, const T5Dims& d, uint64_t q_len, const Var& q,
               const Var& k, const Var& v, const Var& bias, double p) {
  Var mask =
      tape.New(d.heads * q_len * q_len, bias.elem_bytes, Category::kTemporaries, "aten::clone");
  if (tape.grad_enabled && bias.requires_grad()) {
    NodeId n = tape.Node("CloneBackward0", &mask);
    tape.graph.EdgePass(n, bias);
  }
  AttnShape shape;
  shape.batch = d.b;
  shape.seq = q_len;
  shape.heads = shape.kv_heads = d.heads;
  shape.head_dim = d.dkv;
  shape.causal = false;
  Var out = Attend(tape, plan, shape, q, k, v, &mask, p);
  tape.Drop(mask);
  return out;
}

// T5Attention.forward: q / k / v (of `kv_in` for cross-attention), the cache
// update, the bias when this is block 0 (compute_bias, or zeros for
// cross-attention), the kernel, o. query / key / value states live until it
// returns. `*bias` is the bias to use (filled in block 0).
Var AttentionForward(Tape& tape, const T5Params::Attention& a, Param* rel_bias,
                     const StackState& st, const T5Dims& d, const Var& x, const Var* kv_in,
                     Var* bias, Var* weights) {
  const bool cross = kv_in != nullptr;
  const uint64_t q_len = st.q_len, k_len = cross ? d.src : st.q_len;
  const uint64_t q_tokens = d.b * q_len, k_tokens = d.b * k_len;
  Var q = Linear(tape, x, *a.q, nullptr, q_tokens, d.inner);
  const Var& kv_src = cross ? *kv_in : x;
  Var k = Linear(tape, kv_src, *a.k, nullptr, k_tokens, d.inner);
  Var v = Linear(tape, kv_src, *a.v, nullptr, k_tokens, d.inner);
  if (st.cache) {
    k = CacheCopy(tape, st.cache, k);
    v = CacheCopy(tape, st.cache, v);
  }
  if (bias->t == kNoTensor) {
    *bias = cross ? CrossZeros(tape, st, d, q.elem_bytes)
                  : ComputeBias(tape, *rel_bias, d, q_len, k_len, st.decoder);
  }
  const Var* mask = cross ? nullptr : st.mask;
  Var ctx = st.sdpa && !cross && !st.decoder
                ? SdpaKernel(tape, *st.sdpa, d, q_len, q, k, v, *bias, st.training ? st.p : 0.0)
                : EagerKernel(tape, d, q_len, k_len, q, k, v, st.cache != nullptr, *bias, mask,
                              st.training ? st.p : 0.0, weights);
  Var out = Linear(tape, ctx, *a.o, nullptr, q_tokens, d.h);
  tape.Drop(ctx);
  for (Var* t : {&q, &k, &v}) tape.Drop(*t);
  return out;
}

// T5LayerSelfAttention / T5LayerCrossAttention: norm (a local until it
// returns), attention, `hidden_states + dropout(attention_output)`.
Var AttentionLayer(Tape& tape, const T5Params::Attention& a, Param& norm, Param* rel_bias,
                   const StackState& st, const T5Dims& d, const Var& x, const Var* kv_in, Var* bias,
                   Var* weights) {
  const uint64_t tokens = d.b * st.q_len;
  Var normed = T5LayerNorm(tape, x, norm, tokens);
  Var attn = AttentionForward(tape, a, rel_bias, st, d, normed, kv_in, bias, weights);
  Var dropped = Dropout(tape, attn, st.training ? st.p : 0.0);
  Var out = Add(tape, x, dropped);
  tape.Drop(dropped);
  tape.Drop(attn);  // `attention_output` is rebound once the sum exists
  tape.Drop(normed);
  return out;
}

// T5DenseActDense / T5DenseGatedActDense, then `hidden_states.to(wo.weight.dtype)`
// before wo when the dtypes differ (under autocast: the half activation copied
// to fp32, which wo's autocast casts back). The gated form keeps hidden_gelu
// and hidden_linear until it returns.
Var DenseBlock(Tape& tape, const ModelSpec& spec, const T5Params::Block& b, const StackState& st,
               const T5Dims& d, const Var& x) {
  const uint64_t tokens = d.b * st.q_len;
  Var gelu, linear, h;
  if (spec.t5.gated) {
    Var up0 = Linear(tape, x, *b.wi_0, nullptr, tokens, d.ff);
    gelu = MlpActivation(tape, spec.mlp, up0);
    tape.Drop(up0);
    linear = Linear(tape, x, *b.wi_1, nullptr, tokens, d.ff);
    h = Mul(tape, gelu, linear);
  } else {
    Var up = Linear(tape, x, *b.wi, nullptr, tokens, d.ff);
    h = MlpActivation(tape, spec.mlp, up);
    tape.Drop(up);
  }
  Var dropped = Dropout(tape, h, st.training ? st.p : 0.0);
  tape.Drop(h);
  Var cast = Cast(tape, dropped, b.wo->elem_bytes);
  tape.Drop(dropped);
  Var out = Linear(tape, cast, *b.wo, nullptr, tokens, d.h);
  tape.Drop(cast);
  if (gelu.t != kNoTensor) tape.Drop(gelu);
  if (linear.t != kNoTensor) tape.Drop(linear);
  return out;
}

// T5LayerFF: norm, the dense block, `hidden_states + dropout(forwarded_states)`.
Var FeedForwardLayer(Tape& tape, const ModelSpec& spec, const T5Params::Block& b,
                     const StackState& st, const T5Dims& d, const Var& x) {
  Var normed = T5LayerNorm(tape, x, *b.norm_ff, d.b * st.q_len);
  Var ff = DenseBlock(tape, spec, b, st, d, normed);
  tape.Drop(normed);
  Var dropped = Dropout(tape, ff, st.training ? st.p : 0.0);
  Var out = Add(tape, x, dropped);
  tape.Drop(dropped);
  tape.Drop(ff);  // `forwarded_states` lives until T5LayerFF returns
  return out;
}

// T5Block (a GradientCheckpointingLayer whose positional arguments are the
// hidden states, the mask, position_bias, the encoder's states, its mask and
// the cross bias: what a non-reentrant checkpoint keeps). The eager weights
// land in `_`, rebound by the cross-attention, alive until the block returns.
Var Block(Tape& tape, const ModelSpec& spec, const T5Params::Block& b, StackState& st,
          const T5Dims& d, const Var& x) {
  if (st.ckpt) {
    tape.graph.BeginCheckpoint(st.reentrant);
    const Var* kept[] = {&x, st.mask, &st.position_bias, st.encoder_out, &st.cross_bias};
    for (const Var* in : kept) {
      if (in && in->t != kNoTensor) tape.graph.Keep(in->t);
    }
  }
  Var weights;
  Var h = AttentionLayer(tape, b.self, *b.norm_self, b.rel_bias, st, d, x, nullptr,
                         &st.position_bias, &weights);
  if (st.decoder) {
    Var cross_weights;
    Var h2 = AttentionLayer(tape, b.cross, *b.norm_cross, nullptr, st, d, h, st.encoder_out,
                            &st.cross_bias, &cross_weights);
    tape.Drop(h);
    tape.Drop(weights);
    weights = cross_weights;
    h = h2;
  }
  Var out = FeedForwardLayer(tape, spec, b, st, d, h);
  tape.Drop(h);
  tape.Drop(weights);
  if (st.ckpt) tape.graph.EndCheckpoint();
  return out;
}

// T5Stack.forward after the mask: embed_tokens(ids) (`inputs_embeds`, a local
// until it returns), dropout, the blocks, final_layer_norm, dropout. Under
// PEFT with checkpointing the shared embedding's output is made to require
// grad (enable_input_require_grads).
Var StackForward(Tape& tape, const ModelSpec& spec, const std::vector<T5Params::Block>& blocks,
                 Param& shared, Param& final_norm, StackState& st, const T5Dims& d, const Var& ids,
                 bool require_input_grad) {
  const uint64_t tokens = d.b * st.q_len;
  Var embeds = Embedding(tape, ids, shared, tokens, d.h);
  if (require_input_grad) embeds = RequireInputGrad(tape, embeds);
  // The decoder's create_causal_mask for eager: a float [b, 1, tgt, tgt] in
  // the embeddings' dtype (an absent or all-ones mask is None elsewhere:
  // create_bidirectional_mask).
  Var mask;
  if (st.decoder) {
    mask = tape.New(d.b * st.q_len * st.q_len, embeds.elem_bytes, Category::kOther, "causal_mask");
    st.mask = &mask;
  }
  Var x = Dropout(tape, embeds, st.training ? st.p : 0.0);
  for (size_t i = 0; i < blocks.size(); ++i) {
    tape.SetModule(fmt::format("{}.block.{}", st.decoder ? "decoder" : "encoder", i));
    Var y = Block(tape, spec, blocks[i], st, d, x);
    tape.Drop(x);
    x = y;
  }
  tape.SetModule(st.decoder ? "decoder.final_layer_norm" : "encoder.final_layer_norm");
  Var normed = T5LayerNorm(tape, x, final_norm, tokens);
  tape.Drop(x);
  Var out = Dropout(tape, normed, st.training ? st.p : 0.0);
  tape.Drop(normed);
  // The stack returns: its locals go.
  for (Var* v : {&st.position_bias, &st.cross_bias}) {
    if (v->t != kNoTensor) tape.Drop(*v);
  }
  tape.Drop(embeds);
  if (mask.t != kNoTensor) tape.Drop(mask);
  st.mask = nullptr;
  return out;
}

// PreTrainedModel._shift_right(labels): new_zeros [b, tgt] (the decoder's
// input ids), `labels[..., :-1].clone()` copied in, then `== -100` (a bool
// temporary) and masked_fill_.
Var ShiftRight(Tape& tape, const T5Dims& d) {
  Var shifted = tape.New(d.b * d.tgt, kI64, Category::kOther, "aten::new_zeros");
  Var clone = tape.New(d.b * (d.tgt - 1), kI64, Category::kTemporaries, "aten::clone");
  tape.Drop(clone);
  Var eq = tape.New(d.b * d.tgt, kBool, Category::kTemporaries, "aten::eq");
  tape.Drop(eq);
  return shifted;
}

// `sequence_output * d_model**-0.5` when the embeddings were tied
// (scale_decoder_outputs), lm_head (the shared embedding), then
// CrossEntropyLoss(ignore_index=-100) on the logits as they are. Under CPU
// autocast log_softmax returns fp32 from the half logits (modelled as a cast
// first, as BERT's MLM head); CUDA autocast runs cross_entropy on them.
Var HeadLoss(Tape& tape, const ModelSpec& spec, const T5Params& tp, const T5Dims& d,
             const Var& sequence_output) {
  tape.SetModule("lm_head");
  Var scaled =
      spec.t5.scale_decoder_outputs ? Scale(tape, sequence_output) : tape.Share(sequence_output);
  Var logits = Linear(tape, scaled, *tp.shared, nullptr, d.b * d.tgt, spec.vocab_size);
  Var loss;
  if (tape.autocast && !tape.cpu_rules) {
    loss = CrossEntropyLossHalfCudaAutocast(tape, logits);
  } else {
    Var upcast = tape.autocast ? Cast(tape, logits, kF32) : tape.Share(logits);
    loss = CrossEntropyLoss(tape, upcast);
    tape.Drop(upcast);
  }
  // The rebound `sequence_output` and `lm_logits` live until the forward returns.
  tape.Drop(logits);
  tape.Drop(scaled);
  return loss;
}

StackState TrainingStack(const ModelSpec& spec, const TrainingSetup& setup, bool decoder,
                         uint64_t q_len) {
  StackState st;
  st.decoder = decoder;
  st.training = true;
  st.ckpt = setup.grad_ckpt != GradCkpt::kNone;
  st.reentrant = setup.grad_ckpt == GradCkpt::kReentrant;
  st.q_len = q_len;
  st.p = spec.t5.dropout;
  return st;
}

}  // namespace

ForwardOut T5Forward(Tape& tape, const ModelSpec& spec, T5Params& tp, const TrainingSetup& setup) {
  const T5Dims d = DimsOf(spec, setup.batch, setup.seq, T5TargetLen(setup));
  const bool input_grad = InputsRequireGrad(setup);
  tape.SetModule("batch");
  Var ids = tape.New(d.b * d.src, kI64, Category::kOther, "input_ids");
  Var labels = tape.New(d.b * d.tgt, kI64, Category::kOther, "labels");
  // The encoder: an all-ones or absent mask is None (create_bidirectional_mask).
  StackState enc = TrainingStack(spec, setup, false, d.src);
  Var encoder_out =
      StackForward(tape, spec, tp.encoder, *tp.shared, *tp.encoder_norm, enc, d, ids, input_grad);
  tape.SetModule("decoder");
  Var decoder_ids = ShiftRight(tape, d);
  StackState dec = TrainingStack(spec, setup, true, d.tgt);
  dec.encoder_out = &encoder_out;
  // The decoder makes an EncoderDecoderCache (use_cache defaults to the
  // config's True); checkpointed blocks get cache=None
  // (GradientCheckpointingLayer), so it stays empty.
  std::vector<Var> cache;
  if (spec.use_cache && setup.use_cache && !dec.ckpt) dec.cache = &cache;
  Var decoder_out = StackForward(tape, spec, tp.decoder, *tp.shared, *tp.decoder_norm, dec, d,
                                 decoder_ids, input_grad);
  Var loss = HeadLoss(tape, spec, tp, d, decoder_out);
  // The model's output (logits, cache, encoder_last_hidden_state) goes with
  // the forward; `model(**batch).loss` keeps the loss only.
  for (Var& v : cache) tape.Drop(v);
  for (Var* v : {&decoder_out, &encoder_out, &decoder_ids, &ids, &labels}) tape.Drop(*v);
  return ForwardOut{loss, {}};
}

Var T5EncoderNoGrad(Tape& tape, const ModelSpec& spec, T5Params& tp, const TrainingSetup& setup,
                    uint64_t batch, uint64_t len) {
  const bool grad_was = tape.grad_enabled;
  tape.grad_enabled = false;
  const T5Dims d = DimsOf(spec, batch, len, len);
  Var ids = tape.New(batch * len, kI64, Category::kOther, "input_ids");
  StackState st;
  st.training = false;
  st.q_len = len;
  // A float mask (the position bias) is always passed: PlanAttention's
  // explicit-mask case.
  const AttnPlan plan = PlanAttention(setup, tp.shared->elem_bytes, d.heads, d.heads,
                                      /*sliding_window_mask=*/true, 0.0);
  if (setup.attn == Attention::kSdpa) st.sdpa = &plan;
  Var out = StackForward(tape, spec, tp.encoder, *tp.shared, *tp.encoder_norm, st, d, ids, false);
  tape.Drop(ids);
  tape.grad_enabled = grad_was;
  return out;
}

}  // namespace vramscope::lower
