// ResolveModel: a config.json path, a model directory (config.json plus
// safetensors headers), a catalog alias / Hugging Face id, or a Hub id whose
// config.json is fetched (hub.h).
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "catalog_internal.h"
#include "config_reader.h"
#include "hub.h"
#include "param_list.h"
#include "safetensors.h"
#include "vramscope/model.h"

namespace vramscope {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kMaxConfigBytes = 16ULL << 20;   // config.json, index.json
constexpr size_t kMaxShards = 10'000;

Result<std::string> ReadSmallFile(const fs::path& path) {
  std::error_code ec;
  uint64_t size = fs::file_size(path, ec);
  if (ec) return MakeError(fmt::format("{}: cannot read: {}", path.string(), ec.message()));
  if (size > kMaxConfigBytes) {
    return MakeError(fmt::format("{}: {} bytes is too large for a JSON config (limit {})",
                                 path.string(), size, kMaxConfigBytes));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return MakeError(fmt::format("{}: cannot open", path.string()));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The parameter name without the wrapper prefixes that differ between a model
// class and its checkpoint ("transformer.h.0" vs "h.0", "language_model.model.x"
// vs "model.language_model.x"), and with TF-era LayerNorm gamma/beta spelled
// weight/bias, as transformers renames them on load.
std::string CanonicalName(std::string_view name) {
  static const std::set<std::string_view> kWrappers = {"model", "language_model", "transformer",
                                                       "base_model"};
  while (true) {
    size_t dot = name.find('.');
    if (dot == std::string_view::npos || kWrappers.count(name.substr(0, dot)) == 0) break;
    name.remove_prefix(dot + 1);
  }
  std::string out(name);
  auto replace_suffix = [&](std::string_view from, std::string_view to) {
    if (out.size() >= from.size() && out.compare(out.size() - from.size(), from.size(), from) == 0) {
      out.replace(out.size() - from.size(), from.size(), to);
    }
  };
  replace_suffix(".gamma", ".weight");
  replace_suffix(".beta", ".bias");
  return out;
}

// Non-parameter buffers that older checkpoints saved next to the weights:
// GPT-2 / GPT-NeoX causal masks, rotary inv_freq, BERT position_ids.
bool IsBufferName(std::string_view name) {
  for (std::string_view suffix : {".attn.bias", ".attn.masked_bias", ".attention.bias",
                                  ".attention.masked_bias", ".inv_freq", ".position_ids"}) {
    if (name.size() >= suffix.size() && name.substr(name.size() - suffix.size()) == suffix) {
      return true;
    }
  }
  return false;
}

// Layer index from "...layers.12." / "...h.12." / "...layer.12."; -1 if none.
int LayerOf(std::string_view name) {
  for (std::string_view marker : {"layers.", "h.", "layer."}) {
    size_t at = 0;
    while ((at = name.find(marker, at)) != std::string_view::npos) {
      bool boundary = at == 0 || name[at - 1] == '.';
      size_t digits = at + marker.size(), end = digits;
      while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
      // At most 6 digits: layer indices are below kMaxLayers, and a longer run
      // of digits is a name, not an index (std::stoi would throw on overflow).
      if (boundary && end > digits && end - digits <= 6 && end < name.size() &&
          name[end] == '.' && name.find("vision") == std::string_view::npos) {
        return std::stoi(std::string(name.substr(digits, end - digits)));
      }
      at += marker.size();
    }
  }
  return -1;
}

// Shard files of a model directory: those named by model.safetensors.index.json
// when present, else every *.safetensors file, sorted by name.
Result<std::vector<fs::path>> FindShards(const fs::path& dir) {
  std::vector<fs::path> shards;
  const fs::path index = dir / "model.safetensors.index.json";
  std::error_code ec;
  if (fs::is_regular_file(index, ec)) {
    Result<std::string> text = ReadSmallFile(index);
    if (!text.ok()) return text.error();
    if (ingest::JsonNestsDeeperThan(*text, ingest::kMaxJsonDepth)) {
      return MakeError(fmt::format("{}: JSON nested deeper than {} levels", index.string(),
                                   ingest::kMaxJsonDepth));
    }
    nlohmann::json root = nlohmann::json::parse(*text, nullptr, false);
    if (root.is_discarded() || !root.is_object()) {
      return MakeError(fmt::format("{}: not valid JSON", index.string()));
    }
    auto map = root.find("weight_map");
    if (map == root.end() || !map->is_object()) {
      return MakeError(fmt::format("{}: weight_map: missing or not an object", index.string()));
    }
    std::set<std::string> files;
    for (const auto& [tensor, file] : map->items()) {
      if (!file.is_string()) {
        return MakeError(fmt::format("{}: weight_map: {}: expected a file name", index.string(),
                                     ingest::QuoteForMessage(tensor, 120)));
      }
      std::string f = file.get<std::string>();
      // Only plain file names inside the directory: never follow a path out of it.
      if (f.empty() || f == "." || f == ".." || f.find('/') != std::string::npos ||
          f.find('\\') != std::string::npos) {
        return MakeError(fmt::format("{}: weight_map: {}: {} is not a file name in "
                                     "the model directory",
                                     index.string(), ingest::QuoteForMessage(tensor, 120),
                                     ingest::QuoteForMessage(f, 120)));
      }
      files.insert(f);
    }
    if (files.size() > kMaxShards) {
      return MakeError(fmt::format("{}: weight_map: {} shard files exceed the limit of {}",
                                   index.string(), files.size(), kMaxShards));
    }
    for (const std::string& f : files) {
      if (!fs::is_regular_file(dir / f, ec)) {
        return MakeError(fmt::format("{}: weight_map: shard {} is not in {}", index.string(),
                                     ingest::QuoteForMessage(f, 120), dir.string()));
      }
      shards.push_back(dir / f);
    }
    return shards;
  }
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    if (entry.is_regular_file(ec) && entry.path().extension() == ".safetensors") {
      shards.push_back(entry.path());
    }
  }
  if (ec) return MakeError(fmt::format("{}: cannot list: {}", dir.string(), ec.message()));
  if (shards.size() > kMaxShards) {
    return MakeError(fmt::format("{}: {} safetensors files exceed the limit of {}",
                                 dir.string(), shards.size(), kMaxShards));
  }
  std::sort(shards.begin(), shards.end());
  return shards;
}

// Replaces the config-derived parameter list by the tensors the checkpoint
// stores, keeping the config's module/role/layer annotations where names match.
Status MergeCheckpoint(ModelSpec& spec, const std::vector<fs::path>& shards) {
  std::map<std::string, size_t> by_name;  // canonical config name -> index
  for (size_t i = 0; i < spec.params.size(); ++i) {
    by_name.emplace(CanonicalName(spec.params[i].name), i);
  }
  std::vector<const ingest::SafetensorsTensor*> matched(spec.params.size(), nullptr);
  std::vector<ingest::SafetensorsTensor> all;
  std::vector<size_t> extras;
  std::set<std::string> seen;
  for (const fs::path& shard : shards) {
    Result<std::vector<ingest::SafetensorsTensor>> tensors = ingest::ReadSafetensorsHeader(shard);
    if (!tensors.ok()) return tensors.error();
    for (ingest::SafetensorsTensor& t : *tensors) {
      if (!seen.insert(t.name).second) {
        return MakeError(fmt::format("{}: tensor {} is stored in more than one shard",
                                     shard.string(), ingest::QuoteForMessage(t.name, 120)));
      }
      if (all.size() >= ingest::kMaxTensors) {
        return MakeError(fmt::format("{}: the checkpoint stores more than {} tensors",
                                     shard.string(), ingest::kMaxTensors));
      }
      all.push_back(std::move(t));
    }
  }
  size_t buffers = 0, reshaped = 0;
  for (size_t k = 0; k < all.size(); ++k) {
    auto it = by_name.find(CanonicalName(all[k].name));
    if (it != by_name.end() && matched[it->second] == nullptr) {
      matched[it->second] = &all[k];
    } else if (IsBufferName(all[k].name)) {
      ++buffers;
    } else {
      extras.push_back(k);
    }
  }
  std::vector<ParamTensor> params;
  size_t missing = 0;
  for (size_t i = 0; i < spec.params.size(); ++i) {
    ParamTensor p = spec.params[i];
    if (const ingest::SafetensorsTensor* t = matched[i]) {
      if (t->shape != p.shape) ++reshaped;
      p.shape = t->shape;
      p.numel = t->numel;
      p.stored_dtype = t->dtype;
    } else {
      ++missing;
    }
    params.push_back(std::move(p));
  }
  for (size_t k : extras) {
    const ingest::SafetensorsTensor& t = all[k];
    ParamTensor p;
    p.name = t.name;
    p.shape = t.shape;
    p.numel = t.numel;
    p.stored_dtype = t.dtype;
    p.layer = LayerOf(t.name);
    size_t dot = t.name.rfind('.');
    p.module = dot == std::string::npos ? t.name : t.name.substr(0, dot);
    p.role = ParamRole::kUnknown;
    params.push_back(std::move(p));
  }
  spec.params = std::move(params);
  spec.params_from_safetensors = true;
  if (buffers > 0) {
    spec.notes.push_back(fmt::format(
        "safetensors: skipped {} non-parameter buffers (attention masks, inv_freq, position_ids)",
        buffers));
  }
  if (!extras.empty()) {
    spec.notes.push_back(fmt::format(
        "safetensors: {} stored tensors are not created by the {} config (kept, role \"unknown\"; "
        "first: {})",
        extras.size(), spec.model_type, all[extras.front()].name));
  }
  if (missing > 0) {
    spec.notes.push_back(fmt::format(
        "safetensors: {} parameters the model creates are not in the checkpoint (transformers "
        "initialises them; kept with config shapes)",
        missing));
  }
  if (reshaped > 0) {
    spec.notes.push_back(fmt::format(
        "safetensors: {} tensors are stored with another shape than the config implies "
        "(quantized or packed?); the stored shapes are used",
        reshaped));
  }
  return Ok{};
}

Result<ModelSpec> LoadModelDirectory(const fs::path& dir, std::string_view name) {
  const fs::path config = dir / "config.json";
  std::error_code ec;
  if (!fs::is_regular_file(config, ec)) {
    return MakeError(fmt::format("{}: no config.json in this directory", name));
  }
  Result<std::string> text = ReadSmallFile(config);
  if (!text.ok()) return text.error();
  Result<ModelSpec> spec = ParseModelConfig(*text, config.string());
  if (!spec.ok()) return spec;
  spec->name = std::string(name);
  Result<std::vector<fs::path>> shards = FindShards(dir);
  if (!shards.ok()) return shards.error();
  if (!shards->empty()) {
    Status merged = MergeCheckpoint(*spec, *shards);
    if (!merged.ok()) return merged.error();
  }
  return spec;
}

}  // namespace

namespace ingest {

Result<ModelSpec> ResolveModelWithHub(std::string_view model, const HubLoader& load_hub) {
  if (model.empty()) return MakeError("model: empty name");
  const fs::path path{std::string(model)};
  std::error_code ec;
  fs::file_status status = fs::status(path, ec);
  if (fs::exists(status)) {
    if (fs::is_directory(status)) return LoadModelDirectory(path, model);
    if (fs::is_regular_file(status)) {
      Result<std::string> text = ReadSmallFile(path);
      if (!text.ok()) return text.error();
      return ParseModelConfig(*text, model);
    }
    return MakeError(fmt::format("{}: not a regular file or directory", model));
  }
  if (FindCatalogEntry(model) != nullptr) return LoadCatalogModel(model);
  if (LooksLikeHubId(model)) return load_hub(model);
  return MakeError(fmt::format(
      "{}: neither a config.json, a model directory, a catalog model (`vramscope models` lists "
      "them) nor a Hugging Face id (owner/name){}",
      model, DidYouMean(model)));
}

}  // namespace ingest

Result<ModelSpec> ResolveModel(std::string_view model) {
  return ingest::ResolveModelWithHub(model, [](std::string_view name) {
    // The library's only network access: see src/ingest/hub.h.
    std::unique_ptr<ingest::HttpFetcher> fetcher = ingest::MakeCurlFetcher();
    const ingest::HubSettings settings =
        ingest::ReadHubSettings([](const char* var) { return std::getenv(var); });
    return ingest::LoadHubModel(name, settings, *fetcher);
  });
}

}  // namespace vramscope
