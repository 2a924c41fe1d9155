// ParseGrid and ParseMargin: the grids people type, and one-line errors that
// name the flag for everything else.
#include <gtest/gtest.h>

#include "vramscope/plan.h"

namespace vramscope {
namespace {

using V = std::vector<uint64_t>;
constexpr uint64_t kParseGiB = uint64_t{1} << 30;

TEST(ParseGrid, StartStopCountIsInclusiveAndEven) {
  EXPECT_EQ(*ParseGrid("1:2048:10", "--seq"),
            (V{1, 228, 456, 683, 911, 1138, 1366, 1593, 1821, 2048}));
  EXPECT_EQ(*ParseGrid("0010:20:3", "--seq"), (V{10, 15, 20}));
  EXPECT_EQ(*ParseGrid("5:5:1", "--seq"), (V{5}));
  EXPECT_EQ(*ParseGrid("7:9:1", "--seq"), (V{7}));
  EXPECT_EQ(ParseGrid("1:2048:2048", "--seq")->size(), 2048u);
}

TEST(ParseGrid, DuplicatesFromRoundingAreRemoved) {
  EXPECT_EQ(*ParseGrid("1:4:10", "--batch"), (V{1, 2, 3, 4}));
  EXPECT_EQ(*ParseGrid("3:3:50", "--batch"), (V{3}));
}

TEST(ParseGrid, ListsAreSortedAndDeduplicated) {
  EXPECT_EQ(*ParseGrid("8,1,4, 2,4", "--batch"), (V{1, 2, 4, 8}));
  EXPECT_EQ(*ParseGrid("512", "--seq"), (V{512}));
  EXPECT_EQ(*ParseGrid(" 4096 ", "--seq"), (V{4096}));
}

TEST(ParseGrid, BadGridsNameTheFlag) {
  const char* bad[] = {"1:0:5",
                       "1:10:0",
                       "1:10:10001",
                       "1:10",
                       "1:2:3:4",
                       "a:10:5",
                       "1:b:5",
                       "1:10:x",
                       "0:10:5",
                       "-1:10:5",
                       "1,,2",
                       ",",
                       "",
                       "0",
                       "1.5",
                       "99999999999",
                       "1:10:-3",
                       "1,2,x",
                       "1:10:99999999999999999999"};
  for (const char* text : bad) {
    auto r = ParseGrid(text, "--seq");
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.error().message.rfind("--seq: ", 0), 0u) << r.error().message;
    EXPECT_EQ(r.error().message.find('\n'), std::string::npos);
  }
  EXPECT_NE(ParseGrid("1:0:5", "--seq").error().message.find("STOP 0 is below START 1"),
            std::string::npos);
  EXPECT_NE(ParseGrid("1:9:0", "--seq").error().message.find("COUNT 0"), std::string::npos);
  EXPECT_NE(ParseGrid("1:9:20000", "--seq").error().message.find("COUNT 20000"), std::string::npos);
}

// The grid is quoted whole up to 200 bytes, each item up to 40
// (common::QuoteForMessage); control characters are escaped.
TEST(ParseGrid, MessagesQuoteTheText) {
  const std::string list = "128,256,512,1024,2048,4096,8192,16384,32768,65536,x";
  EXPECT_EQ(ParseGrid(list, "--seq").error().message,
            "--seq: '" + list + "': value 'x' is not a whole number");
  EXPECT_EQ(ParseGrid("1:2", "--batch").error().message, "--batch: '1:2' is not START:STOP:COUNT");
  EXPECT_EQ(ParseGrid("1,\x1b[2J", "--batch").error().message,
            "--batch: '1,\\x1b[2J': value '\\x1b[2J' is not a whole number");
  EXPECT_LT(ParseGrid(std::string(100000, '7') + ",x", "--batch").error().message.size(), 400u);
}

TEST(ParseGrid, ListsLongerThanThePointLimitFail) {
  std::string text = "1";
  for (int i = 2; i <= 10001; ++i) text += "," + std::to_string(i);
  EXPECT_FALSE(ParseGrid(text, "--batch").ok());
}

TEST(ParseMargin, GiBAndPercent) {
  const uint64_t usable = 80 * kParseGiB;
  EXPECT_EQ(*ParseMargin("2", usable), 2 * kParseGiB);
  EXPECT_EQ(*ParseMargin("1.5GiB", usable), 3 * kParseGiB / 2);
  EXPECT_EQ(*ParseMargin("1.5 gib", usable), 3 * kParseGiB / 2);
  EXPECT_EQ(*ParseMargin("0", usable), 0u);
  EXPECT_EQ(*ParseMargin("5%", usable), 4 * kParseGiB);
  EXPECT_EQ(*ParseMargin("12.5 %", usable), 10 * kParseGiB);
}

TEST(ParseMargin, RejectsNegativeHugeAndJunk) {
  const uint64_t usable = 80 * kParseGiB;
  for (const char* text : {"-1", "-0", "-5%", "80", "100%", "120%", "1e30", "inf", "nan", "abc", "",
                           "%", "2 MiB", "GiB"}) {
    auto r = ParseMargin(text, usable);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.error().message.rfind("--margin: ", 0), 0u) << r.error().message;
  }
  EXPECT_NE(ParseMargin("-1", usable).error().message.find("negative"), std::string::npos);
  EXPECT_NE(ParseMargin("81", usable).error().message.find("not below"), std::string::npos);
}

}  // namespace
}  // namespace vramscope
