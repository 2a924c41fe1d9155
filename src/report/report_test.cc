// The Report verdict, the shared helpers, RenderText and RenderTimelineCsv.
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "chart_scale.h"
#include "report_fixtures.h"
#include "report_format.h"
#include "vramscope/report.h"

namespace vramscope {
namespace {

using namespace report_internal;

TEST(ReportTest, FormatBytes) {
  // The unit that fits the number (issue 18: no "0.00 GiB" for small models).
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
  EXPECT_EQ(FormatBytes(1536), "1.50 KiB");
  EXPECT_EQ(FormatBytes(5 * kMiB), "5.00 MiB");
  EXPECT_EQ(FormatBytes(kGiB - kMiB), "1023.00 MiB");
  EXPECT_EQ(FormatBytes(kGiB), "1.00 GiB");
  EXPECT_EQ(FormatBytes(kGiB + kGiB / 2), "1.50 GiB");
  EXPECT_EQ(FormatBytes(12 * kGiB + 348 * kMiB), "12.34 GiB");
  EXPECT_EQ(FormatBytes(uint64_t{1} << 62), "4294967296.00 GiB");
}

TEST(ReportTest, DeviceTotalAddsExtrasAndSaturates) {
  SimResult sim;
  sim.peak_reserved_bytes = 10 * kGiB;
  EXPECT_EQ(DeviceTotalBytes(sim, {kGiB, 2 * kGiB, 3 * kGiB}), 16 * kGiB);
  sim.peak_reserved_bytes = UINT64_MAX - 1;
  EXPECT_EQ(DeviceTotalBytes(sim, {2, 0, 0}), UINT64_MAX);
  RankReport rank;
  rank.sim.peak_reserved_bytes = kGiB;
  rank.extras.cuda_context_bytes = kGiB;
  EXPECT_EQ(DeviceTotalBytes(rank), 2 * kGiB) << "computed when the field is unset";
  rank.device_total_bytes = 5 * kGiB;
  EXPECT_EQ(DeviceTotalBytes(rank), 5 * kGiB) << "the field when set";
}

TEST(ReportTest, VerdictOfTheFixtures) {
  const Report fit = testing::SmallFitReport();
  EXPECT_TRUE(fit.fits());
  EXPECT_EQ(fit.needed_bytes(), 11 * kGiB + 512 * kMiB);
  EXPECT_EQ(fit.headroom_bytes(), static_cast<int64_t>(68 * kGiB));
  EXPECT_EQ(VerdictLine(fit), "FITS on NVIDIA H100 80GB HBM3 with 68.00 GiB to spare");

  const Report oom = testing::OomReport();
  EXPECT_FALSE(oom.fits()) << "an OOM never fits, whatever the totals say";
  EXPECT_LT(DeviceTotalBytes(oom.worst()), oom.gpu.usable_bytes);
  EXPECT_LT(oom.headroom_bytes(), 0);
  EXPECT_EQ(VerdictLine(oom),
            "DOES NOT FIT: out of memory in step 1, forward; needs at least 25.96 GiB, the GPU "
            "has 23.25 GiB usable");

  const Report two = testing::TwoRankReport();
  EXPECT_EQ(two.worst().rank_class, "last stage");
  EXPECT_TRUE(two.fits());

  Report tight = testing::SmallFitReport();
  tight.gpu.usable_bytes = 10 * kGiB;
  EXPECT_FALSE(tight.fits());
  EXPECT_EQ(tight.headroom_bytes(), -static_cast<int64_t>(kGiB + 512 * kMiB));
  EXPECT_EQ(VerdictLine(tight), "DOES NOT FIT: needs 11.50 GiB, the GPU has 10.00 GiB usable");
}

TEST(ReportTest, EmptyReport) {
  const Report empty;
  EXPECT_EQ(empty.worst().sim.peak_allocated_bytes, 0u);
  EXPECT_FALSE(empty.fits());
  EXPECT_EQ(empty.needed_bytes(), 0u);
  EXPECT_NE(RenderText(empty).find("NO RESULT"), std::string::npos);
  EXPECT_EQ(RenderTimelineCsv(empty).find('\n'), RenderTimelineCsv(empty).size() - 1);
}

// "Assumed": names pad to one column; one as wide as it still gets a space.
TEST(ReportTest, AssumedRowsKeepASpaceAfterALongName) {
  Report r;
  r.assumptions = {{"loss", "the model's own", "--loss"},
                   {"text encoders", "frozen on the GPU", "--text-encoder"}};
  const std::string text = RenderText(r);
  EXPECT_NE(text.find("  loss       the model's own [--loss]"), std::string::npos) << text;
  EXPECT_NE(text.find("  text encoders frozen on the GPU [--text-encoder]"), std::string::npos)
      << text;
}

TEST(ReportTest, WorstPrefersTheFirstOfEquals) {
  Report report = testing::TwoRankReport();
  report.ranks[0].device_total_bytes = report.ranks[1].device_total_bytes;
  EXPECT_EQ(report.worst().rank_class, "first stage");
}

TEST(FormatTest, Numbers) {
  EXPECT_EQ(GroupThousands(0), "0");
  EXPECT_EQ(GroupThousands(999), "999");
  EXPECT_EQ(GroupThousands(1000), "1,000");
  EXPECT_EQ(GroupThousands(8030261248), "8,030,261,248");
  EXPECT_EQ(FormatPercent(1, 3), "33.3%");
  EXPECT_EQ(FormatPercent(1, 0), "-");
  EXPECT_EQ(FormatRanks({}), "-");
  EXPECT_EQ(FormatRanks({0, 1, 2, 3, 8, 10, 11}), "0-3, 8, 10-11");
  EXPECT_EQ(SignedDifference(5, 7), -2);
  EXPECT_EQ(SignedDifference(UINT64_MAX, 0), INT64_MAX);
  EXPECT_EQ(SignedDifference(0, UINT64_MAX), INT64_MIN);
}

TEST(FormatTest, SanitizeText) {
  EXPECT_EQ(SanitizeText("plain"), "plain");
  EXPECT_EQ(SanitizeText("a\x1b[31mb\n\t"), "a?[31mb??");
  EXPECT_EQ(SanitizeText("caf\xc3\xa9 \xe2\x86\x92 \xf0\x9f\x98\x80"),
            "caf\xc3\xa9 \xe2\x86\x92 \xf0\x9f\x98\x80");
  EXPECT_EQ(SanitizeText("\xff"), "\xEF\xBF\xBD");
  EXPECT_EQ(SanitizeText("\xc3"), "\xEF\xBF\xBD") << "truncated sequence";
  EXPECT_EQ(SanitizeText("\xc0\xaf"), "\xEF\xBF\xBD\xEF\xBF\xBD") << "overlong";
  EXPECT_EQ(SanitizeText("\xed\xa0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD") << "surrogate";
  EXPECT_EQ(SanitizeText("\xc2\x9b"), "?") << "C1 control (CSI)";
  EXPECT_EQ(SanitizeText(std::string("a\0b", 3)), "a?b");
  EXPECT_EQ(EscapeMarkup("<a href='x'>&\"</a>"), "&lt;a href=&#39;x&#39;&gt;&amp;&quot;&lt;/a&gt;");
  EXPECT_EQ(ClipText("abcdefghij", 6), "abc...");
  EXPECT_EQ(ClipText("abc", 6), "abc");
  EXPECT_EQ(ClipText("\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9", 4), "\xc3\xa9...");
  EXPECT_EQ(DisplayWidth("\xc3\xa9t\xc3\xa9"), 3u);
}

TEST(ChartScaleTest, ValueTicks) {
  const LinearTicks t = ValueTicks(11.5, 5);
  EXPECT_DOUBLE_EQ(t.step, 2.5);
  EXPECT_DOUBLE_EQ(t.top, 12.5);
  EXPECT_EQ(t.decimals, 1);
  EXPECT_EQ(t.values.size(), 6u);
  const LinearTicks tiny = ValueTicks(0.003, 5);
  EXPECT_GE(tiny.top, 0.003);
  EXPECT_EQ(tiny.decimals, 3);
  const LinearTicks zero = ValueTicks(0, 5);
  EXPECT_GE(zero.top, 1.0);
  for (double max : {1e-6, 0.7, 1.0, 3.0, 79.1, 1e9}) {
    const LinearTicks s = ValueTicks(max, 5);
    EXPECT_GE(s.top, max);
    EXPECT_LE(s.values.size(), 12u);
    EXPECT_GE(s.values.size(), 3u);
  }
}

TEST(ChartScaleTest, IndexTicks) {
  EXPECT_EQ(IndexTicks(0, 241, 6), (std::vector<uint64_t>{0, 50, 100, 150, 200}));
  EXPECT_EQ(IndexTicks(0, 1, 6), (std::vector<uint64_t>{0, 1}));
  EXPECT_EQ(IndexTicks(7, 7, 6), (std::vector<uint64_t>{7}));
  EXPECT_LE(IndexTicks(0, UINT64_MAX / 2, 6).size(), 12u);
  const auto top = IndexTicks(UINT64_MAX - 1000, UINT64_MAX, 6);
  ASSERT_FALSE(top.empty());
  for (uint64_t t : top) EXPECT_GE(t, UINT64_MAX - 1000);
  EXPECT_EQ(IndexTicks(3, 1, 6).size(), 0u);
}

TEST(TextTest, SingleRankSections) {
  const std::string text = RenderText(testing::SmallFitReport());
  for (const char* part :
       {"vramscope estimate: tiny-mlp", "FITS on NVIDIA H100 80GB HBM3 with 68.00 GiB to spare",
        "torch.cuda.max_memory_allocated()", "torch.cuda.max_memory_reserved()", "nvidia-smi",
        "peaks in step 2, backward (event 200)", "Breakdown at the peak", "Peak per step and phase",
        "Largest allocations alive at the peak (5 of 42 live)", "Why\n", "Notes\n"}) {
    EXPECT_NE(text.find(part), std::string::npos) << part;
  }
  EXPECT_EQ(text.find("Rank class"), std::string::npos);
  EXPECT_EQ(text.find("Out of memory"), std::string::npos);
}

TEST(TextTest, OomAndRankClasses) {
  const std::string oom = RenderText(testing::OomReport());
  EXPECT_NE(oom.find("Out of memory"), std::string::npos);
  EXPECT_NE(oom.find("CUDA out of memory. Tried to allocate 3.91 GiB."), std::string::npos);
  const std::string two = RenderText(testing::TwoRankReport());
  EXPECT_NE(two.find("worst rank class: \"last stage\" (ranks 4-7)"), std::string::npos);
  EXPECT_NE(two.find("== Rank class \"first stage\" (ranks 0-3) =="), std::string::npos);
  EXPECT_NE(two.find("host memory"), std::string::npos);
}

TEST(TextTest, HostileTextCannotReachTheTerminal) {
  Report report = testing::OomReport();
  report.source = "x\x1b]0;title\x07";
  report.ranks[0].sim.top_at_peak[0].module = "m\r\n\x1b[2J";
  report.ranks[0].sim.oom->message = "a\x1b[31m\nb";
  const std::string text = RenderText(report);
  EXPECT_EQ(text.find('\x1b'), std::string::npos);
  EXPECT_EQ(text.find('\r'), std::string::npos);
  EXPECT_EQ(text.find('\x07'), std::string::npos);
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

TEST(CsvTest, OneRankClass) {
  const Report report = testing::SmallFitReport();
  const auto lines = Lines(RenderTimelineCsv(report));
  ASSERT_EQ(lines.size(), 1 + report.ranks[0].sim.timeline.size());
  EXPECT_EQ(lines[0],
            "event_index,step,phase,allocated_bytes,reserved_bytes,parameters,gradients,"
            "optimizer_state,activations,loss,temporaries,communication,workspace,other");
  EXPECT_EQ(lines[1], "0,0,setup,2147483648,2147483648,2147483648,0,0,0,0,0,0,0,0");
}

TEST(CsvTest, SeveralRankClassesGetAColumn) {
  Report report = testing::TwoRankReport();
  report.ranks[1].rank_class = "last, \"stage\"";
  const auto lines = Lines(RenderTimelineCsv(report));
  EXPECT_EQ(lines[0].rfind("rank_class,event_index,", 0), 0u);
  EXPECT_EQ(lines.size(),
            1 + report.ranks[0].sim.timeline.size() + report.ranks[1].sim.timeline.size());
  EXPECT_EQ(lines[1].rfind("first stage,0,0,setup,", 0), 0u);
  EXPECT_EQ(lines.back().rfind("\"last, \"\"stage\"\"\",130,1,optimizer,", 0), 0u);
}

}  // namespace
}  // namespace vramscope
