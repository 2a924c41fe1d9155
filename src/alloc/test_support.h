// Test helpers: an allocator wrapper that checks every invariant after every
// operation, and a compact text form of the segment layout.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "vramscope/alloc_config.h"
#include "vramscope/allocator.h"

namespace vramscope::testing {

inline constexpr uint64_t KiB = 1024;
inline constexpr uint64_t MiB = kMiB;
inline constexpr uint64_t GiB = kGiB;

// "20M", "1.5K"-style sizes: whole MiB as M, 512-byte multiples as K (with
// .5), anything else in bytes.
inline std::string Units(uint64_t bytes) {
  if (bytes % MiB == 0) return std::to_string(bytes / MiB) + "M";
  if (bytes % 512 == 0) {
    return std::to_string(bytes / KiB) + (bytes % KiB ? ".5K" : "K");
  }
  return std::to_string(bytes) + "B";
}

// One token per segment, in address order: pool (s small / l large), stream,
// 'x' if expandable, then blocks as A<size> (allocated), P<size> (freed,
// pending other streams' events) or F<size> (free):
// "l0[A3M F17M] s1x[A0.5K F2047.5K]".
inline std::string Layout(const std::vector<SegmentView>& segments) {
  std::string out;
  for (const SegmentView& s : segments) {
    if (!out.empty()) out += ' ';
    out += s.small_pool ? 's' : 'l';
    out += std::to_string(s.stream);
    if (s.expandable) out += 'x';
    out += '[';
    for (size_t i = 0; i < s.blocks.size(); ++i) {
      if (i) out += ' ';
      out += s.blocks[i].allocated ? 'A' : s.blocks[i].pending_free ? 'P' : 'F';
      out += Units(s.blocks[i].size_bytes);
    }
    out += ']';
  }
  return out;
}

// Wraps CachingAllocator and runs CheckInvariants() after every call.
class CheckedAllocator {
 public:
  explicit CheckedAllocator(std::string_view conf, uint64_t device_limit_bytes = kUnlimited)
      : allocator_(Parse(conf), device_limit_bytes) {
    Check("construct");
  }
  CheckedAllocator(const AllocatorConfig& config, uint64_t device_limit_bytes)
      : allocator_(config, device_limit_bytes) {
    Check("construct");
  }

  // A Malloc that must succeed.
  BlockHandle Malloc(uint64_t bytes, uint32_t stream = 0) {
    std::optional<BlockHandle> h = TryMalloc(bytes, stream);
    EXPECT_TRUE(h.has_value()) << "Malloc(" << bytes << ") failed: "
                               << (allocator_.last_oom() ? allocator_.last_oom()->message : "");
    return h.value_or(0);
  }
  std::optional<BlockHandle> TryMalloc(uint64_t bytes, uint32_t stream = 0) {
    std::optional<BlockHandle> h = allocator_.Malloc(bytes, stream);
    Check("Malloc(" + std::to_string(bytes) + ")");
    return h;
  }
  FreeTicket Free(BlockHandle h) {
    const FreeTicket ticket = allocator_.Free(h);
    Check("Free");
    return ticket;
  }
  void RecordStream(BlockHandle h, uint32_t stream) {
    allocator_.RecordStream(h, stream);
    Check("RecordStream");
  }
  void CompleteFreeEvents(FreeTicket ticket) {
    allocator_.CompleteFreeEvents(ticket);
    Check("CompleteFreeEvents");
  }
  void EmptyCache() {
    allocator_.EmptyCache();
    Check("EmptyCache");
  }
  void ResetPeaks() {
    allocator_.ResetPeaks();
    Check("ResetPeaks");
  }

  std::string Layout() const { return testing::Layout(allocator_.Segments()); }
  const AllocatorStats& stats() const { return allocator_.stats(); }
  uint64_t Address(BlockHandle h) const { return allocator_.BlockAddress(h); }
  // Read-only access for queries (BlockSize, last_oom, ...); mutations go
  // through the checked methods above.
  const CachingAllocator& raw() const { return allocator_; }

 private:
  static AllocatorConfig Parse(std::string_view conf) {
    Result<AllocatorConfig> c = ParseAllocConf(conf);
    EXPECT_TRUE(c.ok()) << (c.ok() ? "" : c.error().message);
    return c.ok() ? c.value() : AllocatorConfig{};
  }
  void Check(const std::string& what) {
    Status s = allocator_.CheckInvariants();
    ASSERT_TRUE(s.ok()) << "after " << what << ": " << s.error().message;
  }

  CachingAllocator allocator_;
};

}  // namespace vramscope::testing
