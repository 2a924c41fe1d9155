// Lowering of CLIP (transformers 5.24.0 models/clip/modeling_clip.py; 4.57.6
// where it differs): the towers (a causal text tower pooled at its EOS token,
// a ViT-like vision tower with a class token and pre_layrnorm), CLIPModel's
// contrastive training step (return_loss=True), and a text tower run frozen
// under torch.no_grad() as a diffusion step's text encoder
// (frozen_encoder.cc).
#pragma once

#include <vector>

#include "tape.h"
#include "transformer.h"
#include "vramscope/model.h"
#include "vramscope/setup.h"

namespace vramscope::lower {

// One CLIPEncoderLayer's parameters.
struct ClipLayerParams {
  Param *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
  Param *q_b = nullptr, *k_b = nullptr, *v_b = nullptr, *o_b = nullptr;
  Param *ln1 = nullptr, *ln1_b = nullptr, *ln2 = nullptr, *ln2_b = nullptr;
  Param *fc1 = nullptr, *fc1_b = nullptr, *fc2 = nullptr, *fc2_b = nullptr;
};

struct ClipParams {
  // CLIPTextModel
  Param *token = nullptr, *text_pos = nullptr, *final_norm = nullptr, *final_norm_b = nullptr;
  std::vector<ClipLayerParams> text_layers;
  // CLIPVisionModel
  Param *cls = nullptr, *patch = nullptr, *vision_pos = nullptr;
  Param *pre_norm = nullptr, *pre_norm_b = nullptr, *post_norm = nullptr, *post_norm_b = nullptr;
  std::vector<ClipLayerParams> vision_layers;
  // CLIPModel / *WithProjection
  Param *text_proj = nullptr, *visual_proj = nullptr, *logit_scale = nullptr;
};

// Indexes `params` (built from spec.params, in the same order) by name; an
// Error names what is missing.
Result<ClipParams> IndexClipParams(const ModelSpec& spec, std::vector<Param>& params);

// The text length a CLIP text tower reads: --text-len, else
// max_position_embeddings (CLIPTokenizer's padding="max_length", 77).
uint64_t ClipTextLen(const ModelSpec& spec, const TrainingSetup& setup);

// One micro-batch of CLIPModel's inputs as a data loader hands them over:
// input_ids [b, text_len] (int64) and pixel_values [b, c, image, image] (fp32).
struct ClipBatch {
  Var input_ids, pixels;
};
ClipBatch MakeClipBatch(Tape& tape, const ModelSpec& spec, const TrainingSetup& setup);

// CLIPModel.forward(input_ids, pixel_values, return_loss=True) and the loss.
ForwardOut ClipForward(Tape& tape, const ModelSpec& spec, ClipParams& cp,
                       const TrainingSetup& setup, const ClipBatch& batch);

// What a text tower returns to its caller (new references each).
struct ClipTextOut {
  Var last_hidden;  // final_layer_norm's output [b, s, h]
  Var penultimate;  // hidden_states[-2] (kNoTensor unless asked for)
  Var pooled;       // the EOS token's state [b, h] (pooler_output, before any projection)
};

// CLIPTextModel(WithProjection).forward over `ids` [b, text_len];
// `penultimate`: output_hidden_states=True, keeping the second-to-last layer's
// output (SDXL's encode_prompt). The attention plan follows `setup`.
ClipTextOut ClipTextForward(Tape& tape, const ModelSpec& spec, ClipParams& cp,
                            const TrainingSetup& setup, uint64_t batch, const Var& ids,
                            bool penultimate);

}  // namespace vramscope::lower
