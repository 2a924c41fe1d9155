#include "vramscope/common/decimal.h"

#include <gtest/gtest.h>

namespace vramscope::common {
namespace {

// A checkpoint's tensor name is not a number the config vouched for: every
// malformed index is nullopt, never an exception (round 3: "encoder.block.x"
// and 30-digit indices in T5 checkpoints threw from std::stoul).
TEST(ParseDecimal, DigitsOnlyWithinTheMaximum) {
  EXPECT_EQ(ParseDecimal("0", 10), 0u);
  EXPECT_EQ(ParseDecimal("12", 100), 12u);
  EXPECT_EQ(ParseDecimal("007", 100), 7u);
  EXPECT_EQ(ParseDecimal("18446744073709551615", UINT64_MAX), std::nullopt);  // 20 digits
  EXPECT_EQ(ParseDecimal("9999999999999999999", UINT64_MAX), 9999999999999999999u);
  EXPECT_EQ(ParseDecimal("101", 100), std::nullopt);
  for (const char* bad :
       {"", "x", "-1", "+1", " 1", "1 ", "1.0", "0x10", "1e3", "999999999999999999999999999999"}) {
    EXPECT_EQ(ParseDecimal(bad, UINT64_MAX), std::nullopt) << bad;
  }
}

}  // namespace
}  // namespace vramscope::common
