// Hub fetch without a network: id validation, settings from a fake
// environment, URLs, cache keys, the mapping of Hub answers to errors, the
// cache and the resolve order, with a fake HttpFetcher that records requests.
#include "hub.h"

#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "test_util.h"
#include "vramscope/local_io.h"
#include "vramscope/model.h"

namespace vramscope::ingest {
namespace {

namespace fs = std::filesystem;
using testing::IsOneLine;
using testing::TempDir;

// testing::WriteFile, creating the parent directories first.
void WriteFile(const fs::path& path, const std::string& bytes) {
  fs::create_directories(path.parent_path());
  testing::WriteFile(path, bytes);
}

constexpr const char* kTinyLlama = R"({"model_type": "llama", "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 128, "tie_word_embeddings": false})";

// Answers every GET with `next` and remembers what was asked.
class FakeFetcher final : public HttpFetcher {
 public:
  HttpResponse next;
  std::vector<HttpRequest> requests;
  HttpResponse Get(const HttpRequest& request) override {
    requests.push_back(request);
    return next;
  }
};

HttpResponse Ok(std::string body) {
  HttpResponse r;
  r.status = 200;
  r.body = std::move(body);
  return r;
}

HttpResponse Status(long status, std::string error_code = "", std::string error_message = "") {
  HttpResponse r;
  r.status = status;
  r.error_code = std::move(error_code);
  r.error_message = std::move(error_message);
  return r;
}

HubRef Ref(const std::string& name) {
  Result<HubRef> ref = ParseHubRef(name);
  EXPECT_TRUE(ref.ok()) << ref.error().message;
  return ref.ok() ? *ref : HubRef{};
}

void ExpectErrorMentions(const Error& e, std::initializer_list<std::string> parts) {
  EXPECT_TRUE(IsOneLine(e.message)) << e.message;
  for (const std::string& part : parts) {
    EXPECT_NE(e.message.find(part), std::string::npos)
        << "\"" << part << "\" not in: " << e.message;
  }
}

TEST(HubIdTest, ValidIdsAndRevisions) {
  HubRef plain = Ref("meta-llama/Meta-Llama-3-8B");
  EXPECT_EQ(plain.repo_id, "meta-llama/Meta-Llama-3-8B");
  EXPECT_EQ(plain.revision, "main");
  EXPECT_FALSE(plain.explicit_revision);
  HubRef pinned = Ref("Qwen/Qwen2.5-0.5B@0123abcd");
  EXPECT_EQ(pinned.repo_id, "Qwen/Qwen2.5-0.5B");
  EXPECT_EQ(pinned.revision, "0123abcd");
  EXPECT_TRUE(pinned.explicit_revision);
  EXPECT_EQ(Ref("user_1/model.v2-x@refs/pr/1").revision, "refs/pr/1");
  EXPECT_EQ(Ref("a/" + std::string(96, 'b')).repo_id.size(), 98u);
}

TEST(HubIdTest, InvalidIdsSayWhichRuleIsBroken) {
  const std::map<std::string, std::string> cases = {
      {"owner/na me", "character ' '"},
      {"owner/na$me", "character '$'"},
      {"owner/", "name is empty"},
      {"/name", "owner is empty"},
      {"a/b/c", "more than one '/'"},
      {"justaname", "no '/'"},
      {"-owner/name", "start and end with a letter"},
      {"owner/name.", "start and end with a letter"},
      {"ow--ner/name", "\"--\""},
      {"owner/na..me", "\"..\""},
      {"owner/name.git", ".git"},
      {"owner/" + std::string(97, 'x'), "longer than 96"},
      {"owner/name@", "revision after '@' is empty"},
      {"owner/name@../x", "revision must not"},
      {"owner/name@a//b", "revision must not"},
      {"owner/name@x/", "revision must not"},
      {"owner/name@x y", "revision has the character ' '"},
      {"owner/name@" + std::string(256, 'r'), "longer than 255"},
  };
  for (const auto& [name, problem] : cases) {
    Result<HubRef> ref = ParseHubRef(name);
    ASSERT_FALSE(ref.ok()) << name;
    ExpectErrorMentions(ref.error(), {name.substr(0, 40), "not a valid Hugging Face id", problem});
  }
}

TEST(HubIdTest, LooksLikeHubIdOnlyForOwnerSlashName) {
  for (const char* yes : {"a/b", "meta-llama/Meta-Llama-3-8B", "a/b@refs/pr/1", "a b/c"}) {
    EXPECT_TRUE(LooksLikeHubId(yes)) << yes;
  }
  for (const char* no : {"a", "llama-3-8b", "./a/b", "../a/b", "/abs/path", "~/x/y", "a/b/c",
                         "models/config.json", "a/", "/b", "@x/y"}) {
    EXPECT_FALSE(LooksLikeHubId(no)) << no;
  }
}

TEST(HubUrlTest, ResolveUrlOfConfigJson) {
  EXPECT_EQ(HubConfigUrl(Ref("meta-llama/Meta-Llama-3-8B"), "https://huggingface.co"),
            "https://huggingface.co/meta-llama/Meta-Llama-3-8B/resolve/main/config.json");
  EXPECT_EQ(HubConfigUrl(Ref("a/b@v1.0"), "http://127.0.0.1:8080"),
            "http://127.0.0.1:8080/a/b/resolve/v1.0/config.json");
  // huggingface_hub quotes the revision with safe="": '/' becomes %2F.
  EXPECT_EQ(HubConfigUrl(Ref("a/b@refs/pr/1"), "https://hf-mirror.com"),
            "https://hf-mirror.com/a/b/resolve/refs%2Fpr%2F1/config.json");
}

// A fake environment: variables from a map, nullptr for the rest.
EnvLookup Env(std::map<std::string, std::string> vars) {
  auto shared = std::make_shared<std::map<std::string, std::string>>(std::move(vars));
  return [shared](const char* name) -> const char* {
    auto it = shared->find(name);
    return it == shared->end() ? nullptr : it->second.c_str();
  };
}

TEST(HubSettingsTest, DefaultsFollowHuggingfaceHub) {
  TempDir home;
  WriteFile(home.path() / ".cache/huggingface/token", "hf_fromfile\n");
  HubSettings s = ReadHubSettings(Env({{"HOME", home.path().string()}}), DiskFileSystem());
  EXPECT_EQ(s.endpoint, "https://huggingface.co");
  EXPECT_EQ(s.cache_dir, home.path() / ".cache" / "vramscope");
  EXPECT_EQ(s.token, "hf_fromfile");
  EXPECT_FALSE(s.offline);
  EXPECT_EQ(s.connect_timeout_s, 10);
  EXPECT_EQ(s.total_timeout_s, 30);
  EXPECT_EQ(s.max_config_bytes, 4u << 20);
}

TEST(HubSettingsTest, EnvironmentOverrides) {
  TempDir dir;
  WriteFile(dir.path() / "hf/token", "  hf_home_token \r\n");
  WriteFile(dir.path() / "elsewhere", "hf_token_path");
  const std::string d = dir.path().string();
  HubSettings s = ReadHubSettings(Env({{"HOME", d},
                                       {"HF_ENDPOINT", "http://mirror.local:9000//"},
                                       {"VRAMSCOPE_CACHE", d + "/vc"},
                                       {"XDG_CACHE_HOME", d + "/xdg"},
                                       {"HF_HOME", d + "/hf"}}),
                                  DiskFileSystem());
  EXPECT_EQ(s.endpoint, "http://mirror.local:9000");
  EXPECT_EQ(s.cache_dir, fs::path(d + "/vc"));
  EXPECT_EQ(s.token, "hf_home_token");

  s = ReadHubSettings(Env({{"HOME", d},
                           {"XDG_CACHE_HOME", d + "/xdg"},
                           {"HF_TOKEN_PATH", d + "/elsewhere"},
                           {"HF_HOME", d + "/hf"}}),
                      DiskFileSystem());
  EXPECT_EQ(s.cache_dir, fs::path(d + "/xdg") / "vramscope");
  EXPECT_EQ(s.token, "hf_token_path");

  // A relative XDG_CACHE_HOME is ignored (XDG base directory spec).
  s = ReadHubSettings(Env({{"HOME", d}, {"XDG_CACHE_HOME", "rel"}}), DiskFileSystem());
  EXPECT_EQ(s.cache_dir, fs::path(d) / ".cache" / "vramscope");

  s = ReadHubSettings(Env({{"HF_TOKEN", "hf_env"},
                           {"HUGGING_FACE_HUB_TOKEN", "hf_legacy"},
                           {"HF_HOME", d + "/hf"}}),
                      DiskFileSystem());
  EXPECT_EQ(s.token, "hf_env");
  EXPECT_TRUE(s.cache_dir.empty());  // no HOME, no XDG, no VRAMSCOPE_CACHE
  s = ReadHubSettings(Env({{"HUGGING_FACE_HUB_TOKEN", "hf_legacy"}, {"HF_HOME", d + "/hf"}}),
                      DiskFileSystem());
  EXPECT_EQ(s.token, "hf_legacy");
  s = ReadHubSettings(Env({{"HF_TOKEN", ""}, {"HF_HOME", d + "/none"}}), DiskFileSystem());
  EXPECT_EQ(s.token, "");
}

TEST(HubSettingsTest, OfflineTakesHuggingfaceHubTrueValues) {
  for (const char* v : {"1", "ON", "yes", "True"}) {
    EXPECT_TRUE(ReadHubSettings(Env({{"HF_HUB_OFFLINE", v}}), DiskFileSystem()).offline) << v;
  }
  for (const char* v : {"0", "off", "no", "false", ""}) {
    EXPECT_FALSE(ReadHubSettings(Env({{"HF_HUB_OFFLINE", v}}), DiskFileSystem()).offline) << v;
  }
  EXPECT_TRUE(ReadHubSettings(Env({{"TRANSFORMERS_OFFLINE", "1"}}), DiskFileSystem()).offline);
}

TEST(HubCacheTest, KeyedByEndpointRepoAndRevision) {
  HubSettings s;
  s.cache_dir = "/cache";
  const fs::path main_path = HubCachePath(Ref("meta-llama/Llama-2-7b-hf"), s);
  EXPECT_EQ(main_path.parent_path().filename(), "meta-llama--Llama-2-7b-hf");
  EXPECT_EQ(main_path.filename(), "main.json");
  EXPECT_EQ(main_path.parent_path().parent_path().parent_path(), fs::path("/cache/hub"));
  EXPECT_EQ(main_path.parent_path().parent_path().filename().string().rfind("huggingface.co-", 0),
            0u);

  std::set<fs::path> paths = {main_path};
  EXPECT_TRUE(paths.insert(HubCachePath(Ref("meta-llama/Llama-2-7b-hf@v2"), s)).second);
  EXPECT_TRUE(paths.insert(HubCachePath(Ref("meta-llama/Llama-2-7b"), s)).second);
  EXPECT_TRUE(paths.insert(HubCachePath(Ref("meta/llama-Llama-2-7b-hf"), s)).second);
  const fs::path pr = HubCachePath(Ref("meta-llama/Llama-2-7b-hf@refs/pr/1"), s);
  EXPECT_EQ(pr.filename(), "refs%2Fpr%2F1.json");  // one file, no sub-directories
  EXPECT_TRUE(paths.insert(pr).second);
  for (const char* endpoint : {"http://huggingface.co", "https://huggingface.co:443",
                               "https://huggingface.co/mirror", "https://hf-mirror.com"}) {
    HubSettings other = s;
    other.endpoint = endpoint;
    EXPECT_TRUE(paths.insert(HubCachePath(Ref("meta-llama/Llama-2-7b-hf"), other)).second)
        << endpoint;
  }
  s.cache_dir.clear();
  EXPECT_TRUE(HubCachePath(Ref("a/b"), s).empty());
}

TEST(HubErrorsTest, EachAnswerMapsToOneLineSayingWhatToDo) {
  const HubRef ref = Ref("org/model");
  const std::string ep = "https://hub.example";
  struct Case {
    HttpResponse response;
    bool token_sent;
    std::vector<std::string> parts;
  };
  HttpResponse unreachable;
  unreachable.transport = HttpResponse::Transport::kUnreachable;
  unreachable.transport_detail = "Could not resolve host: hub.example";
  HttpResponse timeout = unreachable;
  timeout.transport = HttpResponse::Transport::kTimeout;
  timeout.transport_detail = "Connection timed out after 10001 milliseconds";
  HttpResponse too_large;
  too_large.transport = HttpResponse::Transport::kTooLarge;
  too_large.transport_detail = "4194304 bytes";
  const std::vector<Case> cases = {
      {unreachable,
       false,
       {"org/model: could not reach HF_ENDPOINT https://hub.example", "Could not resolve host",
        "pass a config.json path or set HF_ENDPOINT"}},
      {timeout, false, {"could not reach HF_ENDPOINT", "timed out", "set HF_ENDPOINT"}},
      {too_large, false, {"larger than the size limit", "4194304 bytes"}},
      {Status(401),
       false,
       {"org/model: is gated or private", "HTTP 401",
        "accept its license on the Hub and set HF_TOKEN"}},
      {Status(403), true, {"is gated or private", "HTTP 403", "token sent has no access"}},
      {Status(401, "GatedRepo"), false, {"is gated or private", "set HF_TOKEN"}},
      {Status(403, "GatedRepo"), true, {"is gated or private", "token sent has no access"}},
      {Status(401, "", "Invalid credentials in Authorization header"),
       true,
       {"rejected the token", "check HF_TOKEN"}},
      {Status(404), false, {"org/model: no such model on the Hub (https://hub.example)"}},
      {Status(404, "RepoNotFound"), true, {"no such model on the Hub"}},
      {Status(401, "RepoNotFound"),
       false,
       {"no such model on the Hub", "or it is gated or private", "set HF_TOKEN"}},
      {Status(404, "RevisionNotFound"), false, {"no revision \"main\" of org/model"}},
      {Status(404, "EntryNotFound"), false, {"has no config.json at revision \"main\""}},
      {Status(429), false, {"rate-limiting", "HTTP 429"}},
      {Status(502), false, {"the Hub failed", "HTTP 502", "retry later"}},
      {Status(418),
       false,
       {"unexpected HTTP 418", "https://hub.example/org/model/resolve/main/config.json"}},
      {Ok("{not json"),
       false,
       {"org/model: config.json from https://hub.example", "is not valid JSON"}},
      {Ok("<html>login</html>"), false, {"is not valid JSON", "looks like HTML"}},
      {Ok("[1, 2]"), false, {"is not a JSON object"}},
  };
  for (const Case& c : cases) {
    Result<std::string> r = MapHubResponse(ref, ep, c.token_sent, c.response);
    ASSERT_FALSE(r.ok()) << c.parts.front();
    EXPECT_TRUE(IsOneLine(r.error().message)) << r.error().message;
    for (const std::string& part : c.parts) {
      EXPECT_NE(r.error().message.find(part), std::string::npos)
          << "\"" << part << "\" not in: " << r.error().message;
    }
  }
  Result<std::string> ok = MapHubResponse(ref, ep, false, Ok(kTinyLlama));
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_EQ(*ok, kTinyLlama);
}

TEST(HubErrorsTest, NotFoundSuggestsCatalogModelsAndNamesTheRevision) {
  Result<std::string> r = MapHubResponse(Ref("meta-llama/Meta-Llama-3-8"), "https://huggingface.co",
                                         false, Status(404, "RepoNotFound"));
  ASSERT_FALSE(r.ok());
  ExpectErrorMentions(r.error(), {"no such model on the Hub", "did you mean", "llama-3-8b"});
  r = MapHubResponse(Ref("a/b@v9"), "https://huggingface.co", false, Status(404));
  ASSERT_FALSE(r.ok());
  ExpectErrorMentions(r.error(), {"a/b@v9: no such model or revision on the Hub"});
}

HubSettings TempSettings(const TempDir& dir) {
  HubSettings s;
  s.endpoint = "http://hub.test";
  s.cache_dir = dir.path() / "cache";
  s.token = "hf_secret";
  return s;
}

TEST(HubFetchTest, FetchesOnceThenReadsTheCacheWithoutTheNetwork) {
  TempDir dir;
  HubSettings s = TempSettings(dir);
  FakeFetcher fetcher;
  fetcher.next = Ok(kTinyLlama);
  Result<HubConfig> first = FetchHubConfig(Ref("org/tiny"), s, DiskFileSystem(), fetcher);
  ASSERT_TRUE(first.ok()) << first.error().message;
  EXPECT_FALSE(first->from_cache);
  EXPECT_EQ(first->cache_problem, "");
  ASSERT_EQ(fetcher.requests.size(), 1u);
  const HttpRequest& sent = fetcher.requests[0];
  EXPECT_EQ(sent.url, "http://hub.test/org/tiny/resolve/main/config.json");
  EXPECT_EQ(sent.bearer_token, "hf_secret");
  EXPECT_EQ(sent.connect_timeout_s, 10);
  EXPECT_EQ(sent.total_timeout_s, 30);
  EXPECT_EQ(sent.max_body_bytes, 4u << 20);
  EXPECT_TRUE(fs::is_regular_file(HubCachePath(Ref("org/tiny"), s)));
  // No temporary file is left beside the cache entry.
  size_t files = 0;
  for ([[maybe_unused]] const auto& e :
       fs::directory_iterator(HubCachePath(Ref("org/tiny"), s).parent_path())) {
    ++files;
  }
  EXPECT_EQ(files, 1u);

  fetcher.next = Status(500);  // would fail if asked
  for (bool offline : {false, true}) {
    s.offline = offline;
    Result<HubConfig> again = FetchHubConfig(Ref("org/tiny"), s, DiskFileSystem(), fetcher);
    ASSERT_TRUE(again.ok()) << again.error().message;
    EXPECT_TRUE(again->from_cache);
    EXPECT_EQ(again->text, kTinyLlama);
  }
  EXPECT_EQ(fetcher.requests.size(), 1u);
  // Another revision is another cache entry.
  s.offline = false;
  EXPECT_FALSE(FetchHubConfig(Ref("org/tiny@v2"), s, DiskFileSystem(), fetcher).ok());
  EXPECT_EQ(fetcher.requests.size(), 2u);
}

TEST(HubFetchTest, OfflineWithoutCacheIsAnErrorAndSendsNothing) {
  TempDir dir;
  HubSettings s = TempSettings(dir);
  s.offline = true;
  FakeFetcher fetcher;
  Result<HubConfig> r = FetchHubConfig(Ref("org/tiny"), s, DiskFileSystem(), fetcher);
  ASSERT_FALSE(r.ok());
  ExpectErrorMentions(r.error(), {"org/tiny", "HF_HUB_OFFLINE is set", "no config.json is cached",
                                  HubCachePath(Ref("org/tiny"), s).string()});
  EXPECT_TRUE(fetcher.requests.empty());
}

TEST(HubFetchTest, FailuresAndBadJsonAreNotCachedAndADamagedCacheIsRefetched) {
  TempDir dir;
  HubSettings s = TempSettings(dir);
  s.token.clear();
  FakeFetcher fetcher;
  fetcher.next = Ok("{\"model_type\": ");
  EXPECT_FALSE(FetchHubConfig(Ref("org/tiny"), s, DiskFileSystem(), fetcher).ok());
  EXPECT_EQ(fetcher.requests.back().bearer_token, "");
  fetcher.next = Status(401);
  EXPECT_FALSE(FetchHubConfig(Ref("org/tiny"), s, DiskFileSystem(), fetcher).ok());
  EXPECT_FALSE(fs::exists(HubCachePath(Ref("org/tiny"), s)));

  WriteFile(HubCachePath(Ref("org/tiny"), s), "{truncated");
  ASSERT_TRUE(fs::is_regular_file(HubCachePath(Ref("org/tiny"), s)));
  fetcher.next = Ok(kTinyLlama);
  Result<HubConfig> r = FetchHubConfig(Ref("org/tiny"), s, DiskFileSystem(), fetcher);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_FALSE(r->from_cache);
  EXPECT_EQ(fetcher.requests.size(), 3u);
}

TEST(HubFetchTest, AnUnwritableCacheStillReturnsTheConfig) {
  TempDir dir;
  HubSettings s = TempSettings(dir);
  WriteFile(dir.path() / "file", "x");
  s.cache_dir = dir.path() / "file";  // a file where a directory should be
  FakeFetcher fetcher;
  fetcher.next = Ok(kTinyLlama);
  Result<HubConfig> r = FetchHubConfig(Ref("org/tiny"), s, DiskFileSystem(), fetcher);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_NE(r->cache_problem, "");
  s.cache_dir.clear();
  r = FetchHubConfig(Ref("org/tiny"), s, DiskFileSystem(), fetcher);
  ASSERT_TRUE(r.ok());
  EXPECT_NE(r->cache_problem.find("no cache directory"), std::string::npos);
}

TEST(HubModelTest, LoadsTheSpecAndSaysWhereTheConfigCameFrom) {
  TempDir dir;
  HubSettings s = TempSettings(dir);
  FakeFetcher fetcher;
  fetcher.next = Ok(kTinyLlama);
  Result<ModelSpec> spec = LoadHubModel("org/tiny", s, DiskFileSystem(), fetcher);
  ASSERT_TRUE(spec.ok()) << spec.error().message;
  EXPECT_EQ(spec->name, "org/tiny");
  EXPECT_EQ(spec->hub_id, "org/tiny");
  EXPECT_EQ(spec->model_type, "llama");
  EXPECT_EQ(spec->hidden_size, 64u);
  ASSERT_FALSE(spec->notes.empty());
  EXPECT_NE(spec->notes.back().find("fetched from http://hub.test"), std::string::npos);
  spec = LoadHubModel("org/tiny", s, DiskFileSystem(), fetcher);
  ASSERT_TRUE(spec.ok());
  EXPECT_NE(spec->notes.back().find("read from the cache"), std::string::npos);
}

// Answers by URL (404 EntryNotFound for any other), remembering what was asked.
class RoutedFetcher final : public HttpFetcher {
 public:
  std::map<std::string, HttpResponse> routes;
  std::vector<std::string> asked;
  HttpResponse Get(const HttpRequest& request) override {
    asked.push_back(request.url);
    auto it = routes.find(request.url);
    return it != routes.end() ? it->second : Status(404, "EntryNotFound");
  }
};

constexpr const char* kTinyUNet = R"({"_class_name": "UNet2DConditionModel",
    "block_out_channels": [32, 64], "down_block_types": ["CrossAttnDownBlock2D", "DownBlock2D"],
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D"], "cross_attention_dim": 32,
    "attention_head_dim": 8, "layers_per_block": 1, "sample_size": 8})";

// A diffusers pipeline repository has model_index.json at its root and the
// denoiser's config in unet/ (or transformer/): read there, cached under its
// own key, and found in the cache offline.
TEST(HubModelTest, ADiffusersPipelineIsReadFromItsUNetFolder) {
  TempDir dir;
  HubSettings settings;
  settings.endpoint = "https://hub.example";
  settings.cache_dir = dir.path();
  RoutedFetcher fetcher;
  const std::string root = "https://hub.example/acme/sd-tiny/resolve/main/";
  fetcher.routes[root + "unet/config.json"] = Ok(kTinyUNet);
  Result<ModelSpec> spec = LoadHubModel("acme/sd-tiny", settings, DiskFileSystem(), fetcher);
  ASSERT_TRUE(spec.ok()) << spec.error().message;
  EXPECT_TRUE(spec->is_unet);
  EXPECT_EQ(fetcher.asked,
            (std::vector<std::string>{root + "config.json", root + "unet/config.json"}));
  ASSERT_FALSE(spec->notes.empty());
  EXPECT_NE(spec->notes.back().find("unet/config.json of the diffusers pipeline"),
            std::string::npos)
      << spec->notes.back();
  HubRef unet = Ref("acme/sd-tiny");
  unet.subfolder = "unet";
  EXPECT_EQ(HubCachePath(unet, settings).filename(), "main.unet.json");
  settings.offline = true;
  RoutedFetcher none;
  Result<ModelSpec> cached = LoadHubModel("acme/sd-tiny", settings, DiskFileSystem(), none);
  ASSERT_TRUE(cached.ok()) << cached.error().message;
  EXPECT_TRUE(none.asked.empty());
  // Neither a root config nor a pipeline folder: the root's error, naming both.
  settings.offline = false;
  RoutedFetcher empty;
  Result<ModelSpec> missing = LoadHubModel("acme/nothing", settings, DiskFileSystem(), empty);
  ASSERT_FALSE(missing.ok());
  ExpectErrorMentions(missing.error(), {"acme/nothing", "no config.json", "diffusers pipeline"});
  EXPECT_EQ(empty.asked.size(), 3u);
}

TEST(HubModelTest, UnsupportedArchitectureNamesTheSupportedOnes) {
  TempDir dir;
  FakeFetcher fetcher;
  fetcher.next = Ok(R"({"model_type": "mamba", "hidden_size": 768})");
  Result<ModelSpec> spec =
      LoadHubModel("state-spaces/mamba-130m-hf", TempSettings(dir), DiskFileSystem(), fetcher);
  ASSERT_FALSE(spec.ok());
  ExpectErrorMentions(spec.error(),
                      {"state-spaces/mamba-130m-hf config.json", "\"mamba\"", "not supported"});
  for (const std::string& type : SupportedModelTypes()) ExpectErrorMentions(spec.error(), {type});
}

TEST(HubModelTest, InvalidIdSendsNothing) {
  TempDir dir;
  FakeFetcher fetcher;
  Result<ModelSpec> spec =
      LoadHubModel("org/bad name", TempSettings(dir), DiskFileSystem(), fetcher);
  ASSERT_FALSE(spec.ok());
  ExpectErrorMentions(spec.error(), {"not a valid Hugging Face id"});
  EXPECT_TRUE(fetcher.requests.empty());
}

TEST(ResolveOrderTest, PathThenCatalogThenHub) {
  std::vector<std::string> asked;
  HubLoader loader = [&](std::string_view name) -> Result<ModelSpec> {
    asked.emplace_back(name);
    return MakeError("fake hub");
  };
  // A catalog alias or Hub id never reaches the Hub.
  Result<ModelSpec> alias = ResolveModelWithHub("llama-3-8b", DiskFileSystem(), loader);
  ASSERT_TRUE(alias.ok()) << alias.error().message;
  Result<ModelSpec> id =
      ResolveModelWithHub("META-LLAMA/Meta-Llama-3-8B", DiskFileSystem(), loader);
  ASSERT_TRUE(id.ok()) << id.error().message;
  EXPECT_EQ(id->name, "llama-3-8b");
  // An existing path wins.
  TempDir dir;
  WriteFile(dir.path() / "config.json", kTinyLlama);
  ASSERT_TRUE(ResolveModelWithHub(dir.path().string(), DiskFileSystem(), loader).ok());
  EXPECT_TRUE(asked.empty());
  // Anything else shaped owner/name goes to the Hub, with an @revision too.
  EXPECT_FALSE(ResolveModelWithHub("org/unknown", DiskFileSystem(), loader).ok());
  EXPECT_FALSE(
      ResolveModelWithHub("meta-llama/Meta-Llama-3-8B@main", DiskFileSystem(), loader).ok());
  EXPECT_EQ(asked, (std::vector<std::string>{"org/unknown", "meta-llama/Meta-Llama-3-8B@main"}));
  // A name not shaped like a Hub id gets the general error, without the Hub.
  Result<ModelSpec> none = ResolveModelWithHub("no-such-model", DiskFileSystem(), loader);
  ASSERT_FALSE(none.ok());
  ExpectErrorMentions(none.error(), {"no-such-model: neither a config.json", "Hugging Face id"});
  EXPECT_FALSE(ResolveModelWithHub("missing/config.json", DiskFileSystem(), loader).ok());
  EXPECT_EQ(asked.size(), 2u);
}

}  // namespace
}  // namespace vramscope::ingest

namespace vramscope::ingest {
namespace {

// Files in memory that remember every path asked about: ResolveModel must
// touch nothing but what its ModelIo gives it.
class MemoryFiles final : public FileSystem {
 public:
  std::map<std::string, std::string> files;  // path -> contents
  mutable std::set<std::string> touched;

  Kind Stat(const fs::path& path) const override {
    touched.insert(path.string());
    if (files.count(path.string()) != 0) return Kind::kRegularFile;
    for (const auto& [name, text] : files) {
      if (fs::path(name).parent_path() == path) return Kind::kDirectory;
    }
    return Kind::kMissing;
  }
  Result<uint64_t> FileSize(const fs::path& path) const override {
    touched.insert(path.string());
    auto it = files.find(path.string());
    if (it == files.end()) return MakeError("No such file or directory");
    return it->second.size();
  }
  std::optional<std::string> Read(const fs::path& path, uint64_t offset,
                                  uint64_t max_bytes) const override {
    touched.insert(path.string());
    auto it = files.find(path.string());
    if (it == files.end()) return std::nullopt;
    if (offset >= it->second.size()) return "";
    return it->second.substr(offset, max_bytes);
  }
  Result<std::vector<fs::path>> ListFiles(const fs::path& dir) const override {
    touched.insert(dir.string());
    std::vector<fs::path> out;
    for (const auto& [name, text] : files) {
      if (fs::path(name).parent_path() == dir) out.emplace_back(name);
    }
    return out;
  }
  std::string WriteAtomically(const fs::path& path, std::string_view text) const override {
    touched.insert(path.string());
    written.emplace_back(path.string(), std::string(text));
    return "";
  }
  mutable std::vector<std::pair<std::string, std::string>> written;
};

TEST(ModelIoTest, WithoutIoOnlyTheCatalogResolves) {
  TempDir dir;
  WriteFile(dir.path() / "config.json", kTinyLlama);
  const ModelIo none;
  // The file exists on disk, but no file system was given.
  EXPECT_FALSE(ResolveModel((dir.path() / "config.json").string(), none).ok());
  EXPECT_TRUE(ResolveModel("llama-3-8b", none).ok());
  Result<ModelSpec> hub = ResolveModel("org/tiny", none);
  ASSERT_FALSE(hub.ok());
  ExpectErrorMentions(hub.error(), {"org/tiny: not in the catalog", "no Hugging Face Hub ids"});
}

TEST(ModelIoTest, FilesEnvironmentAndHubComeFromTheCaller) {
  MemoryFiles files;
  files.files["/models/tiny/config.json"] = kTinyLlama;
  FakeFetcher fetcher;
  fetcher.next = Ok(kTinyLlama);
  ModelIo io;
  io.files = &files;
  io.env = Env(
      {{"VRAMSCOPE_CACHE", "/cache"}, {"HF_TOKEN", "hf_x"}, {"HF_ENDPOINT", "http://hub.test"}});
  io.http = &fetcher;

  Result<ModelSpec> dir = ResolveModel("/models/tiny", io);
  ASSERT_TRUE(dir.ok()) << dir.error().message;
  EXPECT_EQ(dir->hidden_size, 64u);
  EXPECT_TRUE(files.touched.count("/models/tiny/config.json"));
  EXPECT_TRUE(fetcher.requests.empty());

  Result<ModelSpec> hub = ResolveModel("org/tiny", io);
  ASSERT_TRUE(hub.ok()) << hub.error().message;
  ASSERT_EQ(fetcher.requests.size(), 1u);
  EXPECT_EQ(fetcher.requests[0].url, "http://hub.test/org/tiny/resolve/main/config.json");
  EXPECT_EQ(fetcher.requests[0].bearer_token, "hf_x");
  ASSERT_EQ(files.written.size(), 1u);
  const std::string cache = files.written[0].first;
  EXPECT_EQ(cache.rfind("/cache/hub/hub.test-", 0), 0u) << cache;
  // The cached copy answers the next time, without the network.
  files.files[cache] = files.written[0].second;
  ASSERT_TRUE(ResolveModel("org/tiny", io).ok());
  EXPECT_EQ(fetcher.requests.size(), 1u);
}

}  // namespace
}  // namespace vramscope::ingest
