// Helpers shared by the src/events tests.
#pragma once

#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "vramscope/event_io.h"

namespace vramscope::events_test {

// The example block of docs/event-stream.md, so that the documented example
// is itself a test input and cannot drift from the reader.
inline std::string DocExample() {
  std::ifstream in(std::string(VS_SOURCE_DIR) + "/docs/event-stream.md");
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string doc = buffer.str();
  const size_t section = doc.find("## Example");
  const size_t open = doc.find("```\n", section);
  const size_t close = doc.find("```", open + 4);
  if (section == std::string::npos || open == std::string::npos || close == std::string::npos) {
    ADD_FAILURE() << "docs/event-stream.md has no ## Example code block";
    return {};
  }
  return doc.substr(open + 4, close - open - 4);
}

// The error message of parsing `text` as "t.ev" (fails the test if it parses).
inline std::string ParseError(std::string_view text, const EventReadLimits& limits = {}) {
  Result<EventStream> result = ParseEventText(text, "t.ev", limits);
  if (result.ok()) {
    ADD_FAILURE() << "parsed without error:\n" << text;
    return {};
  }
  return result.error().message;
}

// Parses `text`, failing the test with the error if it does not parse.
inline EventStream ParseOk(std::string_view text) {
  Result<EventStream> result = ParseEventText(text, "t.ev");
  if (!result.ok()) {
    ADD_FAILURE() << result.error().message;
    return {};
  }
  return std::move(result).value();
}

}  // namespace vramscope::events_test
