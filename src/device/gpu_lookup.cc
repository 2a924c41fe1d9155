// FindGpu: name, alias and display-name lookup in the GPU catalog.
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "vramscope/common/quote.h"
#include "vramscope/gpu.h"

namespace vramscope {
namespace {

// Bytes of an unknown name shown in the error (GPU names run to 40 or so).
constexpr size_t kMaxShownNameBytes = 64;

// Lower-case, with runs of spaces, underscores and dashes as one dash and no
// dash at either end: "NVIDIA  H100_80GB" -> "nvidia-h100-80gb". People type
// names the way nvidia-smi and torch print them as often as catalog keys.
std::string Normalize(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == ' ' || c == '_' || c == '-' || c == '\t') {
      if (!out.empty() && out.back() != '-') out.push_back('-');
    } else if (c >= 'A' && c <= 'Z') {
      out.push_back(static_cast<char>(c - 'A' + 'a'));
    } else {
      out.push_back(c);
    }
  }
  if (!out.empty() && out.back() == '-') out.pop_back();
  return out;
}

bool Matches(const GpuSpec& spec, std::string_view key) {
  if (Normalize(spec.name) == key || Normalize(spec.display_name) == key) return true;
  for (const std::string& alias : spec.aliases) {
    if (Normalize(alias) == key) return true;
  }
  return false;
}

std::string KnownNames() {
  std::string names;
  for (const GpuSpec& spec : GpuCatalog()) {
    if (!names.empty()) names += ", ";
    names += spec.name;
  }
  return names;
}

}  // namespace

Result<GpuSpec> FindGpu(std::string_view name) {
  const std::string key = Normalize(name);
  if (key.empty()) {
    return MakeError(fmt::format("gpu: empty name (known: {})", KnownNames()));
  }
  // "NVIDIA L4" and "l4" name the same GPU; the vendor prefix is optional.
  constexpr std::string_view kVendorPrefix = "nvidia-";
  const std::string without_vendor =
      key.rfind(kVendorPrefix, 0) == 0 ? key.substr(kVendorPrefix.size()) : key;
  for (const GpuSpec& spec : GpuCatalog()) {
    if (Matches(spec, key) || Matches(spec, without_vendor)) return spec;
  }
  return MakeError(fmt::format("gpu: unknown GPU {} (known: {})",
                               common::QuoteForMessage(name, kMaxShownNameBytes, '\''),
                               KnownNames()));
}

}  // namespace vramscope
