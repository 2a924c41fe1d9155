// Helpers of the snapshot tests: reading the committed test files and
// building typed snapshots in memory, including ones whose trace comes from
// the CachingAllocator model itself (so segment actions follow the real
// allocator's rules by construction).
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "vramscope/allocator.h"
#include "vramscope/snapshot.h"

namespace vramscope::snapshot_test {

inline std::string DataPath(const std::string& name) {
  return std::string(VS_SOURCE_DIR) + "/tests/data/snapshots/" + name;
}

inline std::string ReadBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

inline Snapshot LoadOrDie(const std::string& name) {
  Result<Snapshot> s = ReadSnapshotFile(DataPath(name));
  if (!s.ok()) ADD_FAILURE() << s.error().message;
  return s.ok() ? std::move(*s) : Snapshot{};
}

// Frames of a stack as text, so snapshots read from different files compare.
inline std::vector<std::string> StackText(const Snapshot& s, uint32_t stack) {
  std::vector<std::string> out;
  for (uint32_t f : s.stacks[stack]) {
    out.push_back(s.frames[f].name + "@" + s.frames[f].filename + ":" +
                  std::to_string(s.frames[f].line));
  }
  return out;
}

// The same segments, blocks, trace entries and stacks (by content: stack
// and stream indices may differ between readers).
inline void ExpectSameSnapshot(const Snapshot& a, const Snapshot& b) {
  ASSERT_EQ(a.segments.size(), b.segments.size());
  for (size_t i = 0; i < a.segments.size(); ++i) {
    EXPECT_EQ(a.segments[i].address, b.segments[i].address);
    EXPECT_EQ(a.segments[i].total_bytes, b.segments[i].total_bytes);
    ASSERT_EQ(a.segments[i].blocks.size(), b.segments[i].blocks.size());
    for (size_t k = 0; k < a.segments[i].blocks.size(); ++k) {
      EXPECT_EQ(a.segments[i].blocks[k].size_bytes, b.segments[i].blocks[k].size_bytes);
      EXPECT_EQ(StackText(a, a.segments[i].blocks[k].stack),
                StackText(b, b.segments[i].blocks[k].stack));
    }
  }
  ASSERT_EQ(a.device_traces.size(), b.device_traces.size());
  for (size_t d = 0; d < a.device_traces.size(); ++d) {
    ASSERT_EQ(a.device_traces[d].size(), b.device_traces[d].size());
    for (size_t i = 0; i < a.device_traces[d].size(); ++i) {
      const TraceEntry x = a.device_traces[d][i];
      const TraceEntry y = b.device_traces[d][i];
      EXPECT_EQ(x.action, y.action) << d << " " << i;
      EXPECT_EQ(x.addr, y.addr) << d << " " << i;
      EXPECT_EQ(x.size_bytes, y.size_bytes) << d << " " << i;
      EXPECT_EQ(a.streams[x.stream], b.streams[y.stream]) << d << " " << i;
      EXPECT_EQ(StackText(a, x.stack), StackText(b, y.stack)) << d << " " << i;
    }
  }
  EXPECT_EQ(a.unknown_actions, b.unknown_actions);
  EXPECT_EQ(a.external_annotations, b.external_annotations);
  EXPECT_EQ(a.segments_only, b.segments_only);
  EXPECT_EQ(a.settings.has_value(), b.settings.has_value());
}

// Builds Snapshot values by hand: frames and stacks by name, trace entries.
class SnapshotBuilder {
 public:
  SnapshotBuilder() {
    snap_.streams.push_back(0);
    snap_.stacks.emplace_back();
    snap_.device_traces.emplace_back();
  }
  // A stack of (function, file) frames, innermost first.
  uint32_t Stack(std::vector<std::pair<std::string, std::string>> frames) {
    std::vector<uint32_t> ids;
    for (auto& [name, file] : frames) {
      snap_.frames.push_back(SnapshotFrame{name, file, 1});
      ids.push_back(static_cast<uint32_t>(snap_.frames.size() - 1));
    }
    snap_.stacks.push_back(ids);
    return static_cast<uint32_t>(snap_.stacks.size() - 1);
  }
  void Entry(TraceAction action, uint64_t addr, uint64_t size, uint32_t stack = 0,
             uint16_t stream = 0) {
    snap_.device_traces[0].push_back(TraceEntry{addr, size, stack, stream, action});
  }
  void Alloc(uint64_t addr, uint64_t size, uint32_t stack) {
    Entry(TraceAction::kAlloc, addr, size, stack);
  }
  void Free(uint64_t addr, uint64_t size, uint32_t stack = 0) {
    Entry(TraceAction::kFreeRequested, addr, size, stack);
    Entry(TraceAction::kFreeCompleted, addr, size, stack);
  }
  Snapshot& snapshot() { return snap_; }
  size_t entries() const { return snap_.device_traces[0].size(); }

 private:
  Snapshot snap_;
};

// Drives a CachingAllocator and records what PyTorch's would record: segment
// actions (found by diffing Segments()), alloc / free entries, and at the end
// the final segments.
class ModelTracer {
 public:
  explicit ModelTracer(const AllocatorConfig& config, uint64_t limit = kUnlimited)
      : allocator_(config, limit) {
    snap_.streams = {0, 0x1000};
    snap_.stacks.emplace_back();
    snap_.device_traces.emplace_back();
    if (!config.text.empty() || config.expandable_segments) {
      snap_.settings = SnapshotSettings{config.text, config};
    }
    segments_ = SegmentMap();
  }

  // Returns the handle, or nullopt on OOM (an "oom" entry is recorded).
  std::optional<BlockHandle> Malloc(uint64_t bytes, uint32_t stream = 0) {
    std::optional<BlockHandle> h = allocator_.Malloc(bytes, stream);
    RecordSegmentChanges(stream);
    if (!h) {
      const OomInfo& oom = *allocator_.last_oom();
      Emit(TraceAction::kOom, oom.free_device_bytes, RoundSize(bytes, allocator_.config()), stream);
      return h;
    }
    Emit(TraceAction::kAlloc, allocator_.BlockAddress(*h), bytes, stream);
    requested_[*h] = bytes;
    stream_of_[*h] = stream;
    return h;
  }
  void Free(BlockHandle h) {
    const uint64_t address = allocator_.BlockAddress(h);
    allocator_.Free(h);
    Emit(TraceAction::kFreeRequested, address, requested_[h], stream_of_[h]);
    Emit(TraceAction::kFreeCompleted, address, requested_[h], stream_of_[h]);
  }
  void EmptyCache() {
    allocator_.EmptyCache();
    RecordSegmentChanges(0);
  }
  const AllocatorStats& stats() const { return allocator_.stats(); }

  Snapshot Finish() {
    for (const SegmentView& view : allocator_.Segments()) {
      SnapshotSegment seg;
      seg.address = view.address;
      seg.total_bytes = view.total_bytes;
      seg.stream = view.stream == 0 ? 0 : 1;
      seg.small_pool = view.small_pool;
      seg.expandable = view.expandable;
      for (const BlockView& b : view.blocks) {
        SnapshotBlock block;
        block.address = b.address;
        block.size_bytes = b.size_bytes;
        block.requested_bytes = b.requested_bytes;
        block.state = b.allocated ? BlockState::kActiveAllocated : BlockState::kInactive;
        seg.blocks.push_back(block);
      }
      snap_.segments.push_back(std::move(seg));
    }
    return snap_;
  }

 private:
  std::map<uint64_t, uint64_t> SegmentMap() const {
    std::map<uint64_t, uint64_t> m;
    for (const SegmentView& v : allocator_.Segments()) m[v.address] = v.total_bytes;
    return m;
  }
  void RecordSegmentChanges(uint32_t stream) {
    const std::map<uint64_t, uint64_t> now = SegmentMap();
    const bool expandable = allocator_.config().expandable_segments;
    for (const auto& [addr, size] : segments_) {
      auto it = now.find(addr);
      if (it == now.end()) {
        Emit(expandable ? TraceAction::kSegmentUnmap : TraceAction::kSegmentFree, addr, size,
             stream);
      } else if (expandable && it->second < size) {
        Emit(TraceAction::kSegmentUnmap, addr + it->second, size - it->second, stream);
      }
    }
    for (const auto& [addr, size] : now) {
      auto it = segments_.find(addr);
      if (it == segments_.end()) {
        Emit(expandable ? TraceAction::kSegmentMap : TraceAction::kSegmentAlloc, addr, size,
             stream);
      } else if (expandable && it->second < size) {
        Emit(TraceAction::kSegmentMap, addr + it->second, size - it->second, stream);
      }
    }
    segments_ = now;
  }
  void Emit(TraceAction action, uint64_t addr, uint64_t size, uint32_t stream) {
    snap_.device_traces[0].push_back(
        TraceEntry{addr, size, 0, static_cast<uint16_t>(stream == 0 ? 0 : 1), action});
  }

  CachingAllocator allocator_;
  Snapshot snap_;
  std::map<uint64_t, uint64_t> segments_;
  std::map<BlockHandle, uint64_t> requested_;
  std::map<BlockHandle, uint32_t> stream_of_;
};

}  // namespace vramscope::snapshot_test
