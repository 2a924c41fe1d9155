// Each parameter's role as the lowering reads it.
#pragma once

#include <vector>

#include "vramscope/model.h"

namespace vramscope::lower {

// The role of every parameter of `params`, in order, for placement and sharding:
// a Linear's or Conv1D's bias (role kBias, ingest's ParamListBuilder) takes the
// role of the weight of its module; a bias with no weight beside it (BERT's
// cls.predictions.bias, the MLM decoder's) keeps kBias.
std::vector<ParamRole> WeightRoles(const std::vector<ParamTensor>& params);

}  // namespace vramscope::lower
