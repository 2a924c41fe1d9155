// The command entry points (explain, replay, compare): their JSON is the
// report's JSON with one key added, byte for byte what adding it to the
// parsed report gives, and their errors name the file.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "test_support.h"

namespace vramscope {
namespace {

using Json = nlohmann::ordered_json;
using snapshot_test::DataPath;

// The reference: parse the report back, add the key, dump it again.
std::string ByReparsing(const std::string& report_json, const std::string& key, const Json& value) {
  Json j = Json::parse(report_json);
  j[key] = value;
  return j.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
}

// A made-up catalog entry (the catalog is a stage of its own).
GpuSpec Gpu() {
  GpuSpec gpu;
  gpu.name = "test-gpu";
  gpu.display_name = "a test GPU";
  gpu.total_bytes = uint64_t{80} << 30;
  gpu.usable_bytes = gpu.total_bytes - (uint64_t{64} << 20);
  gpu.cuda_context_bytes = uint64_t{500} << 20;
  return gpu;
}

TEST(ExplainSnapshotFile, JsonIsTheReportPlusSnapshot) {
  for (const char* name : {"train_p4.pickle", "oom.pickle", "train_1step.json"}) {
    auto measured = ExplainSnapshotFile(DataPath(name), Gpu());
    ASSERT_TRUE(measured.ok()) << measured.error().message;
    const std::string json = RenderExplainJson(*measured);
    const Json parsed = Json::parse(json);
    ASSERT_TRUE(parsed.contains("snapshot")) << name;
    EXPECT_EQ(json, ByReparsing(RenderJson(measured->report), "snapshot", parsed["snapshot"]))
        << name;
    EXPECT_EQ(parsed["snapshot"]["has_frames"], measured->run.has_frames) << name;
  }
}

TEST(ExplainSnapshotFile, ErrorsNameTheFile) {
  const std::string path = DataPath("train_p4.pickle");
  ExplainOptions options;
  options.device = 7;
  auto measured = ExplainSnapshotFile(path, Gpu(), options);
  ASSERT_FALSE(measured.ok());
  EXPECT_EQ(measured.error().message.rfind(path + ": ", 0), 0u) << measured.error().message;
  auto missing = ExplainSnapshotFile(path + ".missing", Gpu());
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find(path + ".missing"), std::string::npos);
}

TEST(ReplaySnapshotFile, JsonIsTheReportPlusReplay) {
  ReplayOptions options;
  options.gpu = Gpu();
  options.alloc_conf = "expandable_segments:True";
  auto replay = ReplaySnapshotFile(DataPath("train_p4.pickle"), options);
  ASSERT_TRUE(replay.ok()) << replay.error().message;
  EXPECT_EQ(replay->alloc_conf, "expandable_segments:True");
  EXPECT_EQ(replay->predicted_peak_reserved_bytes, replay->report.worst().sim.peak_reserved_bytes);
  const std::string json = RenderReplayJson(*replay);
  const Json parsed = Json::parse(json);
  ASSERT_TRUE(parsed.contains("replay"));
  EXPECT_EQ(json, ByReparsing(RenderJson(replay->report), "replay", parsed["replay"]));
  EXPECT_EQ(parsed["replay"]["events"], replay->events);
}

TEST(ReplaySnapshotFile, WithoutSettingsReplaysTheSnapshotsOwn) {
  ReplayOptions options;
  options.gpu = Gpu();
  auto replay = ReplaySnapshotFile(DataPath("train_p4.pickle"), options);
  ASSERT_TRUE(replay.ok()) << replay.error().message;
  EXPECT_EQ(replay->alloc_conf, replay->baseline_alloc_conf);
  EXPECT_EQ(replay->predicted_peak_reserved_bytes, replay->baseline_peak_reserved_bytes);
  EXPECT_EQ(replay->predicted_peak_allocated_bytes, replay->baseline_peak_allocated_bytes);
}

TEST(ReplaySnapshotFile, BadSettingsFailBeforeReading) {
  ReplayOptions options;
  options.alloc_conf = "no_such_key:1";
  auto replay = ReplaySnapshotFile(DataPath("no_such_file.pickle"), options);
  ASSERT_FALSE(replay.ok());
  EXPECT_NE(replay.error().message.find("no_such_key"), std::string::npos)
      << replay.error().message;
}

TEST(CompareMeasured, NotesAMissingStackOnlyWithoutStacks) {
  auto measured = ExplainSnapshotFile(DataPath("train_p4.pickle"), Gpu());
  ASSERT_TRUE(measured.ok()) << measured.error().message;
  measured->run.has_frames = true;
  const size_t with_stacks = CompareMeasured(*measured, measured->report).notes.size();
  measured->run.has_frames = false;
  const size_t without = CompareMeasured(*measured, measured->report).notes.size();
  EXPECT_EQ(without, with_stacks + 1);
}

}  // namespace
}  // namespace vramscope
