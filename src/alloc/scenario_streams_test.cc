// Hand-derived scenarios for blocks used on two CUDA streams
// (Tensor.record_stream), following c10/cuda/CUDACachingAllocator.cpp of
// torch 2.4-2.11: recordStream (uses on the allocation stream are ignored),
// free (allocated drops at once; a block with stream uses goes through
// insert_events instead of free_block and stays active), process_events
// (run at the start of every malloc; per stream in recording order, stopping
// at the first incomplete event), try_merge_blocks (never absorbs a block with
// outstanding events) and release_cached_blocks (synchronize_and_free_events
// first: empty_cache and the OOM retry wait for every event). In the layouts
// P<size> is a block freed while another stream's work is outstanding
// (snapshot state "active_pending_free"). CheckedAllocator checks every
// invariant after every operation.
#include <gtest/gtest.h>

#include "test_support.h"

namespace vramscope::testing {
namespace {

// free(): allocated_bytes drops, active and requested stay until the event
// completes (free_block decreases them); the block is in no pool.
TEST(AllocatorStreams, FreedBlockUsedOnAnotherStreamStaysActive) {
  CheckedAllocator a("");
  BlockHandle h = a.Malloc(3 * MiB);
  a.RecordStream(h, /*stream=*/1);
  EXPECT_NE(a.Free(h), kNoPendingFree);
  EXPECT_EQ(a.Layout(), "l0[P3M F17M]");
  EXPECT_EQ(a.stats().allocated_bytes, 0u);
  EXPECT_EQ(a.stats().active_bytes, 3 * MiB);
  EXPECT_EQ(a.stats().requested_bytes, 3 * MiB);
  EXPECT_EQ(a.stats().reserved_bytes, 20 * MiB);
}

// get_free_block cannot see the pending block: the same request splits the
// free remainder instead, so active (6 MiB) exceeds allocated (3 MiB).
TEST(AllocatorStreams, PendingBlockIsNotReusedBeforeItsEventCompletes) {
  CheckedAllocator a("");
  BlockHandle h = a.Malloc(3 * MiB);
  a.RecordStream(h, 1);
  a.Free(h);
  a.Malloc(3 * MiB);
  EXPECT_EQ(a.Layout(), "l0[P3M A3M F14M]");
  EXPECT_EQ(a.stats().allocated_bytes, 3 * MiB);
  EXPECT_EQ(a.stats().active_bytes, 6 * MiB);
  EXPECT_EQ(a.stats().peak_active_bytes, 6 * MiB);
}

// A completed event is processed by the next malloc, not at once; then the
// block merges with its free neighbour and best fit hands the same address
// back without a new cudaMalloc.
TEST(AllocatorStreams, CompletedEventIsProcessedByTheNextMalloc) {
  CheckedAllocator a("");
  BlockHandle h = a.Malloc(3 * MiB);
  const uint64_t address = a.Address(h);
  a.RecordStream(h, 1);
  a.CompleteFreeEvents(a.Free(h));
  EXPECT_EQ(a.Layout(), "l0[P3M F17M]");
  EXPECT_EQ(a.stats().active_bytes, 3 * MiB);
  BlockHandle again = a.Malloc(3 * MiB);
  EXPECT_EQ(a.Layout(), "l0[A3M F17M]");
  EXPECT_EQ(a.Address(again), address);
  EXPECT_EQ(a.stats().num_device_alloc, 1u);
  EXPECT_EQ(a.stats().active_bytes, 3 * MiB);
}

// recordStream returns early for the block's own stream: the free caches the
// block at once.
TEST(AllocatorStreams, UseOnTheAllocationStreamChangesNothing) {
  CheckedAllocator a("");
  BlockHandle h = a.Malloc(3 * MiB, /*stream=*/2);
  a.RecordStream(h, 2);
  EXPECT_EQ(a.Free(h), kNoPendingFree);
  EXPECT_EQ(a.Layout(), "l2[F20M]");
  EXPECT_EQ(a.stats().active_bytes, 0u);
}

// Events of one stream complete in order: the GPU finishing the later free's
// work has finished the earlier one's too.
TEST(AllocatorStreams, CompletingALaterEventCompletesEarlierOnes) {
  CheckedAllocator a("");
  BlockHandle x = a.Malloc(3 * MiB);
  BlockHandle y = a.Malloc(3 * MiB);
  a.RecordStream(x, 1);
  a.RecordStream(y, 1);
  a.Free(x);
  const FreeTicket later = a.Free(y);
  EXPECT_EQ(a.Layout(), "l0[P3M P3M F14M]");
  a.CompleteFreeEvents(later);
  a.Malloc(512);
  EXPECT_EQ(a.Layout(), "l0[F20M] s0[A0.5K F2047.5K]");
  EXPECT_EQ(a.stats().active_bytes, 512u);
}

// process_events stops at the first incomplete event of a stream: only the
// earlier block is cached, and it does not merge with its pending neighbour.
TEST(AllocatorStreams, CompletingAnEarlierEventLeavesLaterOnesPending) {
  CheckedAllocator a("");
  BlockHandle x = a.Malloc(3 * MiB);
  BlockHandle y = a.Malloc(3 * MiB);
  a.RecordStream(x, 1);
  a.RecordStream(y, 1);
  const FreeTicket earlier = a.Free(x);
  a.Free(y);
  a.CompleteFreeEvents(earlier);
  a.Malloc(512);
  EXPECT_EQ(a.Layout(), "l0[F3M P3M F14M] s0[A0.5K F2047.5K]");
  EXPECT_EQ(a.stats().active_bytes, 3 * MiB + 512);
}

// insert_events records one event per stream that used the block; the block
// comes back only when every one of them has completed (event_count == 0).
// Completing stream 1 through a later free leaves x waiting for stream 2.
TEST(AllocatorStreams, BlockWaitsForEveryStreamThatUsedIt) {
  CheckedAllocator a("");
  BlockHandle x = a.Malloc(3 * MiB);
  BlockHandle y = a.Malloc(3 * MiB);
  a.RecordStream(x, 1);
  a.RecordStream(x, 2);
  a.RecordStream(x, 1);  // once per stream: stream_uses is a set
  a.RecordStream(y, 1);
  const FreeTicket tx = a.Free(x);
  const FreeTicket ty = a.Free(y);
  a.CompleteFreeEvents(ty);
  a.Malloc(512);
  EXPECT_EQ(a.Layout(), "l0[P3M F17M] s0[A0.5K F2047.5K]");
  a.CompleteFreeEvents(tx);
  a.Malloc(512);
  EXPECT_EQ(a.Layout(), "l0[F20M] s0[A0.5K A0.5K F2047K]");
  EXPECT_EQ(a.stats().active_bytes, 1024u);
}

// empty_cache -> release_cached_blocks -> synchronize_and_free_events: the
// pending block is waited for, cached, and its whole segment released.
TEST(AllocatorStreams, EmptyCacheWaitsForPendingEvents) {
  CheckedAllocator a("");
  BlockHandle h = a.Malloc(3 * MiB);
  a.RecordStream(h, 1);
  const FreeTicket ticket = a.Free(h);
  a.EmptyCache();
  EXPECT_EQ(a.Layout(), "");
  EXPECT_EQ(a.stats().reserved_bytes, 0u);
  EXPECT_EQ(a.stats().active_bytes, 0u);
  EXPECT_EQ(a.stats().num_device_free, 1u);
  a.CompleteFreeEvents(ticket);  // already complete: ignored
  EXPECT_EQ(a.stats().reserved_bytes, 0u);
}

// A 30 MiB request on a 40 MiB device with a 20 MiB segment held by a
// pending block: cudaMalloc fails (50 > 40), release_available_cached_blocks
// does nothing (no max_split_size), release_cached_blocks waits for the
// event, frees the now whole segment, and the retry succeeds.
TEST(AllocatorStreams, OomRetryWaitsForPendingFrees) {
  CheckedAllocator a("", 40 * MiB);
  BlockHandle h = a.Malloc(3 * MiB);
  a.RecordStream(h, 1);
  a.Free(h);
  a.Malloc(30 * MiB);
  EXPECT_EQ(a.Layout(), "l0[A30M]");
  EXPECT_EQ(a.stats().num_alloc_retries, 1u);
  EXPECT_EQ(a.stats().reserved_bytes, 30 * MiB);
}

// The FSDP1 pattern: a side stream (1) allocates a buffer, the default stream
// (0) uses it (record_stream), it is freed. Once the event completes the
// block goes back to stream 1's pool, where stream 0 cannot reach it: the
// same request on stream 0 needs a second segment.
TEST(AllocatorStreams, SideStreamBlockReturnsToItsOwnPool) {
  CheckedAllocator a("");
  BlockHandle g = a.Malloc(3 * MiB, /*stream=*/1);
  a.RecordStream(g, 0);
  a.CompleteFreeEvents(a.Free(g));
  a.Malloc(3 * MiB, /*stream=*/0);
  EXPECT_EQ(a.Layout(), "l1[F20M] l0[A3M F17M]");
  EXPECT_EQ(a.raw().ReservedByStream(),
            (std::vector<StreamReserved>{{0, 20 * MiB}, {1, 20 * MiB}}));
}

// try_merge_blocks skips a neighbour with outstanding events: freeing the
// block after a pending one merges only with the free tail. After the event
// is processed the segment is whole again and serves 20 MiB unsplit.
TEST(AllocatorStreams, PendingBlockDoesNotMergeWithAFreedNeighbour) {
  CheckedAllocator a("");
  BlockHandle x = a.Malloc(3 * MiB);
  BlockHandle y = a.Malloc(3 * MiB);
  a.RecordStream(x, 1);
  const FreeTicket tx = a.Free(x);
  a.Free(y);
  EXPECT_EQ(a.Layout(), "l0[P3M F17M]");
  a.CompleteFreeEvents(tx);
  a.Malloc(20 * MiB);
  EXPECT_EQ(a.Layout(), "l0[A20M]");
  EXPECT_EQ(a.stats().num_device_alloc, 1u);
}

// Expandable segments take the same free path; empty_cache waits for the
// event and then unmaps the whole page, giving the range back.
TEST(AllocatorStreams, ExpandableSegmentWaitsTooAndUnmapsAfterEmptyCache) {
  CheckedAllocator a("expandable_segments:True");
  BlockHandle h = a.Malloc(3 * MiB);
  a.RecordStream(h, 1);
  a.Free(h);
  EXPECT_EQ(a.Layout(), "l0x[P3M F17M]");
  a.EmptyCache();
  EXPECT_EQ(a.Layout(), "");
  EXPECT_EQ(a.stats().reserved_bytes, 0u);
}

// find_expandable_block counts a free block right before the unmapped tail
// toward the request, but not one with outstanding events (allocatable()
// checks event_count): the 18 MiB request maps a fresh page after it.
TEST(AllocatorStreams, ExpandableGrowthSkipsAPendingBlock) {
  CheckedAllocator a("expandable_segments:True");
  a.Malloc(3 * MiB);
  BlockHandle y = a.Malloc(17 * MiB);
  a.RecordStream(y, 1);
  a.Free(y);
  a.Malloc(18 * MiB);
  EXPECT_EQ(a.Layout(), "l0x[A3M P17M A18M F2M]");
  EXPECT_EQ(a.stats().reserved_bytes, 40 * MiB);
}

// vramscope's ideal mode has no cache to protect: uses change nothing.
TEST(AllocatorStreams, IdealModeIgnoresStreamUses) {
  CheckedAllocator a("ideal:True");
  BlockHandle h = a.Malloc(3 * MiB);
  a.RecordStream(h, 1);
  EXPECT_EQ(a.Free(h), kNoPendingFree);
  EXPECT_EQ(a.stats().reserved_bytes, 0u);
  EXPECT_EQ(a.stats().active_bytes, 0u);
}

// A zero-byte tensor has a null data pointer; recording a stream on it does
// nothing (torch: recordStream returns for a null DataPtr).
TEST(AllocatorStreams, ZeroByteBlockHasNoEvents) {
  CheckedAllocator a("");
  BlockHandle h = a.Malloc(0);
  a.RecordStream(h, 1);
  EXPECT_EQ(a.Free(h), kNoPendingFree);
  EXPECT_EQ(a.Layout(), "");
}

// Stream uses die with the allocation: a block that was recorded, freed,
// processed and handed out again is freed at once the second time.
TEST(AllocatorStreams, StreamUsesAreForgottenAfterTheFree) {
  CheckedAllocator a("");
  BlockHandle h = a.Malloc(3 * MiB);
  a.RecordStream(h, 1);
  a.CompleteFreeEvents(a.Free(h));
  BlockHandle again = a.Malloc(3 * MiB);
  EXPECT_EQ(a.Free(again), kNoPendingFree);
  EXPECT_EQ(a.Layout(), "l0[F20M]");
}

}  // namespace
}  // namespace vramscope::testing
