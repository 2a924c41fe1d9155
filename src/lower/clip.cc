#include "clip.h"

#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "attention.h"
#include "loss.h"
#include "ops.h"
#include "unet_ops.h"
#include "vramscope/common/decimal.h"

namespace vramscope::lower {
namespace {

// The slot of a CLIPEncoderLayer parameter named `rest` (after "encoder.layers.N.").
void ClipPlaceLayerParam(ClipLayerParams& l, const std::string& rest, Param* p) {
  const std::pair<const char*, Param**> slots[] = {
      {"self_attn.q_proj.weight", &l.q},   {"self_attn.q_proj.bias", &l.q_b},
      {"self_attn.k_proj.weight", &l.k},   {"self_attn.k_proj.bias", &l.k_b},
      {"self_attn.v_proj.weight", &l.v},   {"self_attn.v_proj.bias", &l.v_b},
      {"self_attn.out_proj.weight", &l.o}, {"self_attn.out_proj.bias", &l.o_b},
      {"layer_norm1.weight", &l.ln1},      {"layer_norm1.bias", &l.ln1_b},
      {"layer_norm2.weight", &l.ln2},      {"layer_norm2.bias", &l.ln2_b},
      {"mlp.fc1.weight", &l.fc1},          {"mlp.fc1.bias", &l.fc1_b},
      {"mlp.fc2.weight", &l.fc2},          {"mlp.fc2.bias", &l.fc2_b}};
  for (const auto& [name, slot] : slots) {
    if (rest == name) *slot = p;
  }
}

// "encoder.layers.N.rest" under `prefix`: places the parameter in layers[N].
bool ClipPlaceEncoderParam(const std::string& name, const std::string& prefix,
                           std::vector<ClipLayerParams>& layers, Param* p) {
  const std::string head = prefix + "encoder.layers.";
  if (!name.starts_with(head)) return false;
  const size_t dot = name.find('.', head.size());
  if (dot == std::string::npos) return false;
  const auto index =
      common::ParseDecimal(std::string_view(name).substr(head.size(), dot - head.size()), 999999);
  if (!index || *index >= layers.size()) return false;
  const size_t i = static_cast<size_t>(*index);
  ClipPlaceLayerParam(layers[i], name.substr(dot + 1), p);
  return true;
}

// A standalone tower has no prefix in transformers 5.24.0; inside CLIPModel or
// a *WithProjection model it is `text_model` / `vision_model`.
std::string ClipTextPrefix(const ClipSpec& c) {
  return (c.has_vision || c.text_projection) ? "text_model." : "";
}
std::string ClipVisionPrefix(const ClipSpec& c) {
  return (c.has_text || c.visual_projection) ? "vision_model." : "";
}

void ClipPlaceTopParam(ClipParams& cp, const ClipSpec& c, const std::string& name, Param* p) {
  const std::string tp = ClipTextPrefix(c), vp = ClipVisionPrefix(c);
  const std::pair<std::string, Param**> top[] = {
      {tp + "embeddings.token_embedding.weight", &cp.token},
      {tp + "embeddings.position_embedding.weight", &cp.text_pos},
      {tp + "final_layer_norm.weight", &cp.final_norm},
      {tp + "final_layer_norm.bias", &cp.final_norm_b},
      {vp + "embeddings.class_embedding", &cp.cls},
      {vp + "embeddings.patch_embedding.weight", &cp.patch},
      {vp + "embeddings.position_embedding.weight", &cp.vision_pos},
      {vp + "pre_layrnorm.weight", &cp.pre_norm},
      {vp + "pre_layrnorm.bias", &cp.pre_norm_b},
      {vp + "post_layernorm.weight", &cp.post_norm},
      {vp + "post_layernorm.bias", &cp.post_norm_b},
      {"text_projection.weight", &cp.text_proj},
      {"visual_projection.weight", &cp.visual_proj},
      {"logit_scale", &cp.logit_scale}};
  for (const auto& [n, slot] : top) {
    if (name == n) *slot = p;
  }
}

Status ClipCheckLayers(const ModelSpec& spec, const std::vector<ClipLayerParams>& layers,
                       const char* tower) {
  for (size_t i = 0; i < layers.size(); ++i) {
    const ClipLayerParams& l = layers[i];
    if (!l.q || !l.k || !l.v || !l.o || !l.ln1 || !l.ln2 || !l.fc1 || !l.fc2) {
      return MakeError(fmt::format("{}: CLIP {} layer {} lacks attention, MLP or norm parameters",
                                   spec.name, tower, i));
    }
  }
  return Ok{};
}

}  // namespace

Result<ClipParams> IndexClipParams(const ModelSpec& spec, std::vector<Param>& params) {
  const ClipSpec& c = spec.clip;
  ClipParams cp;
  cp.text_layers.resize(c.has_text ? c.text.layers : 0);
  cp.vision_layers.resize(c.has_vision ? c.vision.layers : 0);
  for (size_t i = 0; i < spec.params.size() && i < params.size(); ++i) {
    const std::string& name = spec.params[i].name;
    if (c.has_text && ClipPlaceEncoderParam(name, ClipTextPrefix(c), cp.text_layers, &params[i]))
      continue;
    if (c.has_vision &&
        ClipPlaceEncoderParam(name, ClipVisionPrefix(c), cp.vision_layers, &params[i]))
      continue;
    ClipPlaceTopParam(cp, c, name, &params[i]);
  }
  if (c.has_text && (!cp.token || !cp.text_pos || !cp.final_norm))
    return MakeError(fmt::format(
        "{}: could not find the CLIP text embeddings and final norm in its parameter list",
        spec.name));
  if (c.has_vision && (!cp.cls || !cp.patch || !cp.vision_pos || !cp.pre_norm || !cp.post_norm))
    return MakeError(
        fmt::format("{}: could not find the CLIP vision embeddings and norms in its parameter list",
                    spec.name));
  if ((c.text_projection && !cp.text_proj) || (c.visual_projection && !cp.visual_proj) ||
      (c.logit_scale && !cp.logit_scale))
    return MakeError(
        fmt::format("{}: could not find the CLIP projections in its parameter list", spec.name));
  Status text = ClipCheckLayers(spec, cp.text_layers, "text");
  if (!text.ok()) return text.error();
  Status vision = ClipCheckLayers(spec, cp.vision_layers, "vision");
  if (!vision.ok()) return vision.error();
  return cp;
}

uint64_t ClipTextLen(const ModelSpec& spec, const TrainingSetup& setup) {
  return setup.text_len != 0 ? setup.text_len : spec.clip.max_positions;
}

namespace {

// One tower's shapes as CLIPEncoderLayer sees them.
struct ClipTowerDims {
  uint64_t b, s, t, h, heads, inter;
  MlpKind act;
  double attention_dropout;
};

ClipTowerDims ClipDimsOf(const ClipTower& tower, uint64_t batch, uint64_t seq) {
  return ClipTowerDims{batch,       seq,
                       batch * seq, tower.hidden,
                       tower.heads, tower.intermediate,
                       tower.act,   tower.attention_dropout};
}

// CLIPAttention.forward: q, k, v (this order in 4.57.6 and 5.24.0), the
// kernel, `.reshape(...).contiguous()` and out_proj; q / k / v are locals
// until it returns. Eager's weights: 4.57.6 sets them to None before
// returning (output_attentions off); 5.24.0 returns them into the layer's `_`.
Var ClipAttention(Tape& tape, const ClipLayerParams& l, const TrainingSetup& setup,
                  const AttnPlan& plan, const ClipTowerDims& d, bool causal, const Var* mask,
                  const Var& n1, Var* probs) {
  const bool v5 = setup.transformers_version >= 500;
  Var q = Linear(tape, n1, *l.q, l.q_b, d.t, d.h);
  Var k = Linear(tape, n1, *l.k, l.k_b, d.t, d.h);
  Var v = Linear(tape, n1, *l.v, l.v_b, d.t, d.h);
  AttnShape shape{d.b, d.s, d.heads, d.heads, d.h / d.heads};
  shape.causal = causal;
  // 4.57.6's fp32 [s, s] mask, expanded over the batch, into SDPA under
  // autocast: scaled_dot_product_attention is on autocast's lower-precision
  // list, so the mask is cast to a dense [b, 1, s, s] copy, which the
  // kernel's backward keeps (seen in the torch 2.13 CPU trace).
  Var cast_mask;
  const bool sdpa = plan.kernel != AttnKernel::kMath;
  if (sdpa && mask && tape.autocast && mask->elem_bytes != tape.compute_bytes) {
    cast_mask =
        tape.New(d.b * d.s * d.s, tape.compute_bytes, Category::kTemporaries, "aten::_to_copy");
    mask = &cast_mask;
  }
  Var weights;
  Var ctx = Attend(tape, plan, shape, q, k, v, mask, d.attention_dropout,
                   plan.kernel == AttnKernel::kMath ? &weights : nullptr);
  if (cast_mask.t != kNoTensor) tape.Drop(cast_mask);
  Var o = Linear(tape, ctx, *l.o, l.o_b, d.t, d.h);
  tape.Drop(ctx);
  for (Var* x : {&q, &k, &v}) tape.Drop(*x);
  if (weights.t != kNoTensor) {
    if (v5) {
      *probs = weights;
    } else {
      tape.Drop(weights);
    }
  }
  return o;
}

// CLIPMLP.forward: fc1, the activation (fc1's output goes as it is rebound),
// fc2 (the activation goes as it is rebound).
Var ClipMlp(Tape& tape, const ClipLayerParams& l, const ClipTowerDims& d, const Var& n2) {
  Var up = Linear(tape, n2, *l.fc1, l.fc1_b, d.t, d.inter);
  Var act = MlpActivation(tape, d.act, up);
  tape.Drop(up);
  Var down = Linear(tape, act, *l.fc2, l.fc2_b, d.t, d.h);
  tape.Drop(act);
  return down;
}

// One CLIPEncoderLayer (a GradientCheckpointingLayer): layer_norm1, attention,
// the residual; layer_norm2, the MLP, the residual. Each `hidden_states` is
// rebound as it goes, so layer_norm1's output lives until the attention
// returns and layer_norm2's until the MLP returns; 5.24.0's `_` keeps eager's
// weights until the layer returns. The checkpointed call keeps the layer's
// input (and the mask it is passed).
Var ClipEncoderLayer(Tape& tape, const ClipLayerParams& l, const TrainingSetup& setup,
                     const AttnPlan& plan, const ClipTowerDims& d, bool causal, const Var* mask,
                     const Var& x) {
  const bool ckpt = setup.grad_ckpt != GradCkpt::kNone && tape.grad_enabled;
  if (ckpt) {
    tape.graph.BeginCheckpoint(setup.grad_ckpt == GradCkpt::kReentrant);
    tape.graph.Keep(x.t);
    if (mask) tape.graph.Keep(mask->t);
  }
  Var n1 = LayerNorm(tape, x, *l.ln1, l.ln1_b, d.t);
  Var probs;
  Var attn = ClipAttention(tape, l, setup, plan, d, causal, mask, n1, &probs);
  tape.Drop(n1);
  Var mid = Add(tape, x, attn);
  tape.Drop(attn);
  Var n2 = LayerNorm(tape, mid, *l.ln2, l.ln2_b, d.t);
  Var mlp = ClipMlp(tape, l, d, n2);
  tape.Drop(n2);
  Var y = Add(tape, mid, mlp);
  tape.Drop(mlp);
  tape.Drop(mid);
  if (probs.t != kNoTensor) tape.Drop(probs);
  if (ckpt) tape.graph.EndCheckpoint();
  return y;
}

// CLIPEncoder.forward: the layers in turn. `keep_penultimate`: with
// output_hidden_states the encoder collects every layer's input and the last
// output (all_hidden_states); only hidden_states[-2] is handed on, so the
// others are modelled as released when the forward returns: their bytes are
// held until then.
Var ClipRunEncoder(Tape& tape, const std::vector<ClipLayerParams>& layers,
                   const std::string& prefix, const TrainingSetup& setup, const AttnPlan& plan,
                   const ClipTowerDims& d, bool causal, const Var* mask, Var x,
                   std::vector<Var>* all_hidden) {
  for (size_t i = 0; i < layers.size(); ++i) {
    tape.SetModule(fmt::format("{}encoder.layers.{}", prefix, i));
    Var y = ClipEncoderLayer(tape, layers[i], setup, plan, d, causal, mask, x);
    if (all_hidden) {
      all_hidden->push_back(x);
    } else {
      tape.Drop(x);
    }
    x = y;
  }
  return x;
}

AttnPlan ClipTowerPlan(Tape& tape, const TrainingSetup& setup, const ClipTowerDims& d,
                       uint8_t x_bytes, bool mask) {
  AttnPlan plan = PlanAttention(setup, tape.autocast ? tape.compute_bytes : x_bytes, d.heads,
                                d.heads, /*sliding_window_mask=*/mask, d.attention_dropout);
  // SDPA's backward keeps the float mask it was given (4.57.6's text tower).
  plan.save_float_mask = mask;
  return plan;
}

// The text tower's causal mask. 4.57.6 (`_create_4d_causal_attention_mask`,
// modeling_attn_mask_utils.py) builds an [s, s] fp32 table with full, arange,
// `<` and masked_fill_, cast to the embeddings' dtype and expanded over the
// batch as a view, for eager and SDPA alike. 5.24.0's create_causal_mask
// (masking_utils.py) returns None for SDPA (is_causal) and a float
// [b, 1, s, s] mask for eager.
Var ClipTextMask(Tape& tape, const TrainingSetup& setup, uint64_t b, uint64_t s, uint8_t bytes) {
  if (setup.transformers_version >= 500) {
    if (setup.attn != Attention::kEager) return Var{};
    return tape.New(b * s * s, bytes, Category::kOther, "causal_mask");
  }
  Var full = tape.New(s * s, kF32, Category::kOther, "aten::full");
  Var cond = tape.New(s, kI64, Category::kTemporaries, "aten::arange");
  Var plus = tape.New(s, kI64, Category::kTemporaries, "aten::add");
  Var lt = tape.New(s * s, kBool, Category::kTemporaries, "aten::lt");
  tape.Drop(plus);
  tape.Drop(lt);  // masked_fill_ is in place
  Var mask = Cast(tape, full, bytes);
  tape.Drop(full);
  tape.Drop(cond);
  return mask;
}

// CLIPTextEmbeddings.forward: token_embedding(input_ids) + position_embedding(
// position_ids), the position ids a slice of the registered buffer. Under
// PEFT with checkpointing the token embedding's output is made to require grad
// (5.24.0: get_input_embeddings() is the token embedding).
Var ClipTextEmbeddings(Tape& tape, ClipParams& cp, const TrainingSetup& setup,
                       const ClipTowerDims& d, const Var& ids) {
  Var tok = Embedding(tape, ids, *cp.token, d.t, d.h);
  if (tape.grad_enabled && InputsRequireGrad(setup)) tok = RequireInputGrad(tape, tok);
  Var pos_ids;  // a view of the position_ids buffer: no new storage
  Var pos = Embedding(tape, pos_ids, *cp.text_pos, d.s, d.h);
  Var x = Add(tape, tok, pos);
  tape.Drop(tok);
  tape.Drop(pos);
  return x;
}

// The EOS token's state: last_hidden_state[arange(b), ids.to(int).argmax(-1)]
// (eos_token_id 2, the configs written before PR #24773) or
// `(ids.to(int) == eos).int().argmax(-1)`. IndexBackward0 keeps both index
// tensors and scatters into a zero gradient of the whole last hidden state.
Var ClipPoolEos(Tape& tape, const ClipSpec& c, const ClipTowerDims& d, const Var& last) {
  Var as_int = tape.New(d.t, 4, Category::kTemporaries, "aten::_to_copy");
  Var picked;
  if (c.eos_token_id == 2) {
    picked = tape.New(d.b, kI64, Category::kTemporaries, "aten::argmax");
  } else {
    Var eq = tape.New(d.t, kBool, Category::kTemporaries, "aten::eq");
    Var ints = tape.New(d.t, 4, Category::kTemporaries, "aten::_to_copy");
    tape.Drop(eq);
    picked = tape.New(d.b, kI64, Category::kTemporaries, "aten::argmax");
    tape.Drop(ints);
  }
  tape.Drop(as_int);
  Var rows = tape.New(d.b, kI64, Category::kTemporaries, "aten::arange");
  // The arange is evaluated first in the subscript; the order of two tiny
  // index tensors does not move a peak.
  Var pooled = tape.New(d.b * d.h, last.elem_bytes, Category::kTemporaries, "aten::index");
  if (tape.grad_enabled && last.requires_grad()) {
    NodeId n = tape.Node("IndexBackward0", &pooled);
    tape.graph.Save(n, rows.t);
    tape.graph.Save(n, picked.t);
    tape.graph.Edge(n, last, last.bytes());
  }
  tape.Drop(rows);
  tape.Drop(picked);
  return pooled;
}

}  // namespace

ClipTextOut ClipTextForward(Tape& tape, const ModelSpec& spec, ClipParams& cp,
                            const TrainingSetup& setup, uint64_t batch, const Var& ids,
                            bool penultimate) {
  const ClipSpec& c = spec.clip;
  const std::string prefix = ClipTextPrefix(c);
  const ClipTowerDims d = ClipDimsOf(c.text, batch, ClipTextLen(spec, setup));
  tape.SetModule(prefix + "embeddings");
  Var x = ClipTextEmbeddings(tape, cp, setup, d, ids);
  Var mask = ClipTextMask(tape, setup, d.b, d.s, x.elem_bytes);
  const Var* mask_p = mask.t != kNoTensor ? &mask : nullptr;
  const AttnPlan plan = ClipTowerPlan(tape, setup, d, x.elem_bytes, mask_p != nullptr);
  std::vector<Var> all_hidden;
  // CLIPTextModel.forward's `hidden_states` (the encoder's inputs_embeds)
  // keeps the embeddings' output until the tower returns.
  Var embeddings = tape.Share(x);
  Var last = ClipRunEncoder(tape, cp.text_layers, prefix, setup, plan, d, /*causal=*/true, mask_p,
                            x, penultimate ? &all_hidden : nullptr);
  tape.SetModule(prefix + "final_layer_norm");
  ClipTextOut out;
  out.last_hidden = LayerNorm(tape, last, *cp.final_norm, cp.final_norm_b, d.t);
  if (penultimate && !all_hidden.empty()) {
    out.penultimate = all_hidden.back();
    all_hidden.pop_back();
  }
  tape.SetModule(prefix + "pooler");
  Var pooled = ClipPoolEos(tape, c, d, out.last_hidden);
  // The forward returns: encoder_outputs (the last layer's output), the
  // mask and the other collected hidden states go.
  tape.Drop(last);
  tape.Drop(embeddings);
  for (Var& h : all_hidden) tape.Drop(h);
  if (mask.t != kNoTensor) tape.Drop(mask);
  out.pooled = pooled;
  return out;
}

ClipBatch MakeClipBatch(Tape& tape, const ModelSpec& spec, const TrainingSetup& setup) {
  const ClipSpec& c = spec.clip;
  tape.SetModule("batch");
  ClipBatch batch;
  batch.input_ids =
      tape.New(setup.batch * ClipTextLen(spec, setup), kI64, Category::kOther, "input_ids");
  batch.pixels = tape.New(setup.batch * c.num_channels * c.image_size * c.image_size, kF32,
                          Category::kOther, "pixel_values");
  return batch;
}

namespace {

// CLIPVisionEmbeddings.forward: pixel_values.to(the patch embedding's dtype)
// (a copy under 16-bit weights), the bias-free Conv2d (flattened and
// transposed as a view, the local `patch_embeds` kept until it returns),
// torch.cat with the expanded class embedding (the wider dtype: the fp32
// class embedding's under autocast), `+ position_embedding(position_ids)`.
// Under PEFT with checkpointing (5.24.0) the patch embedding's output is made
// to require grad too: PEFT hooks every input embedding it finds.
Var ClipVisionEmbeddings(Tape& tape, const ClipSpec& c, ClipParams& cp, const TrainingSetup& setup,
                         const ClipTowerDims& d, const Var& pixels) {
  Var px = Cast(tape, pixels, cp.patch->elem_bytes);
  Var patches = Conv2d(tape, px, *cp.patch, nullptr, d.b * c.Patches() * d.h);
  tape.Drop(px);
  if (tape.grad_enabled && InputsRequireGrad(setup)) patches = RequireInputGrad(tape, patches);
  const uint8_t cat_bytes = std::max(patches.elem_bytes, cp.cls->elem_bytes);
  Var joined = tape.New(d.t * d.h, cat_bytes, Category::kTemporaries, "aten::cat");
  if (tape.grad_enabled && (patches.requires_grad() || cp.cls->var.requires_grad())) {
    NodeId n = tape.Node("CatBackward0", &joined);
    // ExpandBackward0 sums the class embedding's slice over the batch.
    tape.graph.Edge(n, cp.cls->var, cp.cls->numel * cp.cls->elem_bytes);
    tape.graph.EdgeSlice(n, patches, patches.bytes());
  }
  Var pos_ids;  // the position_ids buffer
  Var pos = Embedding(tape, pos_ids, *cp.vision_pos, d.s, d.h);
  Var x = Add(tape, joined, pos);
  tape.Drop(joined);
  tape.Drop(pos);
  tape.Drop(patches);
  return x;
}

// What a vision tower returns: the last hidden state and post_layernorm's
// output of the class token.
struct ClipVisionOut {
  Var last_hidden, pooled;
};

// CLIPVisionModel.forward: embeddings, pre_layrnorm, the encoder,
// `last_hidden_state[:, 0, :]` (a view post_layernorm saves: SelectBackward0
// makes a zero gradient of the whole output) and post_layernorm, which copies
// the strided rows to a contiguous buffer inside the kernel.
ClipVisionOut ClipVisionForward(Tape& tape, const ModelSpec& spec, ClipParams& cp,
                                const TrainingSetup& setup, const Var& pixels) {
  const ClipSpec& c = spec.clip;
  const std::string prefix = ClipVisionPrefix(c);
  const ClipTowerDims d = ClipDimsOf(c.vision, setup.batch, c.Patches() + 1);
  tape.SetModule(prefix + "embeddings");
  Var e = ClipVisionEmbeddings(tape, c, cp, setup, d, pixels);
  tape.SetModule(prefix + "pre_layrnorm");
  Var x = LayerNorm(tape, e, *cp.pre_norm, cp.pre_norm_b, d.t);
  tape.Drop(e);
  const AttnPlan plan = ClipTowerPlan(tape, setup, d, x.elem_bytes, false);
  // CLIPVisionModel.forward's `hidden_states` keeps pre_layrnorm's output
  // until the tower returns.
  Var encoder_input = tape.Share(x);
  Var last = ClipRunEncoder(tape, cp.vision_layers, prefix, setup, plan, d, /*causal=*/false,
                            nullptr, x, nullptr);
  tape.SetModule(prefix + "post_layernorm");
  Var first = tape.Share(last);
  first.numel = d.b * d.h;
  if (tape.grad_enabled && last.requires_grad()) {
    NodeId n = tape.Node("SelectBackward0", &first);
    tape.graph.Edge(n, last, last.bytes());
  }
  Var rows = tape.New(d.b * d.h, first.elem_bytes, Category::kTemporaries, "aten::contiguous");
  Var pooled = LayerNorm(tape, first, *cp.post_norm, cp.post_norm_b, d.b);
  tape.Drop(rows);
  tape.Drop(first);
  tape.Drop(encoder_input);
  return ClipVisionOut{last, pooled};
}

// _get_vector_norm (torch.pow(x, 2), sum(-1, keepdim=True), pow(0.5)) and
// `x / norm`: PowBackward0 saves its input, DivBackward0 both operands. CUDA
// autocast runs pow in fp32 (a saved fp32 copy of x; the division then
// promotes to fp32); CPU autocast leaves it in x's dtype.
Var ClipNormalize(Tape& tape, const Var& x, uint64_t rows) {
  const bool fp32_pow = tape.autocast && !tape.cpu_rules;
  Var xin = fp32_pow ? Cast(tape, x, kF32) : tape.Share(x);
  Var sq = tape.New(x.numel, xin.elem_bytes, Category::kTemporaries, "aten::pow");
  if (tape.grad_enabled && xin.requires_grad()) {
    NodeId n = tape.Node("PowBackward0", &sq);
    tape.graph.Save(n, xin.t);
    tape.graph.Edge(n, xin, xin.bytes());
  }
  tape.Drop(xin);
  Var sum = tape.New(rows, sq.elem_bytes, Category::kTemporaries, "aten::sum");
  if (tape.grad_enabled && sq.requires_grad()) {
    NodeId n = tape.Node("SumBackward1", &sum);
    tape.graph.Edge(n, sq, sq.bytes());
  }
  tape.Drop(sq);
  Var norm = tape.New(rows, sum.elem_bytes, Category::kTemporaries, "aten::pow");
  if (tape.grad_enabled && sum.requires_grad()) {
    NodeId n = tape.Node("PowBackward0", &norm);
    tape.graph.Save(n, sum.t);
    tape.graph.Edge(n, sum, sum.bytes());
  }
  tape.Drop(sum);
  const uint8_t bytes = std::max(x.elem_bytes, norm.elem_bytes);
  Var out = tape.New(x.numel, bytes, Category::kTemporaries, "aten::div");
  if (tape.grad_enabled && (x.requires_grad() || norm.requires_grad())) {
    NodeId n = tape.Node("DivBackward0", &out);
    tape.graph.Save(n, x.t);
    tape.graph.Save(n, norm.t);
    tape.graph.Edge(n, x, x.bytes());
    tape.graph.Edge(n, norm, norm.bytes());
  }
  tape.Drop(norm);
  return out;
}

// F.cross_entropy(logits, arange(b)) over [b, b] logits (fp32 log-softmax
// under autocast, as a classification head's).
Var ClipContrastiveLoss(Tape& tape, const Var& logits, uint64_t b) {
  Var labels = tape.New(b, kI64, Category::kTemporaries, "aten::arange");
  Var loss;
  if (tape.autocast && !tape.cpu_rules) {
    loss = CrossEntropyLossHalfCudaAutocast(tape, logits);
  } else {
    Var l32 = tape.autocast ? Cast(tape, logits, kF32) : tape.Share(logits);
    loss = CrossEntropyLoss(tape, l32);
    tape.Drop(l32);
  }
  tape.Drop(labels);
  return loss;
}

// A 0-d op over one or two 0-d fp32 losses (their sum, its halving).
Var ClipScalarOp(Tape& tape, const Var& a, const Var* b, std::string_view op) {
  Var out = tape.New(1, kF32, Category::kLoss, op);
  if (tape.grad_enabled && (a.requires_grad() || (b && b->requires_grad()))) {
    NodeId n = tape.Node(b ? "AddBackward0" : "DivBackward0", &out);
    tape.graph.EdgePass(n, a);
    if (b) tape.graph.EdgePass(n, *b);
  }
  return out;
}

// The head of CLIPModel.forward: normalized embeddings, `matmul(text,
// image.t())`, `* logit_scale.exp()` (MulBackward0 saves both operands), and
// image_text_contrastive_loss: (cross_entropy(logits) + cross_entropy(
// logits.t())) / 2.
Var ClipContrastiveHead(Tape& tape, ClipParams& cp, uint64_t b, const Var& image_proj,
                        const Var& text_proj) {
  tape.SetModule("clip");
  Var image = ClipNormalize(tape, image_proj, b);
  Var text = ClipNormalize(tape, text_proj, b);
  Var t_in = tape.autocast ? Cast(tape, text, tape.compute_bytes) : tape.Share(text);
  Var i_in = tape.autocast ? Cast(tape, image, tape.compute_bytes) : tape.Share(image);
  Var sim = tape.New(b * b, t_in.elem_bytes, Category::kTemporaries, "aten::mm");
  if (tape.grad_enabled && (t_in.requires_grad() || i_in.requires_grad())) {
    NodeId n = tape.Node("MmBackward0", &sim);
    tape.graph.Save(n, t_in.t);
    tape.graph.Save(n, i_in.t);
    tape.graph.Edge(n, t_in, t_in.bytes());
    tape.graph.Edge(n, i_in, i_in.bytes());
  }
  tape.Drop(t_in);
  tape.Drop(i_in);
  Param& scale = *cp.logit_scale;
  Var exp = tape.New(1, scale.elem_bytes, Category::kTemporaries, "aten::exp");
  if (tape.grad_enabled && scale.var.requires_grad()) {
    NodeId n = tape.Node("ExpBackward0", &exp);
    tape.graph.Save(n, exp.t);
    tape.graph.Edge(n, scale.var, scale.numel * scale.elem_bytes);
  }
  Var logits = tape.New(b * b, sim.elem_bytes, Category::kTemporaries, "aten::mul");
  if (tape.grad_enabled && (sim.requires_grad() || exp.requires_grad())) {
    NodeId n = tape.Node("MulBackward0", &logits);
    if (exp.requires_grad()) tape.graph.Save(n, sim.t);
    tape.graph.Save(n, exp.t);
    tape.graph.Edge(n, sim, sim.bytes());
    if (exp.requires_grad()) tape.graph.Edge(n, exp, exp.bytes());
  }
  tape.Drop(sim);
  tape.Drop(exp);
  Var caption = ClipContrastiveLoss(tape, logits, b);
  Var image_loss = ClipContrastiveLoss(tape, logits, b);
  Var sum = ClipScalarOp(tape, caption, &image_loss, "aten::add");
  tape.Drop(caption);
  tape.Drop(image_loss);
  Var loss = ClipScalarOp(tape, sum, nullptr, "aten::div");
  tape.Drop(sum);
  // The output keeps logits and the normalized embeddings until it is dropped.
  tape.Drop(logits);
  tape.Drop(image);
  tape.Drop(text);
  return loss;
}

}  // namespace

// CLIPModel.forward (5.24.0): get_image_features (the vision tower, then
// visual_projection, which replaces pooler_output), get_text_features (the
// same for text), the head. 4.57.6 runs both towers first and projects after,
// so both pooled states live to the end of the forward.
ForwardOut ClipForward(Tape& tape, const ModelSpec& spec, ClipParams& cp,
                       const TrainingSetup& setup, const ClipBatch& batch) {
  const ClipSpec& c = spec.clip;
  const uint64_t b = setup.batch;
  const bool v5 = setup.transformers_version >= 500;
  ClipVisionOut vision = ClipVisionForward(tape, spec, cp, setup, batch.pixels);
  Var image_proj;
  auto project_image = [&] {
    tape.SetModule("visual_projection");
    image_proj = Linear(tape, vision.pooled, *cp.visual_proj, nullptr, b, c.projection_dim);
  };
  if (v5) {
    project_image();
    tape.Drop(vision.pooled);
  }
  ClipTextOut text = ClipTextForward(tape, spec, cp, setup, b, batch.input_ids, false);
  if (!v5) project_image();
  tape.SetModule("text_projection");
  Var text_proj = Linear(tape, text.pooled, *cp.text_proj, nullptr, b, c.projection_dim);
  if (v5) tape.Drop(text.pooled);
  Var loss = ClipContrastiveHead(tape, cp, b, image_proj, text_proj);
  // CLIPOutput goes when the loss is taken from it.
  for (Var* v : {&vision.last_hidden, &vision.pooled, &text.last_hidden, &text.pooled, &image_proj,
                 &text_proj}) {
    if (v->t != kNoTensor) tape.Drop(*v);
  }
  return ForwardOut{loss};
}

}  // namespace vramscope::lower
