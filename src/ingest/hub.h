// Hugging Face Hub fetch of one file, config.json. The network, the
// environment and the cache files are the caller's (ModelIo,
// vramscope/model_io.h): this code only decides what to ask and what the
// answers mean.
//
// The steps are split so each can be tested alone:
//   ParseHubRef        "owner/name[@revision]" -> HubRef (pure validation)
//   ReadHubSettings    environment + token file -> HubSettings
//   HubConfigUrl       HubRef + endpoint -> URL (pure)
//   HubCachePath       HubRef + settings -> cache file (pure)
//   MapHubResponse     HTTP response -> config text or one-line Error (pure)
//   FetchHubConfig     cache, else HttpFetcher::Get, then write the cache
// HttpFetcher and FileSystem are interfaces: the real ones (libcurl, the
// disk) live outside the core library (vramscope/local_io.h); tests pass fakes
// that record what was asked.
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
#include "vramscope/model_io.h"
#include "vramscope/result.h"

namespace vramscope::ingest {

// A model repository on the Hub and the revision (branch, tag or commit) to read.
struct HubRef {
  std::string repo_id;  // "meta-llama/Meta-Llama-3-8B"
  std::string revision = "main";
  bool explicit_revision = false;  // "@revision" was given
  // A diffusers pipeline's component folder ("unet", "transformer") whose
  // config.json is read instead of the root's; empty: the root.
  std::string subfolder;
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
  std::string token;                                // empty: send no Authorization header
  std::filesystem::path cache_dir;                  // vramscope's cache root; empty: no cache
  bool offline = false;                             // HF_HUB_OFFLINE: cache only, never the network
  int connect_timeout_s = 10;
  int total_timeout_s = 30;
  uint64_t max_config_bytes = 4ULL << 20;  // a config.json is a few KiB
};

// Settings from the environment (see the top of this file; the cache root is
// $VRAMSCOPE_CACHE, else $XDG_CACHE_HOME/vramscope, else $HOME/.cache/vramscope).
// Reads the token file through `files` when no token variable is set; an
// unreadable or absent file means no token. Empty variables count as unset.
HubSettings ReadHubSettings(const EnvLookup& env, const FileSystem& files);

// "{endpoint}/{repo_id}/resolve/{revision}/[{subfolder}/]config.json"; a '/'
// inside the revision is sent as %2F, as huggingface_hub quotes it.
std::string HubConfigUrl(const HubRef& ref, std::string_view endpoint);

// Where the config of `ref` fetched from `endpoint` is cached, under
// cache_dir: hub/<host>-<hash of endpoint>/<owner>--<name>/<revision>.json,
// with '/' in the revision written %2F (a subfolder's: <revision>.<subfolder>.json).
// Distinct endpoints, repos, revisions and subfolders never share a file.
std::filesystem::path HubCachePath(const HubRef& ref, const HubSettings& settings);

// The config text of a 200 response, or a one-line Error naming `ref` and
// saying what to do (gated: accept the license and set HF_TOKEN; unreachable:
// pass a config.json path or set HF_ENDPOINT; ...). `token_sent` tells a
// rejected token from a missing one.
Result<std::string> MapHubResponse(const HubRef& ref, std::string_view endpoint, bool token_sent,
                                   const HttpResponse& response);

struct HubConfig {
  std::string text;    // config.json
  std::string source;  // the URL, or the cache file when read from it
  bool from_cache = false;
  std::string cache_problem;  // why the fetched config was not cached; empty if it was
  std::string subfolder;      // the pipeline component it was read from; empty: the root
};

// config.json of `ref`: the cached copy in `files` when there is one (no
// network at all), otherwise one GET through `fetcher` and, on success with
// valid JSON, FileSystem::WriteAtomically of the cache (a concurrent reader
// never sees half a file). Offline without a cached copy is an error. A
// cached file that is not valid JSON is ignored and refetched. A repository
// without a root config.json (the Hub's EntryNotFound), or offline without its
// cached copy, is tried as a diffusers pipeline: unet/config.json, then
// transformer/config.json (diffusers' model_index.json layout), each the same
// way; the first found is returned with its subfolder.
Result<HubConfig> FetchHubConfig(const HubRef& ref, const HubSettings& settings,
                                 const FileSystem& files, HttpFetcher& fetcher);

// ParseHubRef + FetchHubConfig + ParseModelConfig: the ModelSpec of a Hub id,
// with name = `name`, hub_id = the repo id, and a note saying where the
// config came from.
Result<ModelSpec> LoadHubModel(std::string_view name, const HubSettings& settings,
                               const FileSystem& files, HttpFetcher& fetcher);

// ResolveModel (model_io.h) with its last step, the Hub, done by `load_hub`:
// an existing path in `files`, then a catalog alias or id, then — for a name
// that LooksLikeHubId — load_hub(name). ResolveModel passes LoadHubModel with
// the settings of its ModelIo; tests pass a fake.
using HubLoader = std::function<Result<ModelSpec>(std::string_view name)>;
Result<ModelSpec> ResolveModelWithHub(std::string_view model, const FileSystem& files,
                                      const HubLoader& load_hub);

// A FileSystem in which no file exists and nothing can be written: what a
// ModelIo without files means.
const FileSystem& NoFileSystem();

}  // namespace vramscope::ingest
