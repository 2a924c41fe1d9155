// ParamListBuilder: appends ParamTensor entries with Hugging Face names.
//
// Family builders (arch_*.cc) describe a model module by module in the order
// transformers registers them, so the resulting list matches what
// `model.named_parameters()` yields (tied weights once). Element counts are
// computed with overflow checks; a list that would overflow or exceed
// kMaxParameters is reported through overflowed() instead of wrapping.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "vramscope/model.h"

namespace vramscope::ingest {

// Above this many parameters a config is treated as absurd (100 trillion).
inline constexpr uint64_t kMaxParameters = 100'000'000'000'000ULL;
// Above this many tensors a config is treated as absurd (the largest real MoE
// checkpoints have tens of thousands).
inline constexpr uint64_t kMaxTensors = 200'000;

class ParamListBuilder {
 public:
  explicit ParamListBuilder(std::vector<ParamTensor>* out) : out_(out) {}

  // nn.Linear(in, out, bias): "<module>.weight" [out, in] and "<module>.bias" [out].
  void Linear(const std::string& module, uint64_t out_features, uint64_t in_features, bool bias,
              int layer, ParamRole role);
  // transformers' Conv1D(nf=out, nx=in) (GPT-2): weight is stored [in, out].
  void Conv1D(const std::string& module, uint64_t out_features, uint64_t in_features, int layer,
              ParamRole role);
  // A norm with a weight of `dim` and optionally a bias; role "norm".
  void Norm(const std::string& module, uint64_t dim, bool bias, int layer);
  // nn.Embedding(rows, dim): "<module>.weight".
  void Embedding(const std::string& module, uint64_t rows, uint64_t dim, ParamRole role);
  // Any other tensor; `name` is the full parameter name.
  void Tensor(const std::string& name, std::vector<uint64_t> shape, int layer,
              const std::string& module, ParamRole role, bool is_linear_weight);

  bool overflowed() const { return overflowed_; }
  uint64_t total() const { return total_; }

 private:
  std::vector<ParamTensor>* out_;
  uint64_t total_ = 0;
  bool overflowed_ = false;
};

}  // namespace vramscope::ingest
