// vramscope models [FILTER] [--arch TYPE] [--json]: the bundled model catalog.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "command.h"
#include "output.h"
#include "vramscope/common/quote.h"
#include "vramscope/model.h"

namespace vramscope::cli {
namespace {

struct ModelsArgs {
  std::string filter;  // case-insensitive substring of alias, Hub id, family or model_type
  std::string arch;    // model_type or architecture class, case-insensitive
  bool json = false;
};

struct Row {
  const CatalogEntry* entry;
  ModelSpec spec;
  std::string note;
};

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// What sets a model apart for memory: experts, a vision tower, an encoder.
std::string NoteFor(const ModelSpec& spec) {
  std::vector<std::string> parts;
  if (spec.num_experts > 0) {
    const bool shared = spec.shared_expert_intermediate_size > 0;
    parts.push_back(fmt::format("MoE {} experts, top-{}{}", spec.num_experts,
                                spec.experts_per_token, shared ? " + shared expert" : ""));
  }
  if (std::any_of(spec.params.begin(), spec.params.end(),
                  [](const ParamTensor& p) { return p.role == ParamRole::kVision; })) {
    parts.push_back("vision tower + projector (multimodal)");
  }
  if (spec.is_encoder) parts.push_back("encoder (masked LM)");
  if (spec.is_flux) parts.push_back("diffusion transformer (MMDiT): --image-size, --text-len");
  if (spec.is_vae) parts.push_back("frozen VAE: --vae of a UNet or FLUX estimate");
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : "; ") + p;
  return out;
}

// 8030261248 -> "8.03B", 124439808 -> "124.4M".
std::string ShortCount(uint64_t n) {
  if (n >= 1'000'000'000) return fmt::format("{:.2f}B", static_cast<double>(n) / 1e9);
  return fmt::format("{:.1f}M", static_cast<double>(n) / 1e6);
}

bool Matches(const Row& row, const ModelsArgs& args) {
  if (!args.arch.empty()) {
    const std::string arch = Lower(args.arch);
    if (Lower(row.spec.model_type) != arch && Lower(row.spec.architecture) != arch) return false;
  }
  if (!args.filter.empty()) {
    const std::string needle = Lower(args.filter);
    bool any = false;
    for (const std::string& hay :
         {row.entry->alias, row.entry->hub_id, row.entry->family, row.spec.model_type}) {
      any = any || Lower(hay).find(needle) != std::string::npos;
    }
    if (!any) return false;
  }
  return true;
}

int RunModels(const ModelsArgs& args) {
  if (!args.arch.empty()) {
    const auto& types = SupportedModelTypes();
    const std::string arch = Lower(args.arch);
    bool known = std::find(types.begin(), types.end(), arch) != types.end();
    // A class name ("LlamaForCausalLM") is accepted when a catalog model has it.
    for (const CatalogEntry& e : ModelCatalog()) {
      if (known) break;
      Result<ModelSpec> spec = LoadCatalogModel(e.alias);
      known = spec.ok() && Lower(spec->architecture) == arch;
    }
    if (!known) {
      std::string list;
      for (const std::string& t : types) list += (list.empty() ? "" : ", ") + t;
      return FailBadInput(
          MakeError(fmt::format("--arch: {} is not a supported architecture (supported: {})",
                                common::QuoteForMessage(args.arch), list)));
    }
  }
  std::vector<Row> rows;
  for (const CatalogEntry& e : ModelCatalog()) {
    Result<ModelSpec> spec = LoadCatalogModel(e.alias);
    // Every catalog entry parses (ingest_test checks it): a failure is a bug.
    if (!spec.ok()) {
      std::fprintf(stderr, "vramscope: internal error: %s\n", spec.error().message.c_str());
      return kExitInternal;
    }
    Row row{&e, std::move(spec).value(), ""};
    if (!Matches(row, args)) continue;
    row.note = NoteFor(row.spec);
    rows.push_back(std::move(row));
  }
  if (args.json) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const Row& r : rows) {
      list.push_back({{"alias", r.entry->alias},
                      {"hub_id", r.entry->hub_id},
                      {"family", r.entry->family},
                      {"model_type", r.spec.model_type},
                      {"architecture", r.spec.architecture},
                      {"parameters", r.spec.ParameterCount()},
                      {"layers", r.spec.num_layers},
                      {"hidden_size", r.spec.hidden_size},
                      {"note", r.note}});
    }
    std::puts(list.dump(2).c_str());
    return kExitOk;
  }
  if (rows.empty()) {
    std::fprintf(stderr, "vramscope: no catalog model matches; `vramscope models` lists all\n");
    return kExitOk;
  }
  // Columns as wide as their longest cell (aliases such as
  // sd-image-variations-image-encoder and model types such as
  // flux_transformer_2d outgrow fixed widths), so every row lines up.
  size_t alias_width = 5, id_width = 15, arch_width = 4;
  for (const Row& r : rows) {
    alias_width = std::max(alias_width, r.entry->alias.size());
    id_width = std::max(id_width, r.entry->hub_id.size());
    arch_width = std::max(arch_width, r.spec.model_type.size());
  }
  std::puts(fmt::format("{:<{}} {:<{}} {:<{}} {:>9}  {}", "alias", alias_width, "Hugging Face id",
                        id_width, "arch", arch_width, "params", "note")
                .c_str());
  for (const Row& r : rows) {
    std::string line = fmt::format("{:<{}} {:<{}} {:<{}} {:>9}  {}", r.entry->alias, alias_width,
                                   r.entry->hub_id, id_width, r.spec.model_type, arch_width,
                                   ShortCount(r.spec.ParameterCount()), r.note);
    while (!line.empty() && line.back() == ' ') line.pop_back();
    std::puts(line.c_str());
  }
  return kExitOk;
}

RunFn SetupModels(CLI::App* sub) {
  auto args = std::make_shared<ModelsArgs>();
  sub->add_option("FILTER", args->filter,
                  "Only models whose alias, Hugging Face id, family or architecture contains this");
  sub->add_option("--arch", args->arch,
                  "Only models of this architecture (config.json model_type, e.g. llama, "
                  "qwen2_moe, or a class such as LlamaForCausalLM)");
  sub->add_flag("--json", args->json, "Print the catalog as JSON (integer parameter counts)");
  return [args] { return RunModels(*args); };
}

}  // namespace

extern const CommandSpec kModelsCommand = {"models", "List the bundled model catalog",
                                           &SetupModels};

}  // namespace vramscope::cli
