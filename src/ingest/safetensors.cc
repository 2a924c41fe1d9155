#include "safetensors.h"

#include <algorithm>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "config_reader.h"
#include "param_list.h"
#include "vramscope/common/checked.h"

namespace vramscope::ingest {

uint64_t SafetensorsDTypeBits(std::string_view dtype) {
  struct Entry {
    std::string_view name;
    uint64_t bits;
  };
  // The dtypes the safetensors format defines (safetensors 0.4).
  static constexpr Entry kDtypes[] = {
      {"BOOL", 8},    {"U8", 8},   {"I8", 8},      {"F8_E5M2", 8}, {"F8_E4M3", 8},
      {"F8_E8M0", 8}, {"I16", 16}, {"U16", 16},    {"F16", 16},    {"BF16", 16},
      {"I32", 32},    {"U32", 32}, {"F32", 32},    {"F64", 64},    {"I64", 64},
      {"U64", 64},    {"F4", 4},   {"F6_E2M3", 6}, {"F6_E3M2", 6},
  };
  for (const Entry& e : kDtypes) {
    if (e.name == dtype) return e.bits;
  }
  return 0;
}

namespace {

Result<SafetensorsTensor> ParseEntry(const std::string& key, const nlohmann::json& entry,
                                     std::string_view name) {
  auto fail = [&](std::string problem) {
    return MakeError(
        fmt::format("{}: tensor {}: {}", name, common::QuoteForMessage(key, 120), problem));
  };
  if (!entry.is_object()) return fail("expected an object, got " + DescribeJson(entry));
  SafetensorsTensor t;
  t.name = key;
  auto dtype = entry.find("dtype");
  if (dtype == entry.end() || !dtype->is_string()) return fail("dtype: missing or not a string");
  t.dtype = dtype->get<std::string>();
  uint64_t bits = SafetensorsDTypeBits(t.dtype);
  if (bits == 0) return fail(fmt::format("dtype: unknown {}", common::QuoteForMessage(t.dtype)));
  auto shape = entry.find("shape");
  if (shape == entry.end() || !shape->is_array()) return fail("shape: missing or not an array");
  t.numel = 1;
  for (const nlohmann::json& d : *shape) {
    if (!d.is_number_unsigned()) return fail("shape: expected non-negative integers");
    uint64_t dim = d.get<uint64_t>();
    t.shape.push_back(dim);
    const std::optional<uint64_t> numel = common::CheckedMul(t.numel, dim);
    if (!numel) return fail("shape: too large");
    t.numel = *numel;
  }
  auto offsets = entry.find("data_offsets");
  if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2 ||
      !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
    return fail("data_offsets: expected [begin, end]");
  }
  t.data_begin = (*offsets)[0].get<uint64_t>();
  t.data_end = (*offsets)[1].get<uint64_t>();
  if (t.data_end < t.data_begin) return fail("data_offsets: end before begin");
  // Rounded up to whole bytes (F4, F6 pack several elements per byte).
  const std::optional<uint64_t> bits_total = common::CheckedMul(t.numel, bits);
  const std::optional<uint64_t> bits_padded =
      bits_total ? common::CheckedAdd(*bits_total, 7) : std::nullopt;
  if (!bits_padded) return fail("shape: too large");
  const uint64_t expected_bytes = *bits_padded / 8;
  if (t.data_end - t.data_begin != expected_bytes) {
    return fail(fmt::format("data_offsets: {} bytes for {} x {} needs {}",
                            t.data_end - t.data_begin, t.numel, t.dtype, expected_bytes));
  }
  return t;
}

}  // namespace

Result<std::vector<SafetensorsTensor>> ParseSafetensorsHeader(std::string_view prefix,
                                                              uint64_t file_size_bytes,
                                                              std::string_view name) {
  if (prefix.size() < 8 || file_size_bytes < 8) {
    return MakeError(
        fmt::format("{}: too short for a safetensors file ({} bytes)", name, file_size_bytes));
  }
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) {
    header_bytes = (header_bytes << 8) | static_cast<unsigned char>(prefix[i]);
  }
  if (header_bytes > kMaxSafetensorsHeaderBytes) {
    return MakeError(fmt::format("{}: header length {} exceeds the {} byte limit", name,
                                 header_bytes, kMaxSafetensorsHeaderBytes));
  }
  if (header_bytes > file_size_bytes - 8) {
    return MakeError(fmt::format("{}: header length {} runs past the end of the {} byte file", name,
                                 header_bytes, file_size_bytes));
  }
  if (prefix.size() < 8 + header_bytes) {
    return MakeError(fmt::format("{}: header truncated ({} of {} bytes read)", name,
                                 prefix.size() - 8, header_bytes));
  }
  std::string_view text = prefix.substr(8, header_bytes);
  if (auto nul = common::FindNulByte(text)) {
    return MakeError(fmt::format("{}: header: {}", name, common::NulByteProblem(*nul)));
  }
  if (common::JsonNestsDeeperThan(text, kMaxJsonDepth)) {
    return MakeError(
        fmt::format("{}: header: JSON nested deeper than {} levels", name, kMaxJsonDepth));
  }
  // A tensor's entry has about 8 items plus one per dimension; the header
  // of a checkpoint within kMaxTensors needs far fewer than this. Checked
  // before parsing: 99 MB of tiny entries took 3 GB as a parsed document.
  constexpr size_t kMaxHeaderItems = kMaxTensors * 16 + 65536;
  if (common::JsonHasMoreItemsThan(text, kMaxHeaderItems)) {
    return MakeError(fmt::format(
        "{}: header: more than {} JSON items (a checkpoint within {} tensors has fewer)", name,
        kMaxHeaderItems, kMaxTensors));
  }
  nlohmann::json header = nlohmann::json::parse(text, nullptr, false);
  if (header.is_discarded() || !header.is_object()) {
    return MakeError(fmt::format("{}: header is not a JSON object", name));
  }
  const uint64_t data_bytes = file_size_bytes - 8 - header_bytes;
  std::vector<SafetensorsTensor> tensors;
  for (const auto& [key, entry] : header.items()) {
    if (key == "__metadata__") continue;
    Result<SafetensorsTensor> t = ParseEntry(key, entry, name);
    if (!t.ok()) return t.error();
    if (t->data_end > data_bytes) {
      return MakeError(
          fmt::format("{}: tensor {}: data_offsets end {} is past the {} data "
                      "bytes in the file",
                      name, common::QuoteForMessage(key, 120), t->data_end, data_bytes));
    }
    tensors.push_back(std::move(t.value()));
  }
  std::sort(tensors.begin(), tensors.end(), [](const auto& a, const auto& b) {
    return a.data_begin != b.data_begin ? a.data_begin < b.data_begin : a.data_end < b.data_end;
  });
  for (size_t i = 1; i < tensors.size(); ++i) {
    if (tensors[i].data_begin < tensors[i - 1].data_end) {
      return MakeError(fmt::format("{}: tensors {} and {} overlap", name,
                                   common::QuoteForMessage(tensors[i - 1].name, 120),
                                   common::QuoteForMessage(tensors[i].name, 120)));
    }
  }
  return tensors;
}

Result<std::vector<SafetensorsTensor>> ReadSafetensorsHeader(const FileSystem& files,
                                                             const std::filesystem::path& path) {
  const std::string name = path.string();
  const Result<uint64_t> size = files.FileSize(path);
  if (!size.ok()) return MakeError(fmt::format("{}: cannot read: {}", name, size.error().message));
  std::optional<std::string> prefix = files.Read(path, 0, 8);
  if (!prefix) return MakeError(fmt::format("{}: cannot open", name));
  if (*size < 8 || prefix->size() < 8) {
    return MakeError(fmt::format("{}: too short for a safetensors file ({} bytes)", name, *size));
  }
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) {
    header_bytes = (header_bytes << 8) | static_cast<unsigned char>((*prefix)[i]);
  }
  // Validate the length before allocating for it: only the header is read.
  if (header_bytes <= kMaxSafetensorsHeaderBytes && header_bytes <= *size - 8) {
    *prefix += files.Read(path, 8, header_bytes).value_or("");
  }
  return ParseSafetensorsHeader(*prefix, *size, name);
}

}  // namespace vramscope::ingest
