// The disk behind FileSystem (vramscope/model_io.h): library vs_ingest_disk,
// linked by the CLI and the tests that use real files, never by vs_ingest.
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <random>

#include <fmt/format.h>

#include "vramscope/local_io.h"

namespace vramscope {
namespace {

namespace fs = std::filesystem;

class Disk final : public FileSystem {
 public:
  Kind Stat(const fs::path& path) const override {
    std::error_code ec;
    const fs::file_status status = fs::status(path, ec);
    if (!fs::exists(status)) return Kind::kMissing;
    if (fs::is_directory(status)) return Kind::kDirectory;
    if (fs::is_regular_file(status)) return Kind::kRegularFile;
    return Kind::kOther;
  }

  Result<uint64_t> FileSize(const fs::path& path) const override {
    std::error_code ec;
    const uint64_t size = fs::file_size(path, ec);
    if (ec) return MakeError(ec.message());
    return size;
  }

  std::optional<std::string> Read(const fs::path& path, uint64_t offset,
                                  uint64_t max_bytes) const override {
    std::ifstream in(path, std::ios::binary);
    if (!in) return std::nullopt;
    std::string out;
    if (!in.seekg(static_cast<std::streamoff>(offset))) return out;
    // In chunks, so that a file shorter than max_bytes costs only its size.
    constexpr uint64_t kChunkBytes = 1 << 20;
    while (out.size() < max_bytes && in) {
      const size_t start = out.size();
      const auto want = static_cast<size_t>(std::min<uint64_t>(kChunkBytes, max_bytes - start));
      out.resize(start + want);
      in.read(out.data() + start, static_cast<std::streamsize>(want));
      out.resize(start + static_cast<size_t>(in.gcount()));
    }
    return out;
  }

  Result<std::vector<fs::path>> ListFiles(const fs::path& dir) const override {
    std::vector<fs::path> files;
    std::error_code ec;
    for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
      if (entry.is_regular_file(ec)) files.push_back(entry.path());
    }
    if (ec) return MakeError(ec.message());
    return files;
  }

  // A temporary file beside `path`, renamed into place: rename() is atomic
  // within a directory, so a concurrent vramscope reads the old file or the
  // new one, never a partial one.
  std::string WriteAtomically(const fs::path& path, std::string_view text) const override {
    std::error_code ec;
    fs::create_directories(path.parent_path(), ec);
    if (ec) return fmt::format("cannot create {}: {}", path.parent_path().string(), ec.message());
    std::random_device entropy;
    const fs::path tmp = path.string() + fmt::format(".tmp-{}-{:08x}", getpid(), entropy());
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out.write(text.data(), static_cast<std::streamsize>(text.size()));
      out.close();
      if (!out) {
        fs::remove(tmp, ec);
        return fmt::format("cannot write {}", tmp.string());
      }
    }
    fs::rename(tmp, path, ec);
    if (ec) {
      std::string problem = fmt::format("cannot rename into {}: {}", path.string(), ec.message());
      fs::remove(tmp, ec);
      return problem;
    }
    return "";
  }
};

}  // namespace

const FileSystem& DiskFileSystem() {
  static const Disk disk;
  return disk;
}

}  // namespace vramscope
