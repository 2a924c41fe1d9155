// The catalog: every entry parses and its parameter count equals the count its
// publisher reports (data/models/<alias>.json: _vramscope.reference_parameters,
// with the source named in reference_source).
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "test_util.h"
#include "vramscope/model.h"

namespace vramscope {
namespace {

// Entries whose reference is a rounded published figure rather than an exact
// count, each with how close it must be and why. Empty today: every catalog
// reference is exact (checkpoint metadata, an index total_size, or a paper
// table), so every entry must match to the parameter. Add an entry here only
// with a reason, never to silence a mismatch.
struct Tolerance {
  double relative;
  const char* reason;
};
const std::map<std::string, Tolerance>& RoundedReferences() {
  static const std::map<std::string, Tolerance> kRounded = {};
  return kRounded;
}

TEST(CatalogTest, HasAtLeastFortyEntriesWithMetadata) {
  const auto& catalog = ModelCatalog();
  EXPECT_GE(catalog.size(), 40u);
  std::set<std::string> aliases, hub_ids;
  for (const CatalogEntry& e : catalog) {
    EXPECT_TRUE(aliases.insert(e.alias).second) << "duplicate alias " << e.alias;
    EXPECT_TRUE(hub_ids.insert(e.hub_id).second) << "duplicate hub id " << e.hub_id;
    EXPECT_FALSE(e.hub_id.empty()) << e.alias;
    EXPECT_FALSE(e.family.empty()) << e.alias;
    EXPECT_FALSE(e.reference_source.empty()) << e.alias;
    EXPECT_GT(e.reference_parameters, 0u) << e.alias;
  }
}

TEST(CatalogTest, CoversTheModelsTheIssueAsksFor) {
  for (const char* alias : {"llama-2-7b",      "llama-2-13b",       "llama-2-70b",
                            "llama-3-8b",      "llama-3-70b",       "llama-3.1-8b",
                            "llama-3.1-70b",   "llama-3.1-405b",    "llama-3.2-1b",
                            "llama-3.2-3b",    "llama-3.3-70b",     "mistral-7b-v0.1",
                            "mistral-7b-v0.3", "mixtral-8x7b",      "qwen1.5-7b",
                            "qwen2-7b",        "qwen2.5-0.5b",      "qwen2.5-1.5b",
                            "qwen2.5-7b",      "qwen2.5-14b",       "qwen2.5-32b",
                            "qwen2.5-72b",     "qwen1.5-moe-a2.7b", "qwen3-0.6b",
                            "qwen3-8b",        "qwen3-30b-a3b",     "gemma-2b",
                            "gemma-7b",        "gemma-2-2b",        "gemma-2-9b",
                            "gemma-2-27b",     "gemma-3-1b",        "gemma-3-4b",
                            "phi-2",           "phi-3-mini-4k",     "phi-4",
                            "falcon-7b",       "falcon-40b",        "gpt2",
                            "gpt2-xl",         "pythia-160m",       "pythia-1.4b",
                            "pythia-6.9b",     "opt-125m",          "opt-1.3b",
                            "opt-6.7b",        "bert-base-uncased", "bert-large-uncased",
                            "stablelm-2-1.6b", "smollm2-135m",      "smollm2-360m",
                            "smollm2-1.7b",    "tinyllama-1.1b",    "yi-6b",
                            "yi-34b"}) {
    Result<ModelSpec> spec = LoadCatalogModel(alias);
    EXPECT_TRUE(spec.ok()) << alias << ": " << (spec.ok() ? "" : spec.error().message);
  }
}

TEST(CatalogTest, EveryEntryMatchesItsReferenceParameterCount) {
  for (const CatalogEntry& e : ModelCatalog()) {
    SCOPED_TRACE(e.alias + " (" + e.reference_source + ")");
    Result<ModelSpec> spec = LoadCatalogModel(e.alias);
    ASSERT_TRUE(spec.ok()) << spec.error().message;
    const uint64_t ours = spec->ParameterCount();
    auto rounded = RoundedReferences().find(e.alias);
    if (rounded == RoundedReferences().end()) {
      EXPECT_EQ(ours, e.reference_parameters)
          << "difference " << static_cast<int64_t>(ours - e.reference_parameters);
    } else {
      double diff =
          std::abs(static_cast<double>(ours) - static_cast<double>(e.reference_parameters));
      EXPECT_LE(diff, rounded->second.relative * static_cast<double>(e.reference_parameters))
          << rounded->second.reason;
    }
  }
}

// The data files themselves: one per alias, named after it, metadata complete,
// and nothing but the config keys plus _vramscope.
TEST(CatalogTest, DataFilesAreNamedAfterTheirAlias) {
  namespace fs = std::filesystem;
  size_t files = 0;
  for (const auto& entry : fs::directory_iterator(fs::path(VS_SOURCE_DIR) / "data/models")) {
    if (entry.path().extension() != ".json") continue;
    ++files;
    std::ifstream in(entry.path());
    nlohmann::json root = nlohmann::json::parse(in, nullptr, false);
    ASSERT_FALSE(root.is_discarded()) << entry.path();
    const nlohmann::json& meta = root["_vramscope"];
    EXPECT_EQ(meta.value("alias", ""), entry.path().stem().string());
    for (const char* key :
         {"alias", "hub_id", "family", "reference_parameters", "reference_source"}) {
      EXPECT_TRUE(meta.contains(key)) << entry.path() << " lacks _vramscope." << key;
    }
    // transformers configs name their model_type; diffusers' their _class_name.
    EXPECT_TRUE(root.contains("model_type") || root.contains("_class_name")) << entry.path();
  }
  EXPECT_EQ(files, ModelCatalog().size()) << "the build embeds a stale catalog: re-run cmake";
}

// Published configs of every supported family are fuzz seeds
// (fuzz/corpus/model_config, docs/hardening.md): each catalog config is
// there byte for byte, and every model_type the parser supports has one.
// OPT-350m (do_layer_norm_before: false) once crashed the lowering.
TEST(CatalogTest, EveryFamilyHasAPublishedConfigAmongTheFuzzSeeds) {
  namespace fs = std::filesystem;
  const fs::path root(VS_SOURCE_DIR);
  std::set<std::string> families;
  for (const auto& entry : fs::directory_iterator(root / "data/models")) {
    if (entry.path().extension() != ".json") continue;
    std::ifstream in(entry.path(), std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ifstream seed_in(root / "fuzz/corpus/model_config" / entry.path().filename(),
                          std::ios::binary);
    const std::string seed((std::istreambuf_iterator<char>(seed_in)),
                           std::istreambuf_iterator<char>());
    EXPECT_EQ(seed, text) << entry.path().filename() << " is not a fuzz seed (copy it)";
    families.insert(nlohmann::json::parse(text).value("model_type", ""));
  }
  for (const std::string& type : SupportedModelTypes()) {
    EXPECT_TRUE(families.count(type)) << "no published config of " << type << " in data/models";
  }
}

TEST(CatalogTest, LooksUpAliasesAndHubIdsIgnoringCase) {
  Result<ModelSpec> by_alias = LoadCatalogModel("LLAMA-3-8B");
  ASSERT_TRUE(by_alias.ok());
  EXPECT_EQ(by_alias->name, "llama-3-8b");
  EXPECT_EQ(by_alias->hub_id, "meta-llama/Meta-Llama-3-8B");
  Result<ModelSpec> by_id = LoadCatalogModel("meta-llama/meta-llama-3-8b");
  ASSERT_TRUE(by_id.ok());
  EXPECT_EQ(by_id->name, "llama-3-8b");
}

TEST(CatalogTest, UnknownNameSuggestsCloseAliases) {
  Result<ModelSpec> spec = LoadCatalogModel("llama-3-8");
  ASSERT_FALSE(spec.ok());
  EXPECT_TRUE(ingest::testing::IsOneLine(spec.error().message));
  EXPECT_NE(spec.error().message.find("not in the model catalog"), std::string::npos);
  EXPECT_NE(spec.error().message.find("llama-3-8b"), std::string::npos) << spec.error().message;

  Result<ModelSpec> typo = LoadCatalogModel("mistrl-7b-v0.3");
  ASSERT_FALSE(typo.ok());
  EXPECT_NE(typo.error().message.find("mistral-7b-v0.3"), std::string::npos)
      << typo.error().message;

  Result<ModelSpec> far = LoadCatalogModel("zzzzzzzzzzzzzzzzzzzzzz");
  ASSERT_FALSE(far.ok());
  EXPECT_EQ(far.error().message.find("did you mean"), std::string::npos);
}

}  // namespace
}  // namespace vramscope
