// Safetensors header reading: tensor names, shapes and dtypes of a checkpoint
// without reading any weights.
//
// A .safetensors file is an 8-byte little-endian header length N, N bytes of
// JSON header {"name": {"dtype", "shape", "data_offsets": [begin, end]}, ...,
// "__metadata__": {...}}, then the tensor data. Offsets are relative to the
// end of the header. ParseSafetensorsHeader validates everything a reader
// would trust: N within the file and under kMaxSafetensorsHeaderBytes, known
// dtypes, offsets inside the data area, sizes matching dtype x shape, and no
// two tensors overlapping.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "vramscope/model_io.h"
#include "vramscope/result.h"

namespace vramscope::ingest {

inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100ULL * 1000 * 1000;  // 100 MB

struct SafetensorsTensor {
  std::string name;
  std::string dtype;  // as spelled in the header: "BF16", "F32", ...
  std::vector<uint64_t> shape;
  uint64_t numel = 0;
  uint64_t data_begin = 0, data_end = 0;  // relative to the data area
};

// `prefix` holds the first bytes of the file (at least 8 + N of them when N is
// acceptable); `file_size_bytes` is the whole file's size. `name` is used in
// messages. Tensors come back sorted by data offset.
Result<std::vector<SafetensorsTensor>> ParseSafetensorsHeader(std::string_view prefix,
                                                              uint64_t file_size_bytes,
                                                              std::string_view name);

// Reads just the length and header of `path` from `files` (never the data)
// and parses it.
Result<std::vector<SafetensorsTensor>> ReadSafetensorsHeader(const FileSystem& files,
                                                             const std::filesystem::path& path);

// Bytes per element for a safetensors dtype; 0 when unknown.
uint64_t SafetensorsDTypeBits(std::string_view dtype);

}  // namespace vramscope::ingest
