// Planner flag values: --margin (ParseMargin) and sweep grids (ParseGrid).
// Every error names the flag and quotes the text (plan.h).
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <string>

#include <fmt/format.h>

#include "vramscope/common/quote.h"
#include "vramscope/plan.h"

namespace vramscope {
namespace {

// Grid values above this are no knob's business (lowering caps seq at 2^22).
constexpr uint64_t kMaxGridValue = uint64_t{1} << 32;
constexpr double kGiBDouble = static_cast<double>(uint64_t{1} << 30);
// A whole grid is quoted up to this many bytes (a list of many values is
// longer than common::kQuotedBytes).
constexpr size_t kGridShownBytes = 200;

// Text from the command line in a message: common::QuoteForMessage, in
// single quotes.
std::string Quote(std::string_view text, size_t max_bytes = common::kQuotedBytes) {
  return common::QuoteForMessage(text, max_bytes, '\'');
}
std::string QuoteGrid(std::string_view text) { return Quote(text, kGridShownBytes); }

std::string_view Trim(std::string_view text) {
  const auto space = [](char c) { return c == ' ' || c == '\t'; };
  while (!text.empty() && space(text.front())) text.remove_prefix(1);
  while (!text.empty() && space(text.back())) text.remove_suffix(1);
  return text;
}

bool EndsWithNoCase(std::string_view text, std::string_view suffix) {
  if (text.size() < suffix.size()) return false;
  return std::equal(
      suffix.begin(), suffix.end(), text.end() - static_cast<ptrdiff_t>(suffix.size()),
      [](char want, char got) { return std::tolower(static_cast<unsigned char>(got)) == want; });
}

// A whole decimal integer, digits only (no sign, no spaces inside).
Result<uint64_t> ParseCount(std::string_view item, std::string_view flag, std::string_view whole,
                            std::string_view what) {
  item = Trim(item);
  uint64_t value = 0;
  const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), value);
  if (item.empty() || ec != std::errc() || end != item.data() + item.size()) {
    return MakeError(fmt::format("{}: {}: {} {} is not a whole number", flag, QuoteGrid(whole),
                                 what, Quote(item)));
  }
  return value;
}

Result<uint64_t> ParseValue(std::string_view item, std::string_view flag, std::string_view whole,
                            std::string_view what) {
  VS_TRY(value, ParseCount(item, flag, whole, what));
  if (value == 0 || value > kMaxGridValue) {
    return MakeError(fmt::format("{}: {}: {} {} is outside 1..{}", flag, QuoteGrid(whole), what,
                                 value, kMaxGridValue));
  }
  return value;
}

Result<std::vector<uint64_t>> ParseRange(std::string_view text, std::string_view flag) {
  const size_t a = text.find(':');
  const size_t b = text.find(':', a + 1);
  if (b == std::string_view::npos || text.find(':', b + 1) != std::string_view::npos) {
    return MakeError(fmt::format("{}: {} is not START:STOP:COUNT", flag, QuoteGrid(text)));
  }
  VS_TRY(start, ParseValue(text.substr(0, a), flag, text, "START"));
  VS_TRY(stop, ParseCount(text.substr(a + 1, b - a - 1), flag, text, "STOP"));
  VS_TRY(count, ParseCount(text.substr(b + 1), flag, text, "COUNT"));
  if (stop < start) {
    return MakeError(
        fmt::format("{}: {}: STOP {} is below START {}", flag, QuoteGrid(text), stop, start));
  }
  if (stop > kMaxGridValue) {
    return MakeError(
        fmt::format("{}: {}: STOP {} is above {}", flag, QuoteGrid(text), stop, kMaxGridValue));
  }
  if (count == 0 || count > kMaxSweepPoints) {
    return MakeError(fmt::format("{}: {}: COUNT {} is outside 1..{}", flag, QuoteGrid(text), count,
                                 kMaxSweepPoints));
  }
  std::vector<uint64_t> values;
  values.reserve(count);
  if (count == 1) return std::vector<uint64_t>{start};
  // Rounded to the nearest integer in integer arithmetic: i * span < 2^46.
  const uint64_t span = stop - start, intervals = count - 1;
  for (uint64_t i = 0; i < count; ++i) {
    values.push_back(start + (2 * i * span + intervals) / (2 * intervals));
  }
  values.erase(std::unique(values.begin(), values.end()), values.end());
  return values;
}

}  // namespace

Result<std::vector<uint64_t>> ParseGrid(std::string_view text, std::string_view flag) {
  text = Trim(text);
  if (text.empty())
    return MakeError(fmt::format("{}: empty grid; use START:STOP:COUNT or A,B,C", flag));
  if (text.find(':') != std::string_view::npos) return ParseRange(text, flag);
  std::vector<uint64_t> values;
  size_t begin = 0;
  while (true) {
    const size_t comma = text.find(',', begin);
    const std::string_view item =
        text.substr(begin, comma == std::string_view::npos ? comma : comma - begin);
    VS_TRY(value, ParseValue(item, flag, text, "value"));
    values.push_back(value);
    if (values.size() > kMaxSweepPoints) {
      return MakeError(fmt::format("{}: more than {} values", flag, kMaxSweepPoints));
    }
    if (comma == std::string_view::npos) break;
    begin = comma + 1;
  }
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());
  return values;
}

Result<uint64_t> ParseMargin(std::string_view text, uint64_t usable_bytes) {
  const std::string_view original = text;
  text = Trim(text);
  bool percent = false;
  if (EndsWithNoCase(text, "%")) {
    percent = true;
    text.remove_suffix(1);
  } else if (EndsWithNoCase(text, "gib")) {
    text.remove_suffix(3);
  }
  text = Trim(text);
  double value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() ||
      !std::isfinite(value)) {
    return MakeError(fmt::format(
        "--margin: {} is not GiB (e.g. 2 or 1.5GiB) or a percentage (e.g. 5%)", Quote(original)));
  }
  if (value < 0 || std::signbit(value))
    return MakeError(fmt::format("--margin: {} is negative", Quote(original)));
  const double usable = static_cast<double>(usable_bytes);
  const double bytes = percent ? value / 100.0 * usable : value * kGiBDouble;
  if (bytes >= usable) {
    return MakeError(fmt::format("--margin: {} is not below the GPU's {} usable", Quote(original),
                                 FormatBytes(usable_bytes)));
  }
  return static_cast<uint64_t>(std::llround(bytes));
}

}  // namespace vramscope
