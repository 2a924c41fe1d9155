// libFuzzer target for model directories of the diffusion and encoder
// families: a config.json and a model.safetensors header (the only part of a
// checkpoint vramscope reads), resolved as `vramscope estimate DIR` resolves
// them (ResolveModel: the header's tensors become the parameter list), then
// lowered (lower_what_was_read.h), where T5 and CLIP parameters are placed
// by the block or layer index in their names.
//
// Input: the config's JSON on the first line, the header's JSON after it. The
// file holds the header and 1 MiB of (never read) data. Seeds: real headers
// of small T5, CLIP, UNet, FLUX and VAE models as transformers and diffusers
// save them (fuzz/make_checkpoint_seeds.py).
//
//   scripts/fuzz.sh fuzz_checkpoint_header
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>

#include "lower_what_was_read.h"
#include "vramscope/model_io.h"

namespace {

namespace fs = std::filesystem;

// The model directory, in memory: path -> (bytes held, file size).
class MemoryDirectory final : public vramscope::FileSystem {
 public:
  std::map<std::string, std::pair<std::string, uint64_t>> files;

  Kind Stat(const fs::path& path) const override {
    if (files.count(path.string())) return Kind::kRegularFile;
    for (const auto& [name, file] : files) {
      if (fs::path(name).parent_path() == path) return Kind::kDirectory;
    }
    return Kind::kMissing;
  }
  vramscope::Result<uint64_t> FileSize(const fs::path& path) const override {
    auto it = files.find(path.string());
    if (it == files.end()) return vramscope::MakeError("No such file or directory");
    return it->second.second;
  }
  std::optional<std::string> Read(const fs::path& path, uint64_t offset,
                                  uint64_t max_bytes) const override {
    auto it = files.find(path.string());
    if (it == files.end()) return std::nullopt;
    if (offset >= it->second.first.size()) return std::string();
    return it->second.first.substr(offset, max_bytes);
  }
  vramscope::Result<std::vector<fs::path>> ListFiles(const fs::path& dir) const override {
    std::vector<fs::path> out;
    for (const auto& [name, file] : files) {
      if (fs::path(name).parent_path() == dir) out.emplace_back(name);
    }
    return out;
  }
  std::string WriteAtomically(const fs::path& path, std::string_view) const override {
    return path.string() + ": read-only";
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t line = input.find('\n');
  if (line == std::string_view::npos) return 0;
  const std::string config(input.substr(0, line));
  const std::string header(input.substr(line + 1));
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i)
    file[i] = static_cast<char>((uint64_t{header.size()} >> (8 * i)) & 0xff);
  file += header;
  MemoryDirectory dir;
  dir.files["/fuzz/model/config.json"] = {config, config.size()};
  dir.files["/fuzz/model/model.safetensors"] = {file, file.size() + (uint64_t{1} << 20)};
  vramscope::ModelIo io;
  io.files = &dir;
  auto spec = vramscope::ResolveModel("/fuzz/model", io);
  if (!spec.ok()) {
    fuzz_support::CheckOneLine("fuzz_checkpoint_header", spec.error());
    return 0;
  }
  fuzz_support::LowerWhatWasRead("fuzz_checkpoint_header", *spec);
  return 0;
}
