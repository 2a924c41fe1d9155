// ResolveModel: a config.json path, a model directory (config.json plus
// safetensors headers), a catalog alias / Hugging Face id, or a Hub id whose
// config.json is fetched (hub.h). Files, variables and the network are the
// caller's (ModelIo, vramscope/model_io.h).
#include <algorithm>
#include <map>
#include <set>
#include <system_error>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "catalog_internal.h"
#include "config_reader.h"
#include "hub.h"
#include "param_list.h"
#include "safetensors.h"
#include "vramscope/common/decimal.h"
#include "vramscope/common/quote.h"
#include "vramscope/model.h"
#include "vramscope/model_io.h"

namespace vramscope {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kMaxConfigBytes = 16ULL << 20;  // config.json, index.json
constexpr size_t kMaxShards = 10'000;

Result<std::string> ReadSmallFile(const FileSystem& files, const fs::path& path) {
  const Result<uint64_t> size = files.FileSize(path);
  if (!size.ok()) {
    return MakeError(fmt::format("{}: cannot read: {}", path.string(), size.error().message));
  }
  if (*size > kMaxConfigBytes) {
    return MakeError(fmt::format("{}: {} bytes is too large for a JSON config (limit {})",
                                 path.string(), *size, kMaxConfigBytes));
  }
  std::optional<std::string> text = files.Read(path, 0, *size);
  if (!text) return MakeError(fmt::format("{}: cannot open", path.string()));
  return std::move(*text);
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
    if (out.size() >= from.size() &&
        out.compare(out.size() - from.size(), from.size(), from) == 0) {
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
      if (boundary && end > digits && end - digits <= 6 && end < name.size() && name[end] == '.' &&
          name.find("vision") == std::string_view::npos) {
        return static_cast<int>(*common::ParseDecimal(name.substr(digits, end - digits), 999999));
      }
      at += marker.size();
    }
  }
  return -1;
}

// Shard files of a model directory: those named by model.safetensors.index.json
// when present, else every *.safetensors file, sorted by name.
Result<std::vector<fs::path>> FindShards(const FileSystem& files, const fs::path& dir) {
  std::vector<fs::path> shards;
  const fs::path index = dir / "model.safetensors.index.json";
  if (files.Stat(index) == FileSystem::Kind::kRegularFile) {
    Result<std::string> text = ReadSmallFile(files, index);
    if (!text.ok()) return text.error();
    if (auto nul = common::FindNulByte(*text)) {
      return MakeError(fmt::format("{}: {}", index.string(), common::NulByteProblem(*nul)));
    }
    if (common::JsonNestsDeeperThan(*text, ingest::kMaxJsonDepth)) {
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
    std::set<std::string> names;
    for (const auto& [tensor, file] : map->items()) {
      if (!file.is_string()) {
        return MakeError(fmt::format("{}: weight_map: {}: expected a file name", index.string(),
                                     common::QuoteForMessage(tensor, 120)));
      }
      std::string f = file.get<std::string>();
      // Only plain file names inside the directory: never follow a path out of it.
      if (f.empty() || f == "." || f == ".." || f.find('/') != std::string::npos ||
          f.find('\\') != std::string::npos) {
        return MakeError(fmt::format(
            "{}: weight_map: {}: {} is not a file name in "
            "the model directory",
            index.string(), common::QuoteForMessage(tensor, 120), common::QuoteForMessage(f, 120)));
      }
      names.insert(f);
    }
    if (names.size() > kMaxShards) {
      return MakeError(fmt::format("{}: weight_map: {} shard files exceed the limit of {}",
                                   index.string(), names.size(), kMaxShards));
    }
    for (const std::string& f : names) {
      if (files.Stat(dir / f) != FileSystem::Kind::kRegularFile) {
        return MakeError(fmt::format("{}: weight_map: shard {} is not in {}", index.string(),
                                     common::QuoteForMessage(f, 120), dir.string()));
      }
      shards.push_back(dir / f);
    }
    return shards;
  }
  Result<std::vector<fs::path>> listed = files.ListFiles(dir);
  if (!listed.ok()) {
    return MakeError(fmt::format("{}: cannot list: {}", dir.string(), listed.error().message));
  }
  for (fs::path& file : *listed) {
    if (file.extension() == ".safetensors") shards.push_back(std::move(file));
  }
  if (shards.size() > kMaxShards) {
    return MakeError(fmt::format("{}: {} safetensors files exceed the limit of {}", dir.string(),
                                 shards.size(), kMaxShards));
  }
  std::sort(shards.begin(), shards.end());
  return shards;
}

// Every tensor of the shards, each name once, at most kMaxTensors.
Result<std::vector<ingest::SafetensorsTensor>> ReadCheckpoint(const FileSystem& files,
                                                              const std::vector<fs::path>& shards) {
  std::vector<ingest::SafetensorsTensor> all;
  std::set<std::string> seen;
  for (const fs::path& shard : shards) {
    Result<std::vector<ingest::SafetensorsTensor>> tensors =
        ingest::ReadSafetensorsHeader(files, shard);
    if (!tensors.ok()) return tensors.error();
    for (ingest::SafetensorsTensor& t : *tensors) {
      if (!seen.insert(t.name).second) {
        return MakeError(fmt::format("{}: tensor {} is stored in more than one shard",
                                     shard.string(), common::QuoteForMessage(t.name, 120)));
      }
      if (all.size() >= ingest::kMaxTensors) {
        return MakeError(fmt::format("{}: the checkpoint stores more than {} tensors",
                                     shard.string(), ingest::kMaxTensors));
      }
      all.push_back(std::move(t));
    }
  }
  return all;
}

// How the stored tensors relate to the config's parameters.
struct CheckpointMatch {
  // Per config parameter, the stored tensor of the same canonical name.
  std::vector<const ingest::SafetensorsTensor*> matched;
  std::vector<size_t> extras;  // stored tensors the config does not create
  size_t buffers = 0;          // stored non-parameter buffers, skipped
};

CheckpointMatch MatchCheckpoint(const std::vector<ParamTensor>& params,
                                const std::vector<ingest::SafetensorsTensor>& all) {
  std::map<std::string, size_t> by_name;  // canonical config name -> index
  for (size_t i = 0; i < params.size(); ++i) by_name.emplace(CanonicalName(params[i].name), i);
  CheckpointMatch m;
  m.matched.assign(params.size(), nullptr);
  for (size_t k = 0; k < all.size(); ++k) {
    auto it = by_name.find(CanonicalName(all[k].name));
    if (it != by_name.end() && m.matched[it->second] == nullptr) {
      m.matched[it->second] = &all[k];
    } else if (IsBufferName(all[k].name)) {
      ++m.buffers;
    } else {
      m.extras.push_back(k);
    }
  }
  return m;
}

// A stored tensor that the config does not create, kept as a parameter.
ParamTensor ExtraParam(const ingest::SafetensorsTensor& t) {
  ParamTensor p;
  p.name = t.name;
  p.shape = t.shape;
  p.numel = t.numel;
  p.stored_dtype = t.dtype;
  p.layer = LayerOf(t.name);
  size_t dot = t.name.rfind('.');
  p.module = dot == std::string::npos ? t.name : t.name.substr(0, dot);
  p.role = ParamRole::kUnknown;
  return p;
}

// The notes telling how far the checkpoint and the config disagree.
void AddCheckpointNotes(ModelSpec& spec, const CheckpointMatch& m,
                        const std::vector<ingest::SafetensorsTensor>& all, size_t missing,
                        size_t reshaped) {
  if (m.buffers > 0) {
    spec.notes.push_back(fmt::format(
        "safetensors: skipped {} non-parameter buffers (attention masks, inv_freq, position_ids)",
        m.buffers));
  }
  if (!m.extras.empty()) {
    spec.notes.push_back(fmt::format(
        "safetensors: {} stored tensors are not created by the {} config (kept, role \"unknown\"; "
        "first: {})",
        m.extras.size(), spec.model_type, all[m.extras.front()].name));
  }
  if (missing > 0) {
    spec.notes.push_back(fmt::format(
        "safetensors: {} parameters the model creates are not in the checkpoint (transformers "
        "initialises them; kept with config shapes)",
        missing));
  }
  if (reshaped > 0) {
    spec.notes.push_back(
        fmt::format("safetensors: {} tensors are stored with another shape than the config implies "
                    "(quantized or packed?); the stored shapes are used",
                    reshaped));
  }
}

// Replaces the config-derived parameter list by the tensors the checkpoint
// stores, keeping the config's module/role/layer annotations where names match.
Status MergeCheckpoint(const FileSystem& files, ModelSpec& spec,
                       const std::vector<fs::path>& shards) {
  Result<std::vector<ingest::SafetensorsTensor>> all = ReadCheckpoint(files, shards);
  if (!all.ok()) return all.error();
  const CheckpointMatch m = MatchCheckpoint(spec.params, *all);
  std::vector<ParamTensor> params;
  size_t missing = 0, reshaped = 0;
  for (size_t i = 0; i < spec.params.size(); ++i) {
    ParamTensor p = spec.params[i];
    if (const ingest::SafetensorsTensor* t = m.matched[i]) {
      if (t->shape != p.shape) ++reshaped;
      p.shape = t->shape;
      p.numel = t->numel;
      p.stored_dtype = t->dtype;
    } else {
      ++missing;
    }
    params.push_back(std::move(p));
  }
  for (size_t k : m.extras) params.push_back(ExtraParam((*all)[k]));
  spec.params = std::move(params);
  spec.params_from_safetensors = true;
  AddCheckpointNotes(spec, m, *all, missing, reshaped);
  return Ok{};
}

Result<ModelSpec> LoadModelDirectory(const FileSystem& files, const fs::path& dir,
                                     std::string_view name) {
  const fs::path config = dir / "config.json";
  if (files.Stat(config) != FileSystem::Kind::kRegularFile) {
    return MakeError(fmt::format("{}: no config.json in this directory", name));
  }
  Result<std::string> text = ReadSmallFile(files, config);
  if (!text.ok()) return text.error();
  Result<ModelSpec> spec = ParseModelConfig(*text, config.string());
  if (!spec.ok()) return spec;
  spec->name = std::string(name);
  Result<std::vector<fs::path>> shards = FindShards(files, dir);
  if (!shards.ok()) return shards.error();
  if (!shards->empty()) {
    Status merged = MergeCheckpoint(files, *spec, *shards);
    if (!merged.ok()) return merged.error();
  }
  return spec;
}

// No file exists, nothing can be written: a ModelIo without files.
class NoFiles final : public FileSystem {
 public:
  Kind Stat(const fs::path&) const override { return Kind::kMissing; }
  Result<uint64_t> FileSize(const fs::path&) const override {
    return MakeError("no file system was given");
  }
  std::optional<std::string> Read(const fs::path&, uint64_t, uint64_t) const override {
    return std::nullopt;
  }
  Result<std::vector<fs::path>> ListFiles(const fs::path&) const override {
    return MakeError("no file system was given");
  }
  std::string WriteAtomically(const fs::path& path, std::string_view) const override {
    return fmt::format("cannot write {}: no file system was given", path.string());
  }
};

}  // namespace

namespace ingest {

namespace {

// MODEL as an error message shows it: the name may come from a results file
// (validate), so control characters are escaped (a catalog alias or an
// ordinary path reads unchanged).
std::string Shown(std::string_view model) { return common::QuoteForMessage(model, 200, '\0'); }

// Why a path that Stat() calls missing cannot be examined, when it exists in
// some form: a symbolic link loop, a folder on the way without permission.
// Empty when it is simply not there (then MODEL may be a catalog alias or a
// Hub id), or when the file system gives no reason. The reason is the
// system's, from FileSize.
std::string WhyNotExamined(const FileSystem& files, const fs::path& path) {
  Result<uint64_t> size = files.FileSize(path);
  if (size.ok()) return {};
  const std::string& reason = size.error().message;
  for (std::errc e : {std::errc::too_many_symbolic_link_levels, std::errc::permission_denied,
                      std::errc::filename_too_long, std::errc::io_error}) {
    if (reason == std::make_error_code(e).message()) return reason;
  }
  return {};
}

}  // namespace

const FileSystem& NoFileSystem() {
  static const NoFiles none;
  return none;
}

Result<ModelSpec> ResolveModelWithHub(std::string_view model, const FileSystem& files,
                                      const HubLoader& load_hub) {
  if (model.empty()) return MakeError("model: empty name");
  const fs::path path{std::string(model)};
  switch (files.Stat(path)) {
    case FileSystem::Kind::kDirectory: return LoadModelDirectory(files, path, model);
    case FileSystem::Kind::kRegularFile: {
      Result<std::string> text = ReadSmallFile(files, path);
      if (!text.ok()) return text.error();
      return ParseModelConfig(*text, model);
    }
    case FileSystem::Kind::kOther:
      return MakeError(fmt::format("{}: not a regular file or directory", Shown(model)));
    case FileSystem::Kind::kMissing:
      if (std::string why = WhyNotExamined(files, path); !why.empty()) {
        return MakeError(fmt::format("{}: cannot be examined ({})", Shown(model), why));
      }
      break;
  }
  if (FindCatalogEntry(model) != nullptr) return LoadCatalogModel(model);
  if (LooksLikeHubId(model)) return load_hub(model);
  return MakeError(fmt::format(
      "{}: neither a config.json, a model directory, a catalog model (`vramscope models` lists "
      "them) nor a Hugging Face id (owner/name){}",
      Shown(model), DidYouMean(model)));
}

}  // namespace ingest

Result<ModelSpec> ResolveModel(std::string_view model, const ModelIo& io) {
  const FileSystem& files = io.files != nullptr ? *io.files : ingest::NoFileSystem();
  return ingest::ResolveModelWithHub(model, files, [&](std::string_view name) -> Result<ModelSpec> {
    if (io.http == nullptr) {
      return MakeError(fmt::format(
          "{}: not in the catalog, and this program reads no Hugging Face Hub ids (pass a "
          "config.json path)",
          name));
    }
    const ingest::HubSettings settings = ingest::ReadHubSettings(io.env, files);
    return ingest::LoadHubModel(name, settings, files, *io.http);
  });
}

}  // namespace vramscope
