#include "encoder.h"
#include "param_roles.h"

#include <string>
#include <unordered_map>

#include <fmt/format.h>

#include "attention.h"
#include "loss.h"
#include "ops.h"
#include "unet_ops.h"

namespace vramscope::lower {
namespace {

bool Has(const std::string& s, std::string_view part) { return s.find(part) != std::string::npos; }

// dense -> dropout -> LayerNorm(x + residual): BertSelfOutput and BertOutput.
Var DenseDropoutAddNorm(Tape& tape, const Var& x, Param* w, Param* b, const Var& residual,
                        Param* norm, Param* norm_b, uint64_t tokens, uint64_t hidden,
                        double dropout) {
  Var dense = Linear(tape, x, *w, b, tokens, hidden);
  Var dropped = Dropout(tape, dense, dropout);
  tape.Drop(dense);
  Var sum = Add(tape, dropped, residual);
  // `hidden_states = self.LayerNorm(hidden_states + input_tensor)` (BertSelfOutput,
  // BertOutput, 4.57.6 / 5.24.0): the dropout's output is overwritten only
  // once the norm has run.
  Var out = LayerNorm(tape, sum, *norm, norm_b, tokens);
  tape.Drop(sum);
  tape.Drop(dropped);
  return out;
}

}  // namespace

Result<EncoderParams> IndexEncoderParams(const ModelSpec& spec, std::vector<Param>& params) {
  EncoderParams ep;
  ep.layers.resize(spec.num_layers);
  // Biases follow their weight; cls.predictions.bias has no weight beside it
  // (it is the decoder's bias) and keeps kBias.
  const std::vector<ParamRole> roles = WeightRoles(spec.params);
  for (size_t i = 0; i < spec.params.size(); ++i) {
    const ParamTensor& pt = spec.params[i];
    Param* p = &params[i];
    const bool bias = pt.name.ends_with(".bias");
    auto set = [&](Param*& w, Param*& b) { (bias ? b : w) = p; };
    const ParamRole r = roles[i];
    if (pt.layer >= 0 && static_cast<uint64_t>(pt.layer) < spec.num_layers) {
      EncoderParams::Layer& l = ep.layers[pt.layer];
      if (r == ParamRole::kQ)
        set(l.q, l.q_b);
      else if (r == ParamRole::kK)
        set(l.k, l.k_b);
      else if (r == ParamRole::kV)
        set(l.v, l.v_b);
      else if (r == ParamRole::kO)
        set(l.o, l.o_b);
      else if (r == ParamRole::kUp)
        set(l.up, l.up_b);
      else if (r == ParamRole::kDown)
        set(l.down, l.down_b);
      else if (r == ParamRole::kNorm && Has(pt.module, "attention.output"))
        set(l.attn_norm, l.attn_norm_b);
      else if (r == ParamRole::kNorm)
        set(l.out_norm, l.out_norm_b);
      continue;
    }
    Param* none = nullptr;
    const bool classifies = spec.num_labels > 0;
    if (classifies && r == ParamRole::kHeadDense)
      set(ep.pooler, ep.pooler_b);
    else if (classifies && r == ParamRole::kLmHead)
      set(ep.classifier, ep.classifier_b);
    else if (r == ParamRole::kEmbed)
      ep.word = p;
    else if (r == ParamRole::kPosEmbed)
      ep.pos = p;
    else if (r == ParamRole::kTypeEmbed)
      ep.type = p;
    else if (r == ParamRole::kNorm && Has(pt.module, "embeddings"))
      set(ep.embed_norm, ep.embed_norm_b);
    else if (r == ParamRole::kNorm)
      set(ep.head_norm, ep.head_norm_b);
    else if (r == ParamRole::kHeadDense)
      set(ep.head_dense, ep.head_dense_b);
    else if (r == ParamRole::kLmHead)
      set(ep.decoder, none);
    else if (r == ParamRole::kBias)
      ep.decoder_b = p;
  }
  if (spec.num_labels > 0) {
    if (!ep.word || !ep.pos || !ep.embed_norm || !ep.classifier ||
        (!spec.token_classification && !ep.pooler)) {
      return MakeError(fmt::format(
          "{}: could not find the embeddings, pooler and classifier in its parameter list",
          spec.name));
    }
  } else if (!ep.decoder) {
    ep.decoder = ep.word;  // tie_word_embeddings
  }
  if (spec.num_labels == 0 &&
      (!ep.word || !ep.pos || !ep.embed_norm || !ep.head_dense || !ep.head_norm)) {
    return MakeError(fmt::format(
        "{}: could not find the embeddings and MLM head in its parameter list", spec.name));
  }
  for (size_t i = 0; i < ep.layers.size(); ++i) {
    const EncoderParams::Layer& l = ep.layers[i];
    if (!l.q || !l.k || !l.v || !l.o || !l.attn_norm || !l.up || !l.down || !l.out_norm) {
      return MakeError(fmt::format("{}: encoder layer {} lacks attention, MLP or norm parameters",
                                   spec.name, i));
    }
  }
  return ep;
}

namespace {

// BertEmbeddings.forward: word + token_type (the registered all-zero
// token_type_ids buffer, expanded) ; `embeddings += position_embeddings`
// in place; LayerNorm; dropout. Returns the embeddings' output [t, h].
Var EmbeddingsForward(Tape& tape, const ModelSpec& spec, const EncoderParams& ep,
                      const TrainingSetup& setup, const Var& ids) {
  const uint64_t s = setup.seq, t = setup.batch * s, h = spec.hidden_size;
  tape.SetModule("bert.embeddings");
  Var x = Embedding(tape, ids, *ep.word, t, h);
  if (InputsRequireGrad(setup)) x = RequireInputGrad(tape, x);
  if (ep.type) {
    Var tt = Embedding(tape, ids, *ep.type, t, h);
    Var sum = Add(tape, x, tt);
    tape.Drop(x);
    tape.Drop(tt);
    x = sum;
  }
  // position_ids [1, s]: one row per position, broadcast over the batch.
  Var pos_ids = tape.New(s, kI64, Category::kOther, "position_ids");
  Var pos = Embedding(tape, pos_ids, *ep.pos, s, h);
  tape.Drop(pos_ids);
  if (tape.grad_enabled && (x.requires_grad() || pos.requires_grad())) {
    // In place: x keeps its storage and gets AddBackward0 as its grad_fn.
    Var y = tape.Share(x);
    NodeId n = tape.Node("AddBackward0", &y);
    tape.graph.Edge(n, x, x.bytes());
    tape.graph.Edge(n, pos, x.bytes());
    tape.Drop(x);
    x = y;
  }
  tape.Drop(pos);
  Var normed = LayerNorm(tape, x, *ep.embed_norm, ep.embed_norm_b, t);
  tape.Drop(x);
  x = Dropout(tape, normed, spec.hidden_dropout);
  tape.Drop(normed);
  return x;
}

// BertModel with attn_implementation="sdpa" and no attention mask:
// _prepare_4d_attention_mask_for_sdpa returns None for an all-ones mask, so
// SDPA runs without a mask (flash or memory-efficient kernel); eager
// materialises the scores. Not causal.
AttnPlan PlanBertAttention(const Tape& tape, const ModelSpec& spec, const TrainingSetup& setup,
                           uint8_t elem_bytes) {
  const uint64_t heads = spec.num_heads;
  AttnPlan plan = PlanAttention(setup, tape.autocast ? tape.compute_bytes : elem_bytes, heads,
                                heads, /*sliding_window_mask=*/false, spec.attention_dropout);
  plan.fp32_softmax = false;  // BertSelfAttention: softmax(attention_scores, dim=-1), no dtype
  return plan;
}

// The masks BertModel.forward (transformers 4.x) keeps as locals until it
// returns; kNoTensor where it makes none.
struct BertMasks {
  Var ones;      // the default all-ones attention_mask
  Var ext_mask;  // eager's extended mask, added to every layer's scores
};

// transformers 4.x BertModel.forward (read in 4.57.6): `attention_mask =
// torch.ones((batch_size, seq_length), device=device)` (fp32) when the batch
// has none, a local until it returns; SDPA's _prepare_4d_attention_mask_for_sdpa
// checks torch.all(mask == 1) and returns None; eager's
// get_extended_attention_mask (modeling_utils.py) makes
// (1.0 - mask[:, None, None, :].to(self.dtype)) * finfo.min, [b, 1, 1, s],
// added to every layer's scores by BertSelfAttention's own eager code
// (legacy_bert). transformers 5.x builds no mask for an unpadded batch.
// `dtype` is BertModel.dtype: the parameters' dtype. Sets plan.legacy_bert
// for eager attention.
BertMasks LegacyBertMasks(Tape& tape, const TrainingSetup& setup, uint8_t dtype, AttnPlan& plan) {
  const uint64_t b = setup.batch, s = setup.seq;
  BertMasks masks;
  tape.SetModule("bert");
  if (!setup.attention_mask)
    masks.ones = tape.New(b * s, kF32, Category::kTemporaries, "aten::ones");
  const uint8_t mask_bytes = setup.attention_mask ? kI64 : kF32;
  if (plan.kernel == AttnKernel::kMath) {
    plan.legacy_bert = true;
    Var cast;
    if (dtype != mask_bytes)
      cast = tape.New(b * s, dtype, Category::kTemporaries, "aten::_to_copy");
    Var rsub = tape.New(b * s, dtype, Category::kTemporaries, "aten::rsub");
    if (cast.t != kNoTensor) tape.Drop(cast);
    masks.ext_mask = tape.New(b * s, dtype, Category::kActivations, "aten::mul");
    tape.Drop(rsub);
  } else {
    Var eq = tape.New(b * s, kBool, Category::kTemporaries, "aten::eq");
    Var all = tape.New(1, kBool, Category::kTemporaries, "aten::all");
    tape.Drop(eq);
    tape.Drop(all);
  }
  return masks;
}

// One BertLayer: self-attention, then the MLP, each closing with
// dense -> dropout -> LayerNorm(x + residual); in a checkpoint region when
// gradient checkpointing is on. `x` stays the caller's; `ext_mask` is null
// without one. `probs`, when given, receives eager attention's returned
// probabilities. Returns the layer's output.
Var BertLayerForward(Tape& tape, const ModelSpec& spec, const EncoderParams::Layer& l,
                     const TrainingSetup& setup, const AttnPlan& plan, const Var* ext_mask,
                     const Var& x, Var* probs) {
  const uint64_t t = setup.batch * setup.seq, h = spec.hidden_size;
  const uint64_t heads = spec.num_heads, dh = spec.head_dim ? spec.head_dim : h / heads;
  const bool ckpt = setup.grad_ckpt != GradCkpt::kNone;
  if (ckpt) {
    tape.graph.BeginCheckpoint(setup.grad_ckpt == GradCkpt::kReentrant);
    tape.graph.Keep(x.t);
    // The extended mask is an argument of the checkpointed call: reentrant
    // CheckpointFunction saves it, non-reentrant's recompute closure holds it.
    if (ext_mask) tape.graph.Keep(ext_mask->t);
  }
  Var q = Linear(tape, x, *l.q, l.q_b, t, h);
  Var k = Linear(tape, x, *l.k, l.k_b, t, h);
  Var v = Linear(tape, x, *l.v, l.v_b, t, h);
  AttnShape shape{setup.batch, setup.seq, heads, heads, dh};
  shape.causal = false;
  Var ctx = Attend(tape, plan, shape, q, k, v, ext_mask, spec.attention_dropout, probs);
  tape.Drop(q);
  tape.Drop(k);
  tape.Drop(v);
  Var attn = DenseDropoutAddNorm(tape, ctx, l.o, l.o_b, x, l.attn_norm, l.attn_norm_b, t, h,
                                 spec.hidden_dropout);
  tape.Drop(ctx);
  Var up = Linear(tape, attn, *l.up, l.up_b, t, spec.intermediate_size);
  Var act = MlpActivation(tape, spec.mlp, up);  // BertIntermediate: ACT2FN[hidden_act]
  tape.Drop(up);
  Var y = DenseDropoutAddNorm(tape, act, l.down, l.down_b, attn, l.out_norm, l.out_norm_b, t, h,
                              spec.hidden_dropout);
  tape.Drop(act);
  tape.Drop(attn);
  // Reentrant CheckpointFunction.backward gets zeros for the returned
  // probabilities no gradient reaches (materialize_grads, torch 2.x).
  if (ckpt && setup.grad_ckpt == GradCkpt::kReentrant && probs && probs->t != kNoTensor) {
    tape.graph.UngradedOutput(probs->bytes());
  }
  if (ckpt) tape.graph.EndCheckpoint();
  return y;
}

// BertEncoder.forward over every layer; takes over `x` (the embeddings'
// output) and returns the last hidden state.
Var BertEncoderForward(Tape& tape, const ModelSpec& spec, const EncoderParams& ep,
                       const TrainingSetup& setup, const AttnPlan& plan, const Var* ext_mask,
                       bool legacy, Var x) {
  // BertEncoder.forward (4.x): `layer_outputs = layer_module(...)` is
  // (layer_output, attention_probs) - BertLayer returns the self-attention's
  // outputs[1:], and eager BertSelfAttention always returns attention_probs
  // (SDPA's returns None) - so the previous layer's probabilities stay
  // referenced until the next layer returns, the last layer's until the
  // encoder returns (checked with weakrefs on the storage, 4.57.6). Without
  // checkpointing the second matmul saves them anyway.
  Var layer_outputs;
  for (uint64_t i = 0; i < spec.num_layers; ++i) {
    tape.SetModule("bert.encoder.layer." + std::to_string(i));
    Var probs;
    Var y = BertLayerForward(tape, spec, ep.layers[i], setup, plan, ext_mask, x,
                             legacy ? &probs : nullptr);
    tape.Drop(x);
    x = y;
    if (layer_outputs.t != kNoTensor) tape.Drop(layer_outputs);
    layer_outputs = probs;
  }
  if (layer_outputs.t != kNoTensor) tape.Drop(layer_outputs);  // BertEncoder returns
  return x;
}

// BertLMPredictionHead: transform (dense, gelu, LayerNorm), then the
// decoder (tied word embeddings) with its bias -> [t, vocab] scores, and the
// masked-LM loss over them. `x` (the last hidden state) stays the caller's.
Var MlmHeadLoss(Tape& tape, const ModelSpec& spec, const EncoderParams& ep,
                const TrainingSetup& setup, const Var& x) {
  const uint64_t t = setup.batch * setup.seq, h = spec.hidden_size;
  tape.SetModule("cls.predictions");
  Var dense = Linear(tape, x, *ep.head_dense, ep.head_dense_b, t, h);
  Var act =
      MlpActivation(tape, spec.mlp, dense);  // BertPredictionHeadTransform: ACT2FN[hidden_act]
  tape.Drop(dense);
  Var hn = LayerNorm(tape, act, *ep.head_norm, ep.head_norm_b, t);
  tape.Drop(act);
  Var scores = Linear(tape, hn, *ep.decoder, ep.decoder_b, t, spec.vocab_size);
  tape.Drop(hn);
  // BertForMaskedLM: CrossEntropyLoss()(scores.view(-1, vocab), labels.view(-1)),
  // no explicit upcast. Under CUDA autocast see CrossEntropyLossHalfCudaAutocast;
  // under CPU autocast log_softmax returns fp32 from the half scores (the CPU
  // fidelity traces), modelled as a cast first.
  // `prediction_scores` stays a local (and the returned logits) until the
  // forward returns.
  if (tape.autocast && !tape.cpu_rules) {
    Var loss = CrossEntropyLossHalfCudaAutocast(tape, scores);
    tape.Drop(scores);
    return loss;
  }
  Var logits = tape.autocast ? Cast(tape, scores, kF32) : tape.Share(scores);
  Var loss = CrossEntropyLoss(tape, logits);
  tape.Drop(logits);
  tape.Drop(scores);
  return loss;
}

// BertPooler.forward (4.57.6 / 5.24.0): dense(hidden_states[:, 0]), tanh. The
// first-token select is a view of the last hidden state, which the dense layer
// saves; its backward (SelectBackward0) makes a zero gradient of the whole
// [b, s, h] state and fills the first row. Runs inside BertModel.forward.
Var BertPooler(Tape& tape, const ModelSpec& spec, const EncoderParams& ep,
               const TrainingSetup& setup, const Var& x) {
  const uint64_t b = setup.batch, h = spec.hidden_size;
  tape.SetModule("bert.pooler");
  Var first = tape.Share(x);
  first.numel = b * h;
  if (tape.grad_enabled && x.requires_grad()) {
    NodeId n = tape.Node("SelectBackward0", &first);
    tape.graph.Edge(n, x, x.bytes());
  }
  Var dense;
  {
    FlatLinearInputs flat(tape);  // a 2-D input: its gradient is the mm's own output
    dense = Linear(tape, first, *ep.pooler, ep.pooler_b, b, h);
  }
  tape.Drop(first);
  Var pooled = UnaryOp(tape, dense, "aten::tanh", "TanhBackward0", /*save_result=*/true);
  tape.Drop(dense);
  return pooled;
}

// BertForSequenceClassification.forward after BertModel: dropout, classifier,
// then MSELoss()(logits.squeeze(), labels.squeeze()) for one label (float
// labels) or CrossEntropyLoss()(logits.view(-1, n), labels.view(-1)). Autocast
// runs mse_loss in fp32 (CUDA's and CPU's fp32 lists); cross-entropy as the MLM
// head's (MlmHeadLoss).
// BertForTokenClassification feeds it the whole [b, s, h] sequence output
// (a 3-D linear input: its gradient is a view) and takes cross-entropy over
// every token.
Var ClassifierLoss(Tape& tape, const ModelSpec& spec, const EncoderParams& ep,
                   const TrainingSetup& setup, const Var& pooled, const Var& labels) {
  const uint64_t rows = spec.token_classification ? setup.batch * setup.seq : setup.batch;
  tape.SetModule("dropout");
  Var dropped = Dropout(tape, pooled, spec.classifier_dropout);
  tape.SetModule("classifier");
  Var logits;
  if (spec.token_classification) {
    logits = Linear(tape, dropped, *ep.classifier, ep.classifier_b, rows, spec.num_labels);
  } else {
    FlatLinearInputs flat(tape);
    logits = Linear(tape, dropped, *ep.classifier, ep.classifier_b, rows, spec.num_labels);
  }
  tape.Drop(dropped);
  Var loss = ClassificationLoss(tape, logits, spec.num_labels, labels);
  tape.Drop(logits);
  return loss;
}

}  // namespace

ForwardOut EncoderForward(Tape& tape, const ModelSpec& spec, EncoderParams& ep,
                          const TrainingSetup& setup) {
  const uint64_t t = setup.batch * setup.seq;
  tape.SetModule("bert");
  Var ids = tape.New(t, kI64, Category::kOther, "input_ids");
  // Token labels for the MLM loss; one per sequence for classification (float
  // for regression).
  Var labels =
      spec.num_labels == 0 || spec.token_classification
          ? tape.New(t, kI64, Category::kOther, "labels")
          : tape.New(setup.batch, spec.num_labels == 1 ? kF32 : kI64, Category::kOther, "labels");
  Var x = EmbeddingsForward(tape, spec, ep, setup, ids);
  // BertModel.forward's local `embedding_output` holds the embeddings' output
  // until it returns, past the encoder (4.57.6 / 5.24.0 models/bert/
  // modeling_bert.py): under autocast (nothing saves the fp32 tensor itself)
  // it outlives layer 0.
  Var embedding_output = tape.Share(x);
  AttnPlan plan = PlanBertAttention(tape, spec, setup, x.elem_bytes);
  const bool legacy = setup.transformers_version < 500;
  BertMasks masks;
  if (legacy) masks = LegacyBertMasks(tape, setup, x.elem_bytes, plan);
  const Var* ext_mask = masks.ext_mask.t != kNoTensor ? &masks.ext_mask : nullptr;
  x = BertEncoderForward(tape, spec, ep, setup, plan, ext_mask, legacy, x);
  // `outputs` (the last hidden state and the pooler's output) lives until the
  // head's forward returns.
  const bool pools = spec.num_labels > 0 && !spec.token_classification;
  Var pooled = pools ? BertPooler(tape, spec, ep, setup, x) : Var{};
  // BertModel.forward returns: its locals go.
  tape.Drop(embedding_output);
  if (masks.ones.t != kNoTensor) tape.Drop(masks.ones);
  if (masks.ext_mask.t != kNoTensor) tape.Drop(masks.ext_mask);

  Var loss = pools                       ? ClassifierLoss(tape, spec, ep, setup, pooled, labels)
             : spec.token_classification ? ClassifierLoss(tape, spec, ep, setup, x, labels)
                                         : MlmHeadLoss(tape, spec, ep, setup, x);
  if (pooled.t != kNoTensor) tape.Drop(pooled);
  // BertForMaskedLM.forward: `outputs = self.bert(...)` holds the last hidden
  // state (sequence_output) until it returns, past the loss (4.57.6 / 5.24.0).
  tape.Drop(x);
  tape.Drop(ids);
  tape.Drop(labels);
  return ForwardOut{loss};
}

}  // namespace vramscope::lower
