// Hand-derived scenarios for the settings and limits of the caching
// allocator: max_split_size_mb, max_non_split_rounding_mb,
// roundup_power2_divisions, the OOM path, the per-process memory fraction,
// garbage collection, ideal mode and very large sizes. Rules cited from
// c10/cuda/CUDACachingAllocator.cpp (torch 2.4-2.11).
#include <gtest/gtest.h>

#include "test_support.h"

namespace vramscope::testing {
namespace {

// get_free_block rule 1: a request below max_split_size never takes an
// oversize block (>= max_split_size): a new segment is made instead.
TEST(AllocatorScenario, MaxSplitSizeKeepsOversizeBlocksFromSmallerRequests) {
  CheckedAllocator a("max_split_size_mb:40");
  a.Free(a.Malloc(60 * MiB));
  a.Malloc(30 * MiB);
  EXPECT_EQ(a.Layout(), "l0[F60M] l0[A30M]");
  EXPECT_EQ(a.stats().reserved_bytes, 90 * MiB);
}

// max_split_size_mb:20 is accepted from torch 2.9 (>= 20). Then a 20 MiB
// large-pool segment is itself oversize once free: a 1.5 MiB request splits a
// fresh 20 MiB segment (should_split: 1.5 MiB < 20 MiB, remainder 18.5 MiB >
// 1 MiB), but after the free merges it back, the next 1.5 MiB request may not
// take the free 20 MiB block (rule 1) and makes a second segment.
TEST(AllocatorScenario, MaxSplitSize20MakesFreedLargeBufferSegmentsOversize) {
  CheckedAllocator a("max_split_size_mb:20");
  const uint64_t request = MiB + MiB / 2;
  const BlockHandle h = a.Malloc(request);
  EXPECT_EQ(a.Layout(), "l0[A1536K F18944K]");
  a.Free(h);
  a.Malloc(request);
  EXPECT_EQ(a.Layout(), "l0[F20M] l0[A1536K F18944K]");
  EXPECT_EQ(a.stats().reserved_bytes, 2 * 20 * MiB);
  EXPECT_EQ(a.stats().allocated_bytes, request);
}

// get_free_block rule 2: an oversize request takes a cached oversize block
// only if block < request + max_non_split_rounding (20 MiB default), and
// should_split never splits it (size >= max_split_size): 41 MiB takes all
// 60 MiB (60 < 61). Without max_split_size the same block would be split.
TEST(AllocatorScenario, OversizeRequestTakesCachedBlockWholeWithin20MiB) {
  CheckedAllocator a("max_split_size_mb:40");
  a.Free(a.Malloc(60 * MiB));
  a.Malloc(41 * MiB);
  EXPECT_EQ(a.Layout(), "l0[A60M]");
  EXPECT_EQ(a.stats().allocated_bytes, 60 * MiB);

  CheckedAllocator plain("");
  plain.Free(plain.Malloc(60 * MiB));
  plain.Malloc(41 * MiB);
  EXPECT_EQ(plain.Layout(), "l0[A41M F19M]");
}

// Rule 2's bound is strict: 70 MiB >= 50 MiB + 20 MiB -> rejected, new
// 50 MiB segment.
TEST(AllocatorScenario, OversizeRequestRejectsBlockAtLeast20MiBLarger) {
  CheckedAllocator a("max_split_size_mb:40");
  a.Free(a.Malloc(70 * MiB));
  a.Malloc(50 * MiB);
  EXPECT_EQ(a.Layout(), "l0[F70M] l0[A50M]");
}

// max_non_split_rounding_mb (torch >= 2.6) widens the bound: 70 < 45 + 30.
TEST(AllocatorScenario, MaxNonSplitRoundingWidensOversizeReuse) {
  CheckedAllocator a("max_split_size_mb:40,max_non_split_rounding_mb:30");
  a.Free(a.Malloc(70 * MiB));
  a.Malloc(45 * MiB);
  EXPECT_EQ(a.Layout(), "l0[A70M]");
}

// release_available_cached_blocks: 45 MiB (segment 46 MiB) is refused the
// cached 70 MiB block (70 >= 45 + 20) and cudaMalloc fails (70 + 46 > 100);
// the single cached block >= max(45, 40) MiB is freed and alloc_block
// succeeds without the full retry (num_alloc_retries stays 0). The 46 MiB
// block is not split (oversize request).
TEST(AllocatorScenario, OomPathFreesOneOversizeBlockWhenMaxSplitIsSet) {
  CheckedAllocator a("max_split_size_mb:40", 100 * MiB);
  a.Free(a.Malloc(70 * MiB));
  a.Malloc(45 * MiB);
  EXPECT_EQ(a.Layout(), "l0[A46M]");
  EXPECT_EQ(a.stats().num_device_free, 1u);
  EXPECT_EQ(a.stats().num_alloc_retries, 0u);
}

// release_available_cached_blocks with no single block >= 70 MiB: frees
// oversize blocks from the largest down (60, then 50) until >= 70 MiB is
// released; the 45 MiB block survives.
TEST(AllocatorScenario, OomPathFreesOversizeBlocksLargestFirst) {
  CheckedAllocator a("max_split_size_mb:40", 200 * MiB);
  BlockHandle x = a.Malloc(45 * MiB);  // segment 46 MiB
  BlockHandle y = a.Malloc(50 * MiB);
  BlockHandle z = a.Malloc(60 * MiB);
  a.Free(x);
  a.Free(y);
  a.Free(z);
  a.Malloc(70 * MiB);  // 156 + 70 > 200
  EXPECT_EQ(a.Layout(), "l0[F46M] l0[A70M]");
  EXPECT_EQ(a.stats().num_device_free, 2u);
  EXPECT_EQ(a.stats().reserved_bytes, 116 * MiB);
}

// malloc's last stage: release_cached_blocks (free every whole cached
// segment) then alloc_block(isRetry=true), which counts num_alloc_retries.
TEST(AllocatorScenario, OomPathFreesCachedSegmentsAndRetries) {
  CheckedAllocator a("", 64 * MiB);
  BlockHandle x = a.Malloc(20 * MiB);
  BlockHandle y = a.Malloc(20 * MiB);
  a.Free(x);
  a.Free(y);
  a.Malloc(30 * MiB);  // 40 + 30 > 64
  EXPECT_EQ(a.Layout(), "l0[A30M]");
  EXPECT_EQ(a.stats().num_alloc_retries, 1u);
  EXPECT_EQ(a.stats().num_device_free, 2u);
  EXPECT_EQ(a.stats().num_ooms, 0u);
}

// A real OOM: nothing cached can be freed. PyTorch's message prints the
// segment size (alloc_size) and the memory split.
TEST(AllocatorScenario, RealOomReportsPyTorchsMessage) {
  CheckedAllocator a("", 64 * MiB);
  a.Malloc(40 * MiB);
  EXPECT_FALSE(a.TryMalloc(30 * MiB).has_value());
  EXPECT_EQ(a.stats().num_ooms, 1u);
  EXPECT_EQ(a.stats().num_alloc_retries, 1u);
  const OomInfo& oom = *a.raw().last_oom();
  EXPECT_EQ(oom.requested_bytes, 30 * MiB);
  EXPECT_EQ(oom.alloc_size_bytes, 30 * MiB);
  EXPECT_EQ(oom.free_device_bytes, 24 * MiB);
  EXPECT_EQ(oom.message,
            "CUDA out of memory. Tried to allocate 30.00 MiB. GPU 0 has a total capacity of "
            "64.00 MiB of which 24.00 MiB is free. Of the allocated memory 40.00 MiB is allocated "
            "by PyTorch, and 0 bytes is reserved by PyTorch but unallocated. If reserved but "
            "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:"
            "True to avoid fragmentation.  See documentation for Memory Management  "
            "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)");
}

// The OOM message's "Tried to allocate" is alloc_size: a 1.5 MiB request
// asks for a 20 MiB segment. The split remainder of a used segment is
// "reserved but unallocated" and cannot be released.
TEST(AllocatorScenario, OomMessagePrintsTheSegmentSize) {
  CheckedAllocator a("", 30 * MiB);
  a.Malloc(3 * MiB);                                // 20 MiB segment, 17 MiB free remainder
  EXPECT_FALSE(a.TryMalloc(18 * MiB).has_value());  // segment 18 MiB > 10 free
  EXPECT_FALSE(a.TryMalloc(18 * MiB - 1).has_value());
  EXPECT_EQ(a.stats().num_ooms, 2u);
  const std::string& m = a.raw().last_oom()->message;
  EXPECT_NE(m.find("Tried to allocate 18.00 MiB. GPU 0 has a total capacity of 30.00 MiB of "
                   "which 10.00 MiB is free. Of the allocated memory 3.00 MiB is allocated by "
                   "PyTorch, and 17.00 MiB is reserved by PyTorch but unallocated."),
            std::string::npos)
      << m;
  a.Malloc(17 * MiB);  // the remainder itself still fits
  EXPECT_EQ(a.Layout(), "l0[A3M A17M]");
  EXPECT_FALSE(a.TryMalloc(1 * MiB + 512 * KiB).has_value());
  EXPECT_NE(a.raw().last_oom()->message.find("Tried to allocate 20.00 MiB."), std::string::npos);
}

// set_per_process_memory_fraction: alloc_block fails when
// reserved + alloc_size > fraction * total; the message says "allowed".
TEST(AllocatorScenario, MemoryFractionCapsReservedMemory) {
  CheckedAllocator a("per_process_memory_fraction:0.5", 100 * MiB);
  a.Malloc(30 * MiB);
  EXPECT_FALSE(a.TryMalloc(30 * MiB).has_value());  // 60 > 50
  EXPECT_NE(a.raw().last_oom()->message.find("70.00 MiB is free. 50.00 MiB allowed; Of the"),
            std::string::npos)
      << a.raw().last_oom()->message;
  a.Malloc(20 * MiB);  // 50 <= 50
  EXPECT_EQ(a.stats().reserved_bytes, 50 * MiB);
}

// garbage_collect_cached_blocks (fraction 1.0 of 100 MiB, threshold 0.3 ->
// 30 MiB). The large pool's clock ticks on every get_free_block:
//   malloc 12 MiB (tick 1, miss) -> segment A; free A (age base 1)
//   malloc 30 MiB (tick 2, miss) -> segment B; free B (base 2)
//   malloc 20 MiB (tick 3) reuses B, free -> B merged (base 3)
//   malloc 40 MiB (tick 4, miss) -> GC: reserved 42 > 30, target 12 MiB;
//   ages A=3, B=1, average 2 -> A freed (12 MiB reclaimed), B kept.
TEST(AllocatorScenario, GarbageCollectionFreesOldCachedSegments) {
  CheckedAllocator a("garbage_collection_threshold:0.3,per_process_memory_fraction:1.0", 100 * MiB);
  a.Free(a.Malloc(12 * MiB));
  a.Free(a.Malloc(30 * MiB));
  a.Free(a.Malloc(20 * MiB));
  EXPECT_EQ(a.Layout(), "l0[F12M] l0[F30M]");
  a.Malloc(40 * MiB);
  EXPECT_EQ(a.Layout(), "l0[F30M] l0[A40M]");
  EXPECT_EQ(a.stats().num_device_free, 1u);
  EXPECT_EQ(a.stats().num_alloc_retries, 0u);
}

// GC only runs with a memory fraction set (set_fraction in malloc).
TEST(AllocatorScenario, GarbageCollectionNeedsAMemoryFraction) {
  CheckedAllocator a("garbage_collection_threshold:0.3", 100 * MiB);
  a.Free(a.Malloc(12 * MiB));
  a.Free(a.Malloc(30 * MiB));
  a.Free(a.Malloc(20 * MiB));
  a.Malloc(40 * MiB);
  EXPECT_EQ(a.Layout(), "l0[F12M] l0[F30M] l0[A40M]");
  EXPECT_EQ(a.stats().num_device_free, 0u);
}

// round_size with roundup_power2_divisions:4. 1200 B is not above
// 512 * 4 = 2048, so it gets plain 512-byte rounding (1536, not 1280);
// 4600 B -> next quarter of [4096, 8192) = 5120; 1200 MiB -> next quarter
// of [1 GiB, 2 GiB) = 1280 MiB (a 1280 MiB segment).
TEST(AllocatorScenario, RoundupPower2DivisionsRoundsToQuarterSteps) {
  CheckedAllocator a("roundup_power2_divisions:4");
  EXPECT_EQ(a.raw().BlockSize(a.Malloc(1200)), 1536u);
  EXPECT_EQ(a.raw().BlockSize(a.Malloc(4600)), 5120u);
  EXPECT_EQ(a.raw().BlockSize(a.Malloc(1200 * MiB)), 1280 * MiB);
  EXPECT_EQ(a.Layout(), "s0[A1.5K A5K F2041.5K] l0[A1280M]");
}

// The list form: [256:1,512:2,1024:4,>:8]. ">" fills the intervals after
// the last key's one, so 1024 keeps its 4 (torch 2.9-2.11
// AcceleratorAllocatorConfig::parseRoundUpPower2Divisions; 2.4-2.8 overwrote
// it with 8). 300 MiB (interval 256 MiB, 1 division) stays 300 MiB; 600 MiB
// (2) -> 768 MiB; 1100 MiB (4: steps of 256 MiB) -> 1280 MiB; 2100 MiB (8:
// steps of 256 MiB in [2 GiB, 4 GiB)) -> 2304 MiB.
TEST(AllocatorScenario, RoundupPower2DivisionsListAppliesPerInterval) {
  CheckedAllocator a("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]");
  EXPECT_EQ(a.raw().BlockSize(a.Malloc(300 * MiB)), 300 * MiB);
  EXPECT_EQ(a.raw().BlockSize(a.Malloc(600 * MiB)), 768 * MiB);
  EXPECT_EQ(a.raw().BlockSize(a.Malloc(1100 * MiB)), 1280 * MiB);
  EXPECT_EQ(a.raw().BlockSize(a.Malloc(2100 * MiB)), 2304 * MiB);
}

// vramscope's ideal mode: no rounding, no caching.
TEST(AllocatorScenario, IdealModeReservesExactlyWhatIsAllocated) {
  CheckedAllocator a("ideal:True");
  BlockHandle x = a.Malloc(100);
  BlockHandle y = a.Malloc(11 * MiB);
  EXPECT_EQ(a.stats().allocated_bytes, 11 * MiB + 100);
  EXPECT_EQ(a.stats().reserved_bytes, 11 * MiB + 100);
  EXPECT_EQ(a.Layout(), "s0[A100B] l0[A11M]");
  a.Free(x);
  EXPECT_EQ(a.stats().reserved_bytes, 11 * MiB);
  a.Free(y);
  EXPECT_EQ(a.stats().reserved_bytes, 0u);
  EXPECT_EQ(a.stats().peak_reserved_bytes, 11 * MiB + 100);
  EXPECT_EQ(a.Layout(), "");
}

TEST(AllocatorScenario, IdealModeOomsOnlyWhenLiveBytesExceedTheLimit) {
  CheckedAllocator a("ideal:True", 1000);
  BlockHandle x = a.Malloc(600);
  EXPECT_FALSE(a.TryMalloc(401).has_value());
  EXPECT_NE(a.raw().last_oom()->message.find("Tried to allocate 401 bytes."), std::string::npos);
  a.Malloc(400);
  a.Free(x);
  a.Malloc(600);
  EXPECT_EQ(a.stats().reserved_bytes, 1000u);
}

// NativeCachingAllocator::allocate rejects >= 1 EB before malloc runs.
TEST(AllocatorScenario, RequestOfOneExabyteIsRejectedUpFront) {
  CheckedAllocator a("");
  EXPECT_FALSE(a.TryMalloc(uint64_t{1} << 60).has_value());
  EXPECT_EQ(a.raw().last_oom()->message,
            "CUDA out of memory. Tried to allocate more than 1EB memory.");
  EXPECT_EQ(a.stats().num_ooms, 0u);
}

// Byte counts up to 2^62 do not overflow: four requests just under 1 EB on
// a 2^62-byte device, then an OOM with sane numbers.
TEST(AllocatorScenario, ByteCountsUpTo2To62DoNotOverflow) {
  const uint64_t limit = uint64_t{1} << 62;
  const uint64_t big = (uint64_t{1} << 60) - 2 * MiB;
  CheckedAllocator a("", limit);
  for (int i = 0; i < 4; ++i) a.Malloc(big);
  EXPECT_EQ(a.stats().reserved_bytes, 4 * big);
  EXPECT_EQ(a.stats().allocated_bytes, 4 * big);
  EXPECT_FALSE(a.TryMalloc(10 * MiB).has_value());  // 8 MiB free
  EXPECT_EQ(a.raw().last_oom()->free_device_bytes, 8 * MiB);
  EXPECT_NE(a.raw().last_oom()->message.find("total capacity of 4294967296.00 GiB"),
            std::string::npos);
  CheckedAllocator e("expandable_segments:True", limit);
  e.Malloc(big);
  const uint64_t page = 20 * MiB;
  EXPECT_EQ(e.stats().reserved_bytes, (big + page - 1) / page * page);
}

}  // namespace
}  // namespace vramscope::testing
