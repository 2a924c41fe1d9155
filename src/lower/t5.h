// Lowering of T5ForConditionalGeneration's seq2seq training step and of
// T5EncoderModel's no-grad forward (transformers 5.24.0
// models/t5/modeling_t5.py): an encoder stack over input_ids [b, src], a
// decoder stack over _shift_right(labels) [b, tgt] that cross-attends to the
// encoder's output, the lm_head (the shared embedding) and CrossEntropyLoss.
#pragma once

#include <vector>

#include "tape.h"
#include "transformer.h"
#include "vramscope/model.h"
#include "vramscope/setup.h"

namespace vramscope::lower {

struct T5Params {
  struct Attention {
    Param *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
  };
  struct Block {
    Attention self, cross;
    Param* rel_bias = nullptr;  // each stack's block 0 only
    Param *norm_self = nullptr, *norm_cross = nullptr, *norm_ff = nullptr;
    Param *wi = nullptr, *wi_0 = nullptr, *wi_1 = nullptr, *wo = nullptr;
  };
  Param* shared = nullptr;
  std::vector<Block> encoder, decoder;
  Param *encoder_norm = nullptr, *decoder_norm = nullptr;
};

// Indexes tape.params (built from spec.params, in the same order) by name; an
// Error names what is missing.
Result<T5Params> IndexT5Params(const ModelSpec& spec, std::vector<Param>& params);

// The decoder's length: --target-len, else --seq.
uint64_t T5TargetLen(const TrainingSetup& setup);

// One micro-batch forward of T5ForConditionalGeneration(input_ids, labels)
// with its loss, as `model(**batch).loss` runs it.
ForwardOut T5Forward(Tape& tape, const ModelSpec& spec, T5Params& tp, const TrainingSetup& setup);

// T5EncoderModel(input_ids).last_hidden_state under torch.no_grad() with the
// model in eval mode (no dropout), as a frozen text encoder runs (FLUX's
// text_encoder_2): input_ids [batch, len] are made here and dropped; the
// weights are whatever dtype `tp` holds (tape.autocast casts them per use).
// Returns the [batch, len, d_model] output, owned by the caller.
// `setup.attn` picks eager attention or SDPA (from_pretrained's default in
// 5.x: sdpa_attention_forward with the position bias as its float mask);
// `setup.device_rules` the SDPA kernel.
Var T5EncoderNoGrad(Tape& tape, const ModelSpec& spec, T5Params& tp, const TrainingSetup& setup,
                    uint64_t batch, uint64_t len);

}  // namespace vramscope::lower
