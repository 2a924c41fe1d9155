#include "vramscope/common/json_depth.h"

namespace vramscope::common {

bool JsonNestsDeeperThan(std::string_view text, size_t max_depth) {
  size_t depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return true;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return false;
}

bool JsonHasMoreItemsThan(std::string_view text, size_t max_items) {
  size_t items = 0;
  bool in_string = false;
  bool escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if ((c == ',' || c == '[' || c == '{') && ++items > max_items) {
      return true;
    }
  }
  return false;
}

std::optional<size_t> FindNulByte(std::string_view text) {
  const size_t at = text.find('\0');
  if (at == std::string_view::npos) return std::nullopt;
  return at;
}

std::string NulByteProblem(size_t offset) {
  return "NUL byte at byte " + std::to_string(offset) + " (JSON text has none)";
}

}  // namespace vramscope::common
