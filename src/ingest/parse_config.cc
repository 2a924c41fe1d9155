// ParseModelConfig: config.json text -> ModelSpec with its parameter list.
#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "config_reader.h"
#include "families.h"
#include "param_list.h"
#include "vramscope/model.h"

namespace vramscope {
namespace {

const ingest::Family* FindFamily(std::string_view model_type) {
  for (const auto* list :
       {&ingest::DecoderFamilies(), &ingest::ClassicFamilies(), &ingest::DiffusersFamilies(),
        &ingest::FluxFamilies(), &ingest::ClipFamilies(), &ingest::VaeFamilies()}) {
    for (const ingest::Family& f : *list) {
      if (f.model_type == model_type) return &f;
    }
  }
  return nullptr;
}

std::string SupportedList() {
  std::string out;
  for (const std::string& t : SupportedModelTypes()) {
    if (!out.empty()) out += ", ";
    out += t;
  }
  return out;
}

}  // namespace

uint64_t DTypeBytes(DType d) {
  switch (d) {
    case DType::kFloat32: return 4;
    case DType::kFloat16:
    case DType::kBFloat16: return 2;
    case DType::kInt8:
    case DType::kUInt8: return 1;
    case DType::kNF4: return 0;
  }
  return 0;
}

std::string_view ParamRoleName(ParamRole r) {
  switch (r) {
    case ParamRole::kUnknown: return "unknown";
    case ParamRole::kEmbed: return "embed";
    case ParamRole::kPosEmbed: return "pos_embed";
    case ParamRole::kTypeEmbed: return "type_embed";
    case ParamRole::kQ: return "q";
    case ParamRole::kK: return "k";
    case ParamRole::kV: return "v";
    case ParamRole::kO: return "o";
    case ParamRole::kQkv: return "qkv";
    case ParamRole::kGate: return "gate";
    case ParamRole::kUp: return "up";
    case ParamRole::kDown: return "down";
    case ParamRole::kGateUp: return "gate_up";
    case ParamRole::kRouter: return "router";
    case ParamRole::kExpertGate: return "expert_gate";
    case ParamRole::kExpertUp: return "expert_up";
    case ParamRole::kExpertDown: return "expert_down";
    case ParamRole::kSharedGate: return "shared_gate";
    case ParamRole::kSharedUp: return "shared_up";
    case ParamRole::kSharedDown: return "shared_down";
    case ParamRole::kSharedExpertGate: return "shared_expert_gate";
    case ParamRole::kNorm: return "norm";
    case ParamRole::kBias: return "bias";
    case ParamRole::kLmHead: return "lm_head";
    case ParamRole::kHeadDense: return "head_dense";
    case ParamRole::kProjIn: return "proj_in";
    case ParamRole::kProjOut: return "proj_out";
    case ParamRole::kVision: return "vision";
    case ParamRole::kProjector: return "projector";
    case ParamRole::kConv: return "conv";
    case ParamRole::kTimeEmbed: return "time_embed";
    case ParamRole::kContextProj: return "context_proj";
  }
  return "unknown";
}

bool IsRoutedExpert(ParamRole r) {
  return r == ParamRole::kExpertGate || r == ParamRole::kExpertUp || r == ParamRole::kExpertDown;
}

bool IsInputSide(ParamRole r) {
  // OPT's project_in widens the embeddings before the first layer (OPTDecoder.forward).
  return r == ParamRole::kEmbed || r == ParamRole::kPosEmbed || r == ParamRole::kProjIn;
}

std::string_view DTypeName(DType d) {
  switch (d) {
    case DType::kFloat32: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kInt8: return "int8";
    case DType::kUInt8: return "uint8";
    case DType::kNF4: return "nf4";
  }
  return "unknown";
}

uint64_t ModelSpec::ParameterCount() const {
  uint64_t total = 0;
  for (const ParamTensor& t : params) total += t.numel;
  return total;
}

const std::vector<std::string>& SupportedModelTypes() {
  static const std::vector<std::string> kTypes = [] {
    std::vector<std::string> types;
    for (const auto* list :
         {&ingest::DecoderFamilies(), &ingest::ClassicFamilies(), &ingest::ClipFamilies()}) {
      for (const ingest::Family& f : *list) types.emplace_back(f.model_type);
    }
    std::sort(types.begin(), types.end());
    return types;
  }();
  return kTypes;
}

Result<ModelSpec> ParseModelConfig(std::string_view json_text, std::string_view name) {
  if (auto nul = common::FindNulByte(json_text)) {
    return MakeError(fmt::format("{}: {}", name, common::NulByteProblem(*nul)));
  }
  if (common::JsonNestsDeeperThan(json_text, ingest::kMaxJsonDepth)) {
    return MakeError(
        fmt::format("{}: JSON nested deeper than {} levels", name, ingest::kMaxJsonDepth));
  }
  nlohmann::json root = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    // Re-parse with exceptions only to learn where the text went wrong.
    std::string where;
    try {
      nlohmann::json ignored = nlohmann::json::parse(json_text);
      (void)ignored;
    } catch (const nlohmann::json::parse_error& e) {
      where = fmt::format(" at byte {}", e.byte);
    } catch (const nlohmann::json::exception& e) {
      // e.g. out_of_range.406 for a number like 1e999: report it, never throw.
      where = fmt::format(" ({})", e.what());
    }
    return MakeError(fmt::format("{}: not valid JSON{}", name, where));
  }
  if (!root.is_object()) {
    return MakeError(
        fmt::format("{}: expected a JSON object, got {}", name, ingest::DescribeJson(root)));
  }
  ingest::ConfigReader r(root, std::string(name));
  const bool diffusers = !r.Has("model_type") && r.Has("_class_name");
  if (!r.Has("model_type") && !diffusers) {
    return MakeError(fmt::format(
        "{}: model_type: missing (supported: {}; or a diffusers {} or {} config, named by "
        "_class_name)",
        name, SupportedList(), ingest::kUNetClassName, ingest::kFluxClassName));
  }
  std::string model_type = diffusers ? "" : r.String("model_type", "");
  if (!r.ok()) return r.error();
  if (diffusers) {
    const std::string cls = r.String("_class_name", "");
    if (!r.ok()) return r.error();
    if (cls == ingest::kUNetClassName) {
      model_type = ingest::kUNetModelType;
    } else if (cls == ingest::kFluxClassName) {
      model_type = ingest::kFluxModelType;
    } else if (cls == ingest::kVaeClassName) {
      model_type = ingest::kVaeModelType;
    } else {
      return MakeError(
          fmt::format("{}: _class_name: {} is not supported (diffusers models: {}, {}, {})", name,
                      common::QuoteForMessage(cls), ingest::kUNetClassName, ingest::kFluxClassName,
                      ingest::kVaeClassName));
    }
  }
  const ingest::Family* family = FindFamily(model_type);
  if (family == nullptr) {
    return MakeError(fmt::format("{}: model_type: {} is not supported (supported: {})", name,
                                 common::QuoteForMessage(model_type), SupportedList()));
  }

  ModelSpec spec;
  spec.name = std::string(name);
  spec.model_type = model_type;
  ingest::ArchDetails arch;
  family->read(r, spec, arch);
  // config.use_cache (PretrainedConfig default True) also holds in training.
  spec.use_cache = r.Bool("use_cache", true);
  if (!r.ok()) return r.error();

  ingest::ParamListBuilder builder(&spec.params);
  family->build(spec, arch, builder);
  if (builder.overflowed()) {
    return MakeError(
        fmt::format("{}: the sizes describe an absurd model (over {} parameters or {} tensors)",
                    name, ingest::kMaxParameters, ingest::kMaxTensors));
  }
  return spec;
}

}  // namespace vramscope
