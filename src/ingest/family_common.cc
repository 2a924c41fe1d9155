#include <fmt/format.h>

#include "families.h"

namespace vramscope::ingest {

uint64_t ReadSize(ConfigReader& r, ModelSpec& spec, std::initializer_list<std::string_view> keys,
                  uint64_t def, uint64_t max) {
  for (std::string_view key : keys) {
    if (r.Has(key)) return r.Uint(key, def, 1, max);
  }
  spec.notes.push_back(fmt::format("{}: {} absent; using the transformers default {}", r.context(),
                                   *keys.begin(), def));
  return def;
}

uint64_t DerivedHeadDim(ConfigReader& r, const ModelSpec& spec, std::string_view hidden_key,
                        std::string_view heads_key) {
  if (spec.num_heads == 0 || spec.hidden_size % spec.num_heads != 0) {
    r.Fail(hidden_key, fmt::format("{} is not divisible by {} {}", spec.hidden_size, heads_key,
                                   spec.num_heads));
    return 1;
  }
  return spec.hidden_size / spec.num_heads;
}

void CheckKvHeads(ConfigReader& r, const ModelSpec& spec, std::string_view kv_key) {
  if (spec.num_kv_heads == 0 || spec.num_kv_heads > spec.num_heads ||
      spec.num_heads % spec.num_kv_heads != 0) {
    r.Fail(kv_key, fmt::format("{} does not divide num_attention_heads {}", spec.num_kv_heads,
                               spec.num_heads));
  }
}

std::string ReadArchitecture(ConfigReader& r, std::string def) {
  std::vector<std::string> names = r.StringList("architectures");
  return names.empty() ? def : names.front();
}

double ReadPartialRotary(ConfigReader& r, std::string_view key, double def) {
  if (r.Has(key)) return r.Number(key, def, 0.0, 1.0);
  for (std::string_view nested : {"rope_parameters", "rope_scaling"}) {
    if (const nlohmann::json* obj = r.Object(nested)) {
      ConfigReader inner(*obj, fmt::format("{}: {}", r.context(), nested));
      if (inner.Has("partial_rotary_factor")) {
        double v = inner.Number("partial_rotary_factor", def, 0.0, 1.0);
        r.Adopt(inner);
        return v;
      }
    }
  }
  return def;
}

std::string ReadTorchDtype(ConfigReader& r) {
  if (r.Has("torch_dtype")) return r.String("torch_dtype", "");
  return r.String("dtype", "");
}

MlpKind ReadActivation(ConfigReader& r, std::string_view key, std::string_view def) {
  // ACT2FN in transformers 4.57 / 5.x activations.py: "gelu" is GELUActivation
  // (F.gelu) and "gelu_pytorch_tanh" GELUTanh (F.gelu, approximate="tanh"), one
  // op each; "gelu_new", "gelu_fast" and "quick_gelu" are Python expressions.
  const std::string name = r.String(key, std::string(def));
  if (name == "relu") return MlpKind::kRelu;
  if (name == "gelu" || name == "gelu_pytorch_tanh") return MlpKind::kGelu;
  if (name == "gelu_new") return MlpKind::kGeluNew;
  if (name == "gelu_fast") return MlpKind::kGeluFast;
  if (name == "quick_gelu") return MlpKind::kQuickGelu;
  r.Fail(key, fmt::format("{} is not a supported activation (relu, gelu, gelu_pytorch_tanh, "
                          "gelu_new, gelu_fast, quick_gelu)",
                          common::QuoteForMessage(name)));
  return MlpKind::kGelu;
}

double ReadOptionalCap(ConfigReader& r, std::string_view key, double def) {
  if (r.IsNull(key)) return 0.0;
  return r.Number(key, def, 0.0, 1e9);
}

// XForSequenceClassification (transformers 4.57.6 / 5.24.0): num_labels is
// len(id2label) as PretrainedConfig sets it (default 2); classifier_dropout
// falls back to hidden_dropout_prob; problem_type, when given, must agree with
// the one the model infers from num_labels and integer labels.
void ReadSequenceClassification(ConfigReader& r, ModelSpec& s) {
  uint64_t labels = 2;
  if (const nlohmann::json* id2label = r.Object("id2label")) {
    labels = id2label->size();
  } else if (r.Has("num_labels")) {
    labels = r.Uint("num_labels", 2, 1, kMaxVocab);
  }
  if (r.ok() && (labels == 0 || labels > kMaxVocab)) {
    r.Fail("id2label", fmt::format("{} labels is outside 1..{}", labels, kMaxVocab));
  }
  s.num_labels = labels;
  s.classifier_dropout = r.Has("classifier_dropout") ? r.Number("classifier_dropout", 0.1, 0.0, 1.0)
                                                     : s.hidden_dropout;
  const std::string problem =
      r.String("problem_type", labels == 1 ? "regression" : "single_label_classification");
  const std::string inferred = labels == 1 ? "regression" : "single_label_classification";
  if (r.ok() && problem != inferred) {
    r.Fail("problem_type", fmt::format("{} is not lowered with {} labels (only {})",
                                       common::QuoteForMessage(problem), labels, inferred));
  }
}

}  // namespace vramscope::ingest
