// QuoteForMessage: input text shown inside a one-line error message.
//
// Every reader quotes what it could not accept ("unknown GPU 'b200'", "dtype:
// unknown \"F7\""). The text comes from files, flags and the network, so it is
// made safe here, once, for every stage: the message stays one printable line
// of bounded length whatever the input holds (docs/hardening.md). Pure and
// thread-safe.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace vramscope::common {

// Bytes of input shown by default; callers quoting long names (tensor names,
// GPU names) pass more.
inline constexpr size_t kQuotedBytes = 40;

// `text` between two `quote` characters, escaped and cut:
// - printable ASCII (0x20..0x7E) is kept, except the backslash and `quote`,
//   which are written \\ and \<quote> so the quoted text reads back
//   unambiguously;
// - every other byte (control characters, DEL, and all bytes of non-ASCII
//   text, valid UTF-8 or not) is written \xNN (lowercase hex), so no terminal
//   escape, bidirectional override or invalid UTF-8 reaches the message;
// - at most `max_bytes` bytes of input are shown; when more were given, "..."
//   follows the closing quote.
// The result is therefore at most 4 * max_bytes + 5 bytes long. With quote
// '\0' no quote characters are written (for text that the message already
// sets apart, such as a key path before a colon); the rest is the same.
// Examples: QuoteForMessage("gelu_x") == "\"gelu_x\"";
//           QuoteForMessage("a\x1b[2J", 40, '\'') == "'a\\x1b[2J'".
std::string QuoteForMessage(std::string_view text, size_t max_bytes = kQuotedBytes,
                            char quote = '"');

// True when `text` holds a control character a terminal may act on: C0
// (0x00-0x1f), DEL (0x7f), or C1 (U+0080-U+009F, UTF-8 0xc2 0x80-0x9f; CSI,
// U+009B, starts escape sequences like ESC [). A name read from a file that
// every message will repeat (a nested config's path) is refused with it.
bool HasControlCharacters(std::string_view text);

}  // namespace vramscope::common
