#include "vramscope/common/checked.h"

#include <gtest/gtest.h>

namespace vramscope::common {
namespace {

constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();

TEST(Checked, AddAtTheEdge) {
  EXPECT_EQ(CheckedAdd(1, 2), 3u);
  EXPECT_EQ(CheckedAdd(kMax - 1, 1), kMax);
  EXPECT_EQ(CheckedAdd(kMax, 0), kMax);
  EXPECT_FALSE(CheckedAdd(kMax, 1).has_value());
  EXPECT_FALSE(CheckedAdd(kMax / 2 + 1, kMax / 2 + 1).has_value());
  static_assert(CheckedAdd(2, 3) == 5u);
}

TEST(Checked, MulAtTheEdge) {
  EXPECT_EQ(CheckedMul(0, kMax), 0u);
  EXPECT_EQ(CheckedMul(uint64_t{1} << 32, (uint64_t{1} << 32) - 1),
            kMax - ((uint64_t{1} << 32) - 1));
  EXPECT_FALSE(CheckedMul(uint64_t{1} << 32, uint64_t{1} << 32).has_value());
  EXPECT_FALSE(CheckedMul(kMax, 2).has_value());
  EXPECT_EQ(CheckedMul(kMax, 1), kMax);
  static_assert(CheckedMul(6, 7) == 42u);
}

TEST(Checked, SaturatingAddAndRoundUp) {
  EXPECT_EQ(SaturatingAdd(kMax - 1, 1), kMax);
  EXPECT_EQ(SaturatingAdd(kMax, kMax), kMax);
  EXPECT_EQ(SaturatingAdd(5, 6), 11u);
  EXPECT_EQ(CheckedRoundUp(0, 512), 0u);
  EXPECT_EQ(CheckedRoundUp(1, 512), 512u);
  EXPECT_EQ(CheckedRoundUp(512, 512), 512u);
  EXPECT_EQ(CheckedRoundUp(kMax - 511, 512), kMax - 511);  // already a multiple
  EXPECT_FALSE(CheckedRoundUp(kMax - 510, 512).has_value());
  EXPECT_FALSE(CheckedRoundUp(kMax, 2).has_value());
}

}  // namespace
}  // namespace vramscope::common
