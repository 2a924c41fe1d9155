// ResolveModel: config.json files, model directories with safetensors headers
// (fixtures generated here: real headers followed by zero bytes), catalog names.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "test_util.h"
#include "vramscope/local_io.h"
#include "vramscope/model.h"
#include "vramscope/model_io.h"

namespace vramscope {
namespace {

namespace fs = std::filesystem;
using ingest::testing::FakeTensor;
using ingest::testing::IsOneLine;
using ingest::testing::MakeSafetensors;
using ingest::testing::TempDir;

// ResolveModel with the disk and without the Hub.
Result<ModelSpec> Resolve(std::string_view model) {
  ModelIo io;
  io.files = &DiskFileSystem();
  return ResolveModel(model, io);
}
using ingest::testing::WriteFile;

// A two-layer llama small enough to write out in full.
constexpr const char* kTinyLlama = R"({"model_type": "llama", "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 128, "tie_word_embeddings": false})";

// Every parameter of kTinyLlama as a fake safetensors tensor.
std::vector<FakeTensor> TinyLlamaTensors(const char* dtype) {
  Result<ModelSpec> spec = ParseModelConfig(kTinyLlama, "tiny");
  EXPECT_TRUE(spec.ok());
  std::vector<FakeTensor> out;
  for (const ParamTensor& p : spec->params) out.push_back({p.name, dtype, p.shape});
  return out;
}

TEST(ResolveModelTest, ConfigJsonPath) {
  TempDir dir;
  WriteFile(dir.path() / "config.json", kTinyLlama);
  Result<ModelSpec> spec = Resolve((dir.path() / "config.json").string());
  ASSERT_TRUE(spec.ok()) << spec.error().message;
  EXPECT_FALSE(spec->params_from_safetensors);
  EXPECT_EQ(spec->hidden_size, 64u);
}

TEST(ResolveModelTest, DirectoryWithConfigOnly) {
  TempDir dir;
  WriteFile(dir.path() / "config.json", kTinyLlama);
  Result<ModelSpec> spec = Resolve(dir.path().string());
  ASSERT_TRUE(spec.ok()) << spec.error().message;
  EXPECT_EQ(spec->name, dir.path().string());
  EXPECT_FALSE(spec->params_from_safetensors);
}

TEST(ResolveModelTest, DirectoryWithSafetensorsTakesStoredNamesShapesAndDtypes) {
  TempDir dir;
  WriteFile(dir.path() / "config.json", kTinyLlama);
  std::vector<FakeTensor> tensors = TinyLlamaTensors("BF16");
  uint64_t expected = ParseModelConfig(kTinyLlama, "tiny")->ParameterCount();
  // An old-style rotary buffer (skipped) and a tensor the config does not create (kept).
  tensors.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", "F32", {8}});
  tensors.push_back({"model.extra_scale", "F32", {3}});
  // A digit run too long to be a layer index must not break layer parsing.
  tensors.push_back({"model.layers.99999999999999999999999.extra", "F32", {1}});
  WriteFile(dir.path() / "model.safetensors", MakeSafetensors(tensors));
  Result<ModelSpec> spec = Resolve(dir.path().string());
  ASSERT_TRUE(spec.ok()) << spec.error().message;
  EXPECT_TRUE(spec->params_from_safetensors);
  EXPECT_EQ(spec->ParameterCount(), expected + 3 + 1);
  EXPECT_EQ(spec->params.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(spec->params.front().stored_dtype, "BF16");
  EXPECT_EQ(spec->params.front().role, ParamRole::kEmbed);
  const ParamTensor& extra = spec->params[spec->params.size() - 2];
  EXPECT_EQ(extra.name, "model.extra_scale");
  EXPECT_EQ(extra.role, ParamRole::kUnknown);
  EXPECT_EQ(extra.layer, -1);
  EXPECT_EQ(spec->params.back().layer, -1);
  std::string notes;
  for (const std::string& n : spec->notes) notes += n + "\n";
  EXPECT_NE(notes.find("skipped 1 non-parameter buffers"), std::string::npos) << notes;
  EXPECT_NE(notes.find("model.extra_scale"), std::string::npos) << notes;
}

TEST(ResolveModelTest, ShardedCheckpointWithIndex) {
  TempDir dir;
  WriteFile(dir.path() / "config.json", kTinyLlama);
  std::vector<FakeTensor> all = TinyLlamaTensors("F32");
  std::vector<FakeTensor> first(all.begin(), all.begin() + 5), second(all.begin() + 5, all.end());
  WriteFile(dir.path() / "model-00001-of-00002.safetensors", MakeSafetensors(first));
  WriteFile(dir.path() / "model-00002-of-00002.safetensors", MakeSafetensors(second));
  // A stray shard not named by the index must be ignored.
  WriteFile(dir.path() / "stray.safetensors", MakeSafetensors({{"junk", "F32", {7}}}));
  std::string index = R"({"metadata": {"total_size": 0}, "weight_map": {)";
  for (size_t i = 0; i < all.size(); ++i) {
    if (i > 0) index += ",";
    index +=
        fmt::format("\"{}\": \"model-0000{}-of-00002.safetensors\"", all[i].name, i < 5 ? 1 : 2);
  }
  WriteFile(dir.path() / "model.safetensors.index.json", index + "}}");
  Result<ModelSpec> spec = Resolve(dir.path().string());
  ASSERT_TRUE(spec.ok()) << spec.error().message;
  EXPECT_EQ(spec->ParameterCount(), ParseModelConfig(kTinyLlama, "t")->ParameterCount());
  EXPECT_EQ(spec->params.back().stored_dtype, "F32");
  EXPECT_TRUE(spec->notes.empty()) << spec->notes.front();
}

TEST(ResolveModelTest, Gpt2StyleCheckpointWithoutPrefixAndWithMaskBuffers) {
  TempDir dir;
  const char* config = R"({"model_type": "gpt2", "n_embd": 16, "n_head": 2, "n_layer": 1,
                          "n_positions": 8, "vocab_size": 10})";
  WriteFile(dir.path() / "config.json", config);
  std::vector<FakeTensor> tensors;
  const ModelSpec from_config = ParseModelConfig(config, "g").value();
  for (const ParamTensor& p : from_config.params) {
    // GPT-2 checkpoints store the base model: "h.0.attn.c_attn.weight", not "transformer.h...".
    tensors.push_back({p.name.substr(std::string("transformer.").size()), "F32", p.shape});
  }
  tensors.push_back({"h.0.attn.bias", "F32", {1, 1, 8, 8}});  // causal mask buffer
  WriteFile(dir.path() / "model.safetensors", MakeSafetensors(tensors));
  Result<ModelSpec> spec = Resolve(dir.path().string());
  ASSERT_TRUE(spec.ok()) << spec.error().message;
  EXPECT_EQ(spec->ParameterCount(), from_config.ParameterCount());
  EXPECT_EQ(spec->params.front().name, "transformer.wte.weight");
  EXPECT_EQ(spec->params.front().stored_dtype, "F32");
}

TEST(ResolveModelTest, CatalogAliasAndHubId) {
  Result<ModelSpec> alias = Resolve("qwen2.5-0.5b");
  ASSERT_TRUE(alias.ok()) << alias.error().message;
  EXPECT_EQ(alias->hub_id, "Qwen/Qwen2.5-0.5B");
  Result<ModelSpec> id = Resolve("Qwen/Qwen2.5-0.5B");
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(id->name, "qwen2.5-0.5b");
}

void ExpectError(const Result<ModelSpec>& r, const std::string& part) {
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(IsOneLine(r.error().message)) << r.error().message;
  EXPECT_NE(r.error().message.find(part), std::string::npos) << r.error().message;
}

TEST(ResolveModelErrorsTest, UnknownNameIsNeitherPathNorCatalog) {
  // No '/': not a Hub id either, so no network (hub_test.cc covers Hub ids).
  Result<ModelSpec> r = Resolve("Meta-Llama-3-8");
  ExpectError(r, "neither a config.json, a model directory, a catalog model");
  ExpectError(r, "llama-3-8b");
  ExpectError(Resolve(""), "empty");
}

TEST(ResolveModelErrorsTest, DirectoryWithoutConfig) {
  TempDir dir;
  WriteFile(dir.path() / "model.safetensors", MakeSafetensors({{"w", "F32", {1}}}));
  ExpectError(Resolve(dir.path().string()), "no config.json in this directory");
}

TEST(ResolveModelErrorsTest, BadConfigInDirectoryNamesTheFile) {
  TempDir dir;
  WriteFile(dir.path() / "config.json", R"({"model_type": "llama", "hidden_size": "big"})");
  ExpectError(Resolve(dir.path().string()),
              (dir.path() / "config.json").string() + ": hidden_size");
}

TEST(ResolveModelErrorsTest, LyingSafetensorsHeaderInDirectory) {
  TempDir dir;
  WriteFile(dir.path() / "config.json", kTinyLlama);
  std::string bytes = MakeSafetensors(TinyLlamaTensors("BF16"));
  ingest::testing::SetHeaderLength(bytes, bytes.size() * 2);
  WriteFile(dir.path() / "model.safetensors", bytes);
  ExpectError(Resolve(dir.path().string()), "model.safetensors: header length");
}

// Limits of docs/hardening.md: index nesting, tensors in a checkpoint.
TEST(ResolveModelErrorsTest, HostileIndexAndTooManyTensors) {
  TempDir dir;
  WriteFile(dir.path() / "config.json", kTinyLlama);
  WriteFile(dir.path() / "model.safetensors.index.json", std::string(100000, '['));
  ExpectError(Resolve(dir.path().string()), "nested deeper than 64 levels");
  WriteFile(dir.path() / "model.safetensors.index.json",
            R"({"weight_map": {"w\u001b[2J\n": "../x"}})");
  ExpectError(Resolve(dir.path().string()), R"(weight_map: "w\x1b[2J\x0a": "../x" is not)");

  TempDir many;
  WriteFile(many.path() / "config.json", kTinyLlama);
  // 200 001 empty tensors over two shards: one more than kMaxTensors.
  for (int shard = 0; shard < 2; ++shard) {
    std::vector<FakeTensor> tensors;
    for (int i = 0; i < 100001 - shard; ++i) {
      tensors.push_back({fmt::format("extra.{}.{}", shard, i), "U8", {0}});
    }
    WriteFile(many.path() / fmt::format("model-{}.safetensors", shard), MakeSafetensors(tensors));
  }
  ExpectError(Resolve(many.path().string()), "stores more than 200000 tensors");
}

TEST(ResolveModelErrorsTest, IndexMustNotPointOutsideTheDirectory) {
  TempDir dir;
  WriteFile(dir.path() / "config.json", kTinyLlama);
  WriteFile(dir.path() / "model.safetensors.index.json",
            R"({"weight_map": {"model.embed_tokens.weight": "../elsewhere.safetensors"}})");
  ExpectError(Resolve(dir.path().string()), "is not a file name in the model directory");
  WriteFile(dir.path() / "model.safetensors.index.json",
            R"({"weight_map": {"model.embed_tokens.weight": "missing.safetensors"}})");
  ExpectError(Resolve(dir.path().string()), "shard \"missing.safetensors\" is not in");
  WriteFile(dir.path() / "model.safetensors.index.json", R"({"weight_map": [1]})");
  ExpectError(Resolve(dir.path().string()), "weight_map: missing or not an object");
}

TEST(ResolveModelErrorsTest, TensorInTwoShards) {
  TempDir dir;
  WriteFile(dir.path() / "config.json", kTinyLlama);
  WriteFile(dir.path() / "a.safetensors", MakeSafetensors({{"model.norm.weight", "F32", {64}}}));
  WriteFile(dir.path() / "b.safetensors", MakeSafetensors({{"model.norm.weight", "F32", {64}}}));
  ExpectError(Resolve(dir.path().string()), "stored in more than one shard");
}

}  // namespace
}  // namespace vramscope
