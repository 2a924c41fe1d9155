// WriteEventText: format, string numbering, sanitizing, and round trips.
#include <random>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "test_util.h"
#include "vramscope/event_io.h"

namespace vramscope {
namespace {

using events_test::DocExample;
using events_test::ParseOk;
using ::testing::HasSubstr;

// Events compared through their string texts, so that streams with different
// string numbering but the same meaning compare equal.
void ExpectSameMeaning(const EventStream& a, const EventStream& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    Event x = a.events()[i];
    Event y = b.events()[i];
    EXPECT_EQ(a.String(x.op), b.String(y.op)) << "event " << i;
    EXPECT_EQ(a.String(x.module), b.String(y.module)) << "event " << i;
    x.op = y.op = 0;
    x.module = y.module = 0;
    EXPECT_EQ(x, y) << "event " << i;
  }
  EXPECT_EQ(a.metadata(), b.metadata());
}

TEST(EventWriter, DocumentedExampleIsWrittenBackByteForByte) {
  const std::string text = DocExample();
  EXPECT_EQ(WriteEventText(ParseOk(text)), text);
}

TEST(EventWriter, EmptyStreamIsJustTheHeader) {
  EXPECT_EQ(WriteEventText(EventStream()), "vramscope-events 1\n");
}

TEST(EventWriter, StringsAreNumberedByFirstUseAndDefinedBeforeIt) {
  EventStream s;
  const uint32_t unused = s.Intern("never.used");
  const uint32_t module = s.Intern("model.l0");
  const uint32_t op = s.Intern("aten::mm");
  ASSERT_EQ(unused, 1u);
  s.metadata()["model"] = "tiny";
  s.AllocInterned(1, 64, Category::kActivations, op, 0);
  s.BeginPhase(1, Phase::kForward);
  s.AllocInterned(2, 32, Category::kTemporaries, op, module, 2);
  s.Free(2);
  s.EmptyCache();
  EXPECT_EQ(WriteEventText(s),
            "vramscope-events 1\n"
            "meta model tiny\n"
            "s 1 aten::mm\n"
            "a 1 64 act 1\n"
            "p 1 forward\n"
            "s 2 model.l0\n"
            "a 2 32 temp 1 2 2\n"
            "f 2\n"
            "e\n");
}

TEST(EventWriter, OptionalFieldsAreWrittenUpToTheLastNonZero) {
  EventStream s;
  s.Alloc(1, 1, Category::kOther);
  s.Alloc(2, 1, Category::kOther, "", "m");
  s.Alloc(3, 1, Category::kOther, "", "", 5);
  EXPECT_EQ(WriteEventText(s),
            "vramscope-events 1\na 1 1 other\ns 1 m\na 2 1 other 0 1\na 3 1 other 0 0 5\n");
}

TEST(EventWriter, DuplicateTextsShareOneIndex) {
  EventStream s;
  const uint32_t first = s.AppendString("x");
  const uint32_t second = s.AppendString("x");
  s.AllocInterned(1, 1, Category::kOther, first, second);
  EXPECT_EQ(WriteEventText(s), "vramscope-events 1\ns 1 x\na 1 1 other 1 1\n");
}

TEST(EventWriter, TextThatCannotBeWrittenVerbatimIsSanitized) {
  EventStream s;
  s.metadata()["a key"] = "two\nlines";
  s.metadata()["blank"] = "";
  s.Alloc(1, 1, Category::kOther, "  leading", "bad\xFFutf8\r");
  s.Alloc(2, 1, Category::kOther, " \t", "\n");  // nothing left: index 0
  const std::string text = WriteEventText(s);
  EXPECT_EQ(text,
            "vramscope-events 1\n"
            "meta a_key two lines\n"
            "meta blank\n"
            "s 1 leading\n"
            "s 2 bad?utf8 \n"
            "a 1 1 other 1 2\n"
            "a 2 1 other\n");
  const EventStream back = ParseOk(text);
  EXPECT_EQ(back.metadata().at("a_key"), "two lines");
  EXPECT_EQ(back.metadata().at("blank"), "");
}

TEST(EventWriter, OverlongTextIsCutToFitOneLine) {
  EventStream s;
  std::string long_text(70000, 'y');
  s.Alloc(1, 1, Category::kOther, long_text);
  const EventStream back = ParseOk(WriteEventText(s));
  EXPECT_EQ(back.String(back.events()[0].op), std::string(60000, 'y'));
}

TEST(EventWriter, ExtremeValuesRoundTrip) {
  EventStream s;
  s.Alloc(~uint64_t{0}, kMaxSizeBytes, Category::kWorkspace, "op", "mod", ~uint32_t{0});
  s.BeginPhase(~uint32_t{0}, Phase::kOptimizer);
  s.Free(~uint64_t{0});
  const EventStream back = ParseOk(WriteEventText(s));
  EXPECT_EQ(back.events(), s.events());
  EXPECT_EQ(back.strings(), s.strings());
}

// Two keys that agree in their first 1024 bytes are cut to the same written
// key: it is written once, with the value a reader keeps (the later one), so
// writing what was read back gives the same bytes (found by the fuzzer).
TEST(EventWriter, KeysEqualAfterTheCutAreWrittenOnce) {
  EventStream s;
  const std::string stem(1024, 'k');
  s.metadata()[stem + "a"] = "first";
  s.metadata()[stem + "b"] = "second";
  const std::string text = WriteEventText(s);
  EXPECT_EQ(text, "vramscope-events 1\nmeta " + stem + " second\n");
  EXPECT_EQ(WriteEventText(ParseOk(text)), text);
}

// Streams with record_stream events are written as version 2 (version-1
// readers would reject `u` and `x`); others stay version 1.
TEST(EventWriter, StreamRecordsAreWrittenAsVersion2) {
  EventStream s;
  s.Alloc(7, 4096, Category::kParameters, "zero3::all_gather", "", 1);
  s.RecordStream(7, 0);
  s.Free(7);
  s.UsesDone(7);
  const std::string text = WriteEventText(s);
  EXPECT_EQ(text,
            "vramscope-events 2\n"
            "s 1 zero3::all_gather\n"
            "a 7 4096 param 1 0 1\n"
            "u 7 0\n"
            "f 7\n"
            "x 7\n");
  EXPECT_EQ(ParseOk(text).events(), s.events());
}

// Random valid streams: write -> parse gives the same events, strings and
// metadata, and writing again gives the same bytes.
TEST(EventWriter, RandomStreamsRoundTrip) {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 200; ++round) {
    EventStream s;
    s.metadata()["round"] = std::to_string(round);
    std::vector<uint64_t> live;
    uint64_t next_id = rng() % 1000;
    const int n = static_cast<int>(rng() % 300);
    for (int i = 0; i < n; ++i) {
      const uint64_t r = rng() % 10;
      if (r < 5 || live.empty()) {
        const std::string op = "op" + std::to_string(rng() % 7);
        const std::string module = rng() % 2 ? "" : "model.l" + std::to_string(rng() % 5);
        s.Alloc(next_id, rng() % kMaxSizeBytes, kAllCategories[rng() % kNumCategories],
                rng() % 4 ? op : "", module, static_cast<uint32_t>(rng() % 3));
        live.push_back(next_id++);
      } else if (r < 8) {
        const size_t k = rng() % live.size();
        s.Free(live[k]);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
      } else if (r < 9) {
        s.BeginPhase(static_cast<uint32_t>(rng() % 4), static_cast<Phase>(rng() % kNumPhases));
      } else if (round % 2 == 1 && !live.empty() && rng() % 2 == 0) {
        // Odd rounds use version 2: a use, a free, sometimes the completion.
        const size_t k = rng() % live.size();
        s.RecordStream(live[k], static_cast<uint32_t>(rng() % 3));
        s.Free(live[k]);
        if (rng() % 2) s.UsesDone(live[k]);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
      } else {
        s.EmptyCache();
      }
    }
    ASSERT_TRUE(s.Validate().ok());
    const std::string text = WriteEventText(s);
    const EventStream back = ParseOk(text);
    ExpectSameMeaning(s, back);
    EXPECT_EQ(WriteEventText(back), text);
    // A stream built in first-use order (as here) comes back identical.
    EXPECT_EQ(back.events(), s.events());
    EXPECT_EQ(back.strings(), s.strings());
  }
}

TEST(EventWriter, ParsedFileWithUnusedAndDuplicateStringsKeepsItsMeaning) {
  const EventStream parsed =
      ParseOk("vramscope-events 1\ns 1 unused\ns 2 x\ns 3 x\na 1 1 act 3 2\n");
  const std::string text = WriteEventText(parsed);
  EXPECT_THAT(text, ::testing::Not(HasSubstr("unused")));
  ExpectSameMeaning(parsed, ParseOk(text));
}

}  // namespace
}  // namespace vramscope
