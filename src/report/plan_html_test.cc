// RenderPlanHtml: offline, script-free, every input text escaped. (That the
// page renders in a browser and shows plan --json's numbers:
// tests/html_test.py.)
#include <string>

#include <gtest/gtest.h>

#include "vramscope/plan.h"

namespace vramscope {
namespace {

TEST(PlanHtml, OfflineScriptFreeAndEscaped) {
  PlanResult plan;
  plan.gpu.name = "gpu<i>";
  plan.gpu.usable_bytes = 10ull << 30;
  plan.model = ModelSummary{};
  plan.model->name = "m\"odel'<x>";
  plan.model->parameters = 1234567;
  plan.seq = 1024;
  plan.tokens_per_step = 4096;
  Strategy s;
  s.fits = true;
  s.device_total_bytes = 3ull << 30;
  s.time.tokens_per_second = 1234.4;
  s.time.step_seconds = 3.318;
  plan.strategies.push_back(s);
  plan.explanation = {"a <b>bold</b> & claim\x1b[31m"};
  const std::string page = RenderPlanHtml(plan, "<script>alert(1)</script>");

  EXPECT_NE(page.find("default-src 'none'"), std::string::npos);
  EXPECT_EQ(page.find("<script"), std::string::npos);
  // Nothing that could reference another resource: the one "http" is the
  // Content-Security-Policy's http-equiv.
  EXPECT_EQ(page.find("http"), page.find("http-equiv"));
  EXPECT_EQ(page.find("http", page.find("http-equiv") + 1), std::string::npos);
  EXPECT_EQ(page.find("src="), std::string::npos);
  EXPECT_EQ(page.find("href="), std::string::npos);
  EXPECT_EQ(page.find("url("), std::string::npos);
  EXPECT_EQ(page.find("<b>bold"), std::string::npos);
  EXPECT_EQ(page.find("<i>"), std::string::npos);
  EXPECT_EQ(page.find("<x>"), std::string::npos);
  EXPECT_EQ(page.find('\x1b'), std::string::npos);
  EXPECT_NE(page.find("&lt;script&gt;alert(1)&lt;/script&gt;"), std::string::npos);
  EXPECT_NE(page.find("m&quot;odel&#39;&lt;x&gt;"), std::string::npos);
  EXPECT_NE(page.find("1,234,567 parameters"), std::string::npos);
  EXPECT_NE(page.find(">1234<"), std::string::npos) << "tokens/s as plan's text prints it";
  EXPECT_NE(page.find(">3.32<"), std::string::npos);
  EXPECT_NE(page.find(">3.00 GiB<"), std::string::npos);
  EXPECT_EQ(page.rfind("</html>\n"), page.size() - 8);
}

}  // namespace
}  // namespace vramscope
