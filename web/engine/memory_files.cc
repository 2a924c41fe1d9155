#include "memory_files.h"

#include <algorithm>

namespace vramscope::web {

namespace fs = std::filesystem;

const std::string* MemoryFileSystem::Find(const fs::path& path) const {
  auto it = files_.find(path.lexically_normal().string());
  return it == files_.end() ? nullptr : &it->second;
}

bool MemoryFileSystem::IsDirectory(const fs::path& path) const {
  const std::string dir = path.lexically_normal().string();
  return std::any_of(files_.begin(), files_.end(), [&](const auto& entry) {
    return fs::path(entry.first).parent_path().string() == dir;
  });
}

FileSystem::Kind MemoryFileSystem::Stat(const fs::path& path) const {
  if (Find(path)) return Kind::kRegularFile;
  if (IsDirectory(path)) return Kind::kDirectory;
  return Kind::kMissing;
}

Result<uint64_t> MemoryFileSystem::FileSize(const fs::path& path) const {
  if (const std::string* f = Find(path)) return static_cast<uint64_t>(f->size());
  return Error{"No such file or directory"};
}

std::optional<std::string> MemoryFileSystem::Read(const fs::path& path, uint64_t offset,
                                                  uint64_t max_bytes) const {
  const std::string* f = Find(path);
  if (!f) return std::nullopt;
  if (offset >= f->size()) return std::string();
  return f->substr(offset, max_bytes);
}

Result<std::vector<fs::path>> MemoryFileSystem::ListFiles(const fs::path& dir) const {
  if (!IsDirectory(dir)) return Error{"No such file or directory"};
  std::vector<fs::path> out;
  const std::string wanted = dir.lexically_normal().string();
  for (const auto& entry : files_) {
    if (fs::path(entry.first).parent_path().string() == wanted) out.emplace_back(entry.first);
  }
  return out;
}

std::string MemoryFileSystem::WriteAtomically(const fs::path& path, std::string_view) const {
  return "the web page writes no files (" + path.string() + ")";
}

}  // namespace vramscope::web
