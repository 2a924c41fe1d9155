// The real outside world for ModelIo (vramscope/model_io.h), kept out of the
// core library: link vs_ingest_disk for the file system and vs_ingest_curl for
// the Hub. Only programs (the CLI) and the tests that need them link these.
#pragma once

#include <memory>

#include "vramscope/model_io.h"

namespace vramscope {

// std::filesystem and fstreams; WriteAtomically writes a temporary file
// beside the target and renames it into place. Stateless and thread-safe.
// (vs_ingest_disk)
const FileSystem& DiskFileSystem();

// libcurl: http and https only (redirects too), at most 10 redirects, the
// request's timeouts and size limit; proxies from the usual http_proxy /
// https_proxy / no_proxy variables as libcurl reads them. (vs_ingest_curl)
std::unique_ptr<HttpFetcher> MakeCurlFetcher();

}  // namespace vramscope
