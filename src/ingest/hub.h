// Hugging Face Hub fetch of one file, config.json: the only network I/O of the
// core library, kept behind this header so ResolveModel stays testable.
//
// The steps are split so each can be tested alone:
//   ParseHubRef        "owner/name[@revision]" -> HubRef (pure validation)
//   ReadHubSettings    environment + token file -> HubSettings
//   HubConfigUrl       HubRef + endpoint -> URL (pure)
//   HubCachePath       HubRef + settings -> cache file (pure)
//   MapHubResponse     HTTP response -> config text or one-line Error (pure)
//   FetchHubConfig     cache, else HttpFetcher::Get, then write the cache
// HttpFetcher is an interface: the real one uses libcurl (hub_curl.cc), tests
// pass a fake that records the requests.
//
// Behaviour follows huggingface_hub (constants.py, utils/_token.py,
// utils/_http.py, 0.2x): HF_ENDPOINT without a trailing '/', URL
// {endpoint}/{repo_id}/resolve/{revision}/config.json, token from HF_TOKEN,
// then HUGGING_FACE_HUB_TOKEN, then the file HF_TOKEN_PATH (default
// $HF_HOME/token, HF_HOME default $XDG_CACHE_HOME/huggingface or
// ~/.cache/huggingface), HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE true for
// 1/ON/YES/TRUE, and the Hub's X-Error-Code header telling a missing repo,
// revision or file and a gated repo apart.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "vramscope/model.h"
#include "vramscope/result.h"

namespace vramscope::ingest {

// A model repository on the Hub and the revision (branch, tag or commit) to read.
struct HubRef {
  std::string repo_id;           // "meta-llama/Meta-Llama-3-8B"
  std::string revision = "main";
  bool explicit_revision = false;  // "@revision" was given
};

// True when `name` is meant as a Hub id rather than a local path: one '/'
// between two non-empty parts (before an optional "@revision"), and not
// starting like a path ("/", "./", "../", "~"). Says nothing about validity.
bool LooksLikeHubId(std::string_view name);

// Validates "owner/name" or "owner/name@revision" the way the Hub does: owner
// and name made of ASCII letters, digits, '.', '_', '-', starting and ending
// with a letter, digit or '_', no "--" or "..", name at most 96 characters and
// not ending in ".git"; a revision of letters, digits, '.', '_', '-', '/' (as
// in "refs/pr/1"), at most 255 characters, without "..", "//", a leading '.'
// or '/' or a trailing '/'. The Error names `name` and the rule broken.
Result<HubRef> ParseHubRef(std::string_view name);

struct HubSettings {
  std::string endpoint = "https://huggingface.co";  // HF_ENDPOINT, no trailing '/'
  std::string token;                 // empty: send no Authorization header
  std::filesystem::path cache_dir;   // vramscope's cache root; empty: no cache
  bool offline = false;              // HF_HUB_OFFLINE: cache only, never the network
  int connect_timeout_s = 10;
  int total_timeout_s = 30;
  uint64_t max_config_bytes = 4ULL << 20;  // a config.json is a few KiB
};

// Returns the value of an environment variable, nullptr when unset.
using EnvLookup = std::function<const char*(const char*)>;

// Settings from the environment (see the top of this file; the cache root is
// $VRAMSCOPE_CACHE, else $XDG_CACHE_HOME/vramscope, else $HOME/.cache/vramscope).
// Reads the token file when no token variable is set; an unreadable or absent
// file means no token. Empty variables count as unset.
HubSettings ReadHubSettings(const EnvLookup& env);

// "{endpoint}/{repo_id}/resolve/{revision}/config.json"; a '/' inside the
// revision is sent as %2F, as huggingface_hub quotes it.
std::string HubConfigUrl(const HubRef& ref, std::string_view endpoint);

// Where the config of `ref` fetched from `endpoint` is cached, under
// cache_dir: hub/<host>-<hash of endpoint>/<owner>--<name>/<revision>.json,
// with '/' in the revision written %2F. Distinct endpoints, repos and
// revisions never share a file.
std::filesystem::path HubCachePath(const HubRef& ref, const HubSettings& settings);

struct HttpRequest {
  std::string url;
  std::string bearer_token;  // sent as "Authorization: Bearer ..." when not empty
  int connect_timeout_s = 10;
  int total_timeout_s = 30;
  uint64_t max_body_bytes = 4ULL << 20;
};

struct HttpResponse {
  enum class Transport : uint8_t {
    kOk,           // an HTTP response arrived (any status)
    kUnreachable,  // DNS, refused connection, TLS failure, bad URL
    kTimeout,      // connect or total time limit passed
    kTooLarge,     // the body passed max_body_bytes
  };
  Transport transport = Transport::kOk;
  std::string transport_detail;  // libcurl's words when transport != kOk
  long status = 0;               // of the last response, after redirects
  std::string body;
  std::string error_code;        // X-Error-Code of the last response
  std::string error_message;     // X-Error-Message of the last response
};

// Performs one GET, following redirects. Implementations never throw; every
// failure is described in the response.
class HttpFetcher {
 public:
  virtual ~HttpFetcher() = default;
  virtual HttpResponse Get(const HttpRequest& request) = 0;
};

// The libcurl fetcher: http and https only (redirects too), at most 10
// redirects, the request's timeouts and size limit; proxies from the usual
// http_proxy / https_proxy / no_proxy variables as libcurl reads them.
std::unique_ptr<HttpFetcher> MakeCurlFetcher();

// The config text of a 200 response, or a one-line Error naming `ref` and
// saying what to do (gated: accept the license and set HF_TOKEN; unreachable:
// pass a config.json path or set HF_ENDPOINT; ...). `token_sent` tells a
// rejected token from a missing one.
Result<std::string> MapHubResponse(const HubRef& ref, std::string_view endpoint,
                                   bool token_sent, const HttpResponse& response);

struct HubConfig {
  std::string text;               // config.json
  std::string source;             // the URL, or the cache file when read from it
  bool from_cache = false;
  std::string cache_problem;      // why the fetched config was not cached; empty if it was
};

// config.json of `ref`: the cached copy when there is one (no network at all),
// otherwise one GET through `fetcher` and, on success with valid JSON, an
// atomic write of the cache (a temporary file renamed into place, so a
// concurrent reader never sees half a file). Offline without a cached copy is
// an error. A cached file that is not valid JSON is ignored and refetched.
Result<HubConfig> FetchHubConfig(const HubRef& ref, const HubSettings& settings,
                                 HttpFetcher& fetcher);

// ParseHubRef + FetchHubConfig + ParseModelConfig: the ModelSpec of a Hub id,
// with name = `name`, hub_id = the repo id, and a note saying where the
// config came from.
Result<ModelSpec> LoadHubModel(std::string_view name, const HubSettings& settings,
                               HttpFetcher& fetcher);

// ResolveModel (model.h) with its last step, the Hub, done by `load_hub`:
// an existing path, then a catalog alias or id, then — for a name that
// LooksLikeHubId — load_hub(name). ResolveModel passes LoadHubModel with the
// environment's settings and the libcurl fetcher; tests pass a fake.
using HubLoader = std::function<Result<ModelSpec>(std::string_view name)>;
Result<ModelSpec> ResolveModelWithHub(std::string_view model, const HubLoader& load_hub);

}  // namespace vramscope::ingest
