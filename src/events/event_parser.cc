// The rules of docs/event-stream.md, one line at a time.
#include "event_parser.h"

#include <charconv>
#include <limits>

#include <fmt/format.h>

#include "event_text.h"

namespace vramscope::events_internal {
namespace {

constexpr std::string_view kHeaderMagic = "vramscope-events";
// Version 2 adds the `u` and `x` records; every version-1 file is a valid
// version-2 file.
constexpr uint64_t kFormatVersion = 2;
constexpr uint64_t kStreamRecordsVersion = 2;
constexpr uint64_t kBaseVersion = 1;  // what messages suggest: every reader knows it
constexpr std::string_view kUtf8Bom = "\xEF\xBB\xBF";
constexpr uint64_t kMaxU32 = std::numeric_limits<uint32_t>::max();
constexpr uint64_t kMaxU64 = std::numeric_limits<uint64_t>::max();

constexpr std::string_view kAllocForm = "'a ID BYTES CATEGORY [OP [MODULE [STREAM]]]'";
constexpr std::string_view kFreeForm = "'f ID'";
constexpr std::string_view kPhaseForm = "'p STEP PHASE'";
constexpr std::string_view kEmptyCacheForm = "'e'";
constexpr std::string_view kRecordStreamForm = "'u ID STREAM'";
constexpr std::string_view kUsesDoneForm = "'x ID'";
constexpr std::string_view kStringForm = "'s INDEX TEXT'";
constexpr std::string_view kMetaForm = "'meta KEY VALUE'";

// Parses a decimal unsigned integer field. `field` names it in the problem
// ("alloc size"); values above `max` are rejected with `max_text` ("2^62
// bytes") as the limit shown to the user. On failure returns the problem text
// (without the "NAME:LINE: " prefix).
std::optional<std::string> ParseUnsigned(std::string_view token, std::string_view field,
                                         uint64_t max, std::string_view max_text, uint64_t* out) {
  const char* end = token.data() + token.size();
  const auto [ptr, ec] = std::from_chars(token.data(), end, *out);
  if (ec == std::errc::result_out_of_range && ptr == end) {
    return fmt::format("{}: {} is out of range (the limit is {})", field, Quote(token), max_text);
  }
  // from_chars accepts no sign, no "0x" and no spaces: anything it did not
  // consume entirely (including "-5" and "+5") is not a plain unsigned integer.
  if (ec != std::errc() || ptr != end) {
    return fmt::format("{}: {} is not an unsigned integer", field, Quote(token));
  }
  if (*out > max) {
    return fmt::format("{}: {} is out of range (the limit is {})", field, Quote(token), max_text);
  }
  return std::nullopt;
}

}  // namespace

EventParser::EventParser(std::string_view name, const EventReadLimits& limits)
    : name_(name), limits_(limits) {}

Error EventParser::Fail(std::string_view problem) const {
  return MakeError(fmt::format("{}:{}: {}", name_, line_number_, problem));
}

Status EventParser::Stick(Status status) {
  if (!status.ok()) error_ = status.error();
  return status;
}

Status EventParser::ParseLine(std::string_view line) {
  if (error_) return *error_;
  ++line_number_;
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (line.size() > limits_.max_line_bytes) {
    return Stick(Fail(fmt::format("line is longer than {} bytes", limits_.max_line_bytes)));
  }
  if (line_number_ == 1) return Stick(ParseHeader(line));
  return Stick(ParseRecord(line));
}

Result<EventStream> EventParser::Finish() {
  if (error_) return *error_;
  if (line_number_ == 0) {
    line_number_ = 1;
    return Fail(fmt::format("header: missing (the input is empty; expected '{} {}')", kHeaderMagic,
                            kBaseVersion));
  }
  return std::move(stream_);
}

Status EventParser::ParseHeader(std::string_view line) {
  // A UTF-8 byte-order mark is not part of the format, but editors on
  // Windows add one; it carries no meaning, so it is skipped.
  if (line.substr(0, kUtf8Bom.size()) == kUtf8Bom) line.remove_prefix(kUtf8Bom.size());
  Tokenizer tokens(line);
  const std::string_view magic = tokens.Next();
  if (magic != kHeaderMagic) {
    return Fail(
        fmt::format("header: expected '{} {}', got {}", kHeaderMagic, kBaseVersion, Quote(line)));
  }
  const std::string_view version_token = tokens.Next();
  if (version_token.empty()) return Fail("header version: missing");
  uint64_t version = 0;
  if (auto problem = ParseUnsigned(version_token, "header version", kMaxU64, "2^64-1", &version)) {
    return Fail(*problem);
  }
  if (version == 0 || version > kFormatVersion) {
    return Fail(
        fmt::format("header version: unknown version {} (this reader knows versions 1 "
                    "to {})",
                    Quote(version_token), kFormatVersion));
  }
  version_ = version;
  if (const std::string_view extra = tokens.Next(); !extra.empty()) {
    return Fail(fmt::format("header: extra field {} (expected '{} {}')", Quote(extra), kHeaderMagic,
                            version));
  }
  return Ok{};
}

Status EventParser::ParseRecord(std::string_view line) {
  Tokenizer tokens(line);
  const std::string_view record = tokens.Next();
  if (record.empty() || record[0] == '#') return Ok{};  // empty line or comment
  const std::string_view fields(
      record.data() + record.size(),
      static_cast<size_t>(line.data() + line.size() - (record.data() + record.size())));
  if (record.size() == 1) {
    switch (record[0]) {
      case 'a': return ParseAlloc(fields);
      case 'f': return ParseFree(fields);
      case 'p': return ParsePhaseRecord(fields);
      case 'e': return ParseEmptyCache(fields);
      case 's': return ParseString(fields);
      case 'u':
      case 'x':
        if (version_ < kStreamRecordsVersion) {
          return Fail(fmt::format("record {} needs 'vramscope-events {}' in the header",
                                  Quote(record), kStreamRecordsVersion));
        }
        return record[0] == 'u' ? ParseRecordStream(fields) : ParseUsesDone(fields);
      default: break;
    }
  } else if (record == "meta") {
    return ParseMeta(fields);
  }
  return Fail(
      fmt::format("unknown record {} (expected a, f, p, e, s, u, x or meta)", Quote(record)));
}

Status EventParser::CheckEventLimit() {
  if (stream_.size() >= limits_.max_events) {
    return Fail(fmt::format("more than {} events", limits_.max_events));
  }
  return Ok{};
}

Status EventParser::ParseAlloc(std::string_view fields) {
  Tokenizer tokens(fields);
  const std::string_view id_token = tokens.Next();
  if (id_token.empty()) return Fail(fmt::format("alloc id: missing (expected {})", kAllocForm));
  uint64_t id = 0;
  if (auto problem = ParseUnsigned(id_token, "alloc id", kMaxU64, "2^64-1", &id)) {
    return Fail(*problem);
  }
  const std::string_view size_token = tokens.Next();
  if (size_token.empty()) {
    return Fail(fmt::format("alloc size: missing (expected {})", kAllocForm));
  }
  uint64_t size_bytes = 0;
  if (auto problem =
          ParseUnsigned(size_token, "alloc size", kMaxSizeBytes, "2^62 bytes", &size_bytes)) {
    return Fail(*problem);
  }
  const std::string_view category_token = tokens.Next();
  if (category_token.empty()) {
    return Fail(fmt::format("alloc category: missing (expected {})", kAllocForm));
  }
  const std::optional<Category> category = ParseCategory(category_token);
  if (!category) {
    return Fail(fmt::format(
        "alloc category: unknown category {} (expected param, grad, optim, act, loss, temp, "
        "comm, work or other)",
        Quote(category_token)));
  }
  // OP and MODULE must name strings defined above; STREAM is any uint32.
  uint64_t optional_values[3] = {0, 0, 0};
  constexpr std::string_view kOptionalFields[3] = {"alloc op", "alloc module", "alloc stream"};
  for (int i = 0; i < 3; ++i) {
    const std::string_view token = tokens.Next();
    if (token.empty()) break;
    if (auto problem =
            ParseUnsigned(token, kOptionalFields[i], kMaxU32, "2^32-1", &optional_values[i])) {
      return Fail(*problem);
    }
    if (i < 2 && optional_values[i] >= stream_.strings().size()) {
      const size_t defined = stream_.strings().size() - 1;
      return Fail(fmt::format("{}: string {} is not defined ({})", kOptionalFields[i],
                              optional_values[i],
                              defined == 0 ? std::string("no strings are defined yet")
                                           : fmt::format("strings 1..{} are", defined)));
    }
  }
  if (const std::string_view extra = tokens.Next(); !extra.empty()) {
    return Fail(fmt::format("alloc: extra field {} (expected {})", Quote(extra), kAllocForm));
  }
  if (!live_.Insert(id)) return Fail(fmt::format("alloc id: {} is already live", id));
  // Freed allocations still waiting for other streams hold memory too.
  if (live_.size() + uses_.pending() > limits_.max_live_allocations) {
    return Fail(
        fmt::format("alloc id: more than {} live allocations", limits_.max_live_allocations));
  }
  if (Status status = CheckEventLimit(); !status.ok()) return status;
  stream_.AllocInterned(id, size_bytes, *category, static_cast<uint32_t>(optional_values[0]),
                        static_cast<uint32_t>(optional_values[1]),
                        static_cast<uint32_t>(optional_values[2]));
  return Ok{};
}

Result<uint64_t> EventParser::ParseIdOnly(std::string_view fields, std::string_view record,
                                          std::string_view form) {
  Tokenizer tokens(fields);
  const std::string_view id_token = tokens.Next();
  if (id_token.empty()) return Fail(fmt::format("{} id: missing (expected {})", record, form));
  uint64_t id = 0;
  if (auto problem =
          ParseUnsigned(id_token, fmt::format("{} id", record), kMaxU64, "2^64-1", &id)) {
    return Fail(*problem);
  }
  if (const std::string_view extra = tokens.Next(); !extra.empty()) {
    return Fail(fmt::format("{}: extra field {} (expected {})", record, Quote(extra), form));
  }
  return id;
}

Status EventParser::ParseFree(std::string_view fields) {
  Result<uint64_t> id = ParseIdOnly(fields, "free", kFreeForm);
  if (!id.ok()) return id.error();
  if (!live_.Erase(*id)) return Fail(fmt::format("free id: {} is not live", *id));
  if (Status status = CheckEventLimit(); !status.ok()) return status;
  uses_.Free(*id);
  stream_.Free(*id);
  return Ok{};
}

Status EventParser::ParseRecordStream(std::string_view fields) {
  Tokenizer tokens(fields);
  const std::string_view id_token = tokens.Next();
  if (id_token.empty()) {
    return Fail(fmt::format("record stream id: missing (expected {})", kRecordStreamForm));
  }
  uint64_t id = 0;
  if (auto problem = ParseUnsigned(id_token, "record stream id", kMaxU64, "2^64-1", &id)) {
    return Fail(*problem);
  }
  const std::string_view stream_token = tokens.Next();
  if (stream_token.empty()) {
    return Fail(fmt::format("record stream stream: missing (expected {})", kRecordStreamForm));
  }
  uint64_t stream = 0;
  if (auto problem =
          ParseUnsigned(stream_token, "record stream stream", kMaxU32, "2^32-1", &stream)) {
    return Fail(*problem);
  }
  if (const std::string_view extra = tokens.Next(); !extra.empty()) {
    return Fail(fmt::format("record stream: extra field {} (expected {})", Quote(extra),
                            kRecordStreamForm));
  }
  if (!live_.Contains(id)) return Fail(fmt::format("record stream id: {} is not live", id));
  if (Status status = CheckEventLimit(); !status.ok()) return status;
  uses_.Use(id);
  stream_.RecordStream(id, static_cast<uint32_t>(stream));
  return Ok{};
}

Status EventParser::ParseUsesDone(std::string_view fields) {
  Result<uint64_t> id = ParseIdOnly(fields, "uses done", kUsesDoneForm);
  if (!id.ok()) return id.error();
  if (!uses_.Done(*id)) {
    return Fail(fmt::format("uses done id: {} was not freed after a 'u' record (or is done)", *id));
  }
  if (Status status = CheckEventLimit(); !status.ok()) return status;
  stream_.UsesDone(*id);
  return Ok{};
}

Status EventParser::ParsePhaseRecord(std::string_view fields) {
  Tokenizer tokens(fields);
  const std::string_view step_token = tokens.Next();
  if (step_token.empty()) return Fail(fmt::format("phase step: missing (expected {})", kPhaseForm));
  uint64_t step = 0;
  if (auto problem = ParseUnsigned(step_token, "phase step", kMaxU32, "2^32-1", &step)) {
    return Fail(*problem);
  }
  const std::string_view phase_token = tokens.Next();
  if (phase_token.empty())
    return Fail(fmt::format("phase name: missing (expected {})", kPhaseForm));
  Phase phase = Phase::kSetup;
  if (!ParsePhase(phase_token, &phase)) {
    return Fail(
        fmt::format("phase name: unknown phase {} (expected setup, forward, backward or optimizer)",
                    Quote(phase_token)));
  }
  if (const std::string_view extra = tokens.Next(); !extra.empty()) {
    return Fail(fmt::format("phase: extra field {} (expected {})", Quote(extra), kPhaseForm));
  }
  if (Status status = CheckEventLimit(); !status.ok()) return status;
  stream_.BeginPhase(static_cast<uint32_t>(step), phase);
  return Ok{};
}

Status EventParser::ParseEmptyCache(std::string_view fields) {
  Tokenizer tokens(fields);
  if (const std::string_view extra = tokens.Next(); !extra.empty()) {
    return Fail(
        fmt::format("empty cache: extra field {} (expected {})", Quote(extra), kEmptyCacheForm));
  }
  if (Status status = CheckEventLimit(); !status.ok()) return status;
  stream_.EmptyCache();
  return Ok{};
}

Status EventParser::ParseString(std::string_view fields) {
  Tokenizer tokens(fields);
  const std::string_view index_token = tokens.Next();
  if (index_token.empty()) {
    return Fail(fmt::format("string index: missing (expected {})", kStringForm));
  }
  const uint64_t expected = stream_.strings().size();
  uint64_t index = 0;
  if (auto problem = ParseUnsigned(index_token, "string index", kMaxU32, "2^32-1", &index)) {
    return Fail(*problem);
  }
  if (index == 0) return Fail("string index: 0 is the empty string and cannot be defined");
  if (index != expected) {
    return Fail(
        fmt::format("string index: {} is not the next index (expected {})", index, expected));
  }
  const std::string_view text = tokens.Rest();
  if (text.empty()) return Fail(fmt::format("string text: missing (expected {})", kStringForm));
  if (auto problem = FindTextProblem(text)) return Fail("string text: " + *problem);
  stream_.AppendString(text);
  return Ok{};
}

Status EventParser::ParseMeta(std::string_view fields) {
  Tokenizer tokens(fields);
  const std::string_view key = tokens.Next();
  if (key.empty()) return Fail(fmt::format("meta key: missing (expected {})", kMetaForm));
  if (auto problem = FindTextProblem(key)) return Fail("meta key: " + *problem);
  const std::string_view value = tokens.Rest();
  if (auto problem = FindTextProblem(value)) return Fail("meta value: " + *problem);
  // A repeated key replaces the earlier value (later writers refine).
  stream_.metadata()[std::string(key)] = std::string(value);
  return Ok{};
}

}  // namespace vramscope::events_internal
