#include "vramscope/validate.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "vramscope/estimate.h"
#include "vramscope/model.h"

namespace vramscope {
namespace {

constexpr uint64_t kGiB = 1ull << 30;

// A record shaped as tools/groundtruth writes it (docs/groundtruth.md); only
// the fields validate reads are meaningful here.
nlohmann::json Record(const std::string& status, uint64_t alloc, uint64_t reserved) {
  nlohmann::json r = {
      {"schema_version", 1},
      {"format", "vramscope-groundtruth"},
      {"id", "abc123"},
      {"name", "model=gpt2 seq=128"},
      {"status", status},
      {"reason", nullptr},
      {"knobs",
       {{"model", "gpt2"},
        {"batch", 2},
        {"seq", 128},
        {"precision", "fp32"},
        {"optimizer", "adamw-fused"},
        {"steps", 3}}},
      {"env",
       {{"gpu_present", true},
        {"packages", {{"torch", "2.11.0+cu128"}, {"transformers", "4.57.1"}}},
        {"gpu", {{"name", "NVIDIA H100 80GB HBM3"}}}}},
      {"memory",
       {{"peak_allocated_bytes", alloc},
        {"peak_reserved_bytes", reserved},
        {"peak_device_used_bytes", reserved + kGiB / 2},
        {"cuda_context_bytes", kGiB / 2}}},
  };
  if (status == "oom") r["memory"]["peak_allocated_bytes"] = nullptr;
  return r;
}

TEST(ValidateStats, MedianAndNearestRankPercentile) {
  EXPECT_DOUBLE_EQ(Median({}), 0);
  EXPECT_DOUBLE_EQ(Median({3, 1, 2}), 2);
  EXPECT_DOUBLE_EQ(Median({4, 1, 2, 3}), 2.5);
  // Nearest rank over 10 values: p90 is the 9th smallest.
  EXPECT_DOUBLE_EQ(Percentile({10, 9, 8, 7, 6, 5, 4, 3, 2, 1}, 0.9), 9);
  EXPECT_DOUBLE_EQ(Percentile({5}, 0.9), 5);
  EXPECT_DOUBLE_EQ(RelativeError(105, 100), 0.05);
  EXPECT_DOUBLE_EQ(RelativeError(90, 100), -0.10);
}

TEST(ValidateParse, ReadsKnobsVersionsAndGpu) {
  auto f = ParseGroundTruth(Record("ok", 3 * kGiB, 4 * kGiB).dump() + "\n\n", "r.jsonl");
  ASSERT_TRUE(f.ok()) << f.error().message;
  ASSERT_EQ(f->runs.size(), 1u);
  const MeasuredRun& run = f->runs[0];
  EXPECT_EQ(run.where, "r.jsonl:1");
  EXPECT_EQ(run.model, "gpt2");
  EXPECT_EQ(run.setup.batch, 2u);
  EXPECT_EQ(run.setup.seq, 128u);
  EXPECT_EQ(run.setup.precision, Precision::kFp32);
  EXPECT_EQ(run.setup.optimizer, OptimizerKind::kAdamWFused);
  EXPECT_EQ(run.setup.torch_version, 211);
  EXPECT_EQ(run.setup.transformers_version, 457);
  EXPECT_EQ(run.setup.gpu, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(run.peak_allocated_bytes, 3 * kGiB);
  EXPECT_EQ(run.device_bytes, 4 * kGiB + kGiB / 2);
}

TEST(ValidateParse, SkippedAndErrorRecordsAreListedNotCompared) {
  auto rec = Record("skipped", 0, 0);
  rec["reason"] = "flash-attn not installed";
  auto f = ParseGroundTruth(rec.dump(), "r.jsonl");
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_TRUE(f->runs.empty());
  ASSERT_EQ(f->not_compared.size(), 1u);
  EXPECT_NE(f->not_compared[0].find("flash-attn not installed"), std::string::npos);
}

TEST(ValidateParse, BadRecordsNameLineAndField) {
  struct Case {
    std::function<void(nlohmann::json&)> change;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](auto& r) { r["format"] = "other"; }, "r.jsonl:1: format:"},
      {[](auto& r) { r["schema_version"] = 2; }, "schema_version"},
      {[](auto& r) { r["knobs"]["batch"] = -1; }, "knobs.batch"},
      {[](auto& r) { r["knobs"]["batch"] = 0; }, "knobs.batch"},
      {[](auto& r) { r["knobs"]["precision"] = "fp8"; }, "knobs.precision"},
      {[](auto& r) { r["knobs"]["warp_speed"] = "on"; }, "knobs.warp_speed: unknown knob"},
      {[](auto& r) { r["knobs"].erase("model"); }, "knobs.model: missing"},
      {[](auto& r) { r["memory"]["peak_reserved_bytes"] = 1; }, "smaller than peak_allocated"},
      {[](auto& r) { r["memory"].erase("peak_allocated_bytes"); },
       "memory.peak_allocated_bytes: missing"},
      {[](auto& r) { r["env"].erase("gpu"); }, "env.gpu.name"},
      {[](auto& r) { r["status"] = "great"; }, "status"},
  };
  for (const Case& c : cases) {
    auto rec = Record("ok", 3 * kGiB, 4 * kGiB);
    c.change(rec);
    auto f = ParseGroundTruth(rec.dump(), "r.jsonl");
    ASSERT_FALSE(f.ok()) << c.message;
    EXPECT_NE(f.error().message.find(c.message), std::string::npos) << f.error().message;
  }
  auto f = ParseGroundTruth("{\"format\": ", "r.jsonl");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.error().message, "r.jsonl:1: line: not valid JSON");
}

// Hostile input (docs/hardening.md): limits, and messages that stay one
// printable line whatever the file holds.
TEST(ValidateParse, HostileRecords) {
  auto deep = ParseGroundTruth("\n" + std::string(100000, '['), "r.jsonl");
  ASSERT_FALSE(deep.ok());
  EXPECT_EQ(deep.error().message, "r.jsonl:2: line: JSON nested deeper than 64 levels");

  // Issue 24: a NUL after a record, and a line over 1 MiB, before parsing.
  const std::string ok = Record("ok", 3 * kGiB, 4 * kGiB).dump();
  auto nul = ParseGroundTruth(ok + std::string("\0garbage", 8), "r.jsonl");
  ASSERT_FALSE(nul.ok());
  EXPECT_NE(nul.error().message.find("r.jsonl:1: line: NUL byte at byte"), std::string::npos)
      << nul.error().message;
  auto long_line = ParseGroundTruth(ok + "\n" + std::string((1 << 20) + 1, ' ') + "x", "r.jsonl");
  ASSERT_FALSE(long_line.ok());
  EXPECT_NE(long_line.error().message.find("r.jsonl:2: line: 1048578 bytes is above the limit"),
            std::string::npos)
      << long_line.error().message;
  auto thresholds = ParseThresholds(R"({"peak_allocated": {}})" + std::string("\0x", 2), "t.json");
  ASSERT_FALSE(thresholds.ok());
  EXPECT_NE(thresholds.error().message.find("t.json: file: NUL byte"), std::string::npos);

  auto rec = Record("ok", 3 * kGiB, 4 * kGiB);
  rec["knobs"]["evil\x1b[2J\n" + std::string(500, 'k')] = "x";
  auto key = ParseGroundTruth(rec.dump(), "r.jsonl");
  ASSERT_FALSE(key.ok());
  const std::string& m = key.error().message;
  EXPECT_EQ(m.rfind("r.jsonl:1: knobs.evil\\x1b[2J\\x0akkk", 0), 0u) << m;
  EXPECT_NE(m.find("...: unknown knob"), std::string::npos) << m;
  EXPECT_LT(m.size(), 200u) << m;

  // Versions whose numbers overflow an int fall back to the default (sscanf's
  // %d would be undefined behaviour here).
  rec = Record("ok", 3 * kGiB, 4 * kGiB);
  rec["env"]["packages"]["torch"] = "99999999999999999999.1";
  rec["env"]["packages"]["transformers"] = "4.99999999999999999999";
  auto versions = ParseGroundTruth(rec.dump(), "r.jsonl");
  ASSERT_TRUE(versions.ok()) << versions.error().message;
  EXPECT_EQ(versions->runs[0].setup.torch_version, TrainingSetup{}.torch_version);
  EXPECT_EQ(versions->runs[0].setup.transformers_version, TrainingSetup{}.transformers_version);

  std::string many;
  auto skipped = Record("skipped", 0, 0).dump() + "\n";
  for (int i = 0; i < 100001; ++i) many += skipped;
  auto too_many = ParseGroundTruth(many, "r.jsonl");
  ASSERT_FALSE(too_many.ok());
  EXPECT_EQ(too_many.error().message, "r.jsonl:100001: file: more than 100000 records");
}

// The prediction of a record's knobs, computed here through Estimate() so the
// test can check validate's arithmetic around it.
uint64_t PredictedAllocated(const MeasuredRun& run) {
  auto model = ResolveModel(run.model, ModelIo{});
  EXPECT_TRUE(model.ok());
  auto est = Estimate(*model, run.setup, {});
  EXPECT_TRUE(est.ok());
  return est->report.worst().sim.peak_allocated_bytes;
}

TEST(Validate, ErrorsAreRelativeToTheMeasurement) {
  auto f = ParseGroundTruth(Record("ok", 3 * kGiB, 4 * kGiB).dump(), "r.jsonl");
  ASSERT_TRUE(f.ok());
  const uint64_t predicted = PredictedAllocated(f->runs[0]);
  // Measure "exactly 10% above the prediction".
  const uint64_t measured = predicted + predicted / 10;
  auto rec = Record("ok", measured, measured * 2);
  f = ParseGroundTruth(rec.dump() + "\n" + rec.dump(), "r.jsonl");
  ASSERT_TRUE(f.ok());
  std::vector<MeasuredFile> files;
  files.push_back(*f);
  Validation v = Validate(std::move(files), ModelIo{}).value();
  ASSERT_EQ(v.rows.size(), 2u);
  EXPECT_TRUE(v.rows[0].estimated) << v.rows[0].problem;
  EXPECT_EQ(v.rows[0].predicted_allocated_bytes, predicted);
  EXPECT_EQ(v.allocated.count, 2u);
  EXPECT_NEAR(v.allocated.median_abs, 1.0 / 11.0, 1e-6);  // 1 - 1/1.1
  EXPECT_EQ(v.allocated.under_2pct, 2u);
  EXPECT_NEAR(v.allocated.worst_under, 1.0 / 11.0, 1e-6);

  Thresholds t;
  t.allocated_median_abs = 0.03;
  t.allocated_max_under = 0.05;
  auto failures = CheckThresholds(v, t);
  ASSERT_EQ(failures.size(), 2u);
  EXPECT_NE(failures[0].find("median |error| 9.09% > 3.00%"), std::string::npos) << failures[0];
  t = {};
  t.allocated_median_abs = 0.10;
  EXPECT_TRUE(CheckThresholds(v, t).empty());
}

// A known gap leaves the gate's statistics (not the table's), and the gate
// fails once the gap no longer misses.
TEST(ValidateThresholds, KnownGapsLeaveTheGateOnly) {
  auto probe = ParseGroundTruth(Record("ok", 3 * kGiB, 4 * kGiB).dump(), "r.jsonl");
  ASSERT_TRUE(probe.ok());
  const uint64_t predicted = PredictedAllocated(probe->runs[0]);
  auto exact = Record("ok", predicted, 4 * kGiB);
  exact["id"] = "00000000000a";
  auto miss = Record("ok", predicted + predicted / 10, 4 * kGiB);
  miss["id"] = "00000000000b";
  auto f = ParseGroundTruth(exact.dump() + "\n" + miss.dump(), "r.jsonl");
  ASSERT_TRUE(f.ok()) << f.error().message;
  std::vector<MeasuredFile> files = {*f};
  const Validation v = Validate(std::move(files), ModelIo{}).value();
  EXPECT_EQ(v.allocated.count, 2u);  // the summary keeps both
  Thresholds t;
  t.allocated_max_abs = 0.02;
  ASSERT_EQ(CheckThresholds(v, t).size(), 1u);
  t.known_gaps = {{"00000000000b", "why"}};
  EXPECT_TRUE(CheckThresholds(v, t).empty());
  t.known_gaps = {{"00000000000a", "fixed since"}, {"00000000000b", "why"}};
  auto stale = CheckThresholds(v, t);
  ASSERT_EQ(stale.size(), 1u);
  EXPECT_NE(stale[0].find("known gap 00000000000a is within every limit now"), std::string::npos);
  // A gap naming none of these records is no failure (other measurements).
  t.known_gaps = {{"00000000000b", "why"}, {"0000000000ff", "elsewhere"}};
  EXPECT_TRUE(CheckThresholds(v, t).empty());

  auto parsed = ParseThresholds(R"({"known_gaps": {"00000000000b": "a reason"}})", "t.json");
  ASSERT_TRUE(parsed.ok()) << parsed.error().message;
  ASSERT_EQ(parsed->known_gaps.size(), 1u);
  EXPECT_EQ(parsed->known_gaps[0].second, "a reason");
  EXPECT_FALSE(ParseThresholds(R"({"known_gaps": {"B": "x"}})", "t.json").ok());
  EXPECT_FALSE(ParseThresholds(R"({"known_gaps": {"00000000000b": ""}})", "t.json").ok());
  EXPECT_FALSE(ParseThresholds(R"({"known_gaps": ["00000000000b"]})", "t.json").ok());
}

TEST(Validate, MeasuredOomIsComparedWithTheFitVerdict) {
  auto rec = Record("oom", 0, 0);
  rec["reason"] = "CUDA out of memory";
  rec["knobs"]["model"] = "llama-3-8b";
  rec["knobs"]["batch"] = 64;
  rec["knobs"]["seq"] = 8192;
  auto f = ParseGroundTruth(rec.dump(), "r.jsonl");
  ASSERT_TRUE(f.ok()) << f.error().message;
  std::vector<MeasuredFile> files = {*f};
  Validation v = Validate(std::move(files), ModelIo{}).value();
  EXPECT_EQ(v.oom_runs, 1u);
  EXPECT_EQ(v.oom_predicted, 1u);
  EXPECT_EQ(v.allocated.count, 0u);
}

TEST(Validate, UnknownModelIsAGateFailure) {
  auto rec = Record("ok", 3 * kGiB, 4 * kGiB);
  rec["knobs"]["model"] = "no-such-model-anywhere.json";
  auto f = ParseGroundTruth(rec.dump(), "r.jsonl");
  ASSERT_TRUE(f.ok());
  std::vector<MeasuredFile> files = {*f};
  Validation v = Validate(std::move(files), ModelIo{}).value();
  ASSERT_EQ(v.rows.size(), 1u);
  EXPECT_FALSE(v.rows[0].estimated);
  EXPECT_EQ(CheckThresholds(v, Thresholds{}).size(), 1u);
}

TEST(ValidateThresholds, ParseAndRejectUnknownKeys) {
  auto t = ParseThresholds(R"({"peak_allocated": {"median_abs_error": 0.03, "max_abs_error": 0.1,
                                "max_under_estimate": 0.05},
                               "peak_reserved": {"median_abs_error": 0.06}, "comment": "x"})",
                           "t.json");
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_DOUBLE_EQ(*t->allocated_max_abs, 0.1);
  EXPECT_DOUBLE_EQ(*t->reserved_median_abs, 0.06);
  EXPECT_FALSE(t->reserved_max_abs.has_value());
  auto bad = ParseThresholds(R"({"peak_allocated": {"median": 0.03}})", "t.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("t.json: peak_allocated.median: unknown limit"),
            std::string::npos);
  EXPECT_FALSE(ParseThresholds("[]", "t.json").ok());
  EXPECT_FALSE(ParseThresholds(R"({"peak_allocated": {"median_abs_error": -1}})", "t.json").ok());
}

TEST(ValidateThresholds, HostileInput) {
  auto deep = ParseThresholds(std::string(100000, '{'), "t.json");
  ASSERT_FALSE(deep.ok());
  EXPECT_EQ(deep.error().message, "t.json: file: JSON nested deeper than 64 levels");
  auto key = ParseThresholds(R"({"peak\u001b[2J\n": {}})", "t.json");
  ASSERT_FALSE(key.ok());
  EXPECT_EQ(key.error().message, "t.json: peak\\x1b[2J\\x0a: unknown key");
}

}  // namespace
}  // namespace vramscope
