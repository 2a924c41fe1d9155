// SVG and HTML: well-formed, offline (no network reference of any kind), and
// safe with hostile names; the chart copes with 1 point, 2000 points, all-zero
// data, no data, and a GPU limit far above the data.
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "report_fixtures.h"
#include "vramscope/report.h"
#include "xml_check.h"

namespace vramscope {
namespace {

using testing::CheckHtml;
using testing::CheckXml;

size_t Count(const std::string& haystack, const std::string& needle) {
  size_t n = 0;
  for (size_t at = haystack.find(needle); at != std::string::npos;
       at = haystack.find(needle, at + 1))
    ++n;
  return n;
}

// Every "http" must be the SVG namespace or (HTML) the http-equiv attribute of
// the Content-Security-Policy; nothing may reference another resource.
void ExpectOffline(const std::string& markup) {
  const size_t http = Count(markup, "http");
  const size_t allowed = Count(markup, "xmlns=\"http://www.w3.org/2000/svg\"") +
                         Count(markup, "<meta http-equiv=\"Content-Security-Policy\"");
  EXPECT_EQ(http, allowed) << "a reference to the network";
  // Attributes only: escaped input text may say src=, but never with a raw quote.
  for (const char* attribute : {"src=\"", "src='", "href=\"", "href='"}) {
    EXPECT_EQ(Count(markup, attribute), 0u) << attribute;
  }
  EXPECT_EQ(Count(markup, "@import"), 0u);
  EXPECT_EQ(Count(markup, "url("), Count(markup, "url(#")) << "url() to anything but an element id";
  EXPECT_EQ(Count(markup, "//"), Count(markup, "http://www.w3.org/2000/svg"))
      << "a protocol-relative reference";
}

std::vector<std::string> InlineSvgs(const std::string& html) {
  std::vector<std::string> out;
  for (size_t at = html.find("<svg"); at != std::string::npos; at = html.find("<svg", at + 1)) {
    const size_t end = html.find("</svg>", at);
    if (end == std::string::npos) break;
    out.push_back(html.substr(at, end + 6 - at));
  }
  return out;
}

Report HostileReport() {
  Report report = testing::OomReport();
  report.source = "<script>alert(\"x\")</script> & 'y'";
  report.gpu.display_name = "GPU <b>bold</b>";
  report.model->name = "evil\x1b[31mred\x1b[0m";
  report.model->architecture = "Arch\xff\xfe";
  report.knobs.push_back({"<k>", "</script><script>alert(1)</script>"});
  report.explanation.push_back("invalid UTF-8 \xc3\x28 and C1 \xc2\x9b control");
  RankReport& rank = report.ranks[0];
  rank.rank_class = "<rc>\"&";
  rank.sim.top_at_peak[0].op = "<img src=x onerror=alert(1)>";
  rank.sim.top_at_peak[0].module = "a&b\"c'd\nnext";
  rank.sim.oom->message = "line one <x>\nline two & \"three\"";
  return report;
}

TEST(MarkupTest, FixturesAreWellFormedAndOffline) {
  for (const auto& [name, report] : testing::GoldenFixtures()) {
    SCOPED_TRACE(name);
    const std::string svg = RenderSvg(report);
    EXPECT_EQ(CheckXml(svg), "");
    ExpectOffline(svg);
    const std::string html = RenderHtml(report);
    EXPECT_EQ(CheckHtml(html), "");
    ExpectOffline(html);
    const auto svgs = InlineSvgs(html);
    EXPECT_EQ(svgs.size(), report.ranks.size()) << "one chart per rank class";
    for (const std::string& inline_svg : svgs) EXPECT_EQ(CheckXml(inline_svg), "");
  }
}

TEST(MarkupTest, HostileNamesAreEscaped) {
  const Report report = HostileReport();
  for (const std::string& markup : {RenderSvg(report), RenderHtml(report)}) {
    EXPECT_EQ(markup.find("<script>alert"), std::string::npos);
    EXPECT_EQ(markup.find("<img"), std::string::npos);
    EXPECT_EQ(markup.find("<b>bold"), std::string::npos);
    EXPECT_EQ(markup.find('\x1b'), std::string::npos);
    EXPECT_EQ(markup.find("\xff"), std::string::npos);
    EXPECT_EQ(markup.find("\xc2\x9b"), std::string::npos);
  }
  const std::string svg = RenderSvg(report);
  EXPECT_EQ(CheckXml(svg), "");
  EXPECT_NE(svg.find("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#39;y&#39;"),
            std::string::npos);
  const std::string html = RenderHtml(report);
  EXPECT_EQ(CheckHtml(html), "");
  for (const std::string& inline_svg : InlineSvgs(html)) EXPECT_EQ(CheckXml(inline_svg), "");
  EXPECT_NE(html.find("&lt;img src=x onerror=alert(1)&gt;"), std::string::npos);
  EXPECT_NE(html.find("a&amp;b&quot;c&#39;d?next"), std::string::npos);
  EXPECT_NE(html.find("line one &lt;x&gt;\nline two &amp; &quot;three&quot;"), std::string::npos);
  // The page's own scripts only: the inline one and one data block per chart.
  EXPECT_EQ(Count(html, "<script"), 1 + report.ranks.size());
  ExpectOffline(html);
}

TEST(MarkupTest, HtmlHasEverySection) {
  const std::string html = RenderHtml(testing::OomReport());
  for (const char* part :
       {"<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none';",
        "DOES NOT FIT", "peak allocated", "peak reserved", "device total", "Memory over time",
        "Breakdown at the peak", "Largest allocations alive at the peak", "Peak per step and phase",
        "Out of memory", "Knobs used", "<h2>Why</h2>", "<h2>Notes</h2>", "class=\"vs-reset\""}) {
    EXPECT_NE(html.find(part), std::string::npos) << part;
  }
}

TEST(MarkupTest, HtmlTimelineDataParses) {
  const Report report = testing::TwoRankReport();
  const std::string html = RenderHtml(report);
  const std::string open = "<script type=\"application/json\" class=\"vs-data\">";
  size_t at = html.find(open);
  for (const RankReport& rank : report.ranks) {
    ASSERT_NE(at, std::string::npos);
    const size_t start = at + open.size();
    const size_t end = html.find("</script>", start);
    const auto data = nlohmann::json::parse(html.substr(start, end - start));
    ASSERT_EQ(data["x"].size(), rank.sim.timeline.size());
    EXPECT_EQ(data["a"].back().get<uint64_t>(), rank.sim.timeline.back().allocated_bytes);
    EXPECT_EQ(data["c"][0].size(), static_cast<size_t>(kNumCategories));
    at = html.find(open, end);
  }
}

std::string SvgOf(const Report& report) {
  const std::string svg = RenderSvg(report);
  EXPECT_EQ(CheckXml(svg), "");
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("inf"), std::string::npos);
  ExpectOffline(svg);
  return svg;
}

TEST(SvgTest, OnePoint) {
  Report report = testing::SmallFitReport();
  auto& timeline = report.ranks[0].sim.timeline;
  timeline.resize(1);
  testing::DerivePeaks(&report.ranks[0].sim);
  const std::string svg = SvgOf(report);
  EXPECT_NE(svg.find("step 0: setup"), std::string::npos);
  EXPECT_NE(svg.find("peak allocated 2.00 GiB"), std::string::npos);
}

TEST(SvgTest, TwoThousandPoints) {
  const std::string svg = SvgOf(testing::ManyPointsReport(2000));
  EXPECT_LT(svg.size(), 400u * 1024) << "steps at equal height share one vertex";
  EXPECT_NE(svg.find("step 7: forward"), std::string::npos);
}

TEST(SvgTest, AllZero) {
  Report report = testing::SmallFitReport();
  for (TimelinePoint& p : report.ranks[0].sim.timeline) {
    p.by_category = {};
    p.reserved_bytes = 0;
  }
  report.ranks[0].sim.top_at_peak.clear();
  testing::DerivePeaks(&report.ranks[0].sim);
  report.ranks[0].sim.peak_reserved_bytes = 0;
  report.ranks[0].extras = {};
  report.ranks[0].device_total_bytes = 0;
  const std::string svg = SvgOf(report);
  EXPECT_NE(svg.find("far above</text>"), std::string::npos);
  EXPECT_NE(svg.find(">1.00</text>"), std::string::npos) << "a default 0..1 GiB axis";
}

TEST(SvgTest, LimitFarAboveTheData) {
  Report report = testing::SmallFitReport();  // 11.5 GiB on a 79.5 GiB GPU
  const std::string svg = SvgOf(report);
  EXPECT_NE(svg.find(">79.50 GiB: far above</text>"), std::string::npos);
  EXPECT_EQ(svg.find("stroke-dasharray=\"8 4\"/>"), svg.rfind("stroke-dasharray=\"8 4\"/>"))
      << "only the legend sample of the limit line";
  EXPECT_EQ(svg.find(">80</text>"), std::string::npos)
      << "the axis follows the data, not the limit";
}

TEST(SvgTest, LimitNearTheDataIsDrawn) {
  const std::string svg = SvgOf(testing::TwoRankReport());  // 25.4 GiB on 79.25: 3x, off chart
  Report near = testing::OomReport();                       // 22.5 GiB on 23.25 GiB
  const std::string near_svg = SvgOf(near);
  EXPECT_NE(near_svg.find(">23.25 GiB</text>"), std::string::npos);
  EXPECT_NE(near_svg.find("OOM: 3.91 GiB more"), std::string::npos);
  const size_t levels = near_svg.find("<g class=\"vs-levels\">");
  const size_t limit_line =
      near_svg.find("stroke=\"#c0392b\" stroke-width=\"1.5\" stroke-dasharray=\"8 4\"");
  EXPECT_LT(levels, limit_line);
  EXPECT_LT(limit_line, near_svg.find("</g>", levels)) << "the limit line is drawn in the plot";
  EXPECT_NE(svg.find("far above</text>"), std::string::npos);
}

TEST(SvgTest, ExtremeAndDisorderedValues) {
  Report report = testing::OomReport();
  SimResult& sim = report.ranks[0].sim;
  constexpr uint64_t kBig = uint64_t{1} << 62;
  sim.timeline[1].event_index = UINT64_MAX;  // out of order and at the end of the range
  sim.timeline[2].by_category.fill(kBig);
  sim.timeline[2].reserved_bytes = kBig;
  sim.timeline.back().event_index = UINT64_MAX - 1;
  sim.peak_event_index = UINT64_MAX;
  sim.oom_event_index = UINT64_MAX;
  sim.oom->allocated_bytes = kBig;
  sim.oom->alloc_size_bytes = kBig;
  SvgOf(report);
  EXPECT_EQ(CheckHtml(RenderHtml(report)), "");
  sim.timeline.resize(1);
  sim.timeline[0].event_index = UINT64_MAX;
  SvgOf(report);
}

TEST(SvgTest, NoTimelineAndNoRanks) {
  Report report = testing::SmallFitReport();
  report.ranks[0].sim.timeline.clear();
  EXPECT_NE(SvgOf(report).find("No timeline was recorded"), std::string::npos);
  Report empty;
  SvgOf(empty);
  EXPECT_EQ(CheckHtml(RenderHtml(empty)), "");
}

}  // namespace
}  // namespace vramscope
