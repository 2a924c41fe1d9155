// Sweep renderers: well-formed, offline, safe with hostile names, and never
// failing on odd input (no points, one value, an axis without values, points
// without coordinates); JSON and CSV carry integer bytes.
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "vramscope/sweep.h"
#include "xml_check.h"

namespace vramscope {
namespace {

using testing::CheckHtml;
using testing::CheckXml;

constexpr uint64_t kGiBBytes = uint64_t{1} << 30;

size_t Count(const std::string& haystack, const std::string& needle) {
  size_t n = 0;
  for (size_t at = haystack.find(needle); at != std::string::npos;
       at = haystack.find(needle, at + 1))
    ++n;
  return n;
}

void ExpectOffline(const std::string& markup) {
  const size_t allowed = Count(markup, "xmlns=\"http://www.w3.org/2000/svg\"") +
                         Count(markup, "<meta http-equiv=\"Content-Security-Policy\"");
  EXPECT_EQ(Count(markup, "http"), allowed) << "a reference to the network";
  for (const char* attribute : {"src=\"", "src='", "href=\"", "href='", "<script"}) {
    EXPECT_EQ(Count(markup, attribute), 0u) << attribute;
  }
  EXPECT_EQ(Count(markup, "url("), 0u);
  EXPECT_EQ(Count(markup, "//"), Count(markup, "http://www.w3.org/2000/svg"));
}

SweepPoint Point(std::vector<uint64_t> at, uint64_t total_gib, bool fits, bool oom = false) {
  SweepPoint p;
  p.at = std::move(at);
  p.device_total_bytes = total_gib * kGiBBytes;
  p.peak_reserved_bytes = p.device_total_bytes - kGiBBytes / 2;
  p.peak_allocated_bytes = p.peak_reserved_bytes - kGiBBytes;
  p.needed_bytes = p.device_total_bytes + (oom ? 3 * kGiBBytes : 0);
  p.fits = fits;
  p.oom = oom;
  return p;
}

SweepResult OneAxis() {
  SweepResult s;
  s.source = "llama-3-8b";
  s.gpu.name = "h100-80g";
  s.gpu.display_name = "NVIDIA H100 80GB HBM3";
  s.gpu.usable_bytes = 79 * kGiBBytes;
  s.model = ModelSummary{"llama-3-8b", "llama", 8'030'261'248, 8'030'261'248};
  s.knobs = {{"batch", "1"}, {"seq", "1..2048 (3 values)"}};
  s.axes = {{SweepVariable::kSeq, {1, 1024, 2048}}};
  s.points = {Point({1}, 40, true), Point({1024}, 70, true), Point({2048}, 79, false, true)};
  return s;
}

SweepResult TwoAxes() {
  SweepResult s = OneAxis();
  s.axes.push_back({SweepVariable::kBatch, {1, 2}});
  s.points = {Point({1, 1}, 40, true),    Point({1, 2}, 45, true),
              Point({1024, 1}, 60, true), Point({1024, 2}, 75, true),
              Point({2048, 1}, 70, true), Point({2048, 2}, 78, false, true)};
  return s;
}

SweepResult Hostile() {
  SweepResult s = OneAxis();
  s.source = "<script>alert(\"x\")</script> & 'y' http://evil.example/";
  s.gpu.display_name = "GPU <b>bold</b>";
  s.model->name = "evil\x1b[31mred\x1b[0m";
  s.knobs.push_back({"<k>", "</script><script>alert(1)</script>"});
  return s;
}

TEST(SweepRender, SvgAndHtmlAreWellFormedAndOffline) {
  for (const SweepResult& s : {OneAxis(), TwoAxes()}) {
    const std::string svg = RenderSweepSvg(s);
    EXPECT_EQ(CheckXml(svg), "");
    ExpectOffline(svg);
    EXPECT_EQ(Count(svg, "<circle"), s.points.size() + 1) << "a marker per point plus the legend's";
    const std::string html = RenderSweepHtml(s);
    EXPECT_EQ(CheckHtml(html), "");
    ExpectOffline(html);
    EXPECT_NE(html.find("default-src 'none'"), std::string::npos);
  }
}

TEST(SweepRender, HostileNamesAreEscaped) {
  const SweepResult s = Hostile();
  for (const std::string& markup : {RenderSweepSvg(s), RenderSweepHtml(s)}) {
    EXPECT_EQ(Count(markup, "<script"), 0u);
    EXPECT_EQ(Count(markup, "<b>bold"), 0u);
    EXPECT_NE(Count(markup, "&lt;b&gt;bold"), 0u);
    EXPECT_EQ(Count(markup, "\x1b"), 0u);
  }
  EXPECT_EQ(CheckHtml(RenderSweepHtml(s)), "");
  EXPECT_EQ(Count(RenderSweepText(s), "\x1b"), 0u);
  EXPECT_TRUE(nlohmann::json::accept(RenderSweepJson(s)));
}

TEST(SweepRender, OddInputNeverFails) {
  std::vector<SweepResult> odd(5, OneAxis());
  odd[0].points.clear();
  odd[1].axes.clear();
  odd[2].axes = {{SweepVariable::kBatch, {4}}};
  odd[2].points = {Point({4}, 10, true)};
  odd[3].axes.push_back({SweepVariable::kBatch, {}});  // no values on the second axis
  odd[4].points = {Point({}, 10, true), Point({5}, 0, false)};
  for (const SweepResult& s : odd) {
    EXPECT_EQ(CheckXml(RenderSweepSvg(s)), "");
    EXPECT_EQ(CheckHtml(RenderSweepHtml(s)), "");
    EXPECT_FALSE(RenderSweepText(s).empty());
    EXPECT_TRUE(nlohmann::json::accept(RenderSweepJson(s)));
    EXPECT_FALSE(RenderSweepCsv(s).empty());
  }
}

TEST(SweepRender, JsonAndCsvCarryIntegerBytes) {
  const SweepResult s = TwoAxes();
  const auto j = nlohmann::json::parse(RenderSweepJson(s));
  EXPECT_EQ(j["variables"], (nlohmann::json{"seq", "batch"}));
  ASSERT_EQ(j["points"].size(), 6u);
  EXPECT_EQ(j["points"][5]["seq"], 2048);
  EXPECT_EQ(j["points"][5]["batch"], 2);
  EXPECT_EQ(j["points"][5]["device_total_bytes"], 78 * kGiBBytes);
  EXPECT_EQ(j["points"][5]["oom"], true);
  EXPECT_EQ(j["gpu"]["usable_bytes"], 79 * kGiBBytes);
  const std::string csv = RenderSweepCsv(s);
  EXPECT_EQ(csv.substr(0, csv.find('\n')),
            "seq,batch,peak_allocated_bytes,peak_reserved_bytes,device_total_bytes,needed_bytes,"
            "oom,fits");
  EXPECT_EQ(Count(csv, "\n"), 7u);
}

TEST(SweepRender, SummarySaysWhereTheGridStopsFitting) {
  const std::string text = RenderSweepText(OneAxis());
  EXPECT_NE(text.find("Fits up to --seq 1024 in this grid; --seq 2048 needs "), std::string::npos)
      << text;
  EXPECT_NE(text.find("(PyTorch would run out of memory on the way)"), std::string::npos) << text;
  EXPECT_NE(text.find("GiB"), std::string::npos);
  const std::string two = RenderSweepText(TwoAxes());
  EXPECT_NE(two.find("--batch 1: 2048; --batch 2: 1024"), std::string::npos) << two;
}

TEST(SweepRender, Deterministic) {
  EXPECT_EQ(RenderSweepHtml(TwoAxes()), RenderSweepHtml(TwoAxes()));
  EXPECT_EQ(RenderSweepSvg(OneAxis()), RenderSweepSvg(OneAxis()));
}

}  // namespace
}  // namespace vramscope
