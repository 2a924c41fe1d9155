// ParseEventText on well-formed input (errors: event_reader_errors_test.cc).
#include <gtest/gtest.h>

#include "test_util.h"
#include "vramscope/event_io.h"

namespace vramscope {
namespace {

using events_test::DocExample;
using events_test::ParseOk;

TEST(EventReader, DocumentedExampleParses) {
  const std::string text = DocExample();
  ASSERT_FALSE(text.empty());
  const EventStream s = ParseOk(text);
  ASSERT_EQ(s.size(), 12u);
  EXPECT_EQ(s.metadata().at("source"), "example");
  ASSERT_EQ(s.strings().size(), 3u);
  EXPECT_EQ(s.String(1), "aten::empty");
  EXPECT_EQ(s.String(2), "model.layers.0.mlp");
  const Event& first = s.events()[0];
  EXPECT_EQ(first.kind, EventKind::kAlloc);
  EXPECT_EQ(first.id, 1u);
  EXPECT_EQ(first.size_bytes, 33554432u);
  EXPECT_EQ(first.category, Category::kParameters);
  EXPECT_EQ(first.op, 1u);
  EXPECT_EQ(first.module, 2u);
  EXPECT_EQ(s.events()[1].kind, EventKind::kPhase);
  EXPECT_EQ(s.events()[1].step, 1u);
  EXPECT_EQ(s.events()[1].phase, Phase::kForward);
  EXPECT_TRUE(s.Validate().ok());
}

TEST(EventReader, HeaderOnlyFileIsAnEmptyStream) {
  const EventStream s = ParseOk("vramscope-events 1\n");
  EXPECT_EQ(s.size(), 0u);
  EXPECT_EQ(s.strings().size(), 1u);
  EXPECT_TRUE(s.metadata().empty());
  EXPECT_EQ(ParseOk("vramscope-events 1").size(), 0u);  // no final newline
}

TEST(EventReader, CommentsBlankLinesTabsAndCrlf) {
  const EventStream s = ParseOk(
      "vramscope-events 1\r\n"
      "# a comment\r\n"
      "\r\n"
      "   \t \r\n"
      "  # an indented comment\r\n"
      "a\t5  \t100 act\r\n"
      "\tf 5 \r\n");
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s.events()[0].id, 5u);
  EXPECT_EQ(s.events()[0].size_bytes, 100u);
  EXPECT_EQ(s.events()[1].kind, EventKind::kFree);
}

TEST(EventReader, LongCategoryNamesAreAccepted) {
  const EventStream s = ParseOk(
      "vramscope-events 1\n"
      "a 1 1 parameters\na 2 1 gradients\na 3 1 optimizer_state\na 4 1 activations\n"
      "a 5 1 temporaries\na 6 1 communication\na 7 1 workspace\na 8 1 loss\na 9 1 other\n");
  ASSERT_EQ(s.size(), 9u);
  EXPECT_EQ(s.events()[2].category, Category::kOptimizerState);
  EXPECT_EQ(s.events()[6].category, Category::kWorkspace);
}

TEST(EventReader, OptionalOpModuleAndStream) {
  const EventStream s = ParseOk(
      "vramscope-events 1\ns 1 aten::mm\ns 2 model.l0\n"
      "a 1 8 temp 1\na 2 8 temp 1 2\na 3 8 temp 0 2 7\na 4 8 temp 0 0 4294967295\n");
  ASSERT_EQ(s.size(), 4u);
  EXPECT_EQ(s.events()[0].op, 1u);
  EXPECT_EQ(s.events()[0].module, 0u);
  EXPECT_EQ(s.events()[1].module, 2u);
  EXPECT_EQ(s.events()[2].op, 0u);
  EXPECT_EQ(s.events()[2].stream, 7u);
  EXPECT_EQ(s.events()[3].stream, 4294967295u);
}

TEST(EventReader, ExtremeButValidNumbers) {
  const EventStream s = ParseOk(
      "vramscope-events 1\n"
      "a 18446744073709551615 4611686018427387904 other\n"  // id 2^64-1, size 2^62
      "a 0 0 other\n"
      "a 00042 0007 other\n"  // leading zeros are still decimal
      "f 18446744073709551615\n"
      "p 4294967295 optimizer\n");
  ASSERT_EQ(s.size(), 5u);
  EXPECT_EQ(s.events()[0].id, ~uint64_t{0});
  EXPECT_EQ(s.events()[0].size_bytes, kMaxSizeBytes);
  EXPECT_EQ(s.events()[2].id, 42u);
  EXPECT_EQ(s.events()[2].size_bytes, 7u);
  EXPECT_EQ(s.events()[4].step, 4294967295u);
}

TEST(EventReader, IdsMayBeReusedAfterFreeAndMayStayLive) {
  const EventStream s = ParseOk("vramscope-events 1\na 1 8 act\nf 1\na 1 16 act\na 2 4 param\n");
  ASSERT_EQ(s.size(), 4u);
  EXPECT_EQ(s.events()[2].size_bytes, 16u);
}

TEST(EventReader, PhasesAndEmptyCache) {
  const EventStream s =
      ParseOk("vramscope-events 1\np 0 setup\np 1 forward\np 1 backward\np 1 optimizer\ne\n");
  ASSERT_EQ(s.size(), 5u);
  EXPECT_EQ(s.events()[0].phase, Phase::kSetup);
  EXPECT_EQ(s.events()[3].phase, Phase::kOptimizer);
  EXPECT_EQ(s.events()[4].kind, EventKind::kEmptyCache);
}

TEST(EventReader, MetadataValuesRunToEndOfLine) {
  const EventStream s = ParseOk(
      "vramscope-events 1\n"
      "meta model llama 3  8b \n"
      "meta empty\n"
      "meta note first\n"
      "meta note second\n"
      "a 1 1 other\n"
      "meta late value after events\n");
  EXPECT_EQ(s.metadata().at("model"), "llama 3  8b ");  // verbatim, trailing blank kept
  EXPECT_EQ(s.metadata().at("empty"), "");
  EXPECT_EQ(s.metadata().at("note"), "second");  // a repeated key replaces the value
  EXPECT_EQ(s.metadata().at("late"), "value after events");
}

TEST(EventReader, StringTextRunsToEndOfLineAndMayBeUtf8) {
  const EventStream s = ParseOk(
      "vramscope-events 1\ns 1 model.layers.0 (decoder\tblock) \ns 2 caf\xC3\xA9 \xE2\x82\xAC\n"
      "s 3 model.layers.0 (decoder\tblock) \n");
  ASSERT_EQ(s.strings().size(), 4u);
  EXPECT_EQ(s.String(1), "model.layers.0 (decoder\tblock) ");
  EXPECT_EQ(s.String(2), "caf\xC3\xA9 \xE2\x82\xAC");
  EXPECT_EQ(s.String(3), s.String(1));  // duplicates keep their own index
}

TEST(EventReader, Utf8ByteOrderMarkBeforeHeaderIsSkipped) {
  EXPECT_EQ(ParseOk("\xEF\xBB\xBFvramscope-events 1\na 1 1 act\n").size(), 1u);
}

TEST(EventReader, LineOfExactlyTheLimitIsAccepted) {
  std::string text = "vramscope-events 1\n#";
  text.append(65535, 'x');  // 65 536 bytes
  text += "\r\n";           // the '\r' does not count
  text += "a 1 1 act\n";
  EXPECT_EQ(ParseOk(text).size(), 1u);
}

TEST(EventReader, LimitsAtTheirBoundariesAreAccepted) {
  EventReadLimits limits;
  limits.max_events = 3;
  limits.max_live_allocations = 2;
  const std::string text = "vramscope-events 1\na 1 1 act\na 2 1 act\nf 1\n";
  limits.max_file_bytes = text.size();
  EXPECT_TRUE(ParseEventText(text, "t.ev", limits).ok());
}

}  // namespace
}  // namespace vramscope
