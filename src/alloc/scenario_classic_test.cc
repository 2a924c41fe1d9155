// Hand-derived scenarios for the classic (cudaMalloc) caching allocator,
// default settings. Each expectation was worked out from PyTorch's rules in
// c10/cuda/CUDACachingAllocator.cpp (torch 2.4-2.11); the function that
// holds each rule is named in the comment. Every operation is followed by
// CheckInvariants() (CheckedAllocator).
#include <gtest/gtest.h>

#include "test_support.h"

namespace vramscope::testing {
namespace {

// round_size: 100 B -> 512 B (kMinBlockSize); get_pool: <= 1 MiB -> small;
// get_allocation_size: small -> 2 MiB (kSmallBuffer); should_split (small
// pool): remainder 2 MiB - 512 >= 512 -> split, carved from the front.
TEST(AllocatorScenario, SmallRequestRoundsTo512AndSplitsA2MiBSegment) {
  CheckedAllocator a("");
  a.Malloc(100);
  EXPECT_EQ(a.Layout(), "s0[A0.5K F2047.5K]");
  EXPECT_EQ(a.stats().allocated_bytes, 512u);
  EXPECT_EQ(a.stats().requested_bytes, 100u);
  EXPECT_EQ(a.stats().reserved_bytes, 2 * MiB);
  EXPECT_EQ(a.stats().num_segments, 1u);
  EXPECT_EQ(a.stats().num_device_alloc, 1u);
}

// Small pool packing: 300 KiB requests (already 512-multiples) are carved
// one after another from a 2 MiB segment: six fit (1800 KiB), the seventh
// finds only the 248 KiB remainder and gets a second segment.
TEST(AllocatorScenario, SmallPoolPacksRequestsInto2MiBSegments) {
  CheckedAllocator a("");
  for (int i = 0; i < 6; ++i) a.Malloc(300 * KiB);
  EXPECT_EQ(a.Layout(), "s0[A300K A300K A300K A300K A300K A300K F248K]");
  a.Malloc(300 * KiB);
  EXPECT_EQ(a.stats().num_segments, 2u);
  EXPECT_EQ(a.stats().reserved_bytes, 4 * MiB);
  EXPECT_EQ(a.stats().allocated_bytes, 7 * 300 * KiB);
}

// get_pool: a rounded size of exactly 1 MiB (kSmallSize) is still small.
TEST(AllocatorScenario, OneMiBRequestUsesTheSmallPool) {
  CheckedAllocator a("");
  a.Malloc(1 * MiB);
  EXPECT_EQ(a.Layout(), "s0[A1M F1M]");
  EXPECT_EQ(a.stats().reserved_bytes, 2 * MiB);
}

// round_size: 1 MiB + 1 -> 1 MiB + 512 (large pool); get_allocation_size:
// (1 MiB, 10 MiB) -> 20 MiB (kLargeBuffer); should_split: remainder
// 19 MiB - 512 > 1 MiB -> split.
TEST(AllocatorScenario, RequestJustAbove1MiBGetsA20MiBLargeSegment) {
  CheckedAllocator a("");
  a.Malloc(1 * MiB + 1);
  EXPECT_EQ(a.Layout(), "l0[A1024.5K F19455.5K]");
  EXPECT_EQ(a.stats().allocated_bytes, 1 * MiB + 512);
  EXPECT_EQ(a.stats().reserved_bytes, 20 * MiB);
}

// get_allocation_size gives 1-10 MiB requests a 20 MiB segment; the next
// requests are served by splitting its cached remainder (get_free_block +
// alloc_found_block), not by new cudaMallocs.
TEST(AllocatorScenario, RequestsOf1To10MiBShareOne20MiBSegment) {
  CheckedAllocator a("");
  for (int i = 0; i < 3; ++i) a.Malloc(3 * MiB);
  EXPECT_EQ(a.Layout(), "l0[A3M A3M A3M F11M]");
  EXPECT_EQ(a.stats().num_device_alloc, 1u);
  a.Malloc(9 * MiB);  // 11 MiB left, remainder 2 MiB > 1 MiB -> split
  EXPECT_EQ(a.Layout(), "l0[A3M A3M A3M A9M F2M]");
  a.Malloc(2 * MiB);  // exact fit of the 2 MiB remainder
  EXPECT_EQ(a.Layout(), "l0[A3M A3M A3M A9M A2M]");
  EXPECT_EQ(a.stats().reserved_bytes, 20 * MiB);
}

// get_allocation_size: >= 10 MiB (kMinLargeAlloc) rounds up to 2 MiB
// (kRoundLarge); 10 MiB exactly is its own segment.
TEST(AllocatorScenario, TenMiBRequestGetsAnExactSegment) {
  CheckedAllocator a("");
  a.Malloc(10 * MiB);
  EXPECT_EQ(a.Layout(), "l0[A10M]");
  EXPECT_EQ(a.stats().reserved_bytes, 10 * MiB);
}

// 11 MiB -> segment 12 MiB; should_split (large pool) needs remainder
// > kSmallSize: 1 MiB is not > 1 MiB -> the whole 12 MiB block is handed
// out and counted in allocated_bytes; requested_bytes keeps 11 MiB.
TEST(AllocatorScenario, ElevenMiBRequestTakesAWhole12MiBBlock) {
  CheckedAllocator a("");
  a.Malloc(11 * MiB);
  EXPECT_EQ(a.Layout(), "l0[A12M]");
  EXPECT_EQ(a.stats().allocated_bytes, 12 * MiB);
  EXPECT_EQ(a.stats().requested_bytes, 11 * MiB);
}

// should_split boundary: 19 MiB -> segment 20 MiB, remainder exactly 1 MiB
// -> no split (remaining > kSmallSize is false).
TEST(AllocatorScenario, LargePoolNoSplitWhenRemainderIsExactly1MiB) {
  CheckedAllocator a("");
  a.Malloc(19 * MiB);
  EXPECT_EQ(a.Layout(), "l0[A20M]");
  EXPECT_EQ(a.stats().allocated_bytes, 20 * MiB);
}

// ... and 19 MiB - 512 leaves 1 MiB + 512 > 1 MiB -> split.
TEST(AllocatorScenario, LargePoolSplitsWhenRemainderIs1MiBPlus512) {
  CheckedAllocator a("");
  a.Malloc(19 * MiB - 512);
  EXPECT_EQ(a.Layout(), "l0[A19455.5K F1024.5K]");
  EXPECT_EQ(a.stats().allocated_bytes, 19 * MiB - 512);
}

// 12.5 MiB -> segment 14 MiB, remainder 1.5 MiB > 1 MiB -> split.
TEST(AllocatorScenario, TwelveAndAHalfMiBSplitsOffA1AndAHalfMiBRemainder) {
  CheckedAllocator a("");
  a.Malloc(12 * MiB + 512 * KiB);
  EXPECT_EQ(a.Layout(), "l0[A12800K F1536K]");
  EXPECT_EQ(a.stats().reserved_bytes, 14 * MiB);
}

// free -> free_block caches the block; the next request of the same size on
// the same stream gets it back (get_free_block), no new cudaMalloc.
TEST(AllocatorScenario, FreedBlockIsReusedForTheSameSize) {
  CheckedAllocator a("");
  BlockHandle x = a.Malloc(3 * MiB);
  const uint64_t address = a.Address(x);
  a.Free(x);
  EXPECT_EQ(a.Layout(), "l0[F20M]");
  EXPECT_EQ(a.stats().allocated_bytes, 0u);
  EXPECT_EQ(a.stats().reserved_bytes, 20 * MiB);  // cached, not released
  BlockHandle y = a.Malloc(3 * MiB);
  EXPECT_EQ(a.Address(y), address);
  EXPECT_EQ(a.stats().num_device_alloc, 1u);
}

// Reusing a cached 12 MiB block for an 11.25 MiB request: remainder
// 0.75 MiB is not > 1 MiB -> no split; allocated counts all 12 MiB.
TEST(AllocatorScenario, CachedBlockReusedWholeWhenRemainderIsUnder1MiB) {
  CheckedAllocator a("");
  a.Free(a.Malloc(12 * MiB));
  a.Malloc(11 * MiB + 256 * KiB);
  EXPECT_EQ(a.Layout(), "l0[A12M]");
  EXPECT_EQ(a.stats().allocated_bytes, 12 * MiB);
  EXPECT_EQ(a.stats().requested_bytes, 11 * MiB + 256 * KiB);
  EXPECT_EQ(a.stats().num_device_alloc, 1u);
}

// get_free_block: lower_bound on (stream, size, address) -> the smallest
// cached block that fits: 14 MiB for 13 MiB (no split, remainder 1 MiB),
// then 12 MiB for 12 MiB; 16 MiB stays cached.
TEST(AllocatorScenario, BestFitPicksTheSmallestSufficientBlock) {
  CheckedAllocator a("");
  BlockHandle x = a.Malloc(12 * MiB);
  BlockHandle y = a.Malloc(16 * MiB);
  BlockHandle z = a.Malloc(14 * MiB);
  a.Free(x);
  a.Free(y);
  a.Free(z);
  a.Malloc(13 * MiB);
  a.Malloc(12 * MiB);
  EXPECT_EQ(a.Layout(), "l0[A12M] l0[F16M] l0[A14M]");
  EXPECT_EQ(a.stats().allocated_bytes, 26 * MiB);
  EXPECT_EQ(a.stats().num_device_alloc, 3u);
}

// BlockComparatorSize ends with the address: among equal sizes the lowest
// address wins, whatever order they were freed in.
TEST(AllocatorScenario, BestFitBreaksTiesByLowestAddress) {
  CheckedAllocator a("");
  BlockHandle x = a.Malloc(12 * MiB);
  BlockHandle y = a.Malloc(12 * MiB);
  const uint64_t low = std::min(a.Address(x), a.Address(y));
  a.Free(y);
  a.Free(x);
  EXPECT_EQ(a.Address(a.Malloc(12 * MiB)), low);
}

// free_block -> try_merge_blocks with prev and next: freed neighbours of
// the same segment coalesce at once.
TEST(AllocatorScenario, FreeMergesWithFreeNeighbours) {
  CheckedAllocator a("");
  BlockHandle x = a.Malloc(512);
  BlockHandle y = a.Malloc(512);
  BlockHandle z = a.Malloc(512);
  EXPECT_EQ(a.Layout(), "s0[A0.5K A0.5K A0.5K F2046.5K]");
  a.Free(x);
  EXPECT_EQ(a.Layout(), "s0[F0.5K A0.5K A0.5K F2046.5K]");
  a.Free(z);  // merges with the remainder after it
  EXPECT_EQ(a.Layout(), "s0[F0.5K A0.5K F2047K]");
  a.Free(y);  // merges with both sides
  EXPECT_EQ(a.Layout(), "s0[F2M]");
}

// Merging is address-local within one segment: two fully free segments stay
// two cached blocks, and a request larger than each needs a new segment.
TEST(AllocatorScenario, FreeBlocksOfDifferentSegmentsNeverMerge) {
  CheckedAllocator a("");
  BlockHandle x = a.Malloc(20 * MiB);
  BlockHandle y = a.Malloc(20 * MiB);
  a.Free(x);
  a.Free(y);
  EXPECT_EQ(a.Layout(), "l0[F20M] l0[F20M]");
  a.Malloc(30 * MiB);
  EXPECT_EQ(a.stats().reserved_bytes, 70 * MiB);
}

// release_cached_blocks (empty_cache): only blocks with no prev/next (whole
// segments) are cudaFree'd; a partly used segment keeps its free remainder.
TEST(AllocatorScenario, EmptyCacheReleasesOnlyFullyFreeSegments) {
  CheckedAllocator a("");
  a.Malloc(512);              // small segment stays in use
  a.Free(a.Malloc(3 * MiB));  // large segment becomes fully free
  EXPECT_EQ(a.stats().reserved_bytes, 22 * MiB);
  a.EmptyCache();
  EXPECT_EQ(a.Layout(), "s0[A0.5K F2047.5K]");
  EXPECT_EQ(a.stats().reserved_bytes, 2 * MiB);
  EXPECT_EQ(a.stats().num_device_free, 1u);
  EXPECT_EQ(a.stats().num_segments, 1u);
}

// get_pool: small and large requests use separate pools; a cached large
// block never serves a small request.
TEST(AllocatorScenario, SmallRequestNeverTakesALargePoolBlock) {
  CheckedAllocator a("");
  a.Free(a.Malloc(20 * MiB));
  a.Malloc(512 * KiB);
  EXPECT_EQ(a.Layout(), "l0[F20M] s0[A512K F1536K]");
  EXPECT_EQ(a.stats().reserved_bytes, 22 * MiB);
}

// Blocks are associated with their allocation stream: BlockComparatorSize
// starts with the stream, so stream 1 cannot reuse stream 0's cached block.
TEST(AllocatorScenario, SeparateStreamsDoNotShareBlocks) {
  CheckedAllocator a("");
  a.Free(a.Malloc(3 * MiB, /*stream=*/0));
  a.Malloc(3 * MiB, /*stream=*/1);
  EXPECT_EQ(a.Layout(), "l0[F20M] l1[A3M F17M]");
  EXPECT_EQ(a.stats().num_device_alloc, 2u);
  a.Malloc(3 * MiB, /*stream=*/0);  // stream 0 still reuses its own
  EXPECT_EQ(a.Layout(), "l0[A3M F17M] l1[A3M F17M]");
}

// NativeCachingAllocator::allocate: size 0 returns a null DataPtr without
// calling malloc: no block, no segment, no statistic.
TEST(AllocatorScenario, ZeroByteRequestCostsNothing) {
  CheckedAllocator a("");
  BlockHandle h = a.Malloc(0);
  EXPECT_TRUE(a.raw().IsAllocated(h));
  EXPECT_EQ(a.raw().BlockSize(h), 0u);
  EXPECT_EQ(a.Layout(), "");
  EXPECT_EQ(a.stats().reserved_bytes, 0u);
  EXPECT_EQ(a.stats().requested_bytes, 0u);
  EXPECT_EQ(a.stats().num_device_alloc, 0u);
  a.Free(h);
  EXPECT_FALSE(a.raw().IsAllocated(h));
}

// reset_peak_memory_stats: peaks drop to the current values.
TEST(AllocatorScenario, ResetPeaksSetsPeaksToCurrentValues) {
  CheckedAllocator a("");
  BlockHandle x = a.Malloc(30 * MiB);
  a.Malloc(3 * MiB);
  a.Free(x);
  EXPECT_EQ(a.stats().peak_allocated_bytes, 33 * MiB);
  a.ResetPeaks();
  EXPECT_EQ(a.stats().peak_allocated_bytes, 3 * MiB);
  EXPECT_EQ(a.stats().peak_reserved_bytes, 50 * MiB);  // 30 MiB still cached
  EXPECT_EQ(a.stats().peak_requested_bytes, 3 * MiB);
}

}  // namespace
}  // namespace vramscope::testing
