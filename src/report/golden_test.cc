// Golden tests: each fixture's text, JSON, CSV and SVG must equal the files in
// tests/golden/report/. After reviewing a deliberate change, regenerate them
// with VS_UPDATE_GOLDEN=1 ./report_test --gtest_filter='Golden*'.
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "report_fixtures.h"
#include "vramscope/report.h"

namespace vramscope {
namespace {

std::string GoldenPath(const std::string& name) {
  return std::string(VS_SOURCE_DIR) + "/tests/golden/report/" + name;
}

bool UpdateRequested() {
  const char* flag = std::getenv("VS_UPDATE_GOLDEN");
  return flag != nullptr && std::string(flag) == "1";
}

// Line number and both versions of the first differing line: a readable
// failure instead of two multi-kilobyte strings.
std::string FirstDifference(const std::string& want, const std::string& got) {
  std::istringstream a(want), b(got);
  std::string la, lb;
  for (int line = 1;; ++line) {
    const bool more_a = static_cast<bool>(std::getline(a, la));
    const bool more_b = static_cast<bool>(std::getline(b, lb));
    if (!more_a && !more_b) return "(identical lines; different line ends?)";
    if (!more_a || !more_b || la != lb) {
      return "line " + std::to_string(line) + "\n  golden: " + (more_a ? la : "<end of file>") +
             "\n  actual: " + (more_b ? lb : "<end of output>");
    }
  }
}

void ExpectGolden(const std::string& name, const std::string& actual) {
  const std::string path = GoldenPath(name);
  if (UpdateRequested()) {
    std::ofstream(path, std::ios::binary) << actual;
    return;
  }
  std::ifstream in(path, std::ios::binary);
  ASSERT_TRUE(in.good()) << path << " is missing; run with VS_UPDATE_GOLDEN=1 to create it";
  std::stringstream want;
  want << in.rdbuf();
  EXPECT_TRUE(want.str() == actual)
      << name << " differs from the golden file at " << FirstDifference(want.str(), actual);
}

class GoldenTest : public ::testing::TestWithParam<std::string> {
 protected:
  Report Fixture() const {
    for (auto& [stem, report] : testing::GoldenFixtures()) {
      if (stem == GetParam()) return report;
    }
    ADD_FAILURE() << "no fixture " << GetParam();
    return Report{};
  }
};

TEST_P(GoldenTest, Text) { ExpectGolden(GetParam() + ".txt", RenderText(Fixture())); }
TEST_P(GoldenTest, Json) { ExpectGolden(GetParam() + ".json", RenderJson(Fixture())); }
TEST_P(GoldenTest, Csv) { ExpectGolden(GetParam() + ".csv", RenderTimelineCsv(Fixture())); }
TEST_P(GoldenTest, Svg) { ExpectGolden(GetParam() + ".svg", RenderSvg(Fixture())); }

// The same input renders the same bytes every time (no clocks, no addresses).
TEST_P(GoldenTest, Deterministic) {
  const Report report = Fixture();
  EXPECT_EQ(RenderHtml(report), RenderHtml(report));
  EXPECT_EQ(RenderSvg(report), RenderSvg(report));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenTest, ::testing::Values("small_fit", "oom", "two_ranks"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace vramscope
