#include "overlay_files.h"

#include <algorithm>

namespace vramscope::python {

namespace fs = std::filesystem;

const MemoryFile* OverlayFileSystem::Find(const fs::path& path) const {
  auto it = files_.find(path.lexically_normal().string());
  return it == files_.end() ? nullptr : &it->second;
}

bool OverlayFileSystem::IsDirectory(const fs::path& path) const {
  const std::string dir = path.lexically_normal().string();
  return std::any_of(files_.begin(), files_.end(), [&](const auto& entry) {
    return fs::path(entry.first).parent_path().string() == dir;
  });
}

FileSystem::Kind OverlayFileSystem::Stat(const fs::path& path) const {
  if (Find(path)) return Kind::kRegularFile;
  if (IsDirectory(path)) return Kind::kDirectory;
  return below_.Stat(path);
}

Result<uint64_t> OverlayFileSystem::FileSize(const fs::path& path) const {
  if (const MemoryFile* f = Find(path)) return f->size_bytes;
  return below_.FileSize(path);
}

std::optional<std::string> OverlayFileSystem::Read(const fs::path& path, uint64_t offset,
                                                   uint64_t max_bytes) const {
  const MemoryFile* f = Find(path);
  if (!f) return below_.Read(path, offset, max_bytes);
  if (offset >= f->prefix.size()) return std::string();
  return f->prefix.substr(offset, max_bytes);
}

Result<std::vector<fs::path>> OverlayFileSystem::ListFiles(const fs::path& dir) const {
  if (!IsDirectory(dir)) return below_.ListFiles(dir);
  std::vector<fs::path> out;
  const std::string wanted = dir.lexically_normal().string();
  for (const auto& entry : files_) {
    if (fs::path(entry.first).parent_path().string() == wanted) out.emplace_back(entry.first);
  }
  return out;
}

std::string OverlayFileSystem::WriteAtomically(const fs::path& path, std::string_view text) const {
  return below_.WriteAtomically(path, text);
}

}  // namespace vramscope::python
