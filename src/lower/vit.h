// Lowering of ViTForImageClassification (transformers 5.24.0
// models/vit/modeling_vit.py; 4.57.6 allocates the same tensors): a conv patch
// embedding with a class token and learned positions, pre-LayerNorm encoder
// layers, the final LayerNorm and a classifier on the class token.
#pragma once

#include <vector>

#include "tape.h"
#include "transformer.h"
#include "vramscope/model.h"
#include "vramscope/setup.h"

namespace vramscope::lower {

struct VitParams {
  Param *cls = nullptr, *pos = nullptr, *proj = nullptr, *proj_b = nullptr;
  struct Layer {
    Param *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
    Param *q_b = nullptr, *k_b = nullptr, *v_b = nullptr, *o_b = nullptr;
    Param *ln1 = nullptr, *ln1_b = nullptr, *ln2 = nullptr, *ln2_b = nullptr;
    Param *fc1 = nullptr, *fc1_b = nullptr, *fc2 = nullptr, *fc2_b = nullptr;
  };
  std::vector<Layer> layers;
  Param *norm = nullptr, *norm_b = nullptr, *classifier = nullptr, *classifier_b = nullptr;
};

// Indexes tape.params (built from spec.params, in the same order) by name; an
// Error names what is missing.
Result<VitParams> IndexVitParams(const ModelSpec& spec, std::vector<Param>& params);

// One micro-batch's inputs as the data loader hands them over before the
// forward: pixel_values [batch, channels, image, image] (fp32, as an image
// processor gives them) and one label per image.
struct VitBatch {
  Var pixels, labels;
};
VitBatch MakeVitBatch(Tape& tape, const ModelSpec& spec, const TrainingSetup& setup);

// One micro-batch forward over `batch` (the caller's; not dropped here).
ForwardOut VitForward(Tape& tape, const ModelSpec& spec, VitParams& vp, const TrainingSetup& setup,
                      const VitBatch& batch);

}  // namespace vramscope::lower
