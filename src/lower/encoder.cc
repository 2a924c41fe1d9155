#include "encoder.h"
#include "param_roles.h"

#include <string>
#include <unordered_map>

#include <fmt/format.h>

#include "attention.h"
#include "loss.h"
#include "ops.h"

namespace vramscope::lower {
namespace {

bool Has(const std::string& s, std::string_view part) { return s.find(part) != std::string::npos; }

// dense -> dropout -> LayerNorm(x + residual): BertSelfOutput and BertOutput.
Var DenseDropoutAddNorm(Tape& tape, const Var& x, Param* w, Param* b, const Var& residual,
                        Param* norm, Param* norm_b, uint64_t tokens, uint64_t hidden, double dropout) {
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
      if (r == ParamRole::kQ) set(l.q, l.q_b);
      else if (r == ParamRole::kK) set(l.k, l.k_b);
      else if (r == ParamRole::kV) set(l.v, l.v_b);
      else if (r == ParamRole::kO) set(l.o, l.o_b);
      else if (r == ParamRole::kUp) set(l.up, l.up_b);
      else if (r == ParamRole::kDown) set(l.down, l.down_b);
      else if (r == ParamRole::kNorm && Has(pt.module, "attention.output")) set(l.attn_norm, l.attn_norm_b);
      else if (r == ParamRole::kNorm) set(l.out_norm, l.out_norm_b);
      continue;
    }
    Param* none = nullptr;
    if (r == ParamRole::kEmbed) ep.word = p;
    else if (r == ParamRole::kPosEmbed) ep.pos = p;
    else if (r == ParamRole::kTypeEmbed) ep.type = p;
    else if (r == ParamRole::kNorm && Has(pt.module, "embeddings")) set(ep.embed_norm, ep.embed_norm_b);
    else if (r == ParamRole::kNorm) set(ep.head_norm, ep.head_norm_b);
    else if (r == ParamRole::kHeadDense) set(ep.head_dense, ep.head_dense_b);
    else if (r == ParamRole::kLmHead) set(ep.decoder, none);
    else if (r == ParamRole::kBias) ep.decoder_b = p;
  }
  if (!ep.decoder) ep.decoder = ep.word;  // tie_word_embeddings
  if (!ep.word || !ep.pos || !ep.embed_norm || !ep.head_dense || !ep.head_norm) {
    return MakeError(fmt::format("{}: could not find the embeddings and MLM head in its parameter list", spec.name));
  }
  for (size_t i = 0; i < ep.layers.size(); ++i) {
    const EncoderParams::Layer& l = ep.layers[i];
    if (!l.q || !l.k || !l.v || !l.o || !l.attn_norm || !l.up || !l.down || !l.out_norm) {
      return MakeError(fmt::format("{}: encoder layer {} lacks attention, MLP or norm parameters", spec.name, i));
    }
  }
  return ep;
}

ForwardOut EncoderForward(Tape& tape, const ModelSpec& spec, EncoderParams& ep,
                          const TrainingSetup& setup) {
  const uint64_t b = setup.batch, s = setup.seq, t = b * s, h = spec.hidden_size;
  const uint64_t heads = spec.num_heads, dh = spec.head_dim ? spec.head_dim : h / heads;
  tape.SetModule("bert");
  Var ids = tape.New(t, kI64, Category::kOther, "input_ids");
  Var labels = tape.New(t, kI64, Category::kOther, "labels");

  // BertEmbeddings.forward: word + token_type (the registered all-zero
  // token_type_ids buffer, expanded) ; `embeddings += position_embeddings`
  // in place; LayerNorm; dropout.
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
  // BertModel.forward's local `embedding_output` holds the embeddings' output
  // until it returns, past the encoder (4.57.6 / 5.24.0 models/bert/
  // modeling_bert.py): under autocast (nothing saves the fp32 tensor itself)
  // it outlives layer 0.
  Var embedding_output = tape.Share(x);

  // BertModel with attn_implementation="sdpa" and no attention mask:
  // _prepare_4d_attention_mask_for_sdpa returns None for an all-ones mask, so
  // SDPA runs without a mask (flash or memory-efficient kernel); eager
  // materialises the scores. Not causal.
  AttnPlan plan = PlanAttention(setup, tape.autocast ? tape.compute_bytes : x.elem_bytes,
                                      heads, heads, /*sliding_window_mask=*/false, spec.attention_dropout);
  plan.fp32_softmax = false;  // BertSelfAttention: softmax(attention_scores, dim=-1), no dtype
  // transformers 4.x BertModel.forward (read in 4.57.6): `attention_mask =
  // torch.ones((batch_size, seq_length), device=device)` (fp32) when the batch
  // has none, a local until it returns; SDPA's _prepare_4d_attention_mask_for_sdpa
  // checks torch.all(mask == 1) and returns None; eager's
  // get_extended_attention_mask (modeling_utils.py) makes
  // (1.0 - mask[:, None, None, :].to(self.dtype)) * finfo.min, [b, 1, 1, s],
  // added to every layer's scores by BertSelfAttention's own eager code
  // (legacy_bert). transformers 5.x builds no mask for an unpadded batch.
  const bool legacy = setup.transformers_version < 500;
  Var ones, ext_mask;
  if (legacy) {
    tape.SetModule("bert");
    const uint8_t dtype = x.elem_bytes;  // BertModel.dtype: the parameters' dtype
    if (!setup.attention_mask) ones = tape.New(b * s, kF32, Category::kTemporaries, "aten::ones");
    const uint8_t mask_bytes = setup.attention_mask ? kI64 : kF32;
    if (plan.kernel == AttnKernel::kMath) {
      plan.legacy_bert = true;
      Var cast;
      if (dtype != mask_bytes) cast = tape.New(b * s, dtype, Category::kTemporaries, "aten::_to_copy");
      Var rsub = tape.New(b * s, dtype, Category::kTemporaries, "aten::rsub");
      if (cast.t != kNoTensor) tape.Drop(cast);
      ext_mask = tape.New(b * s, dtype, Category::kActivations, "aten::mul");
      tape.Drop(rsub);
    } else {
      Var eq = tape.New(b * s, kBool, Category::kTemporaries, "aten::eq");
      Var all = tape.New(1, kBool, Category::kTemporaries, "aten::all");
      tape.Drop(eq);
      tape.Drop(all);
    }
  }
  const bool ckpt = setup.grad_ckpt != GradCkpt::kNone;
  // BertEncoder.forward (4.x): `layer_outputs = layer_module(...)` is
  // (layer_output, attention_probs) - BertLayer returns the self-attention's
  // outputs[1:], and eager BertSelfAttention always returns attention_probs
  // (SDPA's returns None) - so the previous layer's probabilities stay
  // referenced until the next layer returns, the last layer's until the
  // encoder returns (checked with weakrefs on the storage, 4.57.6). Without
  // checkpointing the second matmul saves them anyway.
  Var layer_outputs;
  for (uint64_t i = 0; i < spec.num_layers; ++i) {
    const EncoderParams::Layer& l = ep.layers[i];
    tape.SetModule("bert.encoder.layer." + std::to_string(i));
    if (ckpt) {
      tape.graph.BeginCheckpoint(setup.grad_ckpt == GradCkpt::kReentrant);
      tape.graph.Keep(x.t);
      // The extended mask is an argument of the checkpointed call: reentrant
      // CheckpointFunction saves it, non-reentrant's recompute closure holds it.
      if (ext_mask.t != kNoTensor) tape.graph.Keep(ext_mask.t);
    }
    Var q = Linear(tape, x, *l.q, l.q_b, t, h);
    Var k = Linear(tape, x, *l.k, l.k_b, t, h);
    Var v = Linear(tape, x, *l.v, l.v_b, t, h);
    AttnShape shape{b, s, heads, heads, dh};
    shape.causal = false;
    Var probs;
    Var ctx = Attend(tape, plan, shape, q, k, v, ext_mask.t != kNoTensor ? &ext_mask : nullptr,
                     spec.attention_dropout, legacy ? &probs : nullptr);
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
    if (ckpt && setup.grad_ckpt == GradCkpt::kReentrant && probs.t != kNoTensor) {
      tape.graph.UngradedOutput(probs.bytes());
    }
    if (ckpt) tape.graph.EndCheckpoint();
    tape.Drop(x);
    x = y;
    if (layer_outputs.t != kNoTensor) tape.Drop(layer_outputs);
    layer_outputs = probs;
  }
  if (layer_outputs.t != kNoTensor) tape.Drop(layer_outputs);  // BertEncoder returns
  // BertModel.forward returns: its locals go.
  tape.Drop(embedding_output);
  if (ones.t != kNoTensor) tape.Drop(ones);
  if (ext_mask.t != kNoTensor) tape.Drop(ext_mask);

  // BertLMPredictionHead: transform (dense, gelu, LayerNorm), then the
  // decoder (tied word embeddings) with its bias -> [t, vocab] scores.
  tape.SetModule("cls.predictions");
  // BertForMaskedLM.forward: `outputs = self.bert(...)` holds the last hidden
  // state (sequence_output) until it returns, past the loss (4.57.6 / 5.24.0).
  Var dense = Linear(tape, x, *ep.head_dense, ep.head_dense_b, t, h);
  Var act = MlpActivation(tape, spec.mlp, dense);  // BertPredictionHeadTransform: ACT2FN[hidden_act]
  tape.Drop(dense);
  Var hn = LayerNorm(tape, act, *ep.head_norm, ep.head_norm_b, t);
  tape.Drop(act);
  Var scores = Linear(tape, hn, *ep.decoder, ep.decoder_b, t, spec.vocab_size);
  tape.Drop(hn);
  // BertForMaskedLM: CrossEntropyLoss()(scores.view(-1, vocab), labels.view(-1)),
  // no explicit upcast; under autocast cross_entropy's log_softmax is an fp32
  // op, so the scores are cast to fp32 first.
  // `prediction_scores` stays a local (and the returned logits) until the
  // forward returns.
  Var logits = tape.autocast ? Cast(tape, scores, kF32) : tape.Share(scores);
  Var loss = CrossEntropyLoss(tape, logits);
  tape.Drop(logits);
  tape.Drop(scores);
  tape.Drop(x);
  tape.Drop(ids);
  tape.Drop(labels);
  return ForwardOut{loss};
}

}  // namespace vramscope::lower
