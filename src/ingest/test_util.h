// Test helpers for ingest: temporary directories and fake safetensors files
// (a real header followed by zero bytes; no weights).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace vramscope::ingest::testing {

// A fresh directory under the system temp dir, removed with its contents on
// destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

void WriteFile(const std::filesystem::path& path, const std::string& bytes);

struct FakeTensor {
  std::string name;
  std::string dtype;  // "BF16", "F32", ...
  std::vector<uint64_t> shape;
};

// The bytes of a valid .safetensors file holding `tensors` (all zeros).
std::string MakeSafetensors(const std::vector<FakeTensor>& tensors);

// Overwrites the 8-byte little-endian header length of a safetensors image.
void SetHeaderLength(std::string& bytes, uint64_t header_bytes);

// True when `s` is one line (no newline characters).
bool IsOneLine(const std::string& s);

}  // namespace vramscope::ingest::testing
