#include "vramscope/event_stream.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>

namespace vramscope {
namespace {

using ::testing::HasSubstr;

TEST(EventStream, EventIsFortyBytes) { EXPECT_EQ(sizeof(Event), 40u); }

TEST(EventStream, InternReturnsStableIndicesAndZeroForEmpty) {
  EventStream s;
  EXPECT_EQ(s.Intern(""), 0u);
  EXPECT_EQ(s.Intern("aten::mm"), 1u);
  EXPECT_EQ(s.Intern("model.l0"), 2u);
  EXPECT_EQ(s.Intern("aten::mm"), 1u);
  EXPECT_EQ(s.String(0), "");
  EXPECT_EQ(s.String(2), "model.l0");
  EXPECT_EQ(s.strings().size(), 3u);
}

TEST(EventStream, AppendStringKeepsDuplicatesAndInternFindsTheFirst) {
  EventStream s;
  EXPECT_EQ(s.AppendString("x"), 1u);
  EXPECT_EQ(s.AppendString("x"), 2u);
  EXPECT_EQ(s.Intern("x"), 1u);
  EXPECT_EQ(s.strings().size(), 3u);
}

// Intern remembers recent answers by the caller's pointer; a buffer reused
// for other text (same pointer, same length) must not get the old index.
TEST(EventStream, InternChecksTheTextBehindARememberedPointer) {
  EventStream s;
  char buffer[] = "alpha";
  const uint32_t alpha = s.Intern(buffer);
  std::memcpy(buffer, "gamma", 5);
  const uint32_t gamma = s.Intern(buffer);
  EXPECT_NE(gamma, alpha);
  EXPECT_EQ(s.String(gamma), "gamma");
  std::memcpy(buffer, "alpha", 5);
  EXPECT_EQ(s.Intern(buffer), alpha);
  // A copy keeps working with its own strings.
  EventStream copy = s;
  EXPECT_EQ(copy.Intern(buffer), alpha);
  EXPECT_EQ(copy.Intern(std::string("gamma")), gamma);
}

TEST(EventStream, BuildersRecordEvents) {
  EventStream s;
  s.Alloc(7, 4096, Category::kActivations, "aten::mm", "model.l0", 3);
  s.BeginPhase(2, Phase::kBackward);
  s.Free(7);
  s.EmptyCache();
  ASSERT_EQ(s.size(), 4u);
  const Event& a = s.events()[0];
  EXPECT_EQ(a.kind, EventKind::kAlloc);
  EXPECT_EQ(a.id, 7u);
  EXPECT_EQ(a.size_bytes, 4096u);
  EXPECT_EQ(a.category, Category::kActivations);
  EXPECT_EQ(s.String(a.op), "aten::mm");
  EXPECT_EQ(s.String(a.module), "model.l0");
  EXPECT_EQ(a.stream, 3u);
  EXPECT_EQ(s.events()[1].kind, EventKind::kPhase);
  EXPECT_EQ(s.events()[1].step, 2u);
  EXPECT_EQ(s.events()[1].phase, Phase::kBackward);
  EXPECT_EQ(s.events()[2].kind, EventKind::kFree);
  EXPECT_EQ(s.events()[3].kind, EventKind::kEmptyCache);
}

TEST(EventStream, PhaseNamesRoundTrip) {
  for (Phase p : {Phase::kSetup, Phase::kForward, Phase::kBackward, Phase::kOptimizer}) {
    Phase parsed = Phase::kSetup;
    ASSERT_TRUE(ParsePhase(PhaseName(p), &parsed));
    EXPECT_EQ(parsed, p);
  }
  Phase unused = Phase::kSetup;
  EXPECT_FALSE(ParsePhase("Forward", &unused));
  EXPECT_FALSE(ParsePhase("", &unused));
}

TEST(EventStreamValidate, AcceptsAValidStream) {
  EventStream s;
  s.Alloc(1, 10, Category::kParameters, "op");
  s.Alloc(2, kMaxSizeBytes, Category::kOther);
  s.Free(2);
  s.Alloc(2, 0, Category::kOther);  // an id may be reused once freed
  EXPECT_TRUE(s.Validate().ok());
}

TEST(EventStreamValidate, RejectsDoubleAllocOfALiveId) {
  EventStream s;
  s.Alloc(1, 10, Category::kOther);
  s.Alloc(1, 10, Category::kOther);
  const Status status = s.Validate();
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.error().message, "event 1 (alloc id 1): id 1 is already live");
}

TEST(EventStreamValidate, RejectsFreeOfAnIdThatIsNotLive) {
  EventStream s;
  s.Alloc(1, 10, Category::kOther);
  s.Free(1);
  s.Free(1);
  const Status status = s.Validate();
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.error().message, "event 2 (free id 1): id 1 is not live");
}

TEST(EventStreamValidate, RejectsOversizedAllocAndUndefinedString) {
  EventStream big;
  big.Alloc(1, kMaxSizeBytes + 1, Category::kOther);
  ASSERT_FALSE(big.Validate().ok());
  EXPECT_THAT(big.Validate().error().message, HasSubstr("above the limit of 2^62"));

  EventStream undefined;
  undefined.AllocInterned(1, 10, Category::kOther, /*op=*/5, /*module=*/0);
  ASSERT_FALSE(undefined.Validate().ok());
  EXPECT_THAT(undefined.Validate().error().message, HasSubstr("string index 5 is not defined"));
}

}  // namespace
}  // namespace vramscope
