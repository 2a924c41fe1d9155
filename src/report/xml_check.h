// A small markup checker for the renderer tests: enough to catch what a
// renderer bug produces (unbalanced or misnested tags, unquoted or duplicate
// attributes, a raw '<' or '&' from an unescaped name, text outside the root).
// Not a general XML or HTML parser.
#pragma once

#include <string>
#include <string_view>

namespace vramscope::testing {

// Well-formed XML with one root element. Returns "" when fine, else the first
// problem with its byte offset.
std::string CheckXml(std::string_view text);

// The HTML the report writes: like XML, plus a DOCTYPE, void elements (meta,
// br, ...), attributes without values, and script/style as raw text.
std::string CheckHtml(std::string_view text);

}  // namespace vramscope::testing
