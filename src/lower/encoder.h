// Lowering of BertForMaskedLM (transformers 4.4x-4.5x modeling_bert.py): a
// post-LayerNorm encoder with an MLM head tied to the word embeddings.
#pragma once

#include "tape.h"
#include "transformer.h"
#include "vramscope/model.h"
#include "vramscope/setup.h"

namespace vramscope::lower {

// Parameters of an encoder, located by name and role.
struct EncoderParams {
  Param *word = nullptr, *pos = nullptr, *type = nullptr, *embed_norm = nullptr,
        *embed_norm_b = nullptr;
  struct Layer {
    Param *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
    Param *q_b = nullptr, *k_b = nullptr, *v_b = nullptr, *o_b = nullptr;
    Param *attn_norm = nullptr, *attn_norm_b = nullptr;  // attention.output.LayerNorm
    Param *up = nullptr, *up_b = nullptr, *down = nullptr, *down_b = nullptr;
    Param *out_norm = nullptr, *out_norm_b = nullptr;  // output.LayerNorm
  };
  std::vector<Layer> layers;
  Param *head_dense = nullptr, *head_dense_b = nullptr, *head_norm = nullptr,
        *head_norm_b = nullptr, *decoder = nullptr, *decoder_b = nullptr;
  // BertForSequenceClassification (spec.num_labels > 0): pooler and classifier.
  Param *pooler = nullptr, *pooler_b = nullptr, *classifier = nullptr, *classifier_b = nullptr;
};

// Indexes tape.params (built from spec.params, in the same order); an Error
// names what is missing.
Result<EncoderParams> IndexEncoderParams(const ModelSpec& spec, std::vector<Param>& params);

// One micro-batch forward of the masked-LM loss, or of the sequence
// classification loss when spec.num_labels > 0.
ForwardOut EncoderForward(Tape& tape, const ModelSpec& spec, EncoderParams& ep,
                          const TrainingSetup& setup);

}  // namespace vramscope::lower
