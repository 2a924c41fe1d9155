// The outside world the CLI gives the library (vramscope/model_io.h): the
// disk, the process environment and libcurl. The library itself touches none.
#include <cstdlib>
#include <memory>

#include "output.h"
#include "vramscope/local_io.h"

namespace vramscope::cli {

const ModelIo& LocalModelIo() {
  static const std::unique_ptr<HttpFetcher> hub = MakeCurlFetcher();
  static const ModelIo io = [] {
    ModelIo m;
    m.files = &DiskFileSystem();
    m.env = [](const char* var) -> const char* { return std::getenv(var); };
    m.http = hub.get();
    return m;
  }();
  return io;
}

}  // namespace vramscope::cli
