// A command's JSON: the standard report's JSON plus keys of its own
// (explain's "snapshot", replay's "replay").
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace vramscope::snapshot {

// `report_json` (what RenderJson writes: one object at indent 2 ending in
// "\n}\n") with `key`: `value` added as its last member. The bytes are those
// of parsing it, adding the key and dumping it again at indent 2 (invalid
// UTF-8 replaced, as RenderJson does), without parsing back a report whose
// timeline can hold thousands of points. Exact because a dump escapes every
// newline inside a string, so each newline in `value`'s dump starts a line
// that one more level of nesting indents by two spaces. `key` must not be
// in the object yet (checked: a bug otherwise).
std::string AppendJsonMember(std::string report_json, std::string_view key,
                             const nlohmann::ordered_json& value);

}  // namespace vramscope::snapshot
