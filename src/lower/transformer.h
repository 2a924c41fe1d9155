// Lowering of a Hugging Face causal-LM forward pass (transformers 4.4x-4.5x
// modeling_*.py) to tensor lifetimes on a Tape.
#pragma once

#include <cstdint>
#include <vector>

#include "attention.h"
#include "tape.h"
#include "vramscope/model.h"
#include "vramscope/setup.h"

namespace vramscope::lower {

// Parameters of one decoder layer, located by role (nullptr when absent).
struct LayerParams {
  Param *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr, *qkv = nullptr;
  Param *q_b = nullptr, *k_b = nullptr, *v_b = nullptr, *o_b = nullptr, *qkv_b = nullptr;
  Param *gate = nullptr, *up = nullptr, *down = nullptr, *gate_up = nullptr;
  Param *fc1_b = nullptr, *fc2_b = nullptr;  // non-gated MLP biases (weights: up, down)
  Param *norm1 = nullptr, *norm1_b = nullptr, *norm2 = nullptr, *norm2_b = nullptr;
  Param *norm3 = nullptr, *norm4 = nullptr;  // gemma2 sandwich norms
  Param *q_norm = nullptr, *k_norm = nullptr;
  Param* router = nullptr;
  std::vector<Param*> expert_gate, expert_up, expert_down;
  Param *shared_gate = nullptr, *shared_up = nullptr, *shared_down = nullptr;
  Param* shared_router = nullptr;
};

struct ModelParams {
  Param *embed = nullptr, *pos_embed = nullptr, *final_norm = nullptr, *final_norm_b = nullptr,
        *lm_head = nullptr, *lm_head_b = nullptr;
  // OPT's project_in / project_out when word_embed_proj_dim != hidden_size.
  Param *proj_in = nullptr, *proj_out = nullptr;
  std::vector<LayerParams> layers;
};

// Tokens each of `local_experts` experts processes for `tokens` tokens per
// rank routed top-`top_k`: dropless (capacity_factor 0; `imbalance` R gives
// the busiest expert R times its even share, and under expert parallelism
// `ep` > 1 every local expert of the worst rank), or padded to a capacity of
// ceil(F * tokens * k / local_experts) each.
std::vector<uint64_t> ExpertTokens(uint64_t tokens, uint64_t top_k, uint64_t local_experts,
                                   uint64_t ep, double capacity_factor, double imbalance);

// Indexes tape.params (built from spec.params) by layer and role.
ModelParams IndexParams(const ModelSpec& spec, std::vector<Param>& params);

struct ForwardOut {
  Var loss;  // scalar fp32 loss with its grad_fn; a pipeline stage without
             // the head: the hidden states it sends to the next stage
  // Outputs the training script keeps until its backward has run (a UNet's
  // model_pred); dropped after it.
  std::vector<Var> held;
};

// The part of the model one pipeline stage runs (by default all of it).
struct StageSpan {
  uint64_t first_layer = 0;
  uint64_t end_layer = UINT64_MAX;  // exclusive; clamped to the model's layers
  bool embed = true;                // embeddings (else: receives hidden states)
  bool head = true;                 // final norm, lm_head and loss (else: sends)
};

// One micro-batch forward: embeddings, decoder layers (checkpointed when the
// setup says so), final norm, lm_head and the loss. Activations saved for
// backward are re-tagged as such by the lowering's bookkeeping.
// With setup.dpo, TRL's DPO step: `reference` is the frozen reference copy
// (full fine-tuning), or null to run `mp` with its adapters disabled.
ForwardOut Forward(Tape& tape, const ModelSpec& spec, ModelParams& mp, const TrainingSetup& setup,
                   const StageSpan& span = {}, ModelParams* reference = nullptr);

}  // namespace vramscope::lower
