// JsonNestsDeeperThan: a guard to run before parsing untrusted JSON.
//
// nlohmann::json builds every level of nesting (about 100 bytes each, and a
// recursive destructor), so a file of 16 MiB of '[' would take over a gigabyte
// and much stack. Each reader rejects input nested deeper than its limit
// before parsing it (docs/hardening.md). Pure and thread-safe.
#pragma once

#include <cstddef>
#include <string_view>

namespace vramscope::common {

// True when `text` nests arrays and objects more than `max_depth` deep.
// Brackets inside JSON strings do not count (escaped quotes are understood).
// One pass, no allocation; not a validator: nlohmann::json::parse reports
// every other problem afterwards.
bool JsonNestsDeeperThan(std::string_view text, size_t max_depth);

}  // namespace vramscope::common
