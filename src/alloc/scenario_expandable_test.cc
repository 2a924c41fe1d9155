// Hand-derived scenarios for expandable_segments:True (torch 2.4-2.11,
// c10/cuda/CUDACachingAllocator.cpp: find_expandable_block,
// try_allocate_expandable_block, map_block, unmap_block, get_free_block,
// should_split, release_blocks). Large-pool pages are 20 MiB (kLargeBuffer),
// small-pool pages 2 MiB (kSmallBuffer). In the layouts each contiguous
// mapped range is one segment, as memory_snapshot() shows them.
#include <gtest/gtest.h>

#include "test_support.h"

namespace vramscope::testing {
namespace {

constexpr const char* kExpandable = "expandable_segments:True";

// map_block maps whole pages for the rounded request: one 2 MiB page; the
// remainder is split off (should_split: >= 512 B when expandable).
TEST(AllocatorScenario, ExpandableSmallRequestMapsOne2MiBPage) {
  CheckedAllocator a(kExpandable);
  a.Malloc(100);
  EXPECT_EQ(a.Layout(), "s0x[A0.5K F2047.5K]");
  EXPECT_EQ(a.stats().reserved_bytes, 2 * MiB);
  EXPECT_EQ(a.stats().num_segments, 1u);
}

// try_allocate_expandable_block maps for p.size() (25 MiB -> two 20 MiB
// pages = 40 MiB), not for alloc_size (26 MiB); 15 MiB stays free.
TEST(AllocatorScenario, ExpandableLargeRequestMapsWhole20MiBPages) {
  CheckedAllocator a(kExpandable);
  a.Malloc(25 * MiB);
  EXPECT_EQ(a.Layout(), "l0x[A25M F15M]");
  EXPECT_EQ(a.stats().reserved_bytes, 40 * MiB);
  EXPECT_EQ(a.stats().num_device_alloc, 1u);
}

// The segment grows in place: find_expandable_block starts at the free 15 MiB
// block before the unmapped tail, one more page is mapped and merged with it.
TEST(AllocatorScenario, ExpandableSegmentGrowsAtItsEnd) {
  CheckedAllocator a(kExpandable);
  BlockHandle x = a.Malloc(25 * MiB);
  BlockHandle y = a.Malloc(25 * MiB);
  EXPECT_EQ(a.Layout(), "l0x[A25M A25M F10M]");
  EXPECT_EQ(a.Address(y), a.Address(x) + 25 * MiB);
  EXPECT_EQ(a.stats().reserved_bytes, 60 * MiB);
  EXPECT_EQ(a.stats().num_device_alloc, 2u);
  EXPECT_EQ(a.stats().num_segments, 1u);
}

// should_split with expandable segments: remainder >= 512 B in the large
// pool too, so 19.5 MiB uses 19.5 MiB (classic: a whole 20 MiB block).
TEST(AllocatorScenario, ExpandableSplitsLargeRemaindersBelow1MiB) {
  CheckedAllocator a(kExpandable);
  a.Malloc(19 * MiB + 512 * KiB);
  EXPECT_EQ(a.Layout(), "l0x[A19968K F512K]");
  EXPECT_EQ(a.stats().allocated_bytes, 19 * MiB + 512 * KiB);
  CheckedAllocator classic("");
  classic.Malloc(19 * MiB + 512 * KiB);
  EXPECT_EQ(classic.Layout(), "l0[A20M]");
}

// Freed mapped memory is reused by best fit without mapping more pages.
TEST(AllocatorScenario, ExpandableReusesFreedPages) {
  CheckedAllocator a(kExpandable);
  BlockHandle x = a.Malloc(25 * MiB);
  a.Malloc(25 * MiB);
  a.Free(x);
  EXPECT_EQ(a.Layout(), "l0x[F25M A25M F10M]");
  a.Malloc(20 * MiB);
  EXPECT_EQ(a.Layout(), "l0x[A20M F5M A25M F10M]");
  EXPECT_EQ(a.stats().reserved_bytes, 60 * MiB);
  EXPECT_EQ(a.stats().num_device_alloc, 2u);
}

// get_free_block's expandable_size: the 10 MiB tail block counts as 10 MiB
// plus the unmapped pages after it, so the interior 25 MiB block is the
// better fit for 8 MiB and the tail is kept for growth.
TEST(AllocatorScenario, ExpandablePrefersInteriorBlockOverGrowableTail) {
  CheckedAllocator a(kExpandable);
  BlockHandle x = a.Malloc(25 * MiB);
  a.Malloc(25 * MiB);
  a.Free(x);
  a.Malloc(8 * MiB);
  EXPECT_EQ(a.Layout(), "l0x[A8M F17M A25M F10M]");
}

// release_blocks -> unmap_block unmaps only pages entirely inside a free
// block: free [25, 60) MiB covers page [40, 60) only; [25, 40) stays mapped.
TEST(AllocatorScenario, ExpandableEmptyCacheUnmapsWholeFreePagesOnly) {
  CheckedAllocator a(kExpandable);
  a.Malloc(25 * MiB);
  a.Free(a.Malloc(25 * MiB));
  EXPECT_EQ(a.Layout(), "l0x[A25M F35M]");
  a.EmptyCache();
  EXPECT_EQ(a.Layout(), "l0x[A25M F15M]");
  EXPECT_EQ(a.stats().reserved_bytes, 40 * MiB);
  EXPECT_EQ(a.stats().num_device_free, 1u);
}

// A segment whose pages are all unmapped is released
// (release_expandable_segment).
TEST(AllocatorScenario, ExpandableEmptyCacheReleasesAFullyFreeSegment) {
  CheckedAllocator a(kExpandable);
  a.Free(a.Malloc(25 * MiB));
  EXPECT_EQ(a.Layout(), "l0x[F40M]");
  a.EmptyCache();
  EXPECT_EQ(a.Layout(), "");
  EXPECT_EQ(a.stats().reserved_bytes, 0u);
  EXPECT_EQ(a.stats().num_segments, 0u);
}

// Unmapping a page in the middle splits the mapped range in two; the next
// request maps the hole again (find_expandable_block: lowest address first).
TEST(AllocatorScenario, ExpandableRefillsAnUnmappedHoleFirst) {
  CheckedAllocator a(kExpandable);
  BlockHandle x = a.Malloc(20 * MiB);
  BlockHandle y = a.Malloc(20 * MiB);
  a.Malloc(20 * MiB);
  const uint64_t hole = a.Address(y);
  a.Free(y);
  a.EmptyCache();
  EXPECT_EQ(a.Layout(), "l0x[A20M] l0x[A20M]");
  EXPECT_EQ(a.stats().num_segments, 2u);
  EXPECT_EQ(a.stats().reserved_bytes, 40 * MiB);
  BlockHandle z = a.Malloc(20 * MiB);
  EXPECT_EQ(a.Address(z), hole);
  EXPECT_EQ(a.Address(z), a.Address(x) + 20 * MiB);
  EXPECT_EQ(a.Layout(), "l0x[A20M A20M A20M]");
  EXPECT_EQ(a.stats().num_segments, 1u);
}

// One growing segment per (stream, pool).
TEST(AllocatorScenario, ExpandableStreamsGetSeparateSegments) {
  CheckedAllocator a(kExpandable);
  a.Malloc(25 * MiB, 0);
  a.Malloc(25 * MiB, 1);
  EXPECT_EQ(a.Layout(), "l0x[A25M F15M] l1x[A25M F15M]");
  EXPECT_EQ(a.stats().reserved_bytes, 80 * MiB);
}

// OOM path with expandable segments: mapping a page for stream 1 fails
// (60 + 20 > 60 MiB); release_cached_blocks unmaps stream 0's free pages
// (and releases that segment); the retry maps the page.
TEST(AllocatorScenario, ExpandableOomRetryUnmapsFreePagesOfOtherStreams) {
  CheckedAllocator a(kExpandable, 60 * MiB);
  BlockHandle x = a.Malloc(25 * MiB, 0);
  a.Malloc(10 * MiB, 1);
  a.Free(x);
  EXPECT_EQ(a.Layout(), "l0x[F40M] l1x[A10M F10M]");
  a.Malloc(30 * MiB, 1);
  EXPECT_EQ(a.Layout(), "l1x[A10M A30M]");
  EXPECT_EQ(a.stats().num_alloc_retries, 1u);
  EXPECT_EQ(a.stats().reserved_bytes, 40 * MiB);
}

// alloc_block checks the memory fraction with alloc_size, even though
// expandable segments map whole pages: 40 + 12 <= 55 passes, a 20 MiB page
// is mapped and reserved (60 MiB) ends above the allowed 55 MiB.
TEST(AllocatorScenario, ExpandableFractionCheckUsesAllocSize) {
  CheckedAllocator a("expandable_segments:True,per_process_memory_fraction:0.55", 100 * MiB);
  a.Malloc(35 * MiB);
  a.Malloc(12 * MiB);
  EXPECT_EQ(a.Layout(), "l0x[A35M A12M F13M]");
  EXPECT_EQ(a.stats().reserved_bytes, 60 * MiB);
  EXPECT_FALSE(a.TryMalloc(14 * MiB).has_value());  // 60 + 14 > 55
  EXPECT_NE(a.raw().last_oom()->message.find("Tried to allocate 14.00 MiB."), std::string::npos);
  EXPECT_NE(a.raw().last_oom()->message.find("55.00 MiB allowed; "), std::string::npos);
}

// The small pool grows by 2 MiB pages.
TEST(AllocatorScenario, ExpandableSmallPoolGrowsBy2MiBPages) {
  CheckedAllocator a(kExpandable);
  for (int i = 0; i < 3; ++i) a.Malloc(1 * MiB);
  EXPECT_EQ(a.Layout(), "s0x[A1M A1M A1M F1M]");
  EXPECT_EQ(a.stats().reserved_bytes, 4 * MiB);
  EXPECT_EQ(a.stats().num_device_alloc, 2u);
}

}  // namespace
}  // namespace vramscope::testing
