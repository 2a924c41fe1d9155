// Reading and writing event-stream files (format: docs/event-stream.md).
#pragma once

#include <string>
#include <string_view>

#include "vramscope/event_stream.h"
#include "vramscope/result.h"

namespace vramscope {

// Limits enforced by the reader; exceeding one is an Error naming it.
struct EventReadLimits {
  uint64_t max_file_bytes = uint64_t{16} << 30;  // 16 GiB
  uint64_t max_events = uint64_t{1} << 31;
  uint64_t max_line_bytes = 1 << 16;
  uint64_t max_live_allocations = uint64_t{1} << 27;
};

// Parses the text of an event-stream file. `name` is used in error messages
// ("NAME:LINE: problem"). Validates: header and version, every field, sizes in
// [0, 2^62], allocation ids unique while live, frees of live ids only.
Result<EventStream> ParseEventText(std::string_view text, std::string_view name,
                                   const EventReadLimits& limits = {});

// Reads a file from disk (the CLI's seam); errors name the path.
Result<EventStream> ReadEventFile(const std::string& path,
                                  const EventReadLimits& limits = {});

// Serializes a stream in the documented text format.
std::string WriteEventText(const EventStream& stream);

}  // namespace vramscope
