// ParseDecimal: a run of decimal digits read as a number, without exceptions.
//
// Names carry numbers (a T5 checkpoint's "encoder.block.12.layer.0...", a
// layer index in "model.layers.7.mlp"); std::stoul on such text throws on a
// name that is not what it looks like ("block.x", a 30-digit index), and an
// exception thrown from a reader became "internal error" and exit 1. Readers
// call this instead and treat nullopt as "not an index". Header-only, pure.
#pragma once

#include <charconv>
#include <cstdint>
#include <optional>
#include <string_view>

namespace vramscope::common {

// `text` as a decimal number when it is 1 to 19 digits (no sign, no blank)
// and at most `max`; nullopt otherwise.
inline std::optional<uint64_t> ParseDecimal(std::string_view text, uint64_t max) {
  if (text.empty() || text.size() > 19) return std::nullopt;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  uint64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || value > max) return std::nullopt;
  return value;
}

}  // namespace vramscope::common
