// A FileSystem of a few files held in memory and nothing else: how the web
// page hands the engine a config.json the user pasted, dropped or had the
// browser fetch from the Hub. The page's engine sees no disk.
#pragma once

#include <filesystem>
#include <map>
#include <string>

#include "vramscope/model_io.h"

namespace vramscope::web {

class MemoryFileSystem final : public FileSystem {
 public:
  // `files`: absolute paths ("/page/config.json") to whole contents.
  explicit MemoryFileSystem(std::map<std::string, std::string> files) : files_(std::move(files)) {}

  Kind Stat(const std::filesystem::path& path) const override;
  Result<uint64_t> FileSize(const std::filesystem::path& path) const override;
  std::optional<std::string> Read(const std::filesystem::path& path, uint64_t offset,
                                  uint64_t max_bytes) const override;
  Result<std::vector<std::filesystem::path>> ListFiles(
      const std::filesystem::path& dir) const override;
  // The page keeps no cache: nothing is written.
  std::string WriteAtomically(const std::filesystem::path& path,
                              std::string_view text) const override;

 private:
  const std::string* Find(const std::filesystem::path& path) const;
  bool IsDirectory(const std::filesystem::path& path) const;

  std::map<std::string, std::string> files_;
};

}  // namespace vramscope::web
