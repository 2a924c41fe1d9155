#include "event_text.h"

#include <fmt/format.h>

namespace vramscope::events_internal {
namespace {

bool IsControl(unsigned char c) { return (c < 0x20 && c != '\t') || c == 0x7f; }

bool IsContinuation(unsigned char c) { return (c & 0xC0) == 0x80; }

// Length of the well-formed UTF-8 sequence starting at text[i], or 0 if the
// bytes there are not one (overlong forms, surrogates and code points above
// U+10FFFF are rejected, per RFC 3629).
size_t Utf8SequenceLength(std::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  if (lead < 0x80) return 1;
  size_t length = 0;
  unsigned char second_min = 0x80;
  unsigned char second_max = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) second_min = 0xA0;  // overlong
    if (lead == 0xED) second_max = 0x9F;  // surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) second_min = 0x90;  // overlong
    if (lead == 0xF4) second_max = 0x8F;  // above U+10FFFF
  } else {
    return 0;
  }
  if (i + length > text.size()) return 0;
  if (byte(i + 1) < second_min || byte(i + 1) > second_max) return 0;
  for (size_t k = 2; k < length; ++k) {
    if (!IsContinuation(byte(i + k))) return 0;
  }
  return length;
}

// Shared body of SanitizeText / SanitizeToken.
std::string Sanitize(std::string_view text, size_t max_bytes, bool token) {
  std::string out;
  out.reserve(std::min(text.size(), max_bytes));
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    const size_t length = Utf8SequenceLength(text, i);
    if (length == 0) {
      out.push_back('?');
      ++i;
    } else if (length == 1 && (IsControl(c) || (token && IsBlank(text[i])))) {
      out.push_back(token ? '_' : ' ');
      ++i;
    } else {
      out.append(text.substr(i, length));
      i += length;
    }
  }
  size_t first = 0;
  while (first < out.size() && IsBlank(out[first])) ++first;
  out.erase(0, first);
  if (out.size() > max_bytes) {
    size_t cut = max_bytes;
    while (cut > 0 && IsContinuation(static_cast<unsigned char>(out[cut]))) --cut;
    out.resize(cut);
  }
  if (token && out.empty()) out.push_back('_');
  return out;
}

}  // namespace

std::optional<std::string> FindTextProblem(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    const size_t length = Utf8SequenceLength(text, i);
    if (length == 0) return fmt::format("invalid UTF-8 at byte {}", i + 1);
    if (length == 1 && IsControl(c)) {
      return fmt::format("control character 0x{:02x} at byte {}", c, i + 1);
    }
    i += length;
  }
  return std::nullopt;
}

std::string SanitizeText(std::string_view text, size_t max_bytes) {
  return Sanitize(text, max_bytes, /*token=*/false);
}

std::string SanitizeToken(std::string_view text, size_t max_bytes) {
  return Sanitize(text, max_bytes, /*token=*/true);
}

}  // namespace vramscope::events_internal
