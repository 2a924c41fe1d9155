#include "param_list.h"

#include <optional>

#include "vramscope/common/checked.h"

namespace vramscope::ingest {

void ParamListBuilder::Tensor(const std::string& name, std::vector<uint64_t> shape, int layer,
                              const std::string& module, ParamRole role, bool is_linear_weight) {
  if (overflowed_) return;
  uint64_t numel = 1;
  for (uint64_t d : shape) {
    const std::optional<uint64_t> product = common::CheckedMul(numel, d);
    if (!product) {
      overflowed_ = true;
      return;
    }
    numel = *product;
  }
  const std::optional<uint64_t> total = common::CheckedAdd(total_, numel);
  if (!total || *total > kMaxParameters || out_->size() >= kMaxTensors) {
    overflowed_ = true;
    return;
  }
  total_ = *total;
  ParamTensor t;
  t.name = name;
  t.shape = std::move(shape);
  t.numel = numel;
  t.layer = layer;
  t.is_linear_weight = is_linear_weight;
  t.module = module;
  t.role = role;
  out_->push_back(std::move(t));
}

void ParamListBuilder::Linear(const std::string& module, uint64_t out_features,
                              uint64_t in_features, bool bias, int layer, ParamRole role) {
  Tensor(module + ".weight", {out_features, in_features}, layer, module, role, true);
  if (bias) Tensor(module + ".bias", {out_features}, layer, module, ParamRole::kBias, false);
}

void ParamListBuilder::Conv1D(const std::string& module, uint64_t out_features,
                              uint64_t in_features, int layer, ParamRole role) {
  const size_t before = out_->size();
  Tensor(module + ".weight", {in_features, out_features}, layer, module, role, true);
  if (out_->size() > before) out_->back().conv1d = true;
  Tensor(module + ".bias", {out_features}, layer, module, ParamRole::kBias, false);
}

void ParamListBuilder::Norm(const std::string& module, uint64_t dim, bool bias, int layer) {
  Tensor(module + ".weight", {dim}, layer, module, ParamRole::kNorm, false);
  if (bias) Tensor(module + ".bias", {dim}, layer, module, ParamRole::kNorm, false);
}

void ParamListBuilder::Embedding(const std::string& module, uint64_t rows, uint64_t dim,
                                 ParamRole role) {
  Tensor(module + ".weight", {rows, dim}, -1, module, role, false);
}

}  // namespace vramscope::ingest
