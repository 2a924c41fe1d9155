// Memory categories: the one tag enum every allocation carries, from lowering,
// recorded traces and snapshots through the simulator to the report.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

namespace vramscope {

enum class Category : uint8_t {
  kParameters = 0,  // model weights (incl. quantized storage, buffers)
  kGradients,       // .grad tensors and gradient buckets owned by the model
  kOptimizerState,  // Adam moments, momentum, fp32 master copies, step counters
  kActivations,     // tensors autograd saved for backward
  kLoss,            // logits, log-probs and loss tensors
  kTemporaries,     // short-lived intermediates (op outputs, grads in flight)
  kCommunication,   // NCCL / DDP / ZeRO / FSDP buffers
  kWorkspace,       // cuBLAS / cuDNN workspaces
  kOther,           // anything else (inputs, masks, RNG state, ...)
};
inline constexpr int kNumCategories = 9;

// Short token used in event-stream files ("param", "grad", ...).
std::string_view CategoryToken(Category c);
// Long name used in JSON keys of "breakdown_at_peak" ("parameters", ...).
std::string_view CategoryJsonKey(Category c);
// Accepts either the short token or the long JSON key.
std::optional<Category> ParseCategory(std::string_view text);

inline constexpr std::array<Category, kNumCategories> kAllCategories = {
    Category::kParameters,    Category::kGradients, Category::kOptimizerState,
    Category::kActivations,   Category::kLoss,      Category::kTemporaries,
    Category::kCommunication, Category::kWorkspace, Category::kOther};

}  // namespace vramscope
