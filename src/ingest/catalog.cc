// The built-in model catalog: data/models/<alias>.json, embedded at build time.
#include <algorithm>
#include <cctype>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "catalog_data.h"
#include "catalog_internal.h"
#include "vramscope/model.h"

namespace vramscope {
namespace {

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

struct Catalog {
  std::vector<CatalogEntry> entries;
  std::vector<std::string_view> texts;  // config.json text of entries[i]
};

// Built once from the embedded files. A malformed catalog file is a build
// defect (the catalog tests parse every entry), so it aborts.
const Catalog& GetCatalog() {
  static const Catalog kCatalog = [] {
    Catalog c;
    for (size_t i = 0; i < ingest::kCatalogFileCount; ++i) {
      const ingest::EmbeddedFile& f = ingest::kCatalogFiles[i];
      nlohmann::json root = nlohmann::json::parse(f.text, nullptr, false);
      VS_CHECK(!root.is_discarded() && root.is_object());
      auto meta = root.find("_vramscope");
      VS_CHECK(meta != root.end() && meta->is_object());
      CatalogEntry e;
      e.alias = meta->value("alias", "");
      e.hub_id = meta->value("hub_id", "");
      e.family = meta->value("family", "");
      e.reference_parameters = meta->value("reference_parameters", uint64_t{0});
      e.reference_source = meta->value("reference_source", "");
      VS_CHECK(!e.alias.empty() && e.reference_parameters > 0);
      c.entries.push_back(std::move(e));
      c.texts.push_back(f.text);
    }
    return c;
  }();
  return kCatalog;
}

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

namespace ingest {

const CatalogEntry* FindCatalogEntry(std::string_view name) {
  const std::string key = Lower(name);
  for (const CatalogEntry& e : GetCatalog().entries) {
    if (Lower(e.alias) == key || (!e.hub_id.empty() && Lower(e.hub_id) == key)) return &e;
  }
  return nullptr;
}

std::vector<std::string> SuggestCatalogAliases(std::string_view name, size_t max_count) {
  const std::string key = Lower(name);
  if (key.empty()) return {};
  const size_t limit = std::max<size_t>(3, key.size() / 3);
  // The edit distance is at least the difference in length: a name far
  // longer than a candidate cannot be close to it, and is not compared (a
  // 100 000-character name would otherwise cost seconds).
  auto distance = [&](std::string_view candidate) {
    return key.size() > candidate.size() + limit ? SIZE_MAX : EditDistance(key, candidate);
  };
  std::vector<std::pair<size_t, std::string>> scored;
  for (const CatalogEntry& e : GetCatalog().entries) {
    size_t best = SIZE_MAX;
    for (const std::string& candidate : {Lower(e.alias), Lower(e.hub_id)}) {
      if (candidate.empty()) continue;
      size_t d = distance(candidate);
      // The part after the organisation ("meta-llama/") matters most.
      size_t slash = candidate.find('/');
      if (slash != std::string::npos) {
        d = std::min(d, distance(std::string_view(candidate).substr(slash + 1)));
      }
      if (key.size() >= 3 && candidate.find(key) != std::string::npos) d = std::min<size_t>(d, 1);
      best = std::min(best, d);
    }
    if (best <= limit) scored.emplace_back(best, e.alias);
  }
  std::stable_sort(scored.begin(), scored.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> out;
  for (const auto& [score, alias] : scored) {
    if (out.size() == max_count) break;
    out.push_back(alias);
  }
  return out;
}

std::string DidYouMean(std::string_view name) {
  std::vector<std::string> close = SuggestCatalogAliases(name, 5);
  if (close.empty()) return "";
  std::string out = "; did you mean ";
  for (size_t i = 0; i < close.size(); ++i) {
    if (i > 0) out += ", ";
    out += close[i];
  }
  return out + "?";
}

// An instruction- or chat-tuned checkpoint keeps its base model's
// architecture (the same config.json but for token ids and chat settings:
// meta-llama/Llama-3.1-8B and -Instruct, Qwen/Qwen2.5-7B and -Instruct,
// google/gemma-2-9b and -it, mistralai/Mistral-7B-v0.3 and
// Mistral-7B-Instruct-v0.3), so it trains in the same memory.
std::string BaseModelHint(std::string_view repo_id) {
  static constexpr std::string_view kTunedParts[] = {"-instruct", "-chat", "-it"};
  const std::string lower = Lower(repo_id);
  for (std::string_view part : kTunedParts) {
    const size_t at = lower.find(part);
    const size_t end = at + part.size();
    if (at == std::string::npos || (end < lower.size() && lower[end] != '-')) continue;
    const std::string base = std::string(repo_id.substr(0, at)) + std::string(repo_id.substr(end));
    if (const CatalogEntry* e = FindCatalogEntry(base)) {
      return fmt::format(
          "; its base model {} has the same architecture and is in the catalog: pass {} to "
          "estimate it offline",
          e->hub_id, e->alias);
    }
  }
  return "";
}

}  // namespace ingest

const std::vector<CatalogEntry>& ModelCatalog() { return GetCatalog().entries; }

Result<ModelSpec> LoadCatalogModel(std::string_view alias_or_id) {
  const CatalogEntry* e = ingest::FindCatalogEntry(alias_or_id);
  if (e == nullptr) {
    return MakeError(fmt::format("{}: not in the model catalog{}", alias_or_id,
                                 ingest::DidYouMean(alias_or_id)));
  }
  const Catalog& c = GetCatalog();
  size_t index = static_cast<size_t>(e - c.entries.data());
  Result<ModelSpec> spec = ParseModelConfig(c.texts[index], "catalog " + e->alias);
  if (!spec.ok()) return spec;
  spec->name = e->alias;
  spec->hub_id = e->hub_id;
  return spec;
}

}  // namespace vramscope
