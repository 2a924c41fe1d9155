// JsonNestsDeeperThan: a guard to run before parsing untrusted JSON.
//
// nlohmann::json builds every level of nesting (about 100 bytes each, and a
// recursive destructor), so a file of 16 MiB of '[' would take over a gigabyte
// and much stack. Each reader rejects input nested deeper than its limit
// before parsing it (docs/hardening.md). Pure and thread-safe.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace vramscope::common {

// True when `text` nests arrays and objects more than `max_depth` deep.
// Brackets inside JSON strings do not count (escaped quotes are understood).
// One pass, no allocation; not a validator: nlohmann::json::parse reports
// every other problem afterwards.
bool JsonNestsDeeperThan(std::string_view text, size_t max_depth);

// True when `text` holds more than `max_items` JSON items, counted as the
// commas and opening brackets outside strings (each array element or object
// member after the first is preceded by a comma). nlohmann::json spends
// 16-100 bytes on each value, so a header of tens of millions of tiny values
// would take gigabytes; a reader whose documents have a known number of
// items checks this before parsing. One pass, no allocation.
bool JsonHasMoreItemsThan(std::string_view text, size_t max_items);

// The offset of the first NUL byte in `text`, or nullopt. JSON text has no
// raw NUL (a string holds one only as \u0000), but nlohmann::json's lexer
// takes a NUL as the end of its input: a valid document followed by a NUL
// and garbage would be read as if the file ended at the NUL. Every reader of
// JSON calls this before parsing (docs/hardening.md).
std::optional<size_t> FindNulByte(std::string_view text);

// The problem FindNulByte found, worded the same by every reader:
// "NUL byte at byte 1234 (JSON text has none)".
std::string NulByteProblem(size_t offset);

}  // namespace vramscope::common
