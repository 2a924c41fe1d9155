#include "vramscope/common/version.h"

namespace vramscope::common {
namespace {

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// Reads the digits at the start of `*text` (at least one) into `*value`, at
// most 99, and drops them from `*text`.
bool TakeNumber(std::string_view* text, int* value) {
  size_t i = 0;
  int v = 0;
  while (i < text->size() && IsDigit((*text)[i])) {
    v = v * 10 + ((*text)[i] - '0');
    if (v > 99) return false;
    ++i;
  }
  if (i == 0) return false;
  *value = v;
  text->remove_prefix(i);
  return true;
}

}  // namespace

std::optional<MajorMinor> ParseMajorMinor(std::string_view text, std::string_view* rest) {
  MajorMinor version;
  if (!TakeNumber(&text, &version.major)) return std::nullopt;
  if (text.empty() || text.front() != '.') return std::nullopt;
  text.remove_prefix(1);
  if (!TakeNumber(&text, &version.minor)) return std::nullopt;
  if (rest != nullptr) *rest = text;
  return version;
}

}  // namespace vramscope::common
