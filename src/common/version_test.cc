#include "vramscope/common/version.h"

#include <gtest/gtest.h>

namespace vramscope::common {
namespace {

int Packed(std::string_view text) {
  std::optional<MajorMinor> v = ParseMajorMinor(text);
  return v ? v->Packed() : -1;
}

TEST(ParseMajorMinor, ReadsTheLeadingMajorAndMinor) {
  EXPECT_EQ(Packed("4.57"), 457);
  EXPECT_EQ(Packed("2.4"), 204);
  EXPECT_EQ(Packed("4.46.1"), 446);
  EXPECT_EQ(Packed("2.11.0+cu128"), 211);
  EXPECT_EQ(Packed("0.9"), 9);
  EXPECT_EQ(Packed("99.99"), 9999);
  EXPECT_EQ(Packed("04.05"), 405);
}

TEST(ParseMajorMinor, GivesWhatFollowsTheMinor) {
  std::string_view rest = "unset";
  ASSERT_TRUE(ParseMajorMinor("2.11.0+cu128", &rest));
  EXPECT_EQ(rest, ".0+cu128");
  ASSERT_TRUE(ParseMajorMinor("4.46rc1", &rest));
  EXPECT_EQ(rest, "rc1");
  ASSERT_TRUE(ParseMajorMinor("4.46", &rest));
  EXPECT_EQ(rest, "");
}

TEST(ParseMajorMinor, RejectsWhatIsNotAVersion) {
  for (std::string_view bad :
       {"", "4", "4.", ".5", "x.5", "4.x", "-4.5", "4.-5", "4.-0", "+4.5", " 4.5", "4 .5", "100.1",
        "4.100", "999999999999999999999.1", "4.99999999999999999999", "4,5", "\x1b[1m4.5"}) {
    EXPECT_FALSE(ParseMajorMinor(bad).has_value()) << bad;
  }
}

}  // namespace
}  // namespace vramscope::common
