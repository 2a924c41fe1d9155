// RenderJson and ReportToJson: every key of the interface contract with its type, the extras
// of docs/json-schema.md, exact 64-bit integers, and no throw on bad text.
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "report_fixtures.h"
#include "vramscope/report.h"

namespace vramscope {
namespace {

using nlohmann::json;

void ExpectBytes(const json& j, const char* key) {
  ASSERT_TRUE(j.contains(key)) << key;
  EXPECT_TRUE(j[key].is_number_unsigned()) << key << " = " << j[key].dump();
}

void ExpectBreakdown(const json& b) {
  ASSERT_TRUE(b.is_object());
  EXPECT_EQ(b.size(), 9u);
  for (const char* key : {"parameters", "gradients", "optimizer_state", "activations", "loss",
                          "temporaries", "communication", "workspace", "other"}) {
    ExpectBytes(b, key);
  }
}

void ExpectPhases(const json& phases) {
  ASSERT_TRUE(phases.is_array());
  for (const json& p : phases) {
    EXPECT_TRUE(p["step"].is_number_unsigned());
    const std::string phase = p["phase"].get<std::string>();
    EXPECT_TRUE(phase == "setup" || phase == "forward" || phase == "backward" ||
                phase == "optimizer")
        << phase;
    ExpectBytes(p, "peak_allocated_bytes");
    ExpectBytes(p, "peak_reserved_bytes");
    ExpectBytes(p, "allocated_at_end_bytes");
  }
}

// The fields a rank class has at the top level and in "ranks".
void ExpectRankFields(const json& r) {
  for (const char* key : {"peak_allocated_bytes", "peak_reserved_bytes", "device_total_bytes",
                          "host_peak_bytes", "fragmentation_at_peak_bytes", "live_at_peak_count"}) {
    ExpectBytes(r, key);
  }
  EXPECT_TRUE(r["fits"].is_boolean());
  ExpectBreakdown(r["breakdown_at_peak"]);
  ExpectPhases(r["phases"]);
  EXPECT_TRUE(r["headroom_bytes"].is_number_integer());
  EXPECT_TRUE(r["peak"]["step"].is_number_unsigned());
  EXPECT_TRUE(r["peak"]["phase"].is_string());
  ExpectBytes(r["peak"], "event_index");
  ExpectBytes(r["peak"], "reserved_bytes");
  for (const char* key : {"reserved_bytes", "cuda_context_bytes", "nccl_bytes", "other_bytes"}) {
    ExpectBytes(r["device_view"], key);
  }
  ASSERT_TRUE(r["top_allocations"].is_array());
  for (const json& a : r["top_allocations"]) {
    ExpectBytes(a, "block_bytes");
    ExpectBytes(a, "requested_bytes");
    for (const char* key : {"category", "op", "module", "phase"})
      EXPECT_TRUE(a[key].is_string()) << key;
    EXPECT_TRUE(a["step"].is_number_unsigned());
  }
  if (!r["oom"].is_null()) {
    const json& oom = r["oom"];
    for (const char* key : {"requested_bytes", "alloc_size_bytes", "event_index", "allocated_bytes",
                            "reserved_bytes", "device_limit_bytes", "free_device_bytes"}) {
      ExpectBytes(oom, key);
    }
    EXPECT_TRUE(oom["message"].is_string());
    EXPECT_TRUE(oom["step"].is_number_unsigned());
    EXPECT_TRUE(oom["phase"].is_string());
  }
}

uint64_t Sum(const json& breakdown) {
  uint64_t sum = 0;
  for (const auto& [key, value] : breakdown.items()) sum += value.get<uint64_t>();
  return sum;
}

TEST(JsonTest, ContractKeysAndTypes) {
  for (const auto& [name, report] : testing::GoldenFixtures()) {
    SCOPED_TRACE(name);
    const json j = json::parse(RenderJson(report));
    EXPECT_EQ(j["schema_version"], kReportSchemaVersion);
    EXPECT_TRUE(j["command"].is_string());
    EXPECT_TRUE(j["source"].is_string());
    ExpectRankFields(j);
    EXPECT_TRUE(j["gpu"]["name"].is_string());
    ExpectBytes(j["gpu"], "usable_bytes");
    ASSERT_TRUE(j["model"].is_object());
    EXPECT_TRUE(j["model"]["name"].is_string());
    EXPECT_TRUE(j["model"]["architecture"].is_string());
    EXPECT_TRUE(j["model"]["parameters"].is_number_unsigned());
    EXPECT_TRUE(j["model"]["trainable_parameters"].is_number_unsigned());
    ASSERT_TRUE(j["ranks"].is_array());
    ASSERT_EQ(j["ranks"].size(), report.ranks.size());
    for (const json& r : j["ranks"]) {
      EXPECT_TRUE(r["rank_class"].is_string());
      EXPECT_TRUE(r["ranks"].is_array());
      ExpectRankFields(r);
    }
    ExpectBytes(j, "needed_bytes");
    EXPECT_TRUE(j["worst_rank_class"].is_string());
    EXPECT_TRUE(j["knobs"].is_object());
    EXPECT_TRUE(j["explanation"].is_array());
    EXPECT_TRUE(j["notes"].is_array());
    EXPECT_EQ(j["fits"].get<bool>(), report.fits());
    EXPECT_EQ(j["headroom_bytes"].get<int64_t>(), report.headroom_bytes());
  }
}

TEST(JsonTest, BreakdownSumsToPeakAllocated) {
  for (const auto& [name, report] : testing::GoldenFixtures()) {
    SCOPED_TRACE(name);
    const json j = json::parse(RenderJson(report));
    EXPECT_EQ(Sum(j["breakdown_at_peak"]), j["peak_allocated_bytes"].get<uint64_t>());
    for (const json& r : j["ranks"]) {
      EXPECT_EQ(Sum(r["breakdown_at_peak"]), r["peak_allocated_bytes"].get<uint64_t>());
    }
  }
}

TEST(JsonTest, TopLevelIsTheWorstRankClass) {
  const json j = json::parse(RenderJson(testing::TwoRankReport()));
  EXPECT_EQ(j["worst_rank_class"], "last stage");
  EXPECT_EQ(j["peak_allocated_bytes"], j["ranks"][1]["peak_allocated_bytes"]);
  EXPECT_EQ(j["device_total_bytes"], j["ranks"][1]["device_total_bytes"]);
  EXPECT_EQ(j["breakdown_at_peak"], j["ranks"][1]["breakdown_at_peak"]);
  EXPECT_EQ(j["ranks"][0]["ranks"], json::array({0, 1, 2, 3}));
  EXPECT_EQ(j["host_peak_bytes"], 0u);
  EXPECT_EQ(j["ranks"][0]["host_peak_bytes"], 3 * kGiB);
}

TEST(JsonTest, OomAndNegativeHeadroom) {
  const json j = json::parse(RenderJson(testing::OomReport()));
  EXPECT_FALSE(j["fits"].get<bool>());
  EXPECT_LT(j["headroom_bytes"].get<int64_t>(), 0);
  EXPECT_EQ(j["oom"]["alloc_size_bytes"], 4'202'692'608u);
  EXPECT_EQ(j["oom"]["phase"], "forward");
  EXPECT_EQ(j["peak"]["phase"], "forward");
  // needed = allocated at the failure + the failed block + the CUDA context
  EXPECT_EQ(j["needed_bytes"].get<uint64_t>(),
            21 * kGiB + 560 * kMiB + 4'202'692'608u + 512 * kMiB);
}

TEST(JsonTest, BytesUpTo2To62AreExact) {
  constexpr uint64_t kBig = uint64_t{1} << 62;
  Report report = testing::SmallFitReport();
  SimResult& sim = report.ranks[0].sim;
  sim.peak_allocated_bytes = kBig - 1;
  sim.peak_reserved_bytes = kBig;
  sim.breakdown_at_peak = {};
  sim.breakdown_at_peak[static_cast<size_t>(Category::kActivations)] = kBig - 1;
  sim.phases[0].peak_reserved_bytes = kBig - 3;
  report.ranks[0].extras = {kBig, kBig, kBig};
  report.ranks[0].device_total_bytes = 0;  // computed: saturates
  report.ranks[0].host_peak_bytes = kBig + 7;
  const json j = json::parse(RenderJson(report));
  EXPECT_EQ(j["peak_allocated_bytes"].get<uint64_t>(), kBig - 1);
  EXPECT_EQ(j["peak_reserved_bytes"].get<uint64_t>(), kBig);
  EXPECT_EQ(j["breakdown_at_peak"]["activations"].get<uint64_t>(), kBig - 1);
  EXPECT_EQ(j["phases"][0]["peak_reserved_bytes"].get<uint64_t>(), kBig - 3);
  EXPECT_EQ(j["host_peak_bytes"].get<uint64_t>(), kBig + 7);
  EXPECT_EQ(j["device_total_bytes"].get<uint64_t>(), UINT64_MAX);
  EXPECT_EQ(j["headroom_bytes"].get<int64_t>(), INT64_MIN);
  EXPECT_FALSE(j["fits"].get<bool>());
  EXPECT_NE(RenderJson(report).find("4611686018427387903"), std::string::npos);
}

TEST(JsonTest, ModelIsNullWhenAbsent) {
  Report report = testing::SmallFitReport();
  report.model.reset();
  EXPECT_TRUE(json::parse(RenderJson(report))["model"].is_null());
}

TEST(JsonTest, InvalidUtf8IsReplacedNotThrown) {
  Report report = testing::OomReport();
  report.source = "bad \xff\xfe source";
  report.ranks[0].sim.top_at_peak[0].op = "\xc3\x28";
  report.knobs.push_back({"k\xff", "v\x80"});
  std::string text;
  EXPECT_NO_THROW(text = RenderJson(report));
  const json j = json::parse(text);
  EXPECT_EQ(j["source"], "bad \xEF\xBF\xBD\xEF\xBF\xBD source");
}

TEST(JsonTest, NegativeIndentIsOneLine) {
  const std::string text = RenderJson(testing::SmallFitReport(), -1);
  EXPECT_EQ(text.find('\n'), text.size() - 1);
  EXPECT_TRUE(json::accept(text));
}

TEST(JsonTest, EmptyReportStillParses) {
  const json j = json::parse(RenderJson(Report{}));
  EXPECT_FALSE(j["fits"].get<bool>());
  EXPECT_TRUE(j["ranks"].empty());
  EXPECT_EQ(j["peak_allocated_bytes"], 0u);
}

// Commands that embed a report in their own JSON (fit, explain, replay) used
// to print it and parse it back; the object embedded directly must print the
// same, byte for byte, invalid UTF-8 and control characters included.
TEST(JsonTest, ReportToJsonEmbedsAsThePrintedReportParsedBack) {
  std::vector<Report> reports;
  for (auto& [stem, report] : testing::GoldenFixtures()) reports.push_back(report);
  Report bad = testing::OomReport();
  bad.source = "bad \xff\xfe source \x1b[31m";
  bad.ranks[0].sim.top_at_peak[0].op = "\xc3\x28";
  bad.knobs.push_back({"k\xff", "v\x80"});
  reports.push_back(bad);
  reports.push_back(Report{});
  using Ordered = nlohmann::ordered_json;
  for (const Report& report : reports) {
    Ordered direct, parsed;
    direct["estimate"] = ReportToJson(report);
    parsed["estimate"] = Ordered::parse(RenderJson(report, -1));
    EXPECT_EQ(direct.dump(2, ' ', false, Ordered::error_handler_t::replace),
              parsed.dump(2, ' ', false, Ordered::error_handler_t::replace))
        << report.source;
  }
}

}  // namespace
}  // namespace vramscope
