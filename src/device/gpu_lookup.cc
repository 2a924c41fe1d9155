// FindGpu: name, alias and display-name lookup in the GPU catalog.
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "vramscope/gpu.h"

namespace vramscope {
namespace {

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

// The user's text in an error message: printable ASCII only, at most 64
// bytes, so a hostile name cannot break the one-line message.
std::string Printable(std::string_view text) {
  constexpr size_t kMaxShownBytes = 64;
  std::string out;
  for (char c : text.substr(0, kMaxShownBytes)) out.push_back(c >= 0x20 && c < 0x7f ? c : '?');
  if (text.size() > kMaxShownBytes) out += "...";
  return out;
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
  return MakeError(fmt::format("gpu: unknown GPU '{}' (known: {})", Printable(name), KnownNames()));
}

}  // namespace vramscope
