#include "transformer.h"
#include "param_roles.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <unordered_map>

#include "loss.h"
#include "ops.h"

namespace vramscope::lower {
namespace {

// Assigns one parameter to its slot by role and name.
void Place(LayerParams& lp, const ParamTensor& pt, Param* p) {
  const bool bias = pt.name.ends_with(".bias");
  const ParamRole r = pt.role;
  auto set = [&](Param*& w, Param*& b) { (bias ? b : w) = p; };
  Param* none = nullptr;
  if (r == ParamRole::kQ)
    set(lp.q, lp.q_b);
  else if (r == ParamRole::kK)
    set(lp.k, lp.k_b);
  else if (r == ParamRole::kV)
    set(lp.v, lp.v_b);
  else if (r == ParamRole::kO)
    set(lp.o, lp.o_b);
  else if (r == ParamRole::kQkv)
    set(lp.qkv, lp.qkv_b);
  else if (r == ParamRole::kGate)
    set(lp.gate, none);
  else if (r == ParamRole::kUp)
    set(lp.up, lp.fc1_b);
  else if (r == ParamRole::kDown)
    set(lp.down, lp.fc2_b);
  else if (r == ParamRole::kGateUp)
    set(lp.gate_up, none);
  else if (r == ParamRole::kNorm) {
    // Norms share one role; the module name says which (transformers names).
    const std::string& m = pt.module;
    auto has = [&](std::string_view part) { return m.find(part) != std::string::npos; };
    if (has("q_norm") || has("q_layernorm"))
      lp.q_norm = bias ? lp.q_norm : p;
    else if (has("k_norm") || has("k_layernorm"))
      lp.k_norm = bias ? lp.k_norm : p;
    else if (has("pre_feedforward_layernorm"))
      set(lp.norm3, none);
    else if (has("post_feedforward_layernorm"))
      set(lp.norm4, none);
    else if (has("post_attention_layernorm") || has("ln_2") || has("ln_mlp") ||
             has("final_layer_norm"))
      set(lp.norm2, lp.norm2_b);
    else
      set(lp.norm1, lp.norm1_b);
  } else if (r == ParamRole::kRouter)
    lp.router = p;
  else if (r == ParamRole::kExpertGate)
    lp.expert_gate.push_back(p);
  else if (r == ParamRole::kExpertUp)
    lp.expert_up.push_back(p);
  else if (r == ParamRole::kExpertDown)
    lp.expert_down.push_back(p);
  else if (r == ParamRole::kSharedGate)
    lp.shared_gate = p;
  else if (r == ParamRole::kSharedUp)
    lp.shared_up = p;
  else if (r == ParamRole::kSharedDown)
    lp.shared_down = p;
  else if (r == ParamRole::kSharedExpertGate)
    lp.shared_router = p;
}

struct Dims {
  uint64_t b, s, t, h, heads, kv, d, inter, vocab;
  // Megatron sequence parallelism: the residual stream (norms, dropout,
  // residual adds) holds t / sp tokens; 1 without it.
  uint64_t sp = 1;
  // Mixture of experts: expert-parallel size and the routing knobs.
  uint64_t ep = 1;
  double moe_capacity_factor = 0;
  double moe_imbalance = 1;
  // transformers >= 5.0: stacked experts run through grouped_mm (MoeGrouped).
  bool grouped_experts = false;
  Dims Residual() const {
    Dims r = *this;
    r.t = t / sp;
    return r;
  }
};

// What every decoder layer of one forward reads: the attention plan, the 4-D
// mask when one is built, and the rotary cos / sin tables.
struct LayerShared {
  AttnPlan plan;
  const Var* mask = nullptr;
  Var cos, sin;  // [1, s, rotary_dim]; kNoTensor without rotary embeddings
};

// Sequence parallelism (Megatron-LM core tensor_parallel/mappings.py,
// 0.5-0.13): a row-parallel output [t, h] is reduce-scattered to [t/sp, h]
// (the embedding output split the same way); its backward all-gathers the
// gradient to full size. Without sp: the tensor itself.
Var ToSequenceShard(Tape& tape, Var full, const Dims& d, std::string_view op) {
  if (d.sp == 1) return full;
  Var out = tape.New(full.numel / d.sp, full.elem_bytes, Category::kTemporaries, op);
  if (full.requires_grad() && tape.grad_enabled) {
    NodeId n = tape.Node("ReduceScatterToSequenceParallelRegionBackward", &out);
    tape.graph.Edge(n, full, full.bytes());
  }
  tape.Drop(full);
  return out;
}

// The column-parallel linears' all-gathered input lives in Megatron's
// GlobalMemoryBuffer ("mpu"), allocated once at its largest size and reused
// by every layer in forward and backward: no allocation per layer; saved for
// backward is the local [t/sp, h] input.
void EnsureSequenceGatherBuffer(Tape& tape, const Dims& d, uint8_t elem_bytes) {
  if (d.sp == 1 || tape.sp_gather_buffer != kNoTensor) return;
  tape.sp_gather_buffer = tape.graph.Alloc(d.t * d.h * elem_bytes, Category::kCommunication,
                                           "megatron::global_memory_buffer", tape.module());
}

Var Proj(Tape& tape, const Var& x, Param* w, Param* b, uint64_t tokens, uint64_t out) {
  return Linear(tape, x, *w, b, tokens, out);
}

Var NormOp(Tape& tape, const ModelSpec& spec, const Var& x, Param* w, Param* b, const Dims& d) {
  switch (spec.norm) {
    case NormKind::kRmsNorm:
      if (tape.torchtune_modules) return RmsNormTorchtune(tape, x, *w, d.t);
      if (tape.litgpt_modules) return RmsNormLitgpt(tape, x, *w, d.t);
      if (tape.liger) return LigerRmsNorm(tape, x, *w, d.h);
      return RmsNorm(tape, x, *w, d.t, d.h, false);
    case NormKind::kRmsNormGemma: return RmsNorm(tape, x, *w, d.t, d.h, true);
    case NormKind::kLayerNorm:
    case NormKind::kLayerNormNoBias: return LayerNorm(tape, x, *w, b, d.t);
  }
  return tape.Share(x);
}

Var Norm(Tape& tape, const ModelSpec& spec, const Var& x, Param* w, Param* b, const Dims& d) {
  if (!w) return NormOp(tape, spec, x, w, b, d);
  std::vector<Param*> params = {w};
  if (b) params.push_back(b);
  return InModule(tape, ModuleOf(tape, *w), params, x,
                  [&](const Var& in) { return NormOp(tape, spec, in, w, b, d); });
}

// The module holding `p`'s module (a parameter's container: `...self_attn` for
// `...self_attn.o_proj`), for ZeRO-3's module hooks.
std::string ParentModule(Tape& tape, const Param* p) {
  const std::string_view m = ModuleOf(tape, *p);
  return std::string(m.substr(0, m.rfind('.')));
}

// A module without parameters or tensor input/output entered or left, for
// ZeRO-3's module hooks.
void MarkModule(Tape& tape, std::string_view name, bool enter) {
  if (!tape.module_hooks) return;
  if (enter) {
    tape.module_hooks->Enter(name, {}, nullptr);
  } else {
    tape.module_hooks->Leave(name, nullptr);
  }
}

// Whether the model's forward makes a DynamicCache in training: use_cache, no
// gradient checkpointing (GradientCheckpointingLayer turns the cache off,
// transformers 4.57 / 5.x modeling_layers.py), transformers >= 4.36. Gemma 2
// and Gemma 3 in 4.x only make one outside training (`use_cache and
// past_key_values is None and not self.training`, 4.57.6); 5.x dropped that
// condition (5.24.0). Megatron-style layouts run Megatron's model, which has
// no such cache.
bool MakesTrainingCache(const ModelSpec& spec, const TrainingSetup& setup, bool ckpt) {
  // TRL's fused head calls the backbone with use_cache=False (trl 1.16
  // trainer/utils.py add_fused_lm_head); torchtune's own decoder has no
  // cache in training.
  if (!spec.use_cache || !setup.use_cache || ckpt || setup.transformers_version < 436 ||
      setup.impl != ModelImpl::kTransformers || setup.loss == LossKind::kTrlFused ||
      setup.loss == LossKind::kTorchtuneChunked || setup.parallel.model_parallel()) {
    return false;
  }
  const bool gemma_eval_only = spec.model_type == "gemma2" || spec.model_type == "gemma3" ||
                               spec.model_type == "gemma3_text";
  return !(gemma_eval_only && setup.transformers_version < 500);
}

// Whether transformers hands SDPA a materialized causal mask rather than
// is_causal=True. A sliding window shorter than the sequence needs one. So
// does a batch without attention_mask and without a cache in transformers
// 4.54-4.x with torch >= 2.6: _preprocess_mask_arguments then runs
// find_packed_sequence_indices, which returns a tensor even for unpacked
// rows, and create_causal_mask forbids the is_causal skip (masking_utils.py,
// 4.57.6; packed-sequence support arrived in 4.54, PR #39194). 5.x returns None
// for unpacked rows (5.24.0) and skips the mask again.
// Families still on the older _update_causal_mask path in 4.57.6 (qwen2_moe,
// stablelm, falcon, opt) skip the mask as before.
bool SdpaNeedsFullMask(const ModelSpec& spec, const TrainingSetup& setup, bool cache) {
  const std::string& t = spec.model_type;
  const bool legacy_mask = t == "qwen2_moe" || t == "stablelm" || t == "falcon" || t == "opt";
  return !setup.attention_mask && !cache && !legacy_mask && setup.transformers_version >= 454 &&
         setup.transformers_version < 500 && setup.torch_version >= 206;
}

// Padding-free packing (setup.packed): without attention_mask and without a
// cache, _preprocess_mask_arguments calls find_packed_sequence_indices on
// position_ids and create_causal_mask ANDs a same-sequence mask into the
// causal one, which forbids SDPA's is_causal skip (masking_utils.py, 4.54+,
// PR #39194; 5.24.0). flash-attn reads position_ids instead.
bool PackedMask(const ModelSpec& spec, const TrainingSetup& setup, bool cache) {
  const std::string& t = spec.model_type;
  const bool legacy_mask = setup.transformers_version < 500 &&
                           (t == "qwen2_moe" || t == "stablelm" || t == "falcon" || t == "opt");
  return setup.packed && !cache && !legacy_mask && setup.transformers_version >= 454 &&
         setup.attn != Attention::kFlash;
}

bool SdpaGetsMask(const ModelSpec& spec, const TrainingSetup& setup, uint64_t seq, bool cache) {
  if (spec.sliding_window > 0 && spec.sliding_window < seq) return true;
  return SdpaNeedsFullMask(spec, setup, cache) || PackedMask(spec, setup, cache);
}

// Whether layer `layer` attends through a sliding window: config.layer_types'
// defaults (Gemma2Config: every other layer from the first; Gemma3TextConfig:
// all but every sliding_window_pattern-th, 6; 4.57.6 / 5.24.0). Qwen2-MoE's
// layers are all full attention unless use_sliding_window.
bool SlidingLayer(const ModelSpec& spec, uint64_t layer) {
  if (spec.model_type == "gemma2") return layer % 2 == 0;
  if (spec.model_type == "gemma3" || spec.model_type == "gemma3_text") return (layer + 1) % 6 != 0;
  return spec.sliding_window > 0;
}

// Gemma 2 / 3 (4.57.6 and 5.24.0) and Qwen2-MoE (5.24.0) build both masks of
// `causal_mask_mapping`, create_causal_mask and
// create_sliding_window_causal_mask, in every forward, whatever the layers
// use: eager gets two tensors; SDPA a full one only where it cannot skip it.
bool BuildsMaskPair(const ModelSpec& spec, const TrainingSetup& setup) {
  const std::string& t = spec.model_type;
  return t == "gemma2" || t == "gemma3" || t == "gemma3_text" ||
         (t == "qwen2_moe" && setup.transformers_version >= 500);
}

// int(head_dim * partial_rotary_factor) (the attention modules' rotary_ndims).
uint64_t RotaryDim(const ModelSpec& spec, uint64_t head_dim) {
  return static_cast<uint64_t>(static_cast<double>(head_dim) * spec.partial_rotary_factor);
}

// The rotary tables (LlamaRotaryEmbedding.forward under no_grad, and every
// family copied from it, transformers 4.57 / 5.x): position_ids as float,
// freqs = inv_freq x positions, emb = cat(freqs, freqs), cos = emb.cos() *
// attention_scaling and the same for sin, all fp32 with autocast off, then
// .to(x.dtype). position_ids is cache_position.unsqueeze(0) when the caller
// passes none, so the tables are [1, s, rotary_dim] and broadcast over the batch.
void RotaryTables(Tape& tape, uint64_t seq, uint64_t rot_dim, uint8_t x_bytes, Var* cos, Var* sin) {
  Var pos = tape.New(seq, kF32, Category::kTemporaries, "aten::_to_copy");
  Var freqs = tape.New(seq * rot_dim / 2, kF32, Category::kTemporaries, "aten::mul");
  Var emb = tape.New(seq * rot_dim, kF32, Category::kTemporaries, "aten::cat");
  for (auto [table, op] : {std::pair{cos, "aten::cos"}, std::pair{sin, "aten::sin"}}) {
    Var raw = tape.New(seq * rot_dim, kF32, Category::kTemporaries, op);
    Var scaled = tape.New(seq * rot_dim, kF32, Category::kOther, "aten::mul");
    tape.Drop(raw);
    *table = scaled;
  }
  tape.Drop(emb);
  tape.Drop(freqs);
  tape.Drop(pos);
  for (Var* table : {cos, sin}) {
    Var cast = Cast(tape, *table, x_bytes);
    tape.Drop(*table);
    *table = cast;
  }
}

// q_embed = (q * cos) + (rotate_half(q) * sin) (apply_rotary_pos_emb), with
// PyTorch type promotion: a bf16 q against fp32 tables (autocast keeps the
// residual stream, and so the tables, in fp32) gives an fp32 q_embed. With a
// partial rotary factor (gpt_neox, phi, stablelm) only q[..., :rotary_dim]
// rotates and torch.cat((q_embed, q_pass), dim=-1) puts the rest back.
// `pieces`, when given, receives the rotated part and the pass-through view
// instead of dropping them (they are the caller's locals).
Var Rope(Tape& tape, const Var& x, const Var& cos, const Var& sin, uint64_t head_dim,
         uint64_t rot_dim, std::vector<Var>* pieces) {
  const bool grad = x.requires_grad() && tape.grad_enabled;
  const bool partial = rot_dim < head_dim;
  Var rot = tape.Share(x);
  if (partial) {
    // x[..., :rotary_dim]: a view; SliceBackward0 scatters into a zero-filled
    // gradient of x's full size.
    rot.numel = x.numel / head_dim * rot_dim;
    if (grad) {
      NodeId n = tape.Node("SliceBackward0", &rot);
      tape.graph.Edge(n, x, x.bytes());
    }
  }
  Var a = Mul(tape, rot, cos);
  Var neg = tape.New(rot.numel / 2, rot.elem_bytes, Category::kTemporaries, "aten::neg");
  Var cat = tape.New(rot.numel, rot.elem_bytes, Category::kTemporaries, "aten::cat");
  tape.Drop(neg);
  if (grad) {
    NodeId n = tape.Node("CatBackward0", &cat);
    // neg and slice backwards: a half and a full buffer on the way back.
    tape.graph.Workspace(n, rot.bytes() / 2);
    tape.graph.Edge(n, rot, rot.bytes());
  }
  Var bsin = Mul(tape, cat, sin);
  tape.Drop(cat);
  Var out = Add(tape, a, bsin);
  tape.Drop(a);
  tape.Drop(bsin);
  if (!partial) {
    tape.Drop(rot);
    return out;
  }
  Var pass = tape.Share(x);
  pass.numel = x.numel - rot.numel;
  if (grad) {
    NodeId n = tape.Node("SliceBackward0", &pass);
    tape.graph.Edge(n, x, x.bytes());
  }
  tape.Drop(rot);
  const uint8_t bytes = std::max(out.elem_bytes, pass.elem_bytes);
  Var joined = tape.New(x.numel, bytes, Category::kTemporaries, "aten::cat");
  if (tape.grad_enabled && (out.requires_grad() || pass.requires_grad())) {
    NodeId n = tape.Node("CatBackward0", &joined);
    // Each input's gradient is a slice of the incoming one, cast when its
    // dtype differs.
    for (const Var* in : {&out, &pass}) {
      if (in->elem_bytes == bytes) {
        tape.graph.EdgePass(n, *in);
      } else {
        tape.graph.Edge(n, *in, in->bytes());
      }
    }
  }
  for (Var* piece : {&out, &pass}) {
    if (pieces)
      pieces->push_back(*piece);
    else
      tape.Drop(*piece);
  }
  return joined;
}

// liger-kernel 0.8.5 transformers/swiglu.py LigerSwiGLUMLP.forward:
// `down_proj(LigerSiLUMulFunction.apply(gate_proj(x), up_proj(x)))` (gate_proj
// runs first: arguments left to right). ops/swiglu.py:
// - swiglu_forward: `c = torch.empty_like(a)` ([tokens, inter] in a's dtype),
//   one Triton kernel; forward saves (a, b) (ctx.save_for_backward), both
//   already alive as the projections' outputs: no silu(a) tensor exists;
// - swiglu_backward: the kernel recomputes silu(a) and writes da over a and
//   db over b, returning them: no allocation (down_multiplier 1.0).
Var LigerSwiGlu(Tape& tape, const Var& x, const Dims& d, uint64_t tokens, uint64_t inter,
                Param* gate, Param* up, Param* down) {
  Var g = Proj(tape, x, gate, nullptr, tokens, inter);
  Var u = Proj(tape, x, up, nullptr, tokens, inter);
  Var c = tape.New(g.numel, g.elem_bytes, Category::kTemporaries, "liger::swiglu");
  if (tape.grad_enabled && (g.requires_grad() || u.requires_grad())) {
    NodeId n = tape.Node("LigerSiLUMulFunctionBackward", &c);
    tape.graph.Save(n, g.t);
    tape.graph.Save(n, u.t);
    tape.graph.EdgeSaved(n, g, 0, g.bytes());
    tape.graph.EdgeSaved(n, u, 1, u.bytes());
  }
  tape.Drop(g);
  tape.Drop(u);
  Var out = Proj(tape, c, down, nullptr, tokens, d.h);
  tape.Drop(c);
  return out;
}

Var Mlp(Tape& tape, const ModelSpec& spec, const LayerParams& lp, const Var& x, const Dims& d,
        uint64_t tokens, uint64_t inter, Param* gate, Param* up, Param* down) {
  if (tape.liger && spec.mlp == MlpKind::kGatedSilu)
    return LigerSwiGlu(tape, x, d, tokens, inter, gate, up, down);
  if (spec.mlp == MlpKind::kGatedSilu || spec.mlp == MlpKind::kGatedGeluTanh ||
      spec.mlp == MlpKind::kFusedGateUp) {
    Var g, u;
    const bool fused = spec.mlp == MlpKind::kFusedGateUp && lp.gate_up;
    if (fused) {
      // phi3: gate_up_proj then chunk(2): two views of one [t, 2i] tensor.
      Var gu = Proj(tape, x, lp.gate_up, nullptr, tokens, 2 * inter);
      std::vector<Var> parts = Split(tape, gu, {gu.numel / 2, gu.numel / 2});
      tape.Drop(gu);
      g = parts[0];
      u = parts[1];
    } else {
      g = Proj(tape, x, gate, nullptr, tokens, inter);
    }
    // `down_proj(act_fn(gate_proj(x)) * up_proj(x))` (LlamaMLP and its copies,
    // 4.57.6 / 5.24.0): the activation runs before up_proj, so without
    // autograd saving it the gate output is gone by then. LitGPT's LLaMAMLP
    // (litgpt/model.py 0.5.13) makes `x_fc_1` and `x_fc_2` first, locals
    // until it returns.
    const bool litgpt = tape.litgpt_modules;
    if (litgpt && !fused) u = Proj(tape, x, up, nullptr, tokens, inter);
    // The activation is a module of its own (ACT2FN's nn.Module).
    const std::string act_name = ParentModule(tape, down ? down : gate) + ".act_fn";
    Var act = InModule(tape, act_name, {}, g, [&](const Var& in) {
      return spec.mlp == MlpKind::kGatedGeluTanh ? Gelu(tape, in) : Silu(tape, in);
    });
    if (!litgpt) tape.Drop(g);
    if (!fused && !litgpt) u = Proj(tape, x, up, nullptr, tokens, inter);
    Var prod = Mul(tape, act, u);
    tape.Drop(act);
    if (!litgpt) tape.Drop(u);
    Var out = Proj(tape, prod, down, nullptr, tokens, d.h);
    tape.Drop(prod);
    if (litgpt) {
      tape.Drop(g);
      tape.Drop(u);
    }
    return out;
  }
  Var f = Proj(tape, x, up, lp.fc1_b, tokens, inter);
  Var act = MlpActivation(tape, spec.mlp, f);
  tape.Drop(f);
  Var out = Proj(tape, act, down, lp.fc2_b, tokens, d.h);
  tape.Drop(act);
  return out;
}

// qwen2_moe's shared expert, gated: F.sigmoid(self.shared_expert_gate(x)) *
// shared_expert_output (Qwen2MoeSparseMoeBlock, 4.57.6 and 5.24.0). Takes
// `shared`'s reference and returns the gated tensor.
Var GateSharedExpert(Tape& tape, const LayerParams& lp, const Var& x, const Dims& d, Var shared) {
  if (!lp.shared_router) return shared;
  Var gate_logit = Proj(tape, x, lp.shared_router, nullptr, d.t, 1);
  Var sig = UnaryOp(tape, gate_logit, "aten::sigmoid", "SigmoidBackward0", true);
  tape.Drop(gate_logit);
  Var gated = Mul(tape, sig, shared);
  tape.Drop(sig);
  tape.Drop(shared);
  return gated;
}

// The router's top-k (torch.topk of the fp32 probabilities): values and int64
// indices [t, k]; TopkBackward0 saves the indices (derivatives.yaml: the
// gradient is scattered back into zeros [t, E]).
struct TopK {
  Var values, indices;
};
TopK RouterTopK(Tape& tape, const Var& probs, uint64_t tokens, uint64_t top_k) {
  TopK r;
  r.values = tape.New(tokens * top_k, kF32, Category::kTemporaries, "aten::topk");
  r.indices = tape.New(tokens * top_k, kI64, Category::kTemporaries, "aten::topk");
  if (tape.grad_enabled && probs.requires_grad()) {
    NodeId n = tape.Node("TopkBackward0", &r.values);
    tape.graph.Save(n, r.indices.t);
    tape.graph.Edge(n, probs, probs.bytes());
  }
  return r;
}

// routing_weights /= routing_weights.sum(dim=-1, keepdim=True), in place
// (mixtral always; qwen2_moe / qwen3_moe with norm_topk_prob; 4.57.6 and
// 5.24.0). DivBackward0 needs self for the divisor's gradient, so the
// generated in-place kernel first clones it (gen_variable_type.py
// emit_original_self_definition: original_self = self.clone()) and saves that
// copy and the [t, 1] sum; the weights get the new grad_fn.
void NormalizeTopK(Tape& tape, Var& weights, uint64_t tokens) {
  Var sum = tape.New(tokens, weights.elem_bytes, Category::kTemporaries, "aten::sum");
  if (tape.grad_enabled && weights.requires_grad()) {
    NodeId n = tape.Node("SumBackward1", &sum);
    tape.graph.EdgePass(n, weights);  // an expanded view of the gradient
  }
  if (tape.grad_enabled && (weights.requires_grad() || sum.requires_grad())) {
    Var original =
        tape.New(weights.numel, weights.elem_bytes, Category::kTemporaries, "aten::clone");
    const Var before = weights;
    NodeId n = tape.Node("DivBackward0", &weights);
    tape.graph.Save(n, original.t);
    tape.graph.Save(n, sum.t);
    tape.graph.Edge(n, before, before.bytes());
    // -grad * self / other^2 at full size, then summed to [t, 1].
    tape.graph.Workspace(n, before.bytes());
    tape.graph.Edge(n, sum, sum.bytes());
    tape.Drop(original);
  }
  tape.Drop(sum);
}

// Mixture of experts (modeling_mixtral.py / modeling_qwen2_moe.py /
// modeling_qwen3_moe.py SparseMoeBlock.forward, transformers 4.4x-4.57.6):
// router logits, fp32 softmax, top-k weights and indices (TopkBackward0 keeps
// the indices), the optional in-place renormalization, the weights cast back
// to the hidden states' dtype (`routing_weights.to(hidden_states.dtype)`), the
// one-hot expert mask (int64 [E, k, t]); each expert runs its gated MLP on the
// tokens routed to it (index, MLP, weight, index_add_). qwen2_moe then adds
// sigmoid(shared_expert_gate(x)) * shared_expert(x).
Var MoeGrouped(Tape& tape, const ModelSpec& spec, const LayerParams& lp, const Var& x,
               const Dims& d);

// F.softmax(router_logits, dim=1, dtype=torch.float): a cast for half logits,
// then _softmax, which saves its output; topk (TopkBackward0 keeps the
// indices) and the optional in-place renormalization (modeling_mixtral.py /
// modeling_qwen2_moe.py, 4.57.6 / 5.24.0). `release_logits`: the logits' name
// is rebound right after the cast (4.x), else the caller keeps them.
TopK RouterProbabilities(Tape& tape, const ModelSpec& spec, Var& logits, const Dims& d,
                         uint64_t top_k, bool release_logits) {
  Var l32 = Cast(tape, logits, kF32);
  if (release_logits) tape.Drop(logits);
  Var probs = UnaryOp(tape, l32, "aten::_softmax", "SoftmaxBackward0", true);
  tape.Drop(l32);
  TopK top = RouterTopK(tape, probs, d.t, top_k);
  tape.Drop(probs);  // `routing_weights` is rebound to the top-k values
  if (spec.norm_topk_prob) NormalizeTopK(tape, top.values, d.t);
  return top;
}

// The expert loop's Python locals (idx / top_x, current_state,
// current_hidden_states): rebound by the next expert, the last ones live until
// the block returns.
struct ExpertLoopLocals {
  Var where, xs, w;
};

// Expert `e` on the `per_expert` tokens routed to it, added into `out`.
void RunExpert(Tape& tape, const ModelSpec& spec, const LayerParams& lp, const Var& x,
               const Dims& d, size_t e, uint64_t per_expert, uint64_t top_k, const Var& routing,
               Var* out, ExpertLoopLocals* locals) {
  const uint64_t inter = spec.moe_intermediate_size ? spec.moe_intermediate_size : d.inter;
  // idx, top_x = torch.where(expert_mask[expert_idx].squeeze(0)): a copy of
  // the expert's [k, t] mask slice (advanced indexing with a tensor), then
  // nonzero [n, 2] int64, whose two columns are idx and top_x (views). The
  // index ops below save them, so they live until this expert's backward.
  Var slice = tape.New(top_k * d.t, kI64, Category::kTemporaries, "aten::index");
  Var nz = tape.New(2 * per_expert, kI64, Category::kTemporaries, "aten::nonzero");
  tape.Drop(slice);
  if (locals->where.t != kNoTensor) tape.Drop(locals->where);
  locals->where = nz;
  const Var& where = locals->where;
  // current_state = hidden_states[None, top_x]: the previous expert's goes
  // only now, when the name is rebound.
  Var cur = tape.New(per_expert * d.h, x.elem_bytes, Category::kTemporaries, "aten::index");
  if (x.requires_grad() && tape.grad_enabled) {
    NodeId n = tape.Node("IndexBackward0", &cur);
    tape.graph.Save(n, where.t);
    tape.graph.Edge(n, x, x.bytes());
  }
  if (locals->xs.t != kNoTensor) tape.Drop(locals->xs);
  locals->xs = cur;
  Var y = Mlp(tape, spec, lp, locals->xs, d, per_expert, inter, lp.expert_gate[e], lp.expert_up[e],
              lp.expert_down[e]);
  // routing_weights[top_x, idx, None]: this expert's per-token weights.
  Var rw = tape.New(per_expert, routing.elem_bytes, Category::kTemporaries, "aten::index");
  if (routing.requires_grad() && tape.grad_enabled) {
    NodeId n = tape.Node("IndexBackward0", &rw);
    tape.graph.Save(n, where.t);
    tape.graph.Edge(n, routing, routing.bytes());
  }
  Var weighted = Mul(tape, y, rw);
  tape.Drop(rw);
  tape.Drop(y);
  if (locals->w.t != kNoTensor) tape.Drop(locals->w);
  locals->w = weighted;
  // final_hidden_states.index_add_(0, top_x, current_hidden_states.to(dtype)),
  // in place: `out` gets a new grad_fn, IndexAddBackward0 (derivatives.yaml:
  // self gets the incoming gradient as it is, source gets
  // grad.index_select(0, index).expand_as(source), so the index and the
  // source are saved: the weighted rows stay, as the 4.57 trace shows). This
  // is what connects each expert's graph to the loss; the chain of these
  // nodes runs every expert's backward in reverse order. The cast is a no-op
  // unless autocast made the weighted rows fp32 under half hidden states.
  Var src = Cast(tape, locals->w, x.elem_bytes);
  if (tape.grad_enabled && (src.requires_grad() || out->requires_grad())) {
    const Var before = *out;
    NodeId n = tape.Node("IndexAddBackward0", out);
    tape.graph.Save(n, where.t);
    tape.graph.Save(n, src.t);
    tape.graph.EdgePass(n, before);
    tape.graph.Edge(n, src, src.bytes());
  }
  tape.Drop(src);
}

// qwen2_moe: sigmoid(shared_expert_gate(x)) * shared_expert_output added to
// the routed sum (4.57.6 / 5.24.0).
Var AddSharedExpert(Tape& tape, const LayerParams& lp, const Var& x, const Dims& d, Var shared_out,
                    Var routed) {
  Var sh = GateSharedExpert(tape, lp, x, d, shared_out);
  Var sum = Add(tape, routed, sh);
  tape.Drop(sh);
  tape.Drop(routed);
  return sum;
}

Var Moe(Tape& tape, const ModelSpec& spec, const LayerParams& lp, const Var& x, const Dims& d) {
  const FlatLinearInputs flat(tape);  // `hidden_states.view(-1, hidden_dim)`
  if (d.grouped_experts) return MoeGrouped(tape, spec, lp, x, d);
  const uint64_t experts = std::max<uint64_t>(1, lp.expert_gate.size());
  const uint64_t top_k = std::max<uint64_t>(1, spec.experts_per_token);
  Var logits = Proj(tape, x, lp.router, nullptr, d.t, experts);
  TopK top = RouterProbabilities(tape, spec, logits, d, top_k, /*release_logits=*/true);
  // routing_weights = routing_weights.to(hidden_states.dtype): the fp32 values
  // go unless that is their dtype already.
  Var routing = Cast(tape, top.values, x.elem_bytes);
  tape.Drop(top.values);
  Var out = tape.New(d.t * d.h, x.elem_bytes, Category::kTemporaries, "aten::zeros");
  Var expert_mask =
      tape.New(experts * d.ep * top_k * d.t, kI64, Category::kTemporaries, "aten::one_hot");
  const std::vector<uint64_t> routed =
      ExpertTokens(d.t, top_k, lp.expert_gate.size(), d.ep, d.moe_capacity_factor, d.moe_imbalance);
  ExpertLoopLocals locals;
  for (uint64_t e = 0; e < lp.expert_gate.size(); ++e) {
    if (routed[e] > 0) RunExpert(tape, spec, lp, x, d, e, routed[e], top_k, routing, &out, &locals);
  }
  if (lp.shared_gate) {
    // shared_expert_output = self.shared_expert(hidden_states) runs after the routed experts
    // in 4.x.
    out = AddSharedExpert(tape, lp, x, d,
                          Mlp(tape, spec, lp, x, d, d.t, spec.shared_expert_intermediate_size,
                              lp.shared_gate, lp.shared_up, lp.shared_down),
                          out);
  }
  for (Var* v : {&locals.xs, &locals.w, &locals.where}) {
    if (v->t != kNoTensor) tape.Drop(*v);
  }
  tape.Drop(expert_mask);
  tape.Drop(top.indices);
  tape.Drop(routing);
  return out;
}

// One grouped matmul over stacked expert weights (torch._grouped_mm /
// F.grouped_mm, torch >= 2.9; derivatives.yaml treats it like mm: the input
// is saved only if the weight needs a gradient, the weight (a leaf, free)
// only if the input does). `weights` are the per-expert tensors that make up
// the stacked parameter; its gradient is one tensor of their total size.
Var GroupedMm(Tape& tape, const Var& in, const std::vector<Param*>& weights, uint64_t rows,
              uint64_t out_features, uint8_t out_bytes) {
  Var out = tape.New(rows * out_features, out_bytes, Category::kTemporaries, "aten::_grouped_mm");
  bool weight_grad = false;
  for (const Param* p : weights) weight_grad = weight_grad || p->var.requires_grad();
  if (tape.grad_enabled && (weight_grad || in.requires_grad())) {
    NodeId n = tape.Node("GroupedMmBackward0", &out);
    if (weight_grad) tape.graph.Save(n, in.t);
    tape.graph.Edge(n, in, in.bytes());
    for (Param* p : weights) tape.graph.Edge(n, p->var, p->numel * p->elem_bytes);
  }
  return out;
}

// Mixture of experts, transformers >= 5.0 (modeling_qwen2_moe.py,
// modeling_qwen3_moe.py, modeling_mixtral.py: `*TopKRouter` and
// `@use_experts_implementation` `*Experts` with 3-D gate_up_proj [E, 2I, h]
// and down_proj [E, h, I]; integrations/moe.py grouped_mm_experts_forward,
// the default experts implementation):
//   router: F.linear, softmax(dtype=float32) (saved), topk, the top-k weights
//     cast back to the logits' dtype; no one-hot expert mask any more;
//   experts, all S = t * k (token, expert) pairs at once: hidden_states[token_idx]
//     [S, h], argsort by expert and a sorted copy [S, h], one grouped_mm into
//     [S, 2I] (gate | up, saved for act and mul), act(gate) * up, one
//     grouped_mm into [S, h] (saved for the routing weights' gradient), the
//     weighted rows, a copy back in token order, then a sum over k into [t, h];
//     grouped_mm is not autocast-enabled: the input is cast to the experts' dtype.
//   qwen2_moe: the shared expert first, then sigmoid(shared_expert_gate(x)) * it.
// grouped_mm_experts_forward's routing (integrations/moe.py, 5.24.0):
// expert_ids_g, perm = torch.sort(expert_ids); hidden_states[perm // num_top_k],
// one gather whose index (the quotient) IndexBackward0 keeps;
// sample_weights[perm]; the offsets: histc over a 4-byte copy of the sorted ids
// (float on CPU, int32 on CUDA), cumsum to int32 [E].
struct SortedRouting {
  Var ids_sorted, perm, rows, weights, offsets;  // rows: [S, h] in expert order
};

SortedRouting SortByExpert(Tape& tape, const Var& x, const Var& weights, const Dims& d, uint64_t s,
                           uint64_t experts) {
  const bool grad = tape.grad_enabled;
  SortedRouting r;
  r.ids_sorted = tape.New(s, kI64, Category::kTemporaries, "aten::sort");
  r.perm = tape.New(s, kI64, Category::kTemporaries, "aten::sort");
  Var token_idx = tape.New(s, kI64, Category::kTemporaries, "aten::floor_divide");
  r.rows = tape.New(s * d.h, x.elem_bytes, Category::kTemporaries, "aten::index");
  if (grad && x.requires_grad()) {
    NodeId n = tape.Node("IndexBackward0", &r.rows);
    tape.graph.Save(n, token_idx.t);
    tape.graph.Edge(n, x, x.bytes());  // zeros [t, h] + index_put_(accumulate=True)
  }
  tape.Drop(token_idx);
  r.weights = tape.New(s, weights.elem_bytes, Category::kTemporaries, "aten::index");
  if (grad && weights.requires_grad()) {
    NodeId n = tape.Node("IndexBackward0", &r.weights);
    tape.graph.Save(n, r.perm.t);
    tape.graph.Edge(n, weights, weights.bytes());
  }
  Var hist_in = tape.New(s, 4, Category::kTemporaries, "aten::_to_copy");
  Var counts = tape.New(experts, 4, Category::kTemporaries, "aten::histc");
  tape.Drop(hist_in);
  r.offsets = tape.New(experts, 4, Category::kTemporaries, "aten::cumsum");
  tape.Drop(counts);
  return r;
}

// The experts' gated MLPs over all S rows: one grouped_mm into [S, 2I]
// (gate | up, saved for act and mul), act(gate) * up, one grouped_mm into
// [S, h]. grouped_mm is not autocast-enabled: the input is cast to the
// experts' dtype.
Var GroupedExpertMlps(Tape& tape, const ModelSpec& spec, const LayerParams& lp, const Var& rows,
                      uint64_t s, uint64_t inter, uint64_t h) {
  const uint8_t expert_bytes = lp.expert_gate.front()->elem_bytes;
  Var xin = Cast(tape, rows, expert_bytes);
  std::vector<Param*> gate_up = lp.expert_gate;
  gate_up.insert(gate_up.end(), lp.expert_up.begin(), lp.expert_up.end());
  Var gu = GroupedMm(tape, xin, gate_up, s, 2 * inter, expert_bytes);
  tape.Drop(xin);
  // chunk(2, dim=-1): two views of one [S, 2I] storage.
  std::vector<Var> parts = Split(tape, gu, {gu.numel / 2, gu.numel / 2});
  tape.Drop(gu);
  Var g = parts[0];
  Var u = parts[1];
  Var act = spec.mlp == MlpKind::kGatedGeluTanh ? Gelu(tape, g) : Silu(tape, g);
  tape.Drop(g);
  Var prod = Mul(tape, act, u);
  tape.Drop(act);
  tape.Drop(u);
  Var y = GroupedMm(tape, prod, lp.expert_down, s, h, expert_bytes);
  tape.Drop(prod);
  return y;
}

// The weighted rows back in token order, summed over the k experts of each
// token: `weighted_out[inv_perm].view(t, k, h).sum(dim=1)`. Returns the [t, h]
// sum and the unsorted rows (a local until the experts function returns).
Var UnsortAndSum(Tape& tape, Var& weighted, const Var& inv_perm, const Dims& d, uint64_t s,
                 Var* unsorted) {
  // IndexBackward0 saves the index before the gather runs (VariableType saves
  // inputs before the call), so a recompute that stops at this pack never
  // makes the gathered copy.
  NodeId unsort_node = kNoNode;
  if (tape.grad_enabled && weighted.requires_grad()) {
    unsort_node = tape.Node("IndexBackward0", nullptr);
    tape.graph.Save(unsort_node, inv_perm.t);
    tape.graph.Edge(unsort_node, weighted, weighted.bytes());
  }
  *unsorted = tape.New(s * d.h, weighted.elem_bytes, Category::kTemporaries, "aten::index");
  if (unsort_node != kNoNode) {
    unsorted->fn = unsort_node;
    unsorted->slot = 0;
  }
  // `weighted_out = weighted_out[inv_perm]` rebinds the name: the weighted rows
  // go now unless a node saved them.
  tape.Drop(weighted);
  // SumBackward1 hands back an expanded view of the [t, h] gradient, and
  // ViewBackward0 reshapes it to [S, h], which for an expanded (stride-0)
  // tensor is a contiguous copy: a full [S, h] gradient (aten::clone in the
  // 5.24.0 trace) that IndexBackward0 then receives.
  Var summed = tape.New(d.t * d.h, unsorted->elem_bytes, Category::kTemporaries, "aten::sum");
  if (tape.grad_enabled && unsorted->requires_grad()) {
    NodeId n = tape.Node("SumBackward1", &summed);
    tape.graph.Edge(n, *unsorted, unsorted->bytes());
  }
  return summed;
}

Var MoeGrouped(Tape& tape, const ModelSpec& spec, const LayerParams& lp, const Var& x,
               const Dims& d) {
  const FlatLinearInputs flat(tape);  // `hidden_states.view(-1, hidden_dim)`
  const uint64_t experts = lp.expert_gate.size();
  const uint64_t top_k = std::max<uint64_t>(1, spec.experts_per_token);
  const uint64_t s = d.t * top_k;
  const uint64_t inter = spec.moe_intermediate_size ? spec.moe_intermediate_size : d.inter;
  Var shared;
  if (lp.shared_gate) {
    shared = Mlp(tape, spec, lp, x, d, d.t, spec.shared_expert_intermediate_size, lp.shared_gate,
                 lp.shared_up, lp.shared_down);
  }
  // --- router (mixtral: softmax(router_logits.float()); qwen: softmax(dtype=float32))
  Var logits = Proj(tape, x, lp.router, nullptr, d.t, experts);
  TopK top = RouterProbabilities(tape, spec, logits, d, top_k, /*release_logits=*/false);
  Var top_i = top.indices;
  // Qwen2MoeTopKRouter / Qwen3MoeTopKRouter: router_top_value.to(router_logits.dtype);
  // MixtralTopKRouter (5.24.0) returns the fp32 values as they are, so the
  // weighted expert rows are fp32 there.
  Var weights = spec.model_type == "mixtral" ? tape.Share(top.values)
                                             : Cast(tape, top.values, logits.elem_bytes);
  tape.Drop(top.values);
  // `_, routing_weights, selected_experts = self.gate(...)`: the router logits
  // stay bound to `_` until the block returns.
  // --- experts
  SortedRouting r = SortByExpert(tape, x, weights, d, s, experts);
  // The stacked experts are one module whose parameters are all of them.
  std::vector<Param*> stacked = lp.expert_gate;
  stacked.insert(stacked.end(), lp.expert_up.begin(), lp.expert_up.end());
  stacked.insert(stacked.end(), lp.expert_down.begin(), lp.expert_down.end());
  Var y = stacked.empty() ? GroupedExpertMlps(tape, spec, lp, r.rows, s, inter, d.h)
                          : InModule(tape, ModuleOf(tape, *stacked.front()), stacked, r.rows,
                                     [&](const Var& in) {
                                       return GroupedExpertMlps(tape, spec, lp, in, s, inter, d.h);
                                     });
  // out_per_sample_g * sample_weights_g.unsqueeze(-1); the weights' gradient
  // is (grad * y).sum(-1): a full-size product first.
  Var weighted = Mul(tape, y, r.weights);
  if (weighted.fn != kNoNode && r.weights.requires_grad()) {
    tape.graph.Workspace(weighted.fn, weighted.bytes());
  }
  tape.Drop(y);
  // inv_perm = torch.empty_like(perm); inv_perm[perm] = torch.arange(S).
  Var inv_perm = tape.New(s, kI64, Category::kTemporaries, "aten::empty_like");
  Var arange = tape.New(s, kI64, Category::kTemporaries, "aten::arange");
  tape.Drop(arange);
  Var unsorted;
  Var summed = UnsortAndSum(tape, weighted, inv_perm, d, s, &unsorted);
  Var out = Cast(tape, summed, x.elem_bytes);  // .to(hidden_states.dtype)
  tape.Drop(summed);
  // The experts function returns: its locals die.
  for (Var* v : {&r.rows, &unsorted, &r.perm, &inv_perm, &r.ids_sorted, &r.weights, &r.offsets,
                 &weights, &top_i}) {
    tape.Drop(*v);
  }
  if (lp.shared_gate) out = AddSharedExpert(tape, lp, x, d, shared, out);
  tape.Drop(logits);
  return out;
}

// DynamicCache.update in training (use_cache without gradient checkpointing):
// transformers 4.54+ (cache_utils.DynamicLayer / DynamicSlidingWindowLayer, read
// in 4.57.6 and 5.24.0) lazily makes an empty tensor and returns
// torch.cat([empty, states]): a full copy, which attention then uses and the cache
// holds until the model's output is dropped. 4.36-4.53 appended the states
// themselves: no copy, but they stay alive as long. `cache_bytes` is the empty
// tensor's dtype; cat promotes to the wider of it and the states' (the
// states are cast first).
Var CacheUpdate(Tape& tape, Var states, uint8_t cache_bytes) {
  if (!tape.kv_cache_copies) {
    tape.kv_cache->push_back(tape.Share(states));
    return states;
  }
  if (cache_bytes > states.elem_bytes) {
    Var cast = Cast(tape, states, cache_bytes);
    tape.Drop(states);
    states = cast;
  }
  Var copy = tape.New(states.numel, states.elem_bytes, Category::kTemporaries, "aten::cat");
  if (states.requires_grad() && tape.grad_enabled) {
    NodeId n = tape.Node("CatBackward0", &copy);
    tape.graph.Edge(n, states, states.bytes());
  }
  tape.Drop(states);
  tape.kv_cache->push_back(tape.Share(copy));
  return copy;
}

// Stablelm and phi rotate q[..., :rotary_ndims] in the attention forward
// itself (StableLmAttention / PhiAttention.forward, 4.57.6 and 5.24.0):
// query_rot and query_pass are its locals; gpt_neox does it inside
// apply_rotary_pos_emb, whose locals die when it returns.
// torchtune 0.6.1 modules/position_embeddings.py RotaryPositionalEmbeddings
// .forward (Llama3ScaledRoPE's is the same): xshaped = x.float().reshape(...,
// -1, 2); each output half is a difference / sum of two products with the
// cache's halves (fp32, half of x's elements each); torch.stack makes the
// fp32 whole, flatten is a view, type_as(x) casts back. The cache slices are
// views of a buffer without gradient: each MulBackward0 saves only the cache,
// so nothing of x is kept.
Var RopeTorchtune(Tape& tape, const Var& x) {
  Var xf = Cast(tape, x, kF32);
  const uint64_t half = xf.numel / 2;
  Var parts[2];
  for (int i = 0; i < 2; ++i) {
    Var a = tape.New(half, kF32, Category::kTemporaries, "aten::mul");
    Var b = tape.New(half, kF32, Category::kTemporaries, "aten::mul");
    parts[i] = tape.New(half, kF32, Category::kTemporaries, i == 0 ? "aten::sub" : "aten::add");
    tape.Drop(a);
    tape.Drop(b);
  }
  Var stacked = tape.New(xf.numel, kF32, Category::kTemporaries, "aten::stack");
  for (Var& p : parts) tape.Drop(p);
  if (xf.requires_grad() && tape.grad_enabled) {
    NodeId n = tape.Node("StackBackward0", &stacked);
    // unbind's halves times the cache, and the selects' zero-filled gradients
    // summed into xshaped's.
    tape.graph.Workspace(n, xf.numel * kF32);
    tape.graph.Edge(n, xf, xf.bytes());
  }
  Var out = Cast(tape, stacked, x.elem_bytes);
  tape.Drop(stacked);
  tape.Drop(xf);
  return out;
}

// `(x * cos) + (rotated * sin)` with `rotated = torch.cat((-x2, x1), dim=-1)`
// (torchtune's Qwen2 rotary embeddings, LitGPT's apply_rope): the negated half
// is a temporary, `rotated` is returned in *rotated for the caller to drop
// (both keep it bound until they return). cos and sin need no gradient, so
// each MulBackward0 saves only them.
Var RotatedSum(Tape& tape, const Var& x, const Var& cos, const Var& sin, Var* rotated) {
  Var neg = tape.New(x.numel / 2, x.elem_bytes, Category::kTemporaries, "aten::neg");
  *rotated = tape.New(x.numel, x.elem_bytes, Category::kTemporaries, "aten::cat");
  tape.Drop(neg);
  if (x.requires_grad() && tape.grad_enabled) {
    NodeId n = tape.Node("CatBackward0", rotated);
    // neg and slice backwards: a half and a full buffer on the way back.
    tape.graph.Workspace(n, x.bytes() / 2);
    tape.graph.Edge(n, x, x.bytes());
  }
  Var a = Mul(tape, x, cos);
  Var b = Mul(tape, *rotated, sin);
  Var sum = Add(tape, a, b);
  tape.Drop(a);
  tape.Drop(b);
  return sum;
}

// torchtune 0.6.1 models/qwen2/_positional_embeddings.py
// Qwen2RotaryPositionalEmbeddings.forward: cos / sin are the cache's
// [s, head_dim] halves `.to(x.dtype)` (copies for 16-bit x, views of the fp32
// buffer otherwise); `rotated = torch.cat((-x2, x1))` stays bound until the
// return; `(x * cos) + (rotated * sin)`; type_as(x) keeps x's dtype. cos and
// sin need no gradient, so each MulBackward0 saves only them.
Var RopeQwen2Torchtune(Tape& tape, const Var& x, uint64_t seq, uint64_t head_dim) {
  const bool copies = x.elem_bytes != kF32;
  Var cos, sin;  // views of the buffer: no tensor of their own
  cos.numel = sin.numel = seq * head_dim;
  cos.elem_bytes = sin.elem_bytes = x.elem_bytes;
  if (copies) {
    cos = tape.New(seq * head_dim, x.elem_bytes, Category::kTemporaries, "aten::_to_copy");
    sin = tape.New(seq * head_dim, x.elem_bytes, Category::kTemporaries, "aten::_to_copy");
  }
  Var rotated;
  Var out = RotatedSum(tape, x, cos, sin, &rotated);
  tape.Drop(rotated);
  if (copies) {
    tape.Drop(cos);
    tape.Drop(sin);
  }
  return out;
}

// torchtune's rotary embeddings for this family's builder.
Var RopeOfTorchtune(Tape& tape, const ModelSpec& spec, const Dims& d, const Var& x) {
  return spec.model_type == "qwen2" ? RopeQwen2Torchtune(tape, x, d.s, d.d)
                                    : RopeTorchtune(tape, x);
}

// LitGPT 0.5.13 litgpt/model.py apply_rope(x, cos, sin) over a q / k view of
// the fused qkv: `rotated = torch.cat((-x2, x1), dim=-1)` (x's dtype, a local
// until it returns), `roped = (x * cos) + (rotated * sin)` against the fp32
// cache (promoted to fp32 for a half x; each MulBackward0 saves only the
// cache slice, a buffer without gradient), `roped.to(dtype=x.dtype)`.
Var RopeLitgpt(Tape& tape, const Var& x, const Var& cos, const Var& sin) {
  Var rotated;
  Var roped = RotatedSum(tape, x, cos, sin, &rotated);
  Var out = Cast(tape, roped, x.elem_bytes);
  tape.Drop(roped);
  tape.Drop(rotated);
  return out;
}

// CausalSelfAttention.forward (litgpt/model.py 0.5.13): `q_roped =
// apply_rope(q[..., :rope_n_elem], cos, sin)`, then `q = torch.cat((q_roped,
// q[..., rope_n_elem:]), dim=-1)`: a copy even when the pass-through part is
// empty; q_roped / k_roped stay locals until the attention returns.
Var RopeLitgptJoined(Tape& tape, const Var& x, const Var& cos, const Var& sin,
                     std::vector<Var>* locals) {
  Var roped = RopeLitgpt(tape, x, cos, sin);
  Var joined = tape.New(roped.numel, roped.elem_bytes, Category::kTemporaries, "aten::cat");
  if (tape.grad_enabled && roped.requires_grad()) {
    NodeId n = tape.Node("CatBackward0", &joined);
    tape.graph.EdgePass(n, roped);
  }
  locals->push_back(roped);
  return joined;
}

bool RotaryPiecesAreLocals(const ModelSpec& spec) {
  return spec.model_type == "stablelm" || spec.model_type == "phi";
}

// liger-kernel 0.8.5 transformers/rope.py liger_rotary_pos_emb ->
// ops/rope.py LigerRopeFunction: rope_forward transposes q / k back to
// [b, s, heads, d], which is the projections' own contiguous output, so
// `.contiguous()` copies nothing (cos / sin, [1, s, d], neither) and the
// Triton kernel rotates q and k in place; forward saves (cos, sin) only, the
// tables every layer shares. rope_backward does the same to dq / dk: in place
// when they arrive as [b, s, heads, d] storage (SDPA's flash / efficient and
// flash-attn kernels allocate their gradients in the layout of q), copied by
// `.contiguous()` when a matmul made them head-major (eager, SDPA's math).
// The tables' dtype does not promote q: the kernel stores into q's storage.
void LigerRope(Tape& tape, const LayerShared& sh, Var* q, Var* k) {
  if (!tape.grad_enabled || (!q->requires_grad() && !k->requires_grad())) return;
  Var rq = tape.Share(*q), rk = tape.Share(*k);
  NodeId n = tape.Node("LigerRopeFunctionBackward", &rq, 2);
  rk.fn = n;
  rk.slot = 1;
  tape.graph.Save(n, sh.cos.t);
  tape.graph.Save(n, sh.sin.t);
  if (sh.plan.kernel == AttnKernel::kMath) {
    tape.graph.Edge(n, *q, q->bytes());
    tape.graph.Edge(n, *k, k->bytes());
  } else {
    tape.graph.EdgePass(n, *q, 0);
    tape.graph.EdgePass(n, *k, 1);
  }
  tape.Drop(*q);
  tape.Drop(*k);
  *q = rq;
  *k = rk;
}

// `q, k = apply_rotary_pos_emb(q, k, ...)` (transformers) or torchtune's
// pos_embeddings on each: both old ones die on return.
void ApplyRotary(Tape& tape, const ModelSpec& spec, const Dims& d, const LayerShared& sh,
                 std::vector<Var>* locals, Var* q, Var* k) {
  if (tape.liger) {
    LigerRope(tape, sh, q, k);
    return;
  }
  if (tape.litgpt_modules) {
    Var rq = RopeLitgptJoined(tape, *q, sh.cos, sh.sin, locals);
    Var rk = RopeLitgptJoined(tape, *k, sh.cos, sh.sin, locals);
    tape.Drop(*q);
    tape.Drop(*k);
    *q = rq;
    *k = rk;
    return;
  }
  std::vector<Var>* pieces = RotaryPiecesAreLocals(spec) ? locals : nullptr;
  const uint64_t rot = RotaryDim(spec, d.d);
  Var rq = tape.torchtune_modules ? RopeOfTorchtune(tape, spec, d, *q)
                                  : Rope(tape, *q, sh.cos, sh.sin, d.d, rot, pieces);
  Var rk = tape.torchtune_modules ? RopeOfTorchtune(tape, spec, d, *k)
                                  : Rope(tape, *k, sh.cos, sh.sin, d.d, rot, pieces);
  tape.Drop(*q);
  tape.Drop(*k);
  *q = rq;
  *k = rk;
}

// `weights` receives eager attention's returned weights (see Attend).
// The attention forward's Python locals (the fused qkv, the final q / k / v,
// the rotary pieces above) live until it returns, after the output projection
// (LlamaAttention.forward and its copies, FalconAttention, GPTNeoXAttention,
// 4.57.6 / 5.24.0). Where autograd saves them anyway this changes nothing; where
// it saves nothing (no_grad, a reentrant checkpoint's forward, frozen LoRA
// bases) it is what keeps them.
Var SelfAttention(Tape& tape, const ModelSpec& spec, const LayerParams& lp, const Var& x,
                  const Dims& d, const LayerShared& sh, Var* weights) {
  std::vector<Var> locals;
  Var q, k, v;
  const uint64_t qn = d.heads * d.d, kn = d.kv * d.d;
  if (lp.qkv) {
    Var qkv = Proj(tape, x, lp.qkv, lp.qkv_b, d.t, qn + 2 * kn);
    if (spec.kv_sharing == KvSharing::kBroadcast) {
      q = tape.Share(qkv);  // a view; its gradient goes straight into qkv's
      q.numel = d.t * qn;
      // falcon multi_query: fused_qkv[..., [-2], :] and [..., [-1], :] are
      // advanced indexing, copies; IndexBackward0 scatters into a zero-filled
      // gradient of the whole qkv.
      for (Var* kv : {&k, &v}) {
        *kv = tape.New(d.t * kn, qkv.elem_bytes, Category::kTemporaries, "aten::index");
        if (qkv.requires_grad() && tape.grad_enabled) {
          NodeId n = tape.Node("IndexBackward0", kv);
          tape.graph.Edge(n, qkv, qkv.bytes());
        }
      }
    } else {
      // split / chunk into views of one storage; their gradients are
      // concatenated back into a qkv-sized one.
      std::vector<Var> parts = Split(tape, qkv, {d.t * qn, d.t * kn, d.t * kn});
      q = parts[0];
      k = parts[1];
      v = parts[2];
    }
    locals.push_back(qkv);  // `fused_qkv` / `qkv`, or the views' storage
  } else {
    q = Proj(tape, x, lp.q, lp.q_b, d.t, qn);
    k = Proj(tape, x, lp.k, lp.k_b, d.t, kn);
    v = Proj(tape, x, lp.v, lp.v_b, d.t, kn);
  }
  if (lp.q_norm) {
    Dims dq = d;
    dq.t = d.t * d.heads;
    dq.h = d.d;
    Var nq = Norm(tape, spec, q, lp.q_norm, nullptr, dq);
    tape.Drop(q);
    q = nq;
    dq.t = d.t * d.kv;
    Var nk = Norm(tape, spec, k, lp.k_norm, nullptr, dq);
    tape.Drop(k);
    k = nk;
  }
  if (spec.position == PositionKind::kRope) ApplyRotary(tape, spec, d, sh, &locals, &q, &k);
  if (tape.kv_cache) {
    // transformers 4.x makes both empty cache tensors in the keys' dtype
    // (DynamicLayer.lazy_initialization(key_states), 4.57.6); 5.x gives the
    // values their own (lazy_initialization(key_states, value_states), 5.24.0).
    // Under autocast the keys come out of RoPE in fp32 and the values do not.
    const uint8_t v_cache_bytes = tape.kv_values_take_key_dtype ? k.elem_bytes : v.elem_bytes;
    k = CacheUpdate(tape, k, k.elem_bytes);
    v = CacheUpdate(tape, v, v_cache_bytes);
  }
  AttnShape shape{d.b, d.s, d.heads, d.kv, d.d};
  shape.kv_head_major = tape.kv_cache && tape.kv_cache_copies;
  shape.q_head_major = spec.position == PositionKind::kRope && RotaryDim(spec, d.d) < d.d;
  shape.k_head_major = shape.q_head_major;
  // LitGPT's torch.cat after apply_rope: q and k are [b, heads, s, d] copies.
  if (tape.litgpt_modules) shape.q_head_major = shape.k_head_major = true;
  Var kept_weights;  // legacy StableLM: its own local, not returned
  Var ctx = Attend(tape, sh.plan, shape, q, k, v, sh.mask, spec.attention_dropout,
                   sh.plan.legacy_stablelm ? &kept_weights : weights);
  if (kept_weights.t != kNoTensor) locals.push_back(kept_weights);
  Var out = Proj(tape, ctx, lp.o, lp.o_b, d.t, d.h);
  tape.Drop(ctx);
  for (Var* l : {&q, &k, &v}) tape.Drop(*l);
  for (Var& l : locals) tape.Drop(l);
  return out;
}

// Dropout on a branch's output before its residual add (spec.residual_dropout).
Var ResidualDropout(Tape& tape, const ModelSpec& spec, Var x) {
  if (spec.residual_dropout <= 0) return x;
  Var out = Dropout(tape, x, spec.residual_dropout);
  tape.Drop(x);
  return out;
}

// OPT with do_layer_norm_before=False (OPTDecoderLayer.forward, transformers
// 4.57 / 5.x): h = LN(x + dropout(attn(x))); out = LN(h + dropout(fc2(relu(fc1(h))))).
Var PostNormDecoderLayer(Tape& tape, const ModelSpec& spec, const LayerParams& lp, const Var& x,
                         const Dims& d, const LayerShared& sh) {
  const Dims r = d.Residual();
  Var weights;  // OPTDecoderLayer: `hidden_states, self_attn_weights = self.self_attn(...)`
  Var attn = ResidualDropout(tape, spec, SelfAttention(tape, spec, lp, x, d, sh, &weights));
  Var mid = Add(tape, x, attn);
  tape.Drop(attn);
  Var h = Norm(tape, spec, mid, lp.norm1, lp.norm1_b, r);
  tape.Drop(mid);
  Var m =
      ResidualDropout(tape, spec, Mlp(tape, spec, lp, h, d, d.t, d.inter, lp.gate, lp.up, lp.down));
  Var sum = Add(tape, h, m);
  tape.Drop(m);
  Var out = Norm(tape, spec, sum, lp.norm2, lp.norm2_b, r);
  tape.Drop(sum);
  tape.Drop(h);  // `residual` holds it until the layer returns
  if (weights.t != kNoTensor) tape.Drop(weights);
  return out;
}

// How long a decoder layer's forward holds its first norm's output
// (4.57.6 / 5.24.0): most families overwrite `hidden_states` with the
// attention's output, so it dies when the attention returns; GPT2Block
// overwrites it with the residual sum; StableLmDecoderLayer
// (`self_attn_output, _ = ...`), FalconDecoderLayer (`attention_layernorm_out`)
// and PhiDecoderLayer (`attn_outputs, _ = ...`, the MLP reads it) hold it until
// they return.
enum class NormOutLife { kAttention, kResidualAdd, kLayer };

NormOutLife FirstNormLife(const ModelSpec& spec) {
  const std::string& t = spec.model_type;
  if (t == "stablelm" || t == "falcon" || t == "phi") return NormOutLife::kLayer;
  if (t == "gpt2") return NormOutLife::kResidualAdd;
  return NormOutLife::kAttention;
}

// The parallel layout: x + attn(ln(x)) + mlp(ln(x)) (falcon-7b, phi-2;
// gpt-neox uses ln2 for the MLP). FalconDecoderLayer adds the attention
// output into the MLP's in place (`mlp_output += attention_output`) and holds
// both norm outputs to the end; phi and gpt-neox sum into new tensors.
Var ParallelBlock(Tape& tape, const ModelSpec& spec, const LayerParams& lp, const Var& x,
                  const Dims& d, bool moe, Var h, Var attn) {
  const Dims r = d.Residual();
  const bool held = FirstNormLife(spec) == NormOutLife::kLayer;
  Var mh = lp.norm2 && !spec.sandwich_norm ? Norm(tape, spec, x, lp.norm2, lp.norm2_b, r)
                                           : tape.Share(h);
  if (!held) tape.Drop(h);
  Var m = moe ? Moe(tape, spec, lp, mh, d)
              : Mlp(tape, spec, lp, mh, d, d.t, d.inter, lp.gate, lp.up, lp.down);
  m = ResidualDropout(tape, spec, ToSequenceShard(tape, m, d, "megatron::reduce_scatter"));
  if (!held) tape.Drop(mh);
  Var branches;
  if (spec.model_type == "falcon") {
    branches = AddInPlace(tape, m, attn);
  } else {
    branches = Add(tape, attn, m);
    tape.Drop(m);
  }
  Var out = Add(tape, x, branches);
  tape.Drop(branches);
  tape.Drop(attn);
  if (held) {
    tape.Drop(mh);
    tape.Drop(h);
  }
  return out;
}

// FalconDecoderLayer returns `output, attn_weights` (4.57.6 / 5.24.0); the
// other families return the weights only with output_attentions.
bool LayerReturnsWeights(const ModelSpec& spec) { return spec.model_type == "falcon"; }

// Drops eager attention's weights at the layer's end, or hands them to the
// caller when the layer returns them.
void ReleaseWeights(Tape& tape, const ModelSpec& spec, Var& weights, Var* returned) {
  if (weights.t == kNoTensor) return;
  if (LayerReturnsWeights(spec) && returned) {
    *returned = weights;
    weights = Var{};
    return;
  }
  tape.Drop(weights);
}

// `returned` receives the attention weights where the layer returns them.
Var DecoderLayer(Tape& tape, const ModelSpec& spec, const LayerParams& lp, const Var& x,
                 const Dims& d, const LayerShared& sh, bool moe, Var* returned) {
  if (spec.post_norm) return PostNormDecoderLayer(tape, spec, lp, x, d, sh);
  const Dims r = d.Residual();
  // torchtune's TransformerSelfAttentionLayer.forward (0.6.1): `h = self.sa_norm(x)`,
  // `attn_out = self.attn(h, h, ...)`, `h = self.sa_scale(attn_out) + x`: the norm's
  // output goes with that sum, and `attn_out` stays bound until the layer returns.
  const NormOutLife h_life =
      tape.torchtune_modules ? NormOutLife::kResidualAdd : FirstNormLife(spec);
  Var h = Norm(tape, spec, x, lp.norm1, lp.norm1_b, r);
  // Every decoder layer keeps the attention weights that eager attention
  // returns in a local (`hidden_states, _ = self.self_attn(...)` and its
  // spellings, transformers 4.57 / 5.x) until it returns: alive through the
  // MLP even where autograd saves nothing (no_grad, checkpointing).
  Var weights;
  const Param* o_proj = lp.o ? lp.o : lp.qkv;
  Var attn_out = o_proj ? InModule(tape, ParentModule(tape, o_proj), {}, h,
                                   [&](const Var& in) {
                                     return SelfAttention(tape, spec, lp, in, d, sh, &weights);
                                   })
                        : SelfAttention(tape, spec, lp, h, d, sh, &weights);
  Var attn = ToSequenceShard(tape, attn_out, d, "megatron::reduce_scatter");
  attn = ResidualDropout(tape, spec, attn);
  if (spec.sandwich_norm && lp.norm2) {
    Var n = Norm(tape, spec, attn, lp.norm2, nullptr, r);
    tape.Drop(attn);
    attn = n;
  }
  if (spec.parallel_attn) {
    Var out = ParallelBlock(tape, spec, lp, x, d, moe, h, attn);
    ReleaseWeights(tape, spec, weights, returned);
    return out;
  }
  // LitGPT's Block.forward (litgpt/model.py 0.5.13) keeps `attention_output`
  // to the end, `x_normed` until norm_2's output replaces it, and that one
  // until the MLP's output is added.
  const bool litgpt = tape.litgpt_modules;
  if (h_life == NormOutLife::kAttention && !litgpt) tape.Drop(h);
  Var mid = Add(tape, x, attn);
  if (h_life == NormOutLife::kResidualAdd) tape.Drop(h);
  // StableLmDecoderLayer (`self_attn_output`), FalconDecoderLayer
  // (`attention_output`) and GPT2Block (`attn_output`, after GPT2Attention's
  // resid_dropout) keep the attention output in its own local until the layer
  // returns (4.57.6 / 5.24.0); the other sequential families overwrite
  // `hidden_states` with the residual sum.
  const bool attn_lives = tape.torchtune_modules || litgpt || spec.model_type == "stablelm" ||
                          spec.model_type == "gpt2" || spec.model_type == "falcon";
  if (!attn_lives) tape.Drop(attn);
  Param* pre = spec.sandwich_norm ? lp.norm3 : lp.norm2;
  Var h2 = Norm(tape, spec, mid, pre, spec.sandwich_norm ? nullptr : lp.norm2_b, r);
  if (litgpt) tape.Drop(h);
  Var m = moe ? (lp.router ? InModule(tape, ParentModule(tape, lp.router), {}, h2,
                                      [&](const Var& in) { return Moe(tape, spec, lp, in, d); })
                           : Moe(tape, spec, lp, h2, d))
          : lp.down
              ? InModule(tape, ParentModule(tape, lp.down), {}, h2,
                         [&](const Var& in) {
                           return Mlp(tape, spec, lp, in, d, d.t, d.inter, lp.gate, lp.up, lp.down);
                         })
              : Mlp(tape, spec, lp, h2, d, d.t, d.inter, lp.gate, lp.up, lp.down);
  m = ResidualDropout(tape, spec, ToSequenceShard(tape, m, d, "megatron::reduce_scatter"));
  // GPT2Block keeps ln_2's output in `hidden_states` until the residual sum
  // replaces it (`feed_forward_hidden_states = self.mlp(hidden_states)`,
  // 4.57.6 / 5.17 / 5.24); the other families overwrite it with the MLP's output.
  const bool h2_lives = litgpt || spec.model_type == "gpt2";
  if (!h2_lives) tape.Drop(h2);
  if (spec.sandwich_norm && lp.norm4) {
    Var n = Norm(tape, spec, m, lp.norm4, nullptr, r);
    tape.Drop(m);
    m = n;
  }
  Var out = Add(tape, mid, m);
  if (h2_lives) tape.Drop(h2);
  tape.Drop(mid);
  tape.Drop(m);
  if (attn_lives) tape.Drop(attn);
  if (h_life == NormOutLife::kLayer) tape.Drop(h);
  ReleaseWeights(tape, spec, weights, returned);
  return out;
}

bool IsMoeLayer(const ModelSpec& spec, const LayerParams& lp, uint64_t layer) {
  (void)spec;
  (void)layer;
  return lp.router != nullptr && !lp.expert_gate.empty();
}

void DropCache(Tape& tape) {
  if (!tape.kv_cache) return;
  for (Var& v : *tape.kv_cache) tape.Drop(v);
  tape.kv_cache->clear();
  tape.kv_cache = nullptr;
}

}  // namespace

// Tokens each local expert processes (transformer.h). Dropless routing (transformers'
// Mixtral / Qwen-MoE blocks, Megatron's default): t*k token-expert pairs per
// rank; spread evenly, or with `imbalance` R the busiest expert gets R times
// its even share (at most every token once) and the others share the rest;
// under expert parallelism the worst rank's experts are all that busy. With a
// capacity factor F (GShard / DeepSpeed-MoE, Megatron
// --moe-expert-capacity-factor with --moe-pad-expert-input-to-capacity) every
// expert processes exactly ceil(F * t * k / E) tokens, dropped or padded.
std::vector<uint64_t> ExpertTokens(uint64_t tokens, uint64_t top_k, uint64_t local_experts,
                                   uint64_t ep, double capacity_factor, double imbalance) {
  std::vector<uint64_t> out(local_experts, 0);
  if (local_experts == 0) return out;
  const double even = static_cast<double>(tokens * top_k) / static_cast<double>(local_experts);
  if (capacity_factor > 0) {
    const auto cap = static_cast<uint64_t>(std::ceil(capacity_factor * even));
    std::fill(out.begin(), out.end(), cap);
    return out;
  }
  const uint64_t max_per_expert = tokens * ep;  // each token at most once per expert
  if (ep > 1) {
    const auto busy =
        std::min<uint64_t>(max_per_expert, static_cast<uint64_t>(std::ceil(imbalance * even)));
    std::fill(out.begin(), out.end(), busy);
    return out;
  }
  const uint64_t total = tokens * top_k;
  const uint64_t busiest =
      std::min<uint64_t>(max_per_expert, static_cast<uint64_t>(std::ceil(imbalance * even)));
  out[0] = busiest;
  const uint64_t rest = total > busiest ? total - busiest : 0;
  for (uint64_t e = 1; e < local_experts; ++e)
    out[e] = (rest + local_experts - 2) / (local_experts - 1);
  if (local_experts == 1) out[0] = total;
  return out;
}

ModelParams IndexParams(const ModelSpec& spec, std::vector<Param>& params) {
  ModelParams mp;
  mp.layers.resize(spec.num_layers);
  const std::vector<ParamRole> roles = WeightRoles(spec.params);  // biases follow their weight
  for (size_t i = 0; i < spec.params.size(); ++i) {
    ParamTensor pt = spec.params[i];
    Param* p = &params[i];
    pt.role = roles[i];
    if (pt.layer >= 0 && static_cast<uint64_t>(pt.layer) < spec.num_layers) {
      Place(mp.layers[pt.layer], pt, p);
      continue;
    }
    if (pt.role == ParamRole::kEmbed)
      mp.embed = p;
    else if (pt.role == ParamRole::kPosEmbed)
      mp.pos_embed = p;
    else if (pt.role == ParamRole::kNorm)
      (pt.name.ends_with(".bias") ? mp.final_norm_b : mp.final_norm) = p;
    else if (pt.role == ParamRole::kLmHead)
      (pt.name.ends_with(".bias") ? mp.lm_head_b : mp.lm_head) = p;
    else if (pt.role == ParamRole::kProjIn)
      mp.proj_in = p;
    else if (pt.role == ParamRole::kProjOut)
      mp.proj_out = p;
  }
  return mp;
}

namespace {

Dims ForwardDims(const ModelSpec& spec, const TrainingSetup& setup) {
  Dims d;
  d.b = setup.batch;
  d.s = setup.seq;
  d.t = d.b * d.s;
  d.h = spec.hidden_size;
  d.heads = spec.num_heads;
  d.kv = spec.num_kv_heads ? spec.num_kv_heads : spec.num_heads;
  d.d = spec.head_dim ? spec.head_dim : spec.hidden_size / spec.num_heads;
  d.inter = spec.intermediate_size;
  d.vocab = spec.vocab_size;
  d.sp = setup.parallel.sp ? setup.parallel.tp : 1;
  d.ep = setup.parallel.ep;
  d.moe_capacity_factor = setup.moe_capacity_factor;
  d.moe_imbalance = setup.moe_imbalance;
  // transformers >= 5.0 runs routed experts as stacked [E, 2I, h] / [E, h, I]
  // parameters through `grouped_mm` (the default experts implementation,
  // PreTrainedModel.get_correct_experts_implementation). Megatron-style knobs
  // (expert parallelism, a capacity factor) keep the per-expert lowering.
  d.grouped_experts =
      setup.transformers_version >= 500 && d.ep == 1 && setup.moe_capacity_factor == 0;
  return d;
}

// `x` replaced by what `op` made of it (the old tensor dropped).
void Rebind(Tape& tape, Var& x, Var made) {
  tape.Drop(x);
  x = made;
}

// Gemma's sqrt(hidden) scaling: in the model's forward for Gemma 1 / 2 under
// 4.x; inside the embedding module (*TextScaledWordEmbedding) for Gemma 3 and
// for all of them in 5.x, where the input-grad hook then sees the scaled output.
bool IsGemma(const ModelSpec& spec) {
  return spec.model_type == "gemma" || spec.model_type == "gemma2" ||
         spec.model_type == "gemma3_text";
}
bool GemmaScalesInsideEmbedding(const ModelSpec& spec, const TrainingSetup& setup) {
  return IsGemma(spec) && (spec.model_type == "gemma3_text" || setup.transformers_version >= 500);
}

// Learned positions added to the token embeddings. GPT-2 looks positions up
// as cache_position.unsqueeze(0), [1, s], and broadcasts them over the batch
// (GPT2Model.forward, 4.57 / 5.x); OPT derives [b, s] positions from the
// attention mask, and its project_in widens the tokens first (OPTDecoder.forward).
// Both keep the two embeddings in locals (`inputs_embeds`, `position_embeds` /
// `pos_embeds`) that nothing else saves: they live until the base model
// returns, so they go to `base_locals` instead of being dropped.
void AddPositions(Tape& tape, const ModelSpec& spec, ModelParams& mp, const Dims& d, const Var& ids,
                  Var& x, std::vector<Var>* base_locals) {
  const bool batch_shared = spec.model_type == "gpt2";
  Var pos_ids =
      batch_shared ? tape.New(d.s, kI64, Category::kOther, "aten::arange") : tape.Share(ids);
  Var pos = Embedding(tape, pos_ids, *mp.pos_embed, batch_shared ? d.s : d.t, d.h);
  tape.Drop(pos_ids);
  if (mp.proj_in) Rebind(tape, x, Linear(tape, x, *mp.proj_in, nullptr, d.t, d.h));
  Var sum = Add(tape, x, pos);
  base_locals->push_back(x);
  base_locals->push_back(pos);
  x = sum;
}

// The first stage's input: embeddings (scaled, positioned), the input-grad
// hook, sequence-parallel scatter and dropout.
Var EmbedTokens(Tape& tape, const ModelSpec& spec, ModelParams& mp, const TrainingSetup& setup,
                const Dims& d, const Var& ids, std::vector<Var>* base_locals) {
  tape.Unit(0, true);
  tape.SetModule("model.embed_tokens");
  // OPT: embed_tokens is word_embed_proj_dim wide and project_in widens it
  // after the positions are embedded (OPTDecoder.forward).
  const uint64_t embed_dim = mp.proj_in ? mp.embed->numel / d.vocab : d.h;
  const bool scaled_inside = GemmaScalesInsideEmbedding(spec, setup);
  // enable_input_require_grads hooks the embedding module's output, ahead of
  // DeepSpeed's hooks (registered later, by deepspeed.initialize).
  const bool hooked_grad = InputsRequireGrad(setup) && !scaled_inside;
  Var x = Embedding(tape, ids, *mp.embed, d.t, embed_dim, hooked_grad);
  if (scaled_inside) Rebind(tape, x, Scale(tape, x));
  if (InputsRequireGrad(setup) && !hooked_grad) x = RequireInputGrad(tape, x);
  // The base model's `inputs_embeds` holds the embedding until it returns
  // (`hidden_states = inputs_embeds` in LlamaModel, Qwen2Model, FalconModel and
  // the rest, 4.57 / 5.x; Gemma under 4.x scales into a new `hidden_states`).
  // Saved for backward in full training anyway, it matters where nothing saves
  // it (frozen layers: the H100 snapshot of Qwen2.5 LoRA keeps it to the end).
  if (mp.pos_embed) {
    AddPositions(tape, spec, mp, d, ids, x, base_locals);
  } else if (setup.impl != ModelImpl::kTorchtune) {
    // torchtune's TransformerDecoder.forward (0.6.1) rebinds `h` instead.
    base_locals->push_back(tape.Share(x));
  }
  if (IsGemma(spec) && !scaled_inside)
    Rebind(tape, x, Scale(tape, x));  // hidden_states * normalizer
  x = ToSequenceShard(tape, x, d, "megatron::scatter_to_sequence_parallel_region");
  if (spec.hidden_dropout > 0) Rebind(tape, x, Dropout(tape, x, spec.hidden_dropout));
  tape.Unit(0, false);
  return x;
}

// The 4-D masks a forward builds (none for most SDPA paths): [b, 1, s, s],
// eager's float mask in the embeddings' dtype, SDPA's bool (masking_utils'
// sdpa_mask returns bool from 4.53 on); a sliding-window model builds a
// second, full one.
struct ForwardMasks {
  Var mask, second_mask;
};

// sdpa_mask's non-vmap path over a packed row (masking_utils.py, 5.24.0, seen
// with torch 2.13): causal `le`, AND the padding function's ones, then the
// same-sequence `eq` ANDed in; eager turns the bool mask into a float one
// with `where`.
Var PackedCausalMask(Tape& tape, uint64_t elems, uint8_t bytes) {
  Var le = tape.New(elems, kBool, Category::kTemporaries, "aten::le");
  Var causal = tape.New(elems, kBool, Category::kTemporaries, "aten::bitwise_and");
  tape.Drop(le);
  Var same = tape.New(elems, kBool, Category::kTemporaries, "aten::eq");
  Var mask = tape.New(elems, kBool, Category::kOther, "causal_mask");
  tape.Drop(causal);
  tape.Drop(same);
  if (bytes == kBool) return mask;
  Var floats = tape.New(elems, bytes, Category::kOther, "causal_mask");
  tape.Drop(mask);
  return floats;
}

// What every layer reads: the attention plan, the masks, and the rotary
// cos/sin in the residual stream's dtype, made after the mask
// (LlamaModel.forward, 4.57 / 5.x).
LayerShared PrepareLayers(Tape& tape, const ModelSpec& spec, const TrainingSetup& setup,
                          const Dims& d, const Var& x, bool cache, ForwardMasks* masks) {
  LayerShared sh;
  // torchtune's MultiHeadAttention copies k / v to every head itself
  // (k.unsqueeze(2).expand(...).flatten(1, 2), modules/attention.py 0.6.1) and
  // calls SDPA with is_causal when no mask is given.
  // LitGPT's CausalSelfAttention likewise (`k.repeat_interleave(q_per_kv,
  // dim=1)`, an expand and a contiguous clone, litgpt/model.py 0.5.13) and
  // passes mask=None, so is_causal.
  const bool torchtune = setup.impl == ModelImpl::kTorchtune || setup.impl == ModelImpl::kLitgpt;
  sh.plan =
      PlanAttention(setup, tape.autocast ? tape.compute_bytes : x.elem_bytes, d.heads, d.kv,
                    !torchtune && SdpaGetsMask(spec, setup, d.s, cache), spec.attention_dropout,
                    torchtune ? KvSharing::kExpanded : spec.kv_sharing);
  // Eager softmax: llama-style families call softmax(..., dtype=torch.float32)
  // .to(query.dtype); GPT-2 (softmax(attn_weights, dim=-1)) and Falcon
  // (dtype=hidden_states.dtype) stay in the scores' dtype (4.57.6 / 5.24.0).
  if (spec.model_type == "gpt2" || spec.model_type == "falcon") sh.plan.fp32_softmax = false;
  sh.plan.probs_to_v_dtype = spec.model_type == "gpt2";
  sh.plan.softcap = spec.attn_logit_softcapping > 0 && sh.plan.kernel == AttnKernel::kMath;
  sh.plan.legacy_stablelm = spec.model_type == "stablelm" && setup.transformers_version < 500 &&
                            setup.attn == Attention::kEager;
  if (sh.plan.causal_mask_tensor) {
    const uint8_t bytes =
        setup.attn == Attention::kSdpa && setup.transformers_version >= 453 ? kBool : x.elem_bytes;
    masks->mask = PackedMask(spec, setup, cache)
                      ? PackedCausalMask(tape, d.b * d.s * d.s, bytes)
                      : tape.New(d.b * d.s * d.s, bytes, Category::kOther, "causal_mask");
    sh.mask = &masks->mask;
    const bool full_too = setup.attn != Attention::kSdpa || SdpaNeedsFullMask(spec, setup, cache);
    if (BuildsMaskPair(spec, setup) && full_too) {
      masks->second_mask = tape.New(d.b * d.s * d.s, bytes, Category::kOther, "causal_mask");
    }
  }
  tape.SetModule("model.rotary_emb");
  // torchtune slices its rotary cache (a buffer, PlaceBuffers) in each layer.
  if (spec.position == PositionKind::kRope && !torchtune) {
    MarkModule(tape, "model.rotary_emb", true);
    RotaryTables(tape, d.s, RotaryDim(spec, d.d), x.elem_bytes, &sh.cos, &sh.sin);
    MarkModule(tape, "model.rotary_emb", false);
  }
  // LitGPT: `cos = self.cos[:T].unsqueeze(0)`, views of GPT's buffers.
  if (tape.litgpt_modules) {
    sh.cos = tape.Share(tape.rope_cos);
    sh.sin = tape.Share(tape.rope_sin);
    sh.cos.numel = sh.sin.numel = d.s * d.d;
  }
  return sh;
}

// One decoder layer, checkpointed when the setup says so. transformers 5.x's
// GradientCheckpointingLayer checkpoints the layer's forward (cls.forward is
// wrapped, modeling_layers.py 5.24.0): its module hooks run outside the
// checkpoint; 4.x checkpoints Module.__call__ (4.57.6), hooks inside.
Var RunLayer(Tape& tape, const ModelSpec& spec, ModelParams& mp, const TrainingSetup& setup,
             uint64_t i, const Dims& d, LayerShared& sh, ForwardMasks& masks, const Var& x,
             Var* returned) {
  const bool ckpt = setup.grad_ckpt != GradCkpt::kNone;
  auto layer = [&](const Var& in) {
    return DecoderLayer(tape, spec, mp.layers[i], in, d, sh, IsMoeLayer(spec, mp.layers[i], i),
                        returned);
  };
  const std::string name = "model.layers." + std::to_string(i);
  const bool hooks_inside = setup.transformers_version < 500;
  auto checkpointed = [&](const Var& in) {
    if (ckpt) {
      tape.graph.BeginCheckpoint(setup.grad_ckpt == GradCkpt::kReentrant);
      tape.graph.Keep(in.t);
      if (sh.cos.t != kNoTensor) {
        tape.graph.Keep(sh.cos.t);
        tape.graph.Keep(sh.sin.t);
      }
    }
    // Which of the two masks this layer reads (the other is nullptr's is_causal).
    if (BuildsMaskPair(spec, setup) && masks.mask.t != kNoTensor) {
      sh.mask = SlidingLayer(spec, i)
                    ? &masks.mask
                    : (masks.second_mask.t != kNoTensor ? &masks.second_mask : nullptr);
    }
    if (ckpt && sh.mask) tape.graph.Keep(sh.mask->t);
    Var y = hooks_inside ? InModule(tape, name, {}, in, layer) : layer(in);
    if (ckpt && setup.grad_ckpt == GradCkpt::kReentrant && returned->t != kNoTensor) {
      tape.graph.UngradedOutput(returned->bytes());
    }
    if (ckpt) tape.graph.EndCheckpoint();
    return y;
  };
  return hooks_inside ? checkpointed(x) : InModule(tape, name, {}, x, checkpointed);
}

// The stage's decoder layers, each checkpointed when the setup says so.
// `layer_outputs`: what the last layer returned besides its hidden states.
Var RunLayers(Tape& tape, const ModelSpec& spec, ModelParams& mp, const TrainingSetup& setup,
              const StageSpan& span, const Dims& d, LayerShared& sh, ForwardMasks& masks, Var x,
              Var* layer_outputs) {
  const uint64_t end_layer = std::min<uint64_t>(span.end_layer, spec.num_layers);
  for (uint64_t i = span.first_layer; i < end_layer; ++i) {
    tape.SetModule("model.layers." + std::to_string(i));
    tape.Unit(static_cast<int>(i) + 1, true);
    Var returned;
    Var y = RunLayer(tape, spec, mp, setup, i, d, sh, masks, x, &returned);
    tape.Unit(static_cast<int>(i) + 1, false);
    tape.Drop(x);
    x = y;
    // FalconModel.forward's `outputs` holds the previous layer's tuple until
    // the next layer returns, the last one until the model returns.
    if (layer_outputs->t != kNoTensor) tape.Drop(*layer_outputs);
    *layer_outputs = returned;
  }
  return x;
}

// The last stage's final norm, OPT's project_out, lm_head and the loss. OPT's
// post-norm layout has no final norm; project_out narrows to the embeddings'
// width, which the (tied) lm_head reads.
Var HeadAndLoss(Tape& tape, const ModelSpec& spec, ModelParams& mp, const TrainingSetup& setup,
                const Dims& d, Var x, Var* layer_outputs, std::vector<Var>* base_locals,
                const Var& labels, const DpoHead* dpo) {
  tape.SetModule("model.norm");
  Dims dn = d.Residual();
  Var hfin =
      mp.final_norm ? Norm(tape, spec, x, mp.final_norm, mp.final_norm_b, dn) : tape.Share(x);
  tape.Drop(x);
  uint64_t head_in = d.h;
  if (mp.proj_out) {  // inside OPTDecoder.forward, before it returns
    head_in = mp.proj_out->numel / d.h;
    Rebind(tape, hfin, Linear(tape, hfin, *mp.proj_out, nullptr, d.t, head_in));
  }
  if (tape.module_hooks) tape.module_hooks->Leave("model", &hfin);  // the base model returns
  // The base model returns: its locals go.
  if (layer_outputs->t != kNoTensor) tape.Drop(*layer_outputs);
  for (Var& v : *base_locals) tape.Drop(v);
  if (spec.num_labels > 0) {
    tape.SetModule("score");
    Var loss =
        SequenceClassificationLoss(tape, setup, hfin, *mp.lm_head, d.t, spec.num_labels, labels);
    tape.Drop(hfin);
    return loss;
  }
  tape.SetModule("lm_head");
  // get_act_offloading_ctx_manager (torchtune 0.6.1) runs the output projection
  // under a NoOpManager, and the recipes compute the loss after the offloading
  // context has exited: nothing from here on is offloaded.
  tape.graph.offload_activations = false;
  Param* head = mp.lm_head ? mp.lm_head : mp.embed;  // tied embeddings
  if (dpo) {
    Var logps =
        TrlDpoLogps(tape, setup, hfin, *head, d.t, head_in, d.vocab, dpo->all_outputs, dpo->held);
    tape.Drop(hfin);
    return logps;
  }
  if (setup.loss == LossKind::kTorchtuneChunked) {
    return TorchtuneChunkedLoss(tape, &hfin, *head, d.t, head_in, d.vocab);
  }
  if (setup.loss == LossKind::kLitgptChunked) {
    return LitgptChunkedLoss(tape, &hfin, *head, d.b, d.s, head_in, d.vocab);
  }
  Var loss = CausalLmLoss(tape, setup, hfin, *head, mp.lm_head_b, d.t, head_in, d.vocab,
                          spec.final_logit_softcapping);
  tape.Drop(hfin);
  return loss;
}

}  // namespace

namespace {

// The model from the embeddings (or the hidden states a previous pipeline
// stage sent) to the loss (or, without the head, the hidden states to send);
// with `dpo`, to the per-sequence log-probabilities of TRL's DPO head.
Var ForwardBody(Tape& tape, const ModelSpec& spec, ModelParams& mp, const TrainingSetup& setup,
                const StageSpan& span, const Dims& d, const Var& ids, const Var& labels,
                const DpoHead* dpo) {
  Var x;
  std::vector<Var> base_locals;  // the base model's locals nothing else holds
  if (span.embed) MarkModule(tape, "model", true);
  if (span.embed) {
    x = EmbedTokens(tape, spec, mp, setup, d, ids, &base_locals);
  } else {
    // Megatron p2p recv: the previous stage's hidden states, a leaf whose
    // gradient is sent back (the residual stream's dtype).
    tape.SetModule("pipeline");
    x = tape.New(d.Residual().t * d.h, tape.autocast ? kF32 : tape.compute_bytes,
                 Category::kActivations, "pp::recv");
  }
  EnsureSequenceGatherBuffer(tape, d, x.elem_bytes);
  // GradientCheckpointingLayer sets use_cache=False under checkpointing; the
  // cache is then never made (transformers 4.57 / 5.x modeling_layers.py).
  // Megatron-style layouts run Megatron's model, which has no such cache.
  const bool cache = MakesTrainingCache(spec, setup, setup.grad_ckpt != GradCkpt::kNone);
  ForwardMasks masks;
  LayerShared sh = PrepareLayers(tape, spec, setup, d, x, cache, &masks);
  std::vector<Var> kv_cache;
  if (cache) {
    tape.kv_cache = &kv_cache;
    tape.kv_cache_copies = setup.transformers_version >= 454;
    tape.kv_values_take_key_dtype = setup.transformers_version < 500;
  }
  Var layer_outputs;
  x = RunLayers(tape, spec, mp, setup, span, d, sh, masks, x, &layer_outputs);
  for (Var* v : {&sh.cos, &sh.sin, &masks.mask, &masks.second_mask}) {
    if (v->t != kNoTensor) tape.Drop(*v);
  }
  if (!span.head) {
    if (layer_outputs.t != kNoTensor) tape.Drop(layer_outputs);
    for (Var& v : base_locals) tape.Drop(v);
    DropCache(tape);
    return x;  // Megatron p2p send; kept for this micro-batch's backward
  }
  const int head_unit = static_cast<int>(spec.num_layers) + 1;
  tape.Unit(head_unit, true);
  Var loss = HeadAndLoss(tape, spec, mp, setup, d, x, &layer_outputs, &base_locals, labels, dpo);
  tape.Unit(head_unit, false);
  DropCache(tape);  // outputs.past_key_values goes with the model's output
  return loss;
}

// TRL's DPOTrainer._compute_loss (trl 1.16.0 trainer/dpo_trainer.py): the
// policy's forward over chosen and rejected rows, then, unless the reference
// log-probabilities were precomputed, the reference's under torch.no_grad()
// with gradient checkpointing off: a separate frozen copy (`reference`), or
// under PEFT the same model with its adapters disabled. Every output object
// lives until the loss is made; the loss reads the per-sequence sums only.
Var DpoStep(Tape& tape, const ModelSpec& spec, ModelParams& mp, ModelParams* reference,
            const TrainingSetup& setup, const StageSpan& span, const Dims& d, const Var& ids,
            const Var& labels) {
  std::vector<Var> held;
  const DpoHead policy{true, &held};
  Var logps = ForwardBody(tape, spec, mp, setup, span, d, ids, labels, &policy);
  Var ref_logps;
  if (!setup.dpo_precompute_ref) {
    TrainingSetup ref_setup = setup;
    ref_setup.grad_ckpt = GradCkpt::kNone;
    const bool grad = tape.grad_enabled;
    tape.grad_enabled = false;
    tape.adapters_disabled = reference == nullptr;
    // A separate reference gets TRL's default head outputs (log-probabilities
    // only); the policy's own patched forward computes all four.
    const DpoHead ref{reference == nullptr, &held};
    ref_logps =
        ForwardBody(tape, spec, reference ? *reference : mp, ref_setup, span, d, ids, labels, &ref);
    tape.grad_enabled = grad;
    tape.adapters_disabled = false;
  }
  tape.SetModule("dpo_loss");
  Var loss = tape.New(1, kF32, Category::kLoss, "aten::mean");
  if (tape.grad_enabled && logps.requires_grad()) {
    NodeId n = tape.Node("MeanBackward0", &loss);
    tape.graph.Edge(n, logps, logps.bytes(), Category::kLoss);
  }
  tape.Drop(logps);
  if (ref_logps.t != kNoTensor) tape.Drop(ref_logps);
  for (Var& v : held) tape.Drop(v);  // compute_loss returns
  return loss;
}

}  // namespace

ForwardOut Forward(Tape& tape, const ModelSpec& spec, ModelParams& mp, const TrainingSetup& setup,
                   const StageSpan& span, ModelParams* reference) {
  const Dims d = ForwardDims(spec, setup);
  tape.SetModule("model");
  // input_ids and labels: int64 [b, s], made by the data loader (Megatron's
  // pipeline gives tokens to the first stage and labels to the last).
  Var ids, labels;
  if (span.embed) ids = tape.New(d.t, kI64, Category::kOther, "input_ids");
  // One label per sequence for a classification head (float for regression).
  if (span.head) {
    labels = spec.num_labels == 0 ? tape.New(d.t, kI64, Category::kOther, "labels")
                                  : tape.New(setup.batch, spec.num_labels == 1 ? kF32 : kI64,
                                             Category::kOther, "labels");
  }
  // The top module (LlamaForCausalLM and its kind): its hooks also start
  // ZeRO-3's step (parameter_offload.py _start_of_forward_hook).
  MarkModule(tape, "", true);
  Var out = setup.dpo ? DpoStep(tape, spec, mp, reference, setup, span, d, ids, labels)
                      : ForwardBody(tape, spec, mp, setup, span, d, ids, labels, nullptr);
  if (tape.module_hooks) tape.module_hooks->Leave("", &out);
  if (ids.t != kNoTensor) tape.Drop(ids);
  if (labels.t != kNoTensor) tape.Drop(labels);
  return ForwardOut{out};
}

}  // namespace vramscope::lower
