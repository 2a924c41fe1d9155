// From bytes to a typed Snapshot: the structure PyTorch writes, the same
// result from every protocol and from JSON, errors that name the field.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "test_support.h"

namespace vramscope {
namespace {

using snapshot_test::DataPath;
using snapshot_test::LoadOrDie;
using snapshot_test::ReadBytes;

using snapshot_test::ExpectSameSnapshot;

TEST(SnapshotReader, TrainingSnapshotStructure) {
  const Snapshot s = LoadOrDie("train_p4.pickle");
  EXPECT_EQ(s.format, "pickle protocol 4");
  ASSERT_EQ(s.device_traces.size(), 1u);
  EXPECT_EQ(s.device_traces[0].size(), 278u);
  EXPECT_FALSE(s.segments.empty());
  // A default stream and one side stream (the gradient bucket).
  ASSERT_EQ(s.streams.size(), 2u);
  EXPECT_EQ(s.streams[0], 0u);
  EXPECT_EQ(s.streams[1], 0x55D0C0FFEE00u);
  // Shared frame lists: far fewer distinct stacks than entries.
  EXPECT_LT(s.stacks.size(), 40u);
  EXPECT_TRUE(s.stacks[0].empty());
  const TraceEntry& first = s.device_traces[0][0];
  EXPECT_EQ(first.action, TraceAction::kSegmentAlloc);
  EXPECT_EQ(s.frames[s.stacks[first.stack][0]].name, "_apply");
  ASSERT_TRUE(s.settings.has_value());
  EXPECT_EQ(s.settings->config.max_split_size_bytes, kUnlimited);  // recorded as -1
  EXPECT_FALSE(s.settings->config.expandable_segments);
  EXPECT_EQ(s.external_annotations, 0u);
  for (const SnapshotSegment& seg : s.segments) {
    uint64_t sum = 0;
    for (const SnapshotBlock& b : seg.blocks) sum += b.size_bytes;
    EXPECT_EQ(sum, seg.total_bytes);
  }
}

TEST(SnapshotReader, EveryProtocolReadsTheSame) {
  const Snapshot p4 = LoadOrDie("train_p4.pickle");
  ExpectSameSnapshot(p4, LoadOrDie("train_p2.pickle"));
  ExpectSameSnapshot(p4, LoadOrDie("train_p5.pickle"));
  EXPECT_EQ(LoadOrDie("train_p2.pickle").format, "pickle protocol 2");
}

TEST(SnapshotReader, JsonReadsLikeItsPickleTwin) {
  const Snapshot json = LoadOrDie("train_1step.json");
  EXPECT_EQ(json.format, "json");
  ExpectSameSnapshot(json, LoadOrDie("train_1step_p4.pickle"));
}

TEST(SnapshotReader, BareSegmentList) {
  const Snapshot s = LoadOrDie("segments_only.pickle");
  EXPECT_TRUE(s.segments_only);
  EXPECT_FALSE(s.segments.empty());
  EXPECT_TRUE(s.device_traces.empty());
}

TEST(SnapshotReader, OlderLayoutsRead) {
  // torch <= 2.0: blocks without "address"/"frames", with "history"; no
  // time_us, no allocator_settings; an unknown action is skipped.
  const std::string json = R"({"segments": [{"device": 0, "address": 4096, "total_size": 2097152,
      "allocated_size": 1024, "active_size": 1024, "stream": 0, "segment_type": "small",
      "blocks": [{"size": 1024, "requested_size": 1000, "state": "active_allocated",
                  "history": [{"addr": 4096, "real_size": 1000,
                               "frames": [{"name": "f", "filename": "a.py", "line": 3}]}]},
                 {"size": 2096128, "state": "inactive"}]}],
    "device_traces": [[{"action": "alloc", "addr": 4096, "size": 1000, "stream": 0},
                       {"action": "user_defined", "addr": 0, "size": 0, "stream": 0}]]})";
  auto s = ParseSnapshot(json, "old");
  ASSERT_TRUE(s.ok()) << s.error().message;
  ASSERT_EQ(s->segments.size(), 1u);
  EXPECT_TRUE(s->segments[0].small_pool);
  EXPECT_EQ(s->segments[0].blocks[1].address, 4096u + 1024u);  // computed as PyTorch writes it
  EXPECT_EQ(s->segments[0].blocks[0].requested_bytes, 1000u);
  EXPECT_EQ(s->frames[s->stacks[s->segments[0].blocks[0].stack][0]].filename, "a.py");
  EXPECT_EQ(s->device_traces[0][1].action, TraceAction::kOther);
  EXPECT_EQ(s->unknown_actions, 1u);
}

TEST(SnapshotReader, AllocatorSettings) {
  const std::string json = R"({"segments": [], "device_traces": [],
    "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:200",
      "max_split_size": 209715200, "garbage_collection_threshold": 0.0,
      "expandable_segments": false, "roundup_power2_divisions": {"1": 0, "2": 4, "4": 0}},
    "external_annotations": [{"device": 0, "time_us": 5}]})";
  auto s = ParseSnapshot(json, "settings");
  ASSERT_TRUE(s.ok()) << s.error().message;
  ASSERT_TRUE(s->settings.has_value());
  EXPECT_EQ(s->settings->conf_text, "max_split_size_mb:200");
  EXPECT_EQ(s->settings->config.max_split_size_bytes, 200 * kMiB);
  EXPECT_EQ(s->settings->config.roundup_power2_divisions[1], 4u);
  EXPECT_EQ(s->external_annotations, 1u);
  EXPECT_EQ(SnapshotAllocatorConfig(*s).max_split_size_bytes, 200 * kMiB);
}

TEST(SnapshotReader, ErrorsNameTheField) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"segments": 5})", "segments: expected a list, got int"},
      {R"({"device_traces": [[{"action": "alloc", "addr": 1, "size": -5}]]})",
       "device_traces[0][0].size: -5 is negative"},
      {R"({"device_traces": [[{"action": "alloc", "size": 5}]]})",
       "device_traces[0][0]: no \"addr\""},
      {R"({"device_traces": [[{"action": "oom", "size": 5}]]})", "no \"device_free\""},
      {R"({"device_traces": [[{"action": "alloc", "addr": "x", "size": 5}]]})",
       "device_traces[0][0].addr: expected an int, got str"},
      {R"({"device_traces": [[{"action": "alloc", "addr": 1, "size": 5, "frames": [{"name": 3}]}]]})",
       "device_traces[0][0].frames: [0].name: expected a str, got int"},
      {R"({"segments": [{"address": 0, "total_size": 10, "blocks": [{"size": 10}]}]})",
       "segments[0].blocks[0]: no \"state\""},
      {R"({"segments": [{"address": 0, "total_size": 10, "segment_type": "huge", "blocks": []}]})",
       "segments[0].segment_type"},
      {R"({"x": 1})", "not a memory snapshot"},
      {R"(7)", "not a memory snapshot"},
      {"", "empty file"},
  };
  for (const auto& [text, expected] : cases) {
    auto s = ParseSnapshot(text, "in.json");
    ASSERT_FALSE(s.ok()) << text;
    EXPECT_NE(s.error().message.find(expected), std::string::npos) << s.error().message;
    EXPECT_EQ(s.error().message.rfind("in.json: ", 0), 0u) << s.error().message;
  }
}

// Consistency (docs/hardening.md): what no allocator state can be is an
// error, never explained with wrapped numbers; one document per file; a
// torch.save checkpoint is named as such.
TEST(SnapshotReader, InconsistentSnapshotsAndTrailingBytesAreErrors) {
  const std::string g62 = std::to_string(uint64_t{1} << 62);
  const std::string block = R"({"size": )" + g62 + R"(, "state": "active_allocated"})";
  const std::pair<std::string, const char*> cases[] = {
      // Four blocks of 2^62 and one of 100 bytes: the sum wraps to 100.
      {R"({"segments": [{"address": 4096, "total_size": 100, "blocks": [)" + block + "," + block +
           "," + block + "," + block + R"(, {"size": 100, "state": "inactive"}]}]})",
       "segments[0].blocks[0]: block at 0x1000"},
      {R"({"segments": [{"address": 0, "total_size": 4096, "blocks": [{"size": 4096, "state": )"
       R"("inactive"}]}, {"address": 2048, "total_size": 4096, "blocks": [{"size": 4096, )"
       R"("state": "inactive"}]}]})",
       "segments[1]: overlaps segments[0]"},
      {R"({"segments": [{"address": 18446744073709547520, "total_size": 8192, "blocks": []}]})",
       "segments[0]: address 0xfffffffffffff000 + total_size 8192 runs past 2^64"},
      {R"({"segments": [{"address": 4096, "total_size": 4096, "blocks": [{"address": 8192, )"
       R"("size": 2048, "state": "inactive"}, {"size": 2048, "state": "inactive"}]}]})",
       "segments[0].blocks[0]: block at 0x2000 of 2048 bytes does not follow"},
      {R"({"segments": [], "device_traces": []})" + std::string("\0garbage", 8),
       "NUL byte at byte 37"},
      {std::string("PK\x03\x04rest of a zip"), "this is a model checkpoint"},
  };
  for (const auto& [text, expected] : cases) {
    auto s = ParseSnapshot(text, "in.json");
    ASSERT_FALSE(s.ok()) << text;
    EXPECT_NE(s.error().message.find(expected), std::string::npos) << s.error().message;
  }
  std::string pickle = ReadBytes(DataPath("train_p4.pickle"));
  auto twice = ParseSnapshot(pickle + pickle, "twice.pickle");
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.error().message.find("after the STOP opcode"), std::string::npos)
      << twice.error().message;
}

TEST(SnapshotReader, TraceSizesThatWouldWrapAreRefusedWhenMeasured) {
  std::string trace;
  for (int i = 0; i < 5; ++i) {
    if (i > 0) trace += ",";
    trace += R"({"action": "alloc", "addr": )" + std::to_string((i + 1) * 4096) + R"(, "size": )" +
             std::to_string(uint64_t{1} << 62) + "}";
  }
  auto s = ParseSnapshot(R"({"segments": [], "device_traces": [[)" + trace + "]]}", "in.json");
  ASSERT_TRUE(s.ok()) << s.error().message;
  auto run = MeasureSnapshot(*s);
  ASSERT_FALSE(run.ok());
  EXPECT_NE(run.error().message.find("sum past 2^64"), std::string::npos) << run.error().message;
  EXPECT_FALSE(SnapshotToEventStream(*s).ok());
}

// Two allocs just under 2^62 bytes: within the 2 x size + 512 bound this
// reader once used, past the replay simulator's 2 x size + 20 MiB. The reader
// must refuse whatever the simulator would (a fuzz_snapshot_reader finding).
TEST(SnapshotReader, AcceptedTracesAlwaysReplay) {
  const uint64_t size = (uint64_t{1} << 62) - 193952;
  std::string trace;
  for (int i = 0; i < 2; ++i) {
    if (i > 0) trace += ",";
    trace += R"({"action": "alloc", "addr": )" + std::to_string((i + 1) * 4096) + R"(, "size": )" +
             std::to_string(size) + "}";
  }
  auto s = ParseSnapshot(R"({"segments": [], "device_traces": [[)" + trace + "]]}", "in.json");
  ASSERT_TRUE(s.ok()) << s.error().message;
  auto run = MeasureSnapshot(*s);
  ASSERT_FALSE(run.ok());
  EXPECT_NE(run.error().message.find("sum past 2^64"), std::string::npos) << run.error().message;
}

TEST(SnapshotReader, FileErrors) {
  auto missing = ReadSnapshotFile("/nonexistent/snap.pickle");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("no such file"), std::string::npos);
  auto dir = ReadSnapshotFile(std::string(VS_SOURCE_DIR) + "/tests");
  ASSERT_FALSE(dir.ok());
  EXPECT_NE(dir.error().message.find("directory"), std::string::npos);
  SnapshotReadLimits tiny;
  tiny.max_file_bytes = 10;
  auto big = ReadSnapshotFile(DataPath("train_p4.pickle"), tiny);
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.error().message.find("max_file_bytes"), std::string::npos);
}

TEST(SnapshotReader, JsonDepthAndGarbage) {
  auto deep = ParseSnapshot(std::string(100000, '[') + std::string(100000, ']'), "deep.json");
  ASSERT_FALSE(deep.ok());
  EXPECT_NE(deep.error().message.find("max_depth"), std::string::npos);
  auto garbage = ParseSnapshot("\x01\x02\x03", "g");
  ASSERT_FALSE(garbage.ok());
  EXPECT_NE(garbage.error().message.find("neither a pickle"), std::string::npos);
}

}  // namespace
}  // namespace vramscope

namespace vramscope {
namespace {

// The fuzz target's invariants (fuzz/fuzz_snapshot_reader.cc) over its seeds
// and the hostile files, in every regular test run: errors are one
// printable line naming the input; what parses measures, and the measured
// breakdown sums to the peak; the replay stream validates.
TEST(SnapshotRobustness, SeedsAndHostileFilesKeepTheFuzzInvariants) {
  namespace fs = std::filesystem;
  size_t files = 0;
  for (const char* dir : {"/fuzz/corpus/snapshot", "/tests/bad_inputs/snapshot"}) {
    for (const auto& entry : fs::directory_iterator(std::string(VS_SOURCE_DIR) + dir)) {
      ++files;
      const std::string bytes = snapshot_test::ReadBytes(entry.path().string());
      auto snap = ParseSnapshot(bytes, "in");
      if (!snap.ok()) {
        const std::string& m = snap.error().message;
        EXPECT_EQ(m.rfind("in: ", 0), 0u) << m;
        for (char c : m) {
          EXPECT_TRUE(c >= 0x20 && c < 0x7f) << entry.path() << ": " << m;
        }
        continue;
      }
      auto run = MeasureSnapshot(*snap);
      if (!run.ok()) continue;
      uint64_t sum = 0;
      for (uint64_t b : run->sim.breakdown_at_peak) sum += b;
      EXPECT_EQ(sum, run->sim.peak_allocated_bytes) << entry.path();
      auto stream = SnapshotToEventStream(*snap, run->device);
      ASSERT_TRUE(stream.ok()) << entry.path();
      EXPECT_TRUE(stream->Validate().ok()) << entry.path();
    }
  }
  EXPECT_GT(files, 40u);
}

}  // namespace
}  // namespace vramscope
