// The language-model head and loss as transformers computes them.
#pragma once

#include <vector>

#include "tape.h"
#include "vramscope/setup.h"

namespace vramscope::lower {

// lm_head(hidden) (+ its bias when the model has one, phi-2) and the causal-LM
// cross-entropy, per setup.loss and setup.transformers_version. Returns the
// scalar fp32 loss.
Var CausalLmLoss(Tape& tape, const TrainingSetup& setup, const Var& hidden, Param& head,
                 Param* head_bias, uint64_t tokens, uint64_t hidden_size, uint64_t vocab,
                 double softcap);

// The loss of a classification head over `logits` [rows, labels]: MSELoss
// against float `label_values` for one label (autocast runs mse_loss in fp32:
// CUDA's and CPU's fp32 lists), else cross-entropy (fp32 log-probabilities
// under autocast, as CrossEntropyLossHalfCudaAutocast / a cast on CPU).
Var ClassificationLoss(Tape& tape, const Var& logits, uint64_t labels, const Var& label_values);

// GenericForSequenceClassification's head (transformers 4.57.6 / 5.24.0
// modeling_layers.py, loss_utils.py ForSequenceClassificationLoss): `score`
// (no bias) over every token, the rightmost non-pad token of each row picked
// by advanced indexing, then MSELoss (one label, `labels` float) or
// cross-entropy. Returns the scalar fp32 loss.
Var SequenceClassificationLoss(Tape& tape, const TrainingSetup& setup, const Var& hidden,
                               Param& score, uint64_t tokens, uint64_t labels,
                               const Var& label_values);

// TRL >= 1.15's fused LM head and SFTTrainer's loss over its log-probabilities
// (loss_trl.cc). The head's bias, if any, is not modelled (a [vocab] vector).
Var TrlFusedLoss(Tape& tape, const TrainingSetup& setup, const Var& hidden, Param& head,
                 uint64_t tokens, uint64_t hidden_size, uint64_t vocab);

// torchtune's chunked output and CEWithChunkedOutputLoss (loss.cc). Takes over
// `*hidden_owner` (the final norm's output), dropped once the chunks are
// projected, as TransformerDecoder.forward returns.
// LitGPT 0.5.13's fine-tuning step: GPT.forward's lm_head over 128-token
// chunks of each row, chunked_cross_entropy (litgpt/utils.py) in the logits'
// dtype; the chunks stay in tape.loop_logits (the loop's `logits`) until the
// next forward returns. Takes `hidden_owner`'s reference.
inline constexpr uint64_t kLitgptChunkTokens = 128;
Var LitgptChunkedLoss(Tape& tape, Var* hidden_owner, Param& head, uint64_t batch, uint64_t seq,
                      uint64_t hidden_size, uint64_t vocab);
Var TorchtuneChunkedLoss(Tape& tape, Var* hidden_owner, Param& head, uint64_t tokens,
                         uint64_t hidden_size, uint64_t vocab);

// TRL's DPO head (trl 1.16.0 DPOTrainer): the fused head over the chosen and
// rejected rows, returning the per-sequence sums of the log-probabilities
// [rows]. `all_outputs`: the policy's head, which also computes the entropy,
// mean logits and is_top1 (a separate reference model's computes the
// log-probabilities only). The output object's tensors go to `held`: they
// live until the step's loss is made.
struct DpoHead {
  bool all_outputs;
  std::vector<Var>* held;
};
Var TrlDpoLogps(Tape& tape, const TrainingSetup& setup, const Var& hidden, Param& head,
                uint64_t tokens, uint64_t hidden_size, uint64_t vocab, bool all_outputs,
                std::vector<Var>* held);

// F.cross_entropy(logits, labels) = log_softmax (saves its output, in the
// logits' dtype) + nll_loss; backward allocates two logits-sized gradients.
Var CrossEntropyLoss(Tape& tape, const Var& logits);
// F.cross_entropy on half logits under CUDA autocast (no explicit upcast first).
Var CrossEntropyLossHalfCudaAutocast(Tape& tape, const Var& logits);

}  // namespace vramscope::lower
