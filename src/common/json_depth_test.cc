#include "vramscope/common/json_depth.h"

#include <gtest/gtest.h>

#include <string>

namespace vramscope::common {
namespace {

TEST(JsonNestsDeeperThan, CountsArraysAndObjects) {
  EXPECT_FALSE(JsonNestsDeeperThan("{}", 1));
  EXPECT_TRUE(JsonNestsDeeperThan("{\"a\": []}", 1));
  EXPECT_FALSE(JsonNestsDeeperThan("{\"a\": []}", 2));
  EXPECT_FALSE(JsonNestsDeeperThan("[][][]", 1));  // siblings, not nesting
  EXPECT_FALSE(JsonNestsDeeperThan(std::string(64, '[') + std::string(64, ']'), 64));
  EXPECT_TRUE(JsonNestsDeeperThan(std::string(65, '['), 64));
  EXPECT_TRUE(JsonNestsDeeperThan(std::string(100'000, '['), 64));
}

TEST(JsonNestsDeeperThan, IgnoresBracketsInStrings) {
  EXPECT_FALSE(JsonNestsDeeperThan("{\"[[[[\": \"{{{{\"}", 1));
  EXPECT_FALSE(JsonNestsDeeperThan(R"({"a\"[[[": 1})", 1));  // an escaped quote
  EXPECT_TRUE(JsonNestsDeeperThan(R"({"a\\": [[1]]})", 2));  // an escaped backslash ends
}

TEST(JsonNestsDeeperThan, StrayClosingBracketsDoNotUnderflow) {
  EXPECT_TRUE(JsonNestsDeeperThan("]]]]}}}}[[", 1));
  EXPECT_FALSE(JsonNestsDeeperThan("]]]]}}}}[", 1));
}

TEST(JsonHasMoreItemsThan, CountsCommasAndOpeningBracketsOutsideStrings) {
  EXPECT_FALSE(JsonHasMoreItemsThan("{\"a\": [1, 2]}", 3));  // { [ ,
  EXPECT_TRUE(JsonHasMoreItemsThan("{\"a\": [1, 2, 3]}", 3));
  EXPECT_FALSE(JsonHasMoreItemsThan("{\"a,[{\\\",\": 1}", 1));  // inside the string
}

TEST(FindNulByte, FindsTheFirstNulByte) {
  EXPECT_EQ(FindNulByte("{}"), std::nullopt);
  EXPECT_EQ(FindNulByte(std::string_view("{}\0x\0", 5)), 2u);
  EXPECT_EQ(NulByteProblem(2), "NUL byte at byte 2 (JSON text has none)");
}

}  // namespace
}  // namespace vramscope::common
