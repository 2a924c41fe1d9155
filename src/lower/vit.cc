#include "vit.h"

#include <string>

#include <fmt/format.h>

#include "attention.h"
#include "loss.h"
#include "ops.h"
#include "unet_ops.h"

namespace vramscope::lower {
namespace {

// The slot of a layer parameter named `rest` (after "vit.layers.N.").
void PlaceLayerParam(VitParams::Layer& l, const std::string& rest, Param* p) {
  const std::pair<const char*, Param**> slots[] = {
      {"attention.q_proj.weight", &l.q},   {"attention.q_proj.bias", &l.q_b},
      {"attention.k_proj.weight", &l.k},   {"attention.k_proj.bias", &l.k_b},
      {"attention.v_proj.weight", &l.v},   {"attention.v_proj.bias", &l.v_b},
      {"attention.o_proj.weight", &l.o},   {"attention.o_proj.bias", &l.o_b},
      {"layernorm_before.weight", &l.ln1}, {"layernorm_before.bias", &l.ln1_b},
      {"layernorm_after.weight", &l.ln2},  {"layernorm_after.bias", &l.ln2_b},
      {"mlp.fc1.weight", &l.fc1},          {"mlp.fc1.bias", &l.fc1_b},
      {"mlp.fc2.weight", &l.fc2},          {"mlp.fc2.bias", &l.fc2_b}};
  for (const auto& [name, slot] : slots) {
    if (rest == name) *slot = p;
  }
}

}  // namespace

Result<VitParams> IndexVitParams(const ModelSpec& spec, std::vector<Param>& params) {
  VitParams vp;
  vp.layers.resize(spec.num_layers);
  const std::pair<const char*, Param**> top[] = {
      {"vit.embeddings.cls_token", &vp.cls},
      {"vit.embeddings.position_embeddings", &vp.pos},
      {"vit.embeddings.patch_embeddings.projection.weight", &vp.proj},
      {"vit.embeddings.patch_embeddings.projection.bias", &vp.proj_b},
      {"vit.layernorm.weight", &vp.norm},
      {"vit.layernorm.bias", &vp.norm_b},
      {"classifier.weight", &vp.classifier},
      {"classifier.bias", &vp.classifier_b}};
  for (size_t i = 0; i < spec.params.size(); ++i) {
    const ParamTensor& pt = spec.params[i];
    if (pt.layer >= 0 && static_cast<uint64_t>(pt.layer) < spec.num_layers) {
      const std::string prefix = fmt::format("vit.layers.{}.", pt.layer);
      if (pt.name.starts_with(prefix)) {
        PlaceLayerParam(vp.layers[pt.layer], pt.name.substr(prefix.size()), &params[i]);
      }
      continue;
    }
    for (const auto& [name, slot] : top) {
      if (pt.name == name) *slot = &params[i];
    }
  }
  if (!vp.cls || !vp.pos || !vp.proj || !vp.norm || !vp.classifier) {
    return MakeError(fmt::format(
        "{}: could not find the embeddings, final norm and classifier in its parameter list",
        spec.name));
  }
  for (size_t i = 0; i < vp.layers.size(); ++i) {
    const VitParams::Layer& l = vp.layers[i];
    if (!l.q || !l.k || !l.v || !l.o || !l.ln1 || !l.ln2 || !l.fc1 || !l.fc2) {
      return MakeError(
          fmt::format("{}: ViT layer {} lacks attention, MLP or norm parameters", spec.name, i));
    }
  }
  return vp;
}

namespace {

struct VitDims {
  uint64_t b, patches, s, t, h;
};

VitDims DimsOf(const ModelSpec& spec, const TrainingSetup& setup) {
  VitDims d;
  d.b = setup.batch;
  d.patches = spec.vit.Patches();
  d.s = d.patches + 1;
  d.t = d.b * d.s;
  d.h = spec.hidden_size;
  return d;
}

// ViTEmbeddings.forward: the patch projection (a Conv2d whose output is
// flattened and transposed as a view), torch.cat with the expanded class token
// (a new [b, s, h]; CatBackward0 hands each input a view of its gradient),
// `+ position_embeddings` (a new tensor), dropout. With PEFT and checkpointing
// the patch embeddings are get_input_embeddings(): their output is made to
// require grad (enable_input_require_grads).
Var Embeddings(Tape& tape, const ModelSpec& spec, const VitParams& vp, const TrainingSetup& setup,
               const VitDims& d, const Var& pixels) {
  tape.SetModule("vit.embeddings.patch_embeddings.projection");
  Var patches = Conv2d(tape, pixels, *vp.proj, vp.proj_b, d.b * d.patches * d.h);
  if (InputsRequireGrad(setup)) patches = RequireInputGrad(tape, patches);
  tape.SetModule("vit.embeddings");
  // cat promotes to the wider dtype: the class token's under autocast.
  const uint8_t cat_bytes = std::max(patches.elem_bytes, vp.cls->elem_bytes);
  Var joined = tape.New(d.t * d.h, cat_bytes, Category::kTemporaries, "aten::cat");
  if (tape.grad_enabled && (patches.requires_grad() || vp.cls->var.requires_grad())) {
    NodeId n = tape.Node("CatBackward0", &joined);
    tape.graph.EdgeSlice(n, patches, patches.bytes());
    // ExpandBackward0 sums the class token's slice over the batch.
    tape.graph.Edge(n, vp.cls->var, vp.cls->numel * vp.cls->elem_bytes);
  }
  tape.Drop(patches);
  Var with_pos = tape.New(d.t * d.h, cat_bytes, Category::kTemporaries, "aten::add");
  if (tape.grad_enabled && (joined.requires_grad() || vp.pos->var.requires_grad())) {
    NodeId n = tape.Node("AddBackward0", &with_pos);
    tape.graph.EdgePass(n, joined);
    // The position table's gradient: the incoming one summed over the batch.
    tape.graph.Edge(n, vp.pos->var, vp.pos->numel * vp.pos->elem_bytes);
  }
  tape.Drop(joined);
  Var out = Dropout(tape, with_pos, spec.hidden_dropout);
  tape.Drop(with_pos);
  return out;
}

// The attention block: q / k / v (4.57.6 computes k, v, q), the kernel, the
// output projection. 5.24.0's ViTAttention holds q / k / v until it returns,
// past o_proj; 4.57.6's ViTSelfAttention returns before ViTSelfOutput's dense.
// `probs` receives eager's returned probabilities.
Var AttentionBlock(Tape& tape, const ModelSpec& spec, const VitParams::Layer& l,
                   const TrainingSetup& setup, const AttnPlan& plan, const VitDims& d,
                   const Var& n1, Var* probs) {
  const uint64_t heads = spec.num_heads, dh = spec.head_dim ? spec.head_dim : d.h / heads;
  const bool v5 = setup.transformers_version >= 500;
  Var q, k, v;
  if (!v5) k = Linear(tape, n1, *l.k, l.k_b, d.t, d.h);
  if (!v5) v = Linear(tape, n1, *l.v, l.v_b, d.t, d.h);
  q = Linear(tape, n1, *l.q, l.q_b, d.t, d.h);
  if (v5) k = Linear(tape, n1, *l.k, l.k_b, d.t, d.h);
  if (v5) v = Linear(tape, n1, *l.v, l.v_b, d.t, d.h);
  AttnShape shape{d.b, d.s, heads, heads, dh};
  shape.causal = false;
  Var ctx = Attend(tape, plan, shape, q, k, v, nullptr, spec.attention_dropout,
                   plan.kernel == AttnKernel::kMath ? probs : nullptr);
  if (!v5) {
    for (Var* t : {&q, &k, &v}) tape.Drop(*t);
  }
  Var o = Linear(tape, ctx, *l.o, l.o_b, d.t, d.h);
  tape.Drop(ctx);
  if (v5) {
    for (Var* t : {&q, &k, &v}) tape.Drop(*t);
  }
  Var out = Dropout(tape, o, spec.hidden_dropout);
  tape.Drop(o);
  return out;
}

// fc1, the activation (fc1's output goes as it is rebound), fc2; 4.57.6
// (ViTIntermediate, then ViTOutput) releases the norm's output before fc2 and
// keeps the activation until ViTOutput returns; 5.24.0's ViTMLP the other way
// round. Returns fc2's output after dropout, added to `mid`.
Var MlpBlock(Tape& tape, const ModelSpec& spec, const VitParams::Layer& l,
             const TrainingSetup& setup, const VitDims& d, Var n2, const Var& mid) {
  const bool v5 = setup.transformers_version >= 500;
  Var up = Linear(tape, n2, *l.fc1, l.fc1_b, d.t, spec.intermediate_size);
  Var act = MlpActivation(tape, spec.mlp, up);
  tape.Drop(up);
  if (!v5) tape.Drop(n2);
  Var down = Linear(tape, act, *l.fc2, l.fc2_b, d.t, d.h);
  if (v5) {
    tape.Drop(act);
    tape.Drop(n2);
  }
  Var dropped = Dropout(tape, down, spec.hidden_dropout);
  tape.Drop(down);
  Var y = Add(tape, dropped, mid);
  tape.Drop(dropped);
  if (!v5) tape.Drop(act);
  return y;
}

// One ViTLayer (a GradientCheckpointingLayer): layernorm_before, attention,
// the residual; layernorm_after, the MLP, the residual. The locals: 4.57.6
// keeps layernorm_before's output and the attention's until the layer
// returns, 5.24.0 rebinds them as it goes. Eager's returned probabilities stay in `_`
// until the attention module (4.57.6) or the layer (5.24.0) returns.
Var Layer(Tape& tape, const ModelSpec& spec, const VitParams::Layer& l, const TrainingSetup& setup,
          const AttnPlan& plan, const VitDims& d, const Var& x) {
  const bool ckpt = setup.grad_ckpt != GradCkpt::kNone;
  const bool v5 = setup.transformers_version >= 500;
  if (ckpt) {
    tape.graph.BeginCheckpoint(setup.grad_ckpt == GradCkpt::kReentrant);
    tape.graph.Keep(x.t);
  }
  Var n1 = LayerNorm(tape, x, *l.ln1, l.ln1_b, d.t);
  Var probs;
  Var attn = AttentionBlock(tape, spec, l, setup, plan, d, n1, &probs);
  if (v5) tape.Drop(n1);
  if (!v5 && probs.t != kNoTensor) tape.Drop(probs);
  Var mid = Add(tape, attn, x);
  if (v5) tape.Drop(attn);
  Var n2 = LayerNorm(tape, mid, *l.ln2, l.ln2_b, d.t);
  Var y = MlpBlock(tape, spec, l, setup, d, n2, mid);
  tape.Drop(mid);
  if (!v5) {
    tape.Drop(attn);
    tape.Drop(n1);
  }
  // The layer returns its hidden states only (the probabilities are not an
  // output of the checkpointed call).
  if (probs.t != kNoTensor) tape.Drop(probs);
  if (ckpt) tape.graph.EndCheckpoint();
  return y;
}

// sequence_output[:, 0, :] (a view the classifier saves; SelectBackward0 makes
// a zero gradient of the whole output and fills the first row), the
// classifier, and transformers' loss for it (ForSequenceClassificationLoss:
// cross-entropy over labels, MSE for one).
Var Head(Tape& tape, const ModelSpec& spec, const VitParams& vp, const VitDims& d,
         const Var& sequence_output, const Var& labels) {
  tape.SetModule("classifier");
  Var first = tape.Share(sequence_output);
  first.numel = d.b * d.h;
  if (tape.grad_enabled && sequence_output.requires_grad()) {
    NodeId n = tape.Node("SelectBackward0", &first);
    tape.graph.Edge(n, sequence_output, sequence_output.bytes());
  }
  Var logits;
  {
    FlatLinearInputs flat(tape);
    logits = Linear(tape, first, *vp.classifier, vp.classifier_b, d.b, spec.num_labels);
  }
  tape.Drop(first);
  Var loss = ClassificationLoss(tape, logits, spec.num_labels, labels);
  tape.Drop(logits);
  return loss;
}

}  // namespace

VitBatch MakeVitBatch(Tape& tape, const ModelSpec& spec, const TrainingSetup& setup) {
  const uint64_t side = spec.vit.image_size;
  tape.SetModule("batch");
  VitBatch batch;
  batch.pixels = tape.New(setup.batch * spec.vit.num_channels * side * side, kF32, Category::kOther,
                          "pixel_values");
  batch.labels =
      tape.New(setup.batch, spec.num_labels == 1 ? kF32 : kI64, Category::kOther, "labels");
  return batch;
}

ForwardOut VitForward(Tape& tape, const ModelSpec& spec, VitParams& vp, const TrainingSetup& setup,
                      const VitBatch& batch) {
  const VitDims d = DimsOf(spec, setup);
  tape.SetModule("vit");
  // ViTModel.forward: pixel_values.to(the projection weight's dtype), a local
  // until it returns.
  Var px = Cast(tape, batch.pixels, vp.proj->elem_bytes);
  Var x = Embeddings(tape, spec, vp, setup, d, px);
  // `hidden_states = embedding_output`: the local keeps the embeddings alive
  // until ViTModel.forward returns.
  Var embedding_output = tape.Share(x);
  const uint64_t heads = spec.num_heads;
  AttnPlan plan = PlanAttention(setup, tape.autocast ? tape.compute_bytes : x.elem_bytes, heads,
                                heads, /*sliding_window_mask=*/false, spec.attention_dropout);
  for (uint64_t i = 0; i < spec.num_layers; ++i) {
    tape.SetModule("vit.layers." + std::to_string(i));
    Var y = Layer(tape, spec, vp.layers[i], setup, plan, d, x);
    tape.Drop(x);
    x = y;
  }
  tape.SetModule("vit.layernorm");
  Var sequence_output = LayerNorm(tape, x, *vp.norm, vp.norm_b, d.t);
  tape.Drop(x);
  tape.Drop(embedding_output);  // ViTModel.forward returns
  tape.Drop(px);
  Var loss = Head(tape, spec, vp, d, sequence_output, batch.labels);
  // `outputs` (the last hidden state) lives until the forward returns.
  tape.Drop(sequence_output);
  return ForwardOut{loss};
}

}  // namespace vramscope::lower
