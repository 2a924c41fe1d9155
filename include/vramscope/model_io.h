// ModelIo: everything outside the process that resolving a model may touch —
// files, environment variables and the Hugging Face Hub — handed in by the
// caller, so that the core library (src/ingest) reads no file, variable or
// socket of its own.
//
// The CLI passes the real ones (a disk FileSystem, getenv, the libcurl
// HttpFetcher; libraries vs_ingest_disk and vs_ingest_curl, declared in
// vramscope/local_io.h); tests pass fakes. A member left empty means "none":
// no file exists, no variable is set, no Hub can be reached.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "vramscope/model.h"
#include "vramscope/result.h"

namespace vramscope {

// The file operations of ResolveModel and the Hub cache. Implementations are
// used from one thread at a time per call of ResolveModel; the disk one keeps
// no state.
class FileSystem {
 public:
  enum class Kind : uint8_t { kMissing, kRegularFile, kDirectory, kOther };

  virtual ~FileSystem() = default;

  // What `path` is, symbolic links followed; kMissing also when it cannot be
  // examined.
  virtual Kind Stat(const std::filesystem::path& path) const = 0;
  // The size of a regular file; on failure the system's reason
  // ("No such file or directory"), without the path.
  virtual Result<uint64_t> FileSize(const std::filesystem::path& path) const = 0;
  // Up to `max_bytes` bytes from `offset` (fewer at the end of the file), or
  // nullopt when the file cannot be opened. Never reads past max_bytes.
  virtual std::optional<std::string> Read(const std::filesystem::path& path, uint64_t offset,
                                          uint64_t max_bytes) const = 0;
  // The regular files directly inside `dir`, in no particular order; on
  // failure the system's reason, without the path.
  virtual Result<std::vector<std::filesystem::path>> ListFiles(
      const std::filesystem::path& dir) const = 0;
  // Writes `text` to `path` so that a concurrent reader sees the old file or
  // the new one, never part of one (creating the parent directories).
  // Returns "" or the problem, naming the path.
  virtual std::string WriteAtomically(const std::filesystem::path& path,
                                      std::string_view text) const = 0;
};

// One GET of the Hub (hub.h says how the Hub is asked).
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
  std::string transport_detail;  // the client's words when transport != kOk
  long status = 0;               // of the last response, after redirects
  std::string body;
  std::string error_code;     // X-Error-Code of the last response
  std::string error_message;  // X-Error-Message of the last response
};

// Performs one GET, following redirects. Implementations never throw; every
// failure is described in the response.
class HttpFetcher {
 public:
  virtual ~HttpFetcher() = default;
  virtual HttpResponse Get(const HttpRequest& request) = 0;
};

// The value of an environment variable, nullptr when unset.
using EnvLookup = std::function<const char*(const char*)>;

struct ModelIo {
  const FileSystem* files = nullptr;  // none: no path exists, no Hub cache, no token file
  EnvLookup env;                      // none: every variable is unset
  HttpFetcher* http = nullptr;        // none: a Hub id that is not cached is an error
};

// A model by name, with the outside world given explicitly: an existing
// path (config.json or a model directory, read through io.files), then a
// catalog alias or id (no I/O), then a Hub id (HF_* variables through io.env,
// the cache through io.files, the request through io.http).
Result<ModelSpec> ResolveModel(std::string_view model, const ModelIo& io);

}  // namespace vramscope
