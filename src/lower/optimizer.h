// Optimizer steps as memory sees them (torch.optim 2.x, bitsandbytes 0.4x,
// transformers Adafactor).
#pragma once

#include "tape.h"
#include "vramscope/setup.h"

namespace vramscope::lower {

// Bytes of optimizer state kept outside PyTorch's allocator (paged optimizers
// use CUDA managed memory), added to the device view.
struct OptimizerExtras {
  uint64_t managed_state_bytes = 0;
};

// One optimizer.step() over the trainable params that have a .grad. The first
// call creates the state lazily (torch.optim _init_group).
void OptimizerStep(Tape& tape, const TrainingSetup& setup, bool first_step,
                   OptimizerExtras* extras);

// The same step over the given params only (optimizer-in-backward runs one
// single-parameter optimizer per parameter from its post-accumulate-grad hook).
// State is created for params that have none yet.
void OptimizerStepParams(Tape& tape, const TrainingSetup& setup, const std::vector<Param*>& params,
                         OptimizerExtras* extras);

// optimizer.zero_grad(set_to_none=True): drops every .grad.
void ZeroGrad(Tape& tape);

}  // namespace vramscope::lower
