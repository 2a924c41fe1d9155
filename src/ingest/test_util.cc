#include "test_util.h"

#include <atomic>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "safetensors.h"

namespace vramscope::ingest::testing {

namespace fs = std::filesystem;

TempDir::TempDir() {
  static std::atomic<int> counter{0};
  std::random_device rd;
  for (int attempt = 0; attempt < 100; ++attempt) {
    fs::path p = fs::temp_directory_path() /
                 ("vs_ingest_test_" + std::to_string(rd()) + "_" + std::to_string(counter++));
    if (fs::create_directory(p)) {
      path_ = p;
      return;
    }
  }
  std::abort();
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

void WriteFile(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string MakeSafetensors(const std::vector<FakeTensor>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (const FakeTensor& t : tensors) {
    uint64_t numel = 1;
    for (uint64_t d : t.shape) numel *= d;
    uint64_t bytes = (numel * SafetensorsDTypeBits(t.dtype) + 7) / 8;
    header[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  std::string out(8, '\0');
  SetHeaderLength(out, text.size());
  out += text;
  out.append(offset, '\0');
  return out;
}

void SetHeaderLength(std::string& bytes, uint64_t header_bytes) {
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header_bytes >> (8 * i)) & 0xff);
}

bool IsOneLine(const std::string& s) { return s.find('\n') == std::string::npos && !s.empty(); }

}  // namespace vramscope::ingest::testing
