// EventParser: the line-by-line state machine behind ParseEventText and
// ReadEventFile (private to src/events). It implements the rules of
// docs/event-stream.md; callers split the input into lines.
//
// Usage: construct, call ParseLine() for each line in order (without its
// '\n'), then Finish(). The first error ends parsing: every later call
// returns it again. Not thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "live_id_set.h"
#include "vramscope/event_io.h"
#include "vramscope/event_stream.h"
#include "vramscope/result.h"

namespace vramscope::events_internal {

class EventParser {
 public:
  // `name` prefixes every error message ("NAME:LINE: problem").
  EventParser(std::string_view name, const EventReadLimits& limits);

  // Parses the next line. `line` excludes the '\n'; a trailing '\r' is
  // ignored. Lines longer than limits.max_line_bytes are rejected, so a
  // caller may pass a truncated prefix of an over-long line.
  Status ParseLine(std::string_view line);

  // Ends the input; returns the stream or the error (an empty input has no
  // header). Call once.
  Result<EventStream> Finish();

  // Pre-sizes the event vector (a hint; no effect on results).
  void ReserveEvents(size_t n) { stream_.Reserve(n); }

 private:
  Status ParseHeader(std::string_view line);
  Status ParseRecord(std::string_view line);
  Status ParseAlloc(std::string_view fields);
  Status ParseFree(std::string_view fields);
  Status ParsePhaseRecord(std::string_view fields);
  Status ParseEmptyCache(std::string_view fields);
  Status ParseRecordStream(std::string_view fields);
  Status ParseUsesDone(std::string_view fields);
  // Parses the one ID field of `record` (e.g. "free id") from `tokens`,
  // rejecting a missing, malformed or extra field; `form` is the record's
  // form shown in the problem.
  Result<uint64_t> ParseIdOnly(std::string_view fields, std::string_view record,
                               std::string_view form);
  Status ParseString(std::string_view fields);
  Status ParseMeta(std::string_view fields);
  Status CheckEventLimit();

  Error Fail(std::string_view problem) const;
  Status Stick(Status status);

  std::string name_;
  EventReadLimits limits_;
  uint64_t line_number_ = 0;  // of the line being parsed, 1-based
  EventStream stream_;
  LiveIdSet live_;
  StreamUseTracker uses_;
  uint64_t version_ = 0;  // the header's
  std::optional<Error> error_;
};

}  // namespace vramscope::events_internal
