// The structure of every torch generation reads (docs/snapshot.md,
// "Structure by release"); trace entries decoded while reading equal the
// general path's; a file read through the memory-mapped window equals the
// same bytes parsed in memory; non-regular files are refused at once.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "test_support.h"

namespace vramscope {
namespace {

using snapshot_test::DataPath;
using snapshot_test::ExpectSameSnapshot;
using snapshot_test::LoadOrDie;
using snapshot_test::ReadBytes;

// A string literal with its NUL bytes.
template <size_t N>
std::string Bytes(const char (&text)[N]) {
  return std::string(text, N - 1);
}

nlohmann::json TrainFacts() {
  return nlohmann::json::parse(ReadBytes(DataPath("facts.json")))["train"];
}

TEST(SnapshotLayouts, EveryTorchGenerationMeasuresTheSameRun) {
  const nlohmann::json facts = TrainFacts();
  for (const char* name : {"torch2_0.pickle", "torch2_1.pickle", "newest.pickle"}) {
    SCOPED_TRACE(name);
    const Snapshot s = LoadOrDie(name);
    ASSERT_EQ(s.device_traces.size(), 1u);
    auto run = MeasureSnapshot(s);
    ASSERT_TRUE(run.ok()) << run.error().message;
    EXPECT_EQ(run->sim.peak_allocated_bytes, facts["peak_allocated_bytes"].get<uint64_t>());
    EXPECT_EQ(run->sim.peak_reserved_bytes, facts["peak_reserved_bytes"].get<uint64_t>());
    EXPECT_TRUE(run->has_frames);
    // Every block of the final segments has the same address and stack
    // whether the file says it ("address", "frames") or only "history".
    const Snapshot now = LoadOrDie("train_p4.pickle");
    ASSERT_EQ(s.segments.size(), now.segments.size());
    for (size_t i = 0; i < s.segments.size(); ++i) {
      ASSERT_EQ(s.segments[i].blocks.size(), now.segments[i].blocks.size());
      for (size_t k = 0; k < s.segments[i].blocks.size(); ++k) {
        const SnapshotBlock& a = s.segments[i].blocks[k];
        const SnapshotBlock& b = now.segments[i].blocks[k];
        EXPECT_EQ(a.address, b.address);
        EXPECT_EQ(a.requested_bytes, b.requested_bytes);
        EXPECT_EQ(snapshot_test::StackText(s, a.stack), snapshot_test::StackText(now, b.stack));
      }
    }
  }
  const Snapshot v20 = LoadOrDie("torch2_0.pickle");
  EXPECT_FALSE(v20.settings.has_value());
  EXPECT_EQ(v20.device_traces[0].size(), 278u);
  // The newest: time_us, compile_context, user_metadata, pool_id on every
  // entry (ignored), an "annotate" action (kept as kOther), settings with a
  // key this reader does not know, one external annotation.
  const Snapshot newest = LoadOrDie("newest.pickle");
  EXPECT_EQ(newest.device_traces[0].size(), 279u);
  EXPECT_EQ(newest.unknown_actions, 1u);
  EXPECT_EQ(newest.external_annotations, 1u);
  ASSERT_TRUE(newest.settings.has_value());
}

TEST(SnapshotLayouts, Torch113SegmentListWithHistory) {
  const Snapshot s = LoadOrDie("torch1_13.pickle");
  EXPECT_TRUE(s.segments_only);
  EXPECT_TRUE(s.device_traces.empty());
  const Snapshot now = LoadOrDie("train_p4.pickle");
  ASSERT_EQ(s.segments.size(), now.segments.size());
  uint64_t with_stack = 0;
  for (size_t i = 0; i < s.segments.size(); ++i) {
    for (size_t k = 0; k < s.segments[i].blocks.size(); ++k) {
      const SnapshotBlock& a = s.segments[i].blocks[k];
      const SnapshotBlock& b = now.segments[i].blocks[k];
      EXPECT_EQ(a.address, b.address);  // computed from the segment address
      if (a.state == BlockState::kActiveAllocated) {
        EXPECT_EQ(a.requested_bytes, b.requested_bytes);  // history's real_size
      }
      with_stack += a.stack != 0;
    }
  }
  EXPECT_GT(with_stack, 0u);
  auto run = MeasureSnapshot(s);
  ASSERT_TRUE(run.ok()) << run.error().message;
  EXPECT_EQ(run->sim.peak_allocated_bytes, run->segments_allocated_bytes);
}

// Every file both ways: decoded as each entry dict completes (the default)
// and through the general value table. Same result, same errors.
TEST(SnapshotLayouts, CompactEntriesReadLikeTheGeneralPath) {
  namespace fs = std::filesystem;
  SnapshotReadLimits general;
  general.compact_trace_entries = false;
  size_t compared = 0;
  for (const char* dir :
       {"/tests/data/snapshots", "/fuzz/corpus/snapshot", "/tests/bad_inputs/snapshot"}) {
    for (const auto& entry : fs::directory_iterator(std::string(VS_SOURCE_DIR) + dir)) {
      if (entry.path().filename() == "facts.json") continue;
      SCOPED_TRACE(entry.path().string());
      const std::string bytes = ReadBytes(entry.path().string());
      auto compact = ParseSnapshot(bytes, "in");
      auto slow = ParseSnapshot(bytes, "in", general);
      // Documented differences: a dict decoded as a trace entry where
      // PyTorch puts something else, or filled again, is refused.
      if (!compact.ok() && compact.error().message.find("trace entry") != std::string::npos) {
        continue;
      }
      ASSERT_EQ(compact.ok(), slow.ok())
          << (compact.ok() ? slow.error().message : compact.error().message);
      if (!compact.ok()) {
        EXPECT_EQ(compact.error().message, slow.error().message);
        continue;
      }
      ExpectSameSnapshot(*compact, *slow);
      ++compared;
    }
  }
  EXPECT_GT(compared, 15u);
}

// Python's pickler writes a dict that appears twice once and a memo
// reference after; an entry read that way is the same entry twice.
TEST(SnapshotLayouts, SharedEntryDictReadsTwice) {
  // pickle.dumps({"device_traces": [[e, e]]}, protocol=4) with
  // e = {"action": "alloc", "addr": 4096, "size": 512}.
  const std::string p = Bytes(
      "\x80\x04\x95\x46\x00\x00\x00\x00\x00\x00\x00\x7d\x94\x8c\x0d\x64\x65\x76\x69\x63\x65"
      "\x5f\x74\x72\x61\x63\x65\x73\x94\x5d\x94\x5d\x94\x28\x7d\x94\x28\x8c\x06\x61\x63\x74"
      "\x69\x6f\x6e\x94\x8c\x05\x61\x6c\x6c\x6f\x63\x94\x8c\x04\x61\x64\x64\x72\x94\x4d\x00"
      "\x10\x8c\x04\x73\x69\x7a\x65\x94\x4d\x00\x02\x75\x68\x04\x65\x61\x73\x2e");
  auto s = ParseSnapshot(p, "shared");
  ASSERT_TRUE(s.ok()) << s.error().message;
  ASSERT_EQ(s->device_traces.size(), 1u);
  ASSERT_EQ(s->device_traces[0].size(), 2u);
  for (const TraceEntry e : s->device_traces[0]) {
    EXPECT_EQ(e.action, TraceAction::kAlloc);
    EXPECT_EQ(e.addr, 4096u);
    EXPECT_EQ(e.size_bytes, 512u);
  }
}

// An entry dict filled again after it was complete: Python never writes
// that; the reader says so instead of guessing.
TEST(SnapshotLayouts, EntryFilledTwiceIsAnError) {
  // {"action": "alloc", "addr": 1, "size": 2} then SETITEMS {"x": 3}.
  const std::string p = Bytes(
      "\x80\x04\x7d\x28\x8c\x06\x61\x63\x74\x69\x6f\x6e\x8c\x05\x61\x6c\x6c\x6f\x63\x8c"
      "\x04\x61\x64\x64\x72\x4b\x01\x8c\x04\x73\x69\x7a\x65\x4b\x02\x75\x28\x8c\x01\x78"
      "\x4b\x03\x75\x2e");
  auto s = ParseSnapshot(p, "twice");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("already complete"), std::string::npos) << s.error().message;
}

// A pickle of many entries, big enough that reading it from a file drops
// input pages behind the reader: the same as the bytes parsed in memory.
TEST(SnapshotLayouts, FileReadEqualsInMemoryParse) {
  std::string p = Bytes(
      "\x80\x04}(\x8c\x0d"
      "device_traces]]");
  std::string body;
  constexpr int kEntries = 900'000;  // ~40 MB: more than one 32 MiB release step
  for (int i = 0; i < kEntries; ++i) {
    if (i % 1000 == 0) body += '(';
    body += "}(";
    body +=
        "\x8c\x06"
        "action";
    body += (i % 3 == 0) ? std::string(
                               "\x8c\x05"
                               "alloc")
                         : std::string(
                               "\x8c\x0e"
                               "free_requested");
    body +=
        "\x8c\x04"
        "addr";
    body += '\x8a';
    body += '\x06';
    const uint64_t addr = 0x7f0000000000ull + (uint64_t(i) % 4096) * 512;
    for (int b = 0; b < 6; ++b) body += static_cast<char>((addr >> (8 * b)) & 0xff);
    body +=
        "\x8c\x04"
        "sizeM";
    body += static_cast<char>(i & 0xff);
    body += '\x02';
    body +=
        "\x8c\x06"
        "streamK";
    body += '\x00';
    body +=
        "\x8c\x07"
        "time_usJ";
    for (int b = 0; b < 4; ++b) body += static_cast<char>((i >> (8 * b)) & 0xff);
    body += 'u';
    if (i % 1000 == 999 || i == kEntries - 1) body += 'e';
  }
  p += body + "au.";
  const std::string path = ::testing::TempDir() + "/vs_layout_big.pickle";
  {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fwrite(p.data(), 1, p.size(), f);
    std::fclose(f);
  }
  auto from_file = ReadSnapshotFile(path);
  auto in_memory = ParseSnapshot(p, path);
  std::remove(path.c_str());
  ASSERT_TRUE(from_file.ok()) << from_file.error().message;
  ASSERT_TRUE(in_memory.ok()) << in_memory.error().message;
  ASSERT_EQ(from_file->device_traces[0].size(), static_cast<size_t>(kEntries));
  ExpectSameSnapshot(*from_file, *in_memory);
  // One store of 16-byte records, not a value tree: a few MiB per 100k.
  EXPECT_LT(from_file->device_traces[0].StoreBytes(), uint64_t{16} * kEntries + (2u << 20));
}

TEST(SnapshotLayouts, NonRegularFilesAreRefusedWithoutReading) {
  const std::string fifo = ::testing::TempDir() + "/vs_snapshot_fifo";
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto s = ReadSnapshotFile(fifo);  // would block forever if it opened the FIFO
  ::unlink(fifo.c_str());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("FIFO"), std::string::npos) << s.error().message;
  auto dev = ReadSnapshotFile("/dev/zero");
  ASSERT_FALSE(dev.ok());
  EXPECT_NE(dev.error().message.find("character device"), std::string::npos);
}

}  // namespace
}  // namespace vramscope
