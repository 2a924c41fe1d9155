// Hub ids, settings, URLs, the config cache and the mapping of Hub answers to
// one-line errors. The HTTP client and the files are the caller's (ModelIo);
// the real ones are hub_curl.cc and disk_file_system.cc, outside vs_ingest.
#include "hub.h"

#include <cctype>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "catalog_internal.h"
#include "config_reader.h"

namespace vramscope::ingest {
namespace {

namespace fs = std::filesystem;

constexpr size_t kMaxRepoPartChars = 96;  // huggingface_hub REPO_ID_REGEX: {1,96}
constexpr size_t kMaxRevisionChars = 255;
constexpr uint64_t kMaxTokenFileBytes = 64 << 10;

bool IsWordChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
bool IsRepoChar(char c) { return IsWordChar(c) || c == '.' || c == '-'; }

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// The problem with one part of "owner/name", or "" when it is valid.
std::string RepoPartProblem(std::string_view part, std::string_view what) {
  if (part.empty()) return fmt::format("the {} is empty", what);
  if (part.size() > kMaxRepoPartChars) {
    return fmt::format("the {} is longer than {} characters", what, kMaxRepoPartChars);
  }
  for (char c : part) {
    if (!IsRepoChar(c)) {
      return fmt::format("the {} has the character {} (allowed: letters, digits, '.', '_', '-')",
                         what, common::QuoteForMessage(std::string_view(&c, 1), 1, '\''));
    }
  }
  if (!IsWordChar(part.front()) || !IsWordChar(part.back())) {
    return fmt::format("the {} must start and end with a letter, digit or '_'", what);
  }
  return "";
}

std::string RevisionProblem(std::string_view rev) {
  if (rev.empty()) return "the revision after '@' is empty";
  if (rev.size() > kMaxRevisionChars) {
    return fmt::format("the revision is longer than {} characters", kMaxRevisionChars);
  }
  for (char c : rev) {
    if (!IsRepoChar(c) && c != '/') {
      return fmt::format(
          "the revision has the character {} (allowed: letters, digits, '.', '_', '-', '/')",
          common::QuoteForMessage(std::string_view(&c, 1), 1, '\''));
    }
  }
  if (rev.front() == '.' || rev.front() == '/' || rev.back() == '/' ||
      rev.find("..") != std::string_view::npos || rev.find("//") != std::string_view::npos) {
    return "the revision must not start with '.' or '/', end with '/', or contain \"..\" or \"//\"";
  }
  return "";
}

// 32-bit FNV-1a: a short, stable tag telling endpoints apart in cache paths.
uint32_t Fnv1a32(std::string_view s) {
  uint32_t h = 2166136261u;
  for (char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 16777619u;
  }
  return h;
}

std::string EscapeRevision(std::string_view rev) {
  std::string out;
  for (char c : rev) {
    if (c == '/') {
      out += "%2F";
    } else {
      out += c;
    }
  }
  return out;
}

// huggingface_hub's _clean_token: drop CR/LF, trim spaces; empty means none.
std::string CleanToken(std::string_view raw) {
  std::string out;
  for (char c : raw) {
    if (c != '\r' && c != '\n') out += c;
  }
  size_t begin = out.find_first_not_of(" \t");
  if (begin == std::string::npos) return "";
  size_t end = out.find_last_not_of(" \t");
  return out.substr(begin, end - begin + 1);
}

std::string ReadTokenFile(const FileSystem& files, const fs::path& path) {
  if (files.Stat(path) != FileSystem::Kind::kRegularFile) return "";
  const Result<uint64_t> size = files.FileSize(path);
  if (!size.ok() || *size > kMaxTokenFileBytes) return "";
  return CleanToken(files.Read(path, 0, *size).value_or(""));
}

bool IsTrue(const char* value) {
  if (value == nullptr) return false;
  std::string v(value);
  for (char& c : v) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return v == "1" || v == "ON" || v == "YES" || v == "TRUE";
}

// "~/x" -> "$HOME/x", as huggingface_hub's expanduser does for its paths.
fs::path ExpandHome(std::string_view path, const char* home) {
  if (home != nullptr && *home != '\0' && (path == "~" || path.substr(0, 2) == "~/")) {
    return fs::path(home) / std::string(path.substr(std::min<size_t>(path.size(), 2)));
  }
  return fs::path(std::string(path));
}

// The config text when `text` is a JSON object, else what is wrong with it.
Result<std::string> CheckConfigJson(std::string text, std::string_view what) {
  if (auto nul = common::FindNulByte(text)) {
    return MakeError(fmt::format("{}: {}", what, common::NulByteProblem(*nul)));
  }
  if (common::JsonNestsDeeperThan(text, kMaxJsonDepth)) {
    return MakeError(fmt::format("{} is JSON nested deeper than {} levels", what, kMaxJsonDepth));
  }
  nlohmann::json root = nlohmann::json::parse(text, nullptr, false);
  if (root.is_discarded()) {
    size_t first = text.find_first_not_of(" \t\r\n");
    const char* hint = first != std::string::npos && text[first] == '<'
                           ? " (it looks like HTML: a proxy or login page?)"
                           : "";
    return MakeError(fmt::format("{} is not valid JSON{}", what, hint));
  }
  if (!root.is_object()) return MakeError(fmt::format("{} is not a JSON object", what));
  return text;
}

// The cached config of `path` when it is a readable JSON object, else nothing
// (a damaged cache entry is refetched rather than reported).
std::optional<std::string> ReadCache(const FileSystem& files, const fs::path& path,
                                     uint64_t max_bytes) {
  if (path.empty() || files.Stat(path) != FileSystem::Kind::kRegularFile) return std::nullopt;
  const Result<uint64_t> size = files.FileSize(path);
  if (!size.ok() || *size > max_bytes) return std::nullopt;
  std::optional<std::string> text = files.Read(path, 0, *size);
  if (!text) return std::nullopt;
  Result<std::string> checked = CheckConfigJson(std::move(*text), "cache");
  if (!checked.ok()) return std::nullopt;
  return std::move(checked).value();
}

}  // namespace

bool LooksLikeHubId(std::string_view name) {
  std::string_view repo = name.substr(0, name.find('@'));
  if (repo.empty() || repo.front() == '/' || repo.front() == '.' || repo.front() == '~') {
    return false;
  }
  if (EndsWith(repo, ".json")) return false;  // a config.json path that does not exist
  size_t slash = repo.find('/');
  return slash != std::string_view::npos && slash > 0 && slash + 1 < repo.size() &&
         repo.find('/', slash + 1) == std::string_view::npos;
}

Result<HubRef> ParseHubRef(std::string_view name) {
  auto fail = [&](std::string_view problem) {
    return MakeError(fmt::format(
        "{}: not a valid Hugging Face id: {} (expected owner/name or owner/name@revision)", name,
        problem));
  };
  HubRef ref;
  std::string_view repo = name;
  if (size_t at = name.find('@'); at != std::string_view::npos) {
    repo = name.substr(0, at);
    std::string_view rev = name.substr(at + 1);
    if (std::string problem = RevisionProblem(rev); !problem.empty()) return fail(problem);
    ref.revision = std::string(rev);
    ref.explicit_revision = true;
  }
  size_t slash = repo.find('/');
  if (slash == std::string_view::npos) return fail("no '/' between owner and name");
  std::string_view owner = repo.substr(0, slash), model = repo.substr(slash + 1);
  if (model.find('/') != std::string_view::npos) return fail("more than one '/'");
  if (std::string p = RepoPartProblem(owner, "owner"); !p.empty()) return fail(p);
  if (std::string p = RepoPartProblem(model, "name"); !p.empty()) return fail(p);
  if (repo.find("--") != std::string_view::npos || repo.find("..") != std::string_view::npos) {
    return fail("\"--\" and \"..\" are not allowed");
  }
  if (EndsWith(model, ".git")) return fail("the name must not end with \".git\"");
  ref.repo_id = std::string(repo);
  return ref;
}

HubSettings ReadHubSettings(const EnvLookup& env, const FileSystem& files) {
  auto get = [&](const char* var) -> const char* {
    const char* v = env ? env(var) : nullptr;
    return v != nullptr && *v != '\0' ? v : nullptr;
  };
  HubSettings s;
  const char* home = get("HOME");
  if (const char* endpoint = get("HF_ENDPOINT")) {
    s.endpoint = endpoint;
    while (!s.endpoint.empty() && s.endpoint.back() == '/') s.endpoint.pop_back();
  }
  // XDG says a relative XDG_CACHE_HOME is to be ignored.
  const char* xdg = get("XDG_CACHE_HOME");
  if (xdg != nullptr && xdg[0] != '/') xdg = nullptr;
  if (const char* dir = get("VRAMSCOPE_CACHE")) {
    s.cache_dir = ExpandHome(dir, home);
  } else if (xdg != nullptr) {
    s.cache_dir = fs::path(xdg) / "vramscope";
  } else if (home != nullptr) {
    s.cache_dir = fs::path(home) / ".cache" / "vramscope";
  }
  s.offline = IsTrue(get("HF_HUB_OFFLINE")) || IsTrue(get("TRANSFORMERS_OFFLINE"));
  if (const char* token = get("HF_TOKEN")) {
    s.token = CleanToken(token);
  } else if (const char* legacy = get("HUGGING_FACE_HUB_TOKEN")) {
    s.token = CleanToken(legacy);
  } else {
    fs::path token_path;
    if (const char* p = get("HF_TOKEN_PATH")) {
      token_path = ExpandHome(p, home);
    } else if (const char* hf_home = get("HF_HOME")) {
      token_path = ExpandHome(hf_home, home) / "token";
    } else if (xdg != nullptr) {
      token_path = fs::path(xdg) / "huggingface" / "token";
    } else if (home != nullptr) {
      token_path = fs::path(home) / ".cache" / "huggingface" / "token";
    }
    if (!token_path.empty()) s.token = ReadTokenFile(files, token_path);
  }
  return s;
}

std::string HubConfigUrl(const HubRef& ref, std::string_view endpoint) {
  return fmt::format("{}/{}/resolve/{}/{}config.json", endpoint, ref.repo_id,
                     EscapeRevision(ref.revision),
                     ref.subfolder.empty() ? "" : ref.subfolder + "/");
}

fs::path HubCachePath(const HubRef& ref, const HubSettings& settings) {
  if (settings.cache_dir.empty()) return {};
  // The endpoint's host keeps the directory readable; the hash keeps
  // endpoints that differ only in scheme, port or path apart.
  std::string_view rest = settings.endpoint;
  if (size_t scheme = rest.find("://"); scheme != std::string_view::npos) {
    rest.remove_prefix(scheme + 3);
  }
  std::string host;
  for (char c : rest.substr(0, rest.find('/'))) {
    if (host.size() == 64) break;
    host += std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' ? c : '_';
  }
  if (host.empty() || host.front() == '.') host.insert(0, "endpoint");
  const std::string endpoint_dir = fmt::format("{}-{:08x}", host, Fnv1a32(settings.endpoint));
  const size_t slash = ref.repo_id.find('/');
  // "--" cannot occur in a valid repo id, so owner--name is unambiguous.
  const std::string repo_dir = ref.repo_id.substr(0, slash) + "--" + ref.repo_id.substr(slash + 1);
  const std::string sub = ref.subfolder.empty() ? "" : "." + ref.subfolder;
  return settings.cache_dir / "hub" / endpoint_dir / repo_dir /
         (EscapeRevision(ref.revision) + sub + ".json");
}

// Offline, the catalog is what is left: the base model of a tuned variant
// (same architecture), else the aliases close to the id.
static std::string OfflineHint(std::string_view repo_id) {
  std::string hint = BaseModelHint(repo_id);
  return hint.empty() ? DidYouMean(repo_id) : hint;
}

Result<std::string> MapHubResponse(const HubRef& ref, std::string_view endpoint, bool token_sent,
                                   const HttpResponse& r) {
  const std::string id = ref.explicit_revision ? ref.repo_id + "@" + ref.revision : ref.repo_id;
  const std::string gated = fmt::format(
      "{}: is gated or private (HTTP {} from {}): accept its license on the Hub and set "
      "HF_TOKEN{}",
      id, r.status, endpoint, token_sent ? " (the token sent has no access to it)" : "");
  switch (r.transport) {
    case HttpResponse::Transport::kOk: break;
    case HttpResponse::Transport::kUnreachable:
    case HttpResponse::Transport::kTimeout:
      return MakeError(fmt::format(
          "{}: could not reach HF_ENDPOINT {} ({}{}); pass a config.json path or set "
          "HF_ENDPOINT{}",
          id, endpoint, r.transport == HttpResponse::Transport::kTimeout ? "timed out: " : "",
          r.transport_detail, OfflineHint(ref.repo_id)));
    case HttpResponse::Transport::kTooLarge:
      return MakeError(fmt::format("{}: config.json from {} is larger than the size limit ({})", id,
                                   endpoint, r.transport_detail));
  }
  if (r.status == 200) {
    return CheckConfigJson(r.body, fmt::format("{}: config.json from {}", id, endpoint));
  }
  if (r.error_code == "GatedRepo") return MakeError(gated);
  if (r.status == 401 && r.error_message == "Invalid credentials in Authorization header") {
    return MakeError(fmt::format(
        "{}: the Hub rejected the token (HTTP 401 from {}: invalid credentials): check HF_TOKEN "
        "or the token file",
        id, endpoint));
  }
  if (r.error_code == "RevisionNotFound") {
    return MakeError(fmt::format("{}: no revision \"{}\" of {} on the Hub ({})", id, ref.revision,
                                 ref.repo_id, endpoint));
  }
  if (r.error_code == "EntryNotFound") {
    return MakeError(fmt::format(
        "{}: the repository has no config.json at revision \"{}\" (not a transformers model, "
        "nor a diffusers pipeline with unet/ or transformer/?)",
        id, ref.revision));
  }
  // The Hub answers 401 RepoNotFound for a missing repo to an anonymous
  // caller, so as not to reveal private repos: say both.
  if (r.error_code == "RepoNotFound" && r.status == 401 && !token_sent) {
    return MakeError(fmt::format(
        "{}: no such model on the Hub ({}), or it is gated or private: check the id, or accept "
        "its license on the Hub and set HF_TOKEN{}",
        id, endpoint, DidYouMean(ref.repo_id)));
  }
  if (r.error_code == "RepoNotFound" || r.status == 404) {
    // A bare 404 with a revision may mean either; the Hub's code says which.
    const bool either = ref.explicit_revision && r.error_code.empty();
    return MakeError(fmt::format("{}: no such model{} on the Hub ({}): check the id{}", id,
                                 either ? " or revision" : "", endpoint, DidYouMean(ref.repo_id)));
  }
  if (r.status == 401 || r.status == 403) return MakeError(gated);
  if (r.status == 429) {
    return MakeError(fmt::format(
        "{}: the Hub is rate-limiting requests (HTTP 429 from {}); retry later or set HF_TOKEN", id,
        endpoint));
  }
  if (r.status >= 500) {
    return MakeError(
        fmt::format("{}: the Hub failed (HTTP {} from {}); retry later or pass a config.json path",
                    id, r.status, endpoint));
  }
  return MakeError(
      fmt::format("{}: unexpected HTTP {} for {}", id, r.status, HubConfigUrl(ref, endpoint)));
}

namespace {

// One config.json (the root's or a subfolder's): the cache, else one GET.
// `raw` receives the Hub's answer when a request was made.
Result<HubConfig> FetchOneConfig(const HubRef& ref, const HubSettings& settings,
                                 const FileSystem& files, HttpFetcher& fetcher, HttpResponse* raw) {
  const fs::path cache = HubCachePath(ref, settings);
  if (std::optional<std::string> cached = ReadCache(files, cache, settings.max_config_bytes)) {
    return HubConfig{std::move(*cached), cache.string(), true, ""};
  }
  if (settings.offline) {
    return MakeError(fmt::format(
        "{}: HF_HUB_OFFLINE is set and no config.json is cached{}; unset HF_HUB_OFFLINE or pass "
        "a config.json path{}",
        ref.repo_id, cache.empty() ? "" : " at " + cache.string(), OfflineHint(ref.repo_id)));
  }
  HttpRequest request;
  request.url = HubConfigUrl(ref, settings.endpoint);
  request.bearer_token = settings.token;
  request.connect_timeout_s = settings.connect_timeout_s;
  request.total_timeout_s = settings.total_timeout_s;
  request.max_body_bytes = settings.max_config_bytes;
  *raw = fetcher.Get(request);
  Result<std::string> text = MapHubResponse(ref, settings.endpoint, !settings.token.empty(), *raw);
  if (!text.ok()) return text.error();
  HubConfig out{std::move(text).value(), request.url, false, "", ref.subfolder};
  out.cache_problem = cache.empty() ? "no cache directory (set VRAMSCOPE_CACHE or HOME)"
                                    : files.WriteAtomically(cache, out.text);
  return out;
}

// diffusers pipelines (DiffusionPipeline.from_pretrained's model_index.json
// layout, diffusers 0.42.1): the denoiser's config is unet/config.json (Stable
// Diffusion, SDXL) or transformer/config.json (DiT, Flux, SD3).
constexpr const char* kPipelineSubfolders[] = {"unet", "transformer"};

}  // namespace

Result<HubConfig> FetchHubConfig(const HubRef& ref, const HubSettings& settings,
                                 const FileSystem& files, HttpFetcher& fetcher) {
  HttpResponse raw;
  Result<HubConfig> root = FetchOneConfig(ref, settings, files, fetcher, &raw);
  const bool no_root_config = raw.status == 404 && raw.error_code == "EntryNotFound";
  if (root.ok() || !ref.subfolder.empty() || !(no_root_config || settings.offline)) return root;
  for (const char* sub : kPipelineSubfolders) {
    HubRef component = ref;
    component.subfolder = sub;
    HttpResponse component_raw;
    Result<HubConfig> found = FetchOneConfig(component, settings, files, fetcher, &component_raw);
    if (found.ok()) return found;
  }
  return root;
}

Result<ModelSpec> LoadHubModel(std::string_view name, const HubSettings& settings,
                               const FileSystem& files, HttpFetcher& fetcher) {
  Result<HubRef> ref = ParseHubRef(name);
  if (!ref.ok()) return ref.error();
  Result<HubConfig> config = FetchHubConfig(*ref, settings, files, fetcher);
  if (!config.ok()) return config.error();
  const std::string file =
      config->subfolder.empty() ? "config.json" : config->subfolder + "/config.json";
  Result<ModelSpec> spec = ParseModelConfig(config->text, fmt::format("{} {}", name, file));
  if (!spec.ok()) return spec;
  spec->name = std::string(name);
  spec->hub_id = ref->repo_id;
  HubRef read = *ref;
  read.subfolder = config->subfolder;
  const std::string what = config->subfolder.empty()
                               ? fmt::format("config.json of {}", name)
                               : fmt::format("{} of the diffusers pipeline {}", file, name);
  if (config->from_cache) {
    spec->notes.push_back(fmt::format("{} read from the cache {}", what, config->source));
  } else if (config->cache_problem.empty()) {
    spec->notes.push_back(fmt::format("{} fetched from {} and cached at {}", what, config->source,
                                      HubCachePath(read, settings).string()));
  } else {
    spec->notes.push_back(fmt::format("{} fetched from {}; not cached: {}", what, config->source,
                                      config->cache_problem));
  }
  return spec;
}

}  // namespace vramscope::ingest
