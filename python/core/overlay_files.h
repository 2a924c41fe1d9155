// A FileSystem that shows a few files held in memory on top of the disk: how
// the Python module hands the engine a model it has only as Python objects (a
// transformers config, an nn.Module on the meta device) without writing a file.
// The in-memory model is a directory like the ones `vramscope estimate DIR`
// reads: config.json and a model.safetensors of which only the header exists
// (its size is the size the data would have; the engine never reads data).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>

#include "vramscope/model_io.h"

namespace vramscope::python {

struct MemoryFile {
  std::string prefix;       // the bytes held: the whole file, or its header
  uint64_t size_bytes = 0;  // the size the file has (at least prefix.size())
};

class OverlayFileSystem final : public FileSystem {
 public:
  // `files`: absolute-looking paths ("<python>/model/config.json") to contents.
  OverlayFileSystem(std::map<std::string, MemoryFile> files, const FileSystem& below)
      : files_(std::move(files)), below_(below) {}

  Kind Stat(const std::filesystem::path& path) const override;
  Result<uint64_t> FileSize(const std::filesystem::path& path) const override;
  std::optional<std::string> Read(const std::filesystem::path& path, uint64_t offset,
                                  uint64_t max_bytes) const override;
  Result<std::vector<std::filesystem::path>> ListFiles(
      const std::filesystem::path& dir) const override;
  std::string WriteAtomically(const std::filesystem::path& path,
                              std::string_view text) const override;

 private:
  const MemoryFile* Find(const std::filesystem::path& path) const;
  bool IsDirectory(const std::filesystem::path& path) const;

  std::map<std::string, MemoryFile> files_;
  const FileSystem& below_;
};

}  // namespace vramscope::python
