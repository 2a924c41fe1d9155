// The language-model head and loss as transformers computes them.
#pragma once

#include "tape.h"
#include "vramscope/setup.h"

namespace vramscope::lower {

// lm_head(hidden) and the causal-LM cross-entropy, per setup.loss and
// setup.transformers_version. Returns the scalar fp32 loss.
Var CausalLmLoss(Tape& tape, const TrainingSetup& setup, const Var& hidden, Param& head,
                 uint64_t tokens, uint64_t hidden_size, uint64_t vocab, double softcap);

}  // namespace vramscope::lower
