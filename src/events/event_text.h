// Text helpers shared by the event-stream reader and writer (private to
// src/events): tokenizing a line, quoting input in error messages, and the
// rules for free text (string table entries and metadata).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "vramscope/common/quote.h"

namespace vramscope::events_internal {

inline bool IsBlank(char c) { return c == ' ' || c == '\t'; }

// Splits one line into blank-separated tokens without copying.
class Tokenizer {
 public:
  explicit Tokenizer(std::string_view line) : p_(line.data()), end_(line.data() + line.size()) {}

  // The next token, or an empty view at the end of the line.
  std::string_view Next() {
    while (p_ != end_ && IsBlank(*p_)) ++p_;
    const char* start = p_;
    while (p_ != end_ && !IsBlank(*p_)) ++p_;
    return {start, static_cast<size_t>(p_ - start)};
  }

  // Everything after the blanks that follow the current position, verbatim
  // (free text runs to the end of the line, trailing blanks included).
  std::string_view Rest() {
    while (p_ != end_ && IsBlank(*p_)) ++p_;
    std::string_view rest(p_, static_cast<size_t>(end_ - p_));
    p_ = end_;
    return rest;
  }

 private:
  const char* p_;
  const char* end_;
};

// `text` shown in an error message: in single quotes, at most 40 bytes, bytes
// outside printable ASCII as \xNN (common::QuoteForMessage), so that one bad
// line gives one short, printable message line whatever it contains.
inline std::string Quote(std::string_view text) {
  return common::QuoteForMessage(text, common::kQuotedBytes, '\'');
}

// Why `text` is not acceptable free text (invalid UTF-8, or a control
// character other than tab), or nullopt. Free text flows into JSON and HTML
// reports, where invalid UTF-8 would fail far from its source.
std::optional<std::string> FindTextProblem(std::string_view text);

// Makes free text writable on one line so that the reader gives it back:
// control characters become spaces, invalid UTF-8 bytes become '?', leading
// blanks go (the reader skips them), and the result is cut to `max_bytes` at
// a character boundary.
std::string SanitizeText(std::string_view text, size_t max_bytes);

// Like SanitizeText for a token (a metadata key): blanks also become '_', and
// an empty result becomes "_".
std::string SanitizeToken(std::string_view text, size_t max_bytes);

}  // namespace vramscope::events_internal
