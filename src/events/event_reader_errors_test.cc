// Every rule of docs/event-stream.md "Rules a reader enforces": one test
// each, checking the whole message, so the line number and field are exact.
#include <gtest/gtest.h>

#include "event_text.h"
#include "test_util.h"
#include "vramscope/event_io.h"

namespace vramscope {
namespace {

using events_test::ParseError;

constexpr std::string_view kHeader = "vramscope-events 1\n";

std::string WithHeader(std::string_view body) { return std::string(kHeader) + std::string(body); }

// --- header ---------------------------------------------------------------

TEST(EventReaderErrors, EmptyInputHasNoHeader) {
  EXPECT_EQ(ParseError(""),
            "t.ev:1: header: missing (the input is empty; expected 'vramscope-events 1')");
}

TEST(EventReaderErrors, WrongHeader) {
  EXPECT_EQ(ParseError("vramscope-trace 1\n"),
            "t.ev:1: header: expected 'vramscope-events 1', got 'vramscope-trace 1'");
}

TEST(EventReaderErrors, HeaderMustBeTheFirstLine) {
  EXPECT_EQ(ParseError("# comment\nvramscope-events 1\n"),
            "t.ev:1: header: expected 'vramscope-events 1', got '# comment'");
  EXPECT_EQ(ParseError("\nvramscope-events 1\n"),
            "t.ev:1: header: expected 'vramscope-events 1', got ''");
}

TEST(EventReaderErrors, HeaderWithoutVersion) {
  EXPECT_EQ(ParseError("vramscope-events\n"), "t.ev:1: header version: missing");
}

TEST(EventReaderErrors, UnknownVersion) {
  EXPECT_EQ(ParseError("vramscope-events 3\na 1 1 act\n"),
            "t.ev:1: header version: unknown version '3' (this reader knows versions 1 to 2)");
  EXPECT_EQ(ParseError("vramscope-events 0\n"),
            "t.ev:1: header version: unknown version '0' (this reader knows versions 1 to 2)");
}

// --- version 2: record_stream ('u') and its completion ('x') ---------------

TEST(EventReaderErrors, StreamRecordsNeedVersion2) {
  EXPECT_EQ(ParseError(WithHeader("a 1 1 act\nu 1 1\n")),
            "t.ev:3: record 'u' needs 'vramscope-events 2' in the header");
  EXPECT_EQ(ParseError(WithHeader("a 1 1 act\n\nx 1 2\n")),
            "t.ev:4: record 'x' needs 'vramscope-events 2' in the header");
}

TEST(EventReaderErrors, RecordStreamNeedsALiveIdAndAStream) {
  const std::string v2 = "vramscope-events 2\n";
  EXPECT_EQ(ParseError(v2 + "u 1 1\n"), "t.ev:2: record stream id: 1 is not live");
  EXPECT_EQ(ParseError(v2 + "a 1 1 act\nu 1\n"),
            "t.ev:3: record stream stream: missing (expected 'u ID STREAM')");
  EXPECT_EQ(ParseError(v2 + "a 1 1 act\nu 1 4294967296\n"),
            "t.ev:3: record stream stream: '4294967296' is out of range (the limit is 2^32-1)");
  EXPECT_EQ(ParseError(v2 + "a 1 1 act\nu 1 1 1\n"),
            "t.ev:3: record stream: extra field '1' (expected 'u ID STREAM')");
  EXPECT_EQ(ParseError(v2 + "a 1 1 act\nf 1\nu 1 1\n"), "t.ev:4: record stream id: 1 is not live");
}

TEST(EventReaderErrors, UsesDoneNeedsAFreeAfterAUse) {
  const std::string v2 = "vramscope-events 2\n";
  const std::string error = "was not freed after a 'u' record (or is done)";
  EXPECT_EQ(ParseError(v2 + "a 1 1 act\nf 1\nx 1\n"), "t.ev:4: uses done id: 1 " + error);
  EXPECT_EQ(ParseError(v2 + "a 1 1 act\nu 1 1\nx 1\n"), "t.ev:4: uses done id: 1 " + error);
  EXPECT_EQ(ParseError(v2 + "a 1 1 act\nu 1 1\nf 1\nx 1\nx 1\n"),
            "t.ev:6: uses done id: 1 " + error);
  EXPECT_EQ(ParseError(v2 + "x\n"), "t.ev:2: uses done id: missing (expected 'x ID')");
  EXPECT_EQ(ParseError(v2 + "a 1 1 act\nu 1 1\nf 1\nx 1 2\n"),
            "t.ev:5: uses done: extra field '2' (expected 'x ID')");
}

// A freed allocation waiting for another stream still counts against the
// live-allocation limit: the simulator holds its block.
TEST(EventReaderErrors, PendingFreesCountAsLive) {
  EventReadLimits limits;
  limits.max_live_allocations = 1;
  auto r = ParseEventText("vramscope-events 2\na 1 1 act\nu 1 1\nf 1\na 2 1 act\n", "t.ev", limits);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "t.ev:5: alloc id: more than 1 live allocations");
}

TEST(EventReaderErrors, VersionThatIsNotANumber) {
  EXPECT_EQ(ParseError("vramscope-events 1.0\n"),
            "t.ev:1: header version: '1.0' is not an unsigned integer");
}

TEST(EventReaderErrors, HeaderWithExtraField) {
  EXPECT_EQ(ParseError("vramscope-events 1 extra\n"),
            "t.ev:1: header: extra field 'extra' (expected 'vramscope-events 1')");
}

// --- records and fields ---------------------------------------------------

TEST(EventReaderErrors, UnknownRecord) {
  EXPECT_EQ(ParseError(WithHeader("a 1 1 act\n\nz 1 2\n")),
            "t.ev:4: unknown record 'z' (expected a, f, p, e, s, u, x or meta)");
  EXPECT_EQ(ParseError(WithHeader("alloc 1 1 act\n")),
            "t.ev:2: unknown record 'alloc' (expected a, f, p, e, s, u, x or meta)");
}

TEST(EventReaderErrors, AllocMissingId) {
  EXPECT_EQ(ParseError(WithHeader("a\n")),
            "t.ev:2: alloc id: missing (expected 'a ID BYTES CATEGORY [OP [MODULE [STREAM]]]')");
}

TEST(EventReaderErrors, AllocMissingSize) {
  EXPECT_EQ(ParseError(WithHeader("a 1\n")),
            "t.ev:2: alloc size: missing (expected 'a ID BYTES CATEGORY [OP [MODULE [STREAM]]]')");
}

TEST(EventReaderErrors, AllocMissingCategory) {
  EXPECT_EQ(
      ParseError(WithHeader("a 1 10\n")),
      "t.ev:2: alloc category: missing (expected 'a ID BYTES CATEGORY [OP [MODULE [STREAM]]]')");
}

TEST(EventReaderErrors, AllocExtraField) {
  EXPECT_EQ(ParseError(WithHeader("a 1 10 act 0 0 0 9\n")),
            "t.ev:2: alloc: extra field '9' (expected 'a ID BYTES CATEGORY [OP [MODULE "
            "[STREAM]]]')");
}

TEST(EventReaderErrors, NegativeSize) {
  EXPECT_EQ(ParseError(WithHeader("# c\na 1 -5 act\n")),
            "t.ev:3: alloc size: '-5' is not an unsigned integer");
}

TEST(EventReaderErrors, NegativeId) {
  EXPECT_EQ(ParseError(WithHeader("a -1 5 act\n")),
            "t.ev:2: alloc id: '-1' is not an unsigned integer");
}

TEST(EventReaderErrors, NumbersMustBePlainDecimal) {
  for (std::string_view bad : {"+5", "0x10", "1.5", "1e3", "12abc", "5\xC2\xA0"}) {
    EXPECT_EQ(ParseError(WithHeader("a 1 " + std::string(bad) + " act\n")),
              "t.ev:2: alloc size: " + events_internal::Quote(bad) + " is not an unsigned integer");
  }
}

TEST(EventReaderErrors, SizeAboveTwoToThe62) {
  EXPECT_EQ(ParseError(WithHeader("a 1 4611686018427387905 act\n")),
            "t.ev:2: alloc size: '4611686018427387905' is out of range (the limit is 2^62 bytes)");
}

TEST(EventReaderErrors, SizeOfTwoToThe64) {
  EXPECT_EQ(ParseError(WithHeader("a 1 18446744073709551616 act\n")),
            "t.ev:2: alloc size: '18446744073709551616' is out of range (the limit is 2^62 bytes)");
}

TEST(EventReaderErrors, IdOfTwoToThe64) {
  EXPECT_EQ(ParseError(WithHeader("a 18446744073709551616 1 act\n")),
            "t.ev:2: alloc id: '18446744073709551616' is out of range (the limit is 2^64-1)");
}

TEST(EventReaderErrors, StreamAboveTwoToThe32) {
  EXPECT_EQ(ParseError(WithHeader("a 1 1 act 0 0 4294967296\n")),
            "t.ev:2: alloc stream: '4294967296' is out of range (the limit is 2^32-1)");
}

TEST(EventReaderErrors, UnknownCategory) {
  EXPECT_EQ(ParseError(WithHeader("a 1 1 weights\n")),
            "t.ev:2: alloc category: unknown category 'weights' (expected param, grad, optim, "
            "act, loss, temp, comm, work or other)");
}

TEST(EventReaderErrors, AllocNamingAnUndefinedOp) {
  EXPECT_EQ(ParseError(WithHeader("a 1 1 act 1\n")),
            "t.ev:2: alloc op: string 1 is not defined (no strings are defined yet)");
}

TEST(EventReaderErrors, AllocNamingAnUndefinedModule) {
  EXPECT_EQ(ParseError(WithHeader("s 1 aten::mm\ns 2 model\na 1 1 act 1 3\n")),
            "t.ev:4: alloc module: string 3 is not defined (strings 1..2 are)");
}

TEST(EventReaderErrors, StringUsedBeforeItsDefinition) {
  EXPECT_EQ(ParseError(WithHeader("a 1 1 act 1\ns 1 aten::mm\n")),
            "t.ev:2: alloc op: string 1 is not defined (no strings are defined yet)");
}

TEST(EventReaderErrors, DuplicateLiveId) {
  EXPECT_EQ(ParseError(WithHeader("a 7 1 act\na 8 1 act\nf 8\na 7 2 act\n")),
            "t.ev:5: alloc id: 7 is already live");
}

TEST(EventReaderErrors, FreeOfUnknownId) {
  EXPECT_EQ(ParseError(WithHeader("a 1 1 act\nf 2\n")), "t.ev:3: free id: 2 is not live");
}

TEST(EventReaderErrors, DoubleFree) {
  EXPECT_EQ(ParseError(WithHeader("a 1 1 act\nf 1\nf 1\n")), "t.ev:4: free id: 1 is not live");
}

TEST(EventReaderErrors, FreeMissingIdAndExtraField) {
  EXPECT_EQ(ParseError(WithHeader("f\n")), "t.ev:2: free id: missing (expected 'f ID')");
  EXPECT_EQ(ParseError(WithHeader("a 1 1 act\nf 1 1\n")),
            "t.ev:3: free: extra field '1' (expected 'f ID')");
}

TEST(EventReaderErrors, UnknownPhase) {
  EXPECT_EQ(ParseError(WithHeader("p 1 fwd\n")),
            "t.ev:2: phase name: unknown phase 'fwd' (expected setup, forward, backward or "
            "optimizer)");
}

TEST(EventReaderErrors, PhaseMissingFields) {
  EXPECT_EQ(ParseError(WithHeader("p\n")), "t.ev:2: phase step: missing (expected 'p STEP PHASE')");
  EXPECT_EQ(ParseError(WithHeader("p 1\n")),
            "t.ev:2: phase name: missing (expected 'p STEP PHASE')");
}

TEST(EventReaderErrors, NegativeStepAndExtraPhaseField) {
  EXPECT_EQ(ParseError(WithHeader("p -1 forward\n")),
            "t.ev:2: phase step: '-1' is not an unsigned integer");
  EXPECT_EQ(ParseError(WithHeader("p 1 forward now\n")),
            "t.ev:2: phase: extra field 'now' (expected 'p STEP PHASE')");
}

TEST(EventReaderErrors, EmptyCacheWithAField) {
  EXPECT_EQ(ParseError(WithHeader("e 1\n")), "t.ev:2: empty cache: extra field '1' (expected 'e')");
}

TEST(EventReaderErrors, StringIndexGap) {
  EXPECT_EQ(ParseError(WithHeader("s 1 a\ns 3 c\n")),
            "t.ev:3: string index: 3 is not the next index (expected 2)");
}

TEST(EventReaderErrors, StringIndexRedefined) {
  EXPECT_EQ(ParseError(WithHeader("s 1 a\ns 1 b\n")),
            "t.ev:3: string index: 1 is not the next index (expected 2)");
}

TEST(EventReaderErrors, StringIndexZero) {
  EXPECT_EQ(ParseError(WithHeader("s 0 x\n")),
            "t.ev:2: string index: 0 is the empty string and cannot be defined");
}

TEST(EventReaderErrors, StringMissingIndexOrText) {
  EXPECT_EQ(ParseError(WithHeader("s\n")),
            "t.ev:2: string index: missing (expected 's INDEX TEXT')");
  EXPECT_EQ(ParseError(WithHeader("s 1  \n")),
            "t.ev:2: string text: missing (expected 's INDEX TEXT')");
}

TEST(EventReaderErrors, StringTextThatIsNotUtf8) {
  EXPECT_EQ(ParseError(WithHeader("s 1 ab\xFF\n")), "t.ev:2: string text: invalid UTF-8 at byte 3");
  EXPECT_EQ(ParseError(WithHeader("s 1 \xC0\x80\n")),  // overlong NUL
            "t.ev:2: string text: invalid UTF-8 at byte 1");
  EXPECT_EQ(ParseError(WithHeader("s 1 \xED\xA0\x80\n")),  // a UTF-16 surrogate
            "t.ev:2: string text: invalid UTF-8 at byte 1");
}

TEST(EventReaderErrors, StringTextWithControlCharacter) {
  EXPECT_EQ(ParseError(WithHeader(std::string("s 1 a\0b\n", 8))),
            "t.ev:2: string text: control character 0x00 at byte 2");
  EXPECT_EQ(ParseError(WithHeader("s 1 x\r\r\n")),  // only one trailing '\r' is dropped
            "t.ev:2: string text: control character 0x0d at byte 2");
}

TEST(EventReaderErrors, MetaMissingKeyOrBadText) {
  EXPECT_EQ(ParseError(WithHeader("meta\n")),
            "t.ev:2: meta key: missing (expected 'meta KEY VALUE')");
  EXPECT_EQ(ParseError(WithHeader("meta k v\xFF\n")),
            "t.ev:2: meta value: invalid UTF-8 at byte 2");
  EXPECT_EQ(ParseError(WithHeader("meta \x01 v\n")),
            "t.ev:2: meta key: control character 0x01 at byte 1");
}

// --- limits ---------------------------------------------------------------

TEST(EventReaderErrors, LineLongerThan64KiB) {
  std::string text = WithHeader("a 1 1 act\n# ");
  text.append(65535, 'x');  // 65 537 bytes
  text += "\na 2 1 act\n";
  EXPECT_EQ(ParseError(text), "t.ev:3: line is longer than 65536 bytes");
}

TEST(EventReaderErrors, TooManyEvents) {
  EventReadLimits limits;
  limits.max_events = 3;
  EXPECT_EQ(ParseError(WithHeader("p 1 forward\na 1 1 act\ne\nf 1\n"), limits),
            "t.ev:5: more than 3 events");
}

TEST(EventReaderErrors, TooManyLiveAllocations) {
  EventReadLimits limits;
  limits.max_live_allocations = 2;
  EXPECT_EQ(ParseError(WithHeader("a 1 1 act\na 2 1 act\nf 1\na 3 1 act\na 4 1 act\n"), limits),
            "t.ev:6: alloc id: more than 2 live allocations");
}

TEST(EventReaderErrors, InputOverTheSizeLimit) {
  EventReadLimits limits;
  limits.max_file_bytes = 10;
  EXPECT_EQ(ParseError(WithHeader(""), limits), "t.ev: 19 bytes is over the limit of 10 bytes");
}

TEST(EventReaderErrors, FirstErrorWins) {
  EXPECT_EQ(ParseError(WithHeader("f 1\nx\n")), "t.ev:2: free id: 1 is not live");
}

TEST(EventReaderErrors, LineNumbersCountCommentsBlankLinesAndCrlf) {
  EXPECT_EQ(ParseError("vramscope-events 1\r\n# c\r\n\r\n\r\n  \r\na 1 1 act\r\nf 9\r\n"),
            "t.ev:7: free id: 9 is not live");
}

}  // namespace
}  // namespace vramscope
