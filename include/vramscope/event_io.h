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
// [0, 2^62], allocation ids unique while live, frees of live ids only, and
// every rule of docs/event-stream.md; stops at the first violation. String
// indices of the result are the file's. Never crashes on any input; memory
// is the events plus a hash set of live ids.
Result<EventStream> ParseEventText(std::string_view text, std::string_view name,
                                   const EventReadLimits& limits = {});

// Reads a file from disk (the CLI's seam), streaming it in 1 MiB chunks, so
// the file itself is never held in memory. Errors name the path: missing
// file, directory, unopenable, over limits.max_file_bytes, read failure, or
// "PATH:LINE: problem" as ParseEventText.
Result<EventStream> ReadEventFile(const std::string& path, const EventReadLimits& limits = {});

// Serializes a stream in the documented text format (docs/event-stream.md,
// "Writing"): strings renumbered in first-use order, each `s` record before
// its first use. ParseEventText(WriteEventText(s)) succeeds for any stream
// that passes s.Validate(), within the default limits. Aborts (VS_CHECK) on an event naming a
// string index the stream does not have.
std::string WriteEventText(const EventStream& stream);

}  // namespace vramscope
