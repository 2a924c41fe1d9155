// round_size, get_allocation_size and format_size (torch 2.4-2.11).
#include <gtest/gtest.h>

#include "sizing.h"
#include "vramscope/allocator.h"

namespace vramscope {
namespace {

AllocatorConfig Divisions(uint32_t d) {
  AllocatorConfig c;
  c.roundup_power2_divisions.fill(d);
  return c;
}

TEST(RoundSize, RoundsUpTo512ByteMultiples) {
  const AllocatorConfig c;
  EXPECT_EQ(RoundSize(1, c), 512u);
  EXPECT_EQ(RoundSize(511, c), 512u);
  EXPECT_EQ(RoundSize(512, c), 512u);
  EXPECT_EQ(RoundSize(513, c), 1024u);
  EXPECT_EQ(RoundSize(kMiB + 1, c), kMiB + 512);
}

TEST(RoundSize, PowerOfTwoDivisionsOnlyAbove512TimesDivisions) {
  const AllocatorConfig c = Divisions(4);
  EXPECT_EQ(RoundSize(1200, c), 1536u);  // 1200 <= 2048: plain rounding
  EXPECT_EQ(RoundSize(2048, c), 2048u);
  EXPECT_EQ(RoundSize(2100, c), 2560u);  // [2048, 4096) in steps of 512
  EXPECT_EQ(RoundSize(4600, c), 5120u);  // steps of 1024 (plain: 4608)
  EXPECT_EQ(RoundSize(4096, c), 4096u);  // powers of two stay
  EXPECT_EQ(RoundSize(1200 * kMiB, c), 1280 * kMiB);
  EXPECT_EQ(RoundSize(1200 * kMiB, Divisions(1)), 1200 * kMiB);  // 1 = off
  // Division step below one byte: round to the next power of two.
  EXPECT_EQ(RoundSize(3000, Divisions(1u << 30)), 3072u);  // 3000 < 512 * 2^30: plain
}

TEST(RoundSize, DivisionIntervalIsLog2MinusTwenty) {
  AllocatorConfig c;
  c.roundup_power2_divisions[0] = 8;                              // < 2 MiB
  c.roundup_power2_divisions[1] = 2;                              // [2, 4) MiB
  c.roundup_power2_divisions[15] = 2;                             // >= 32 GiB
  EXPECT_EQ(RoundSize(kMiB + kMiB / 3, c), kMiB + 3 * kMiB / 8);  // eighths of [1, 2) MiB
  EXPECT_EQ(RoundSize(3 * kMiB - 7, c), 3 * kMiB);                // halves of [2, 4) MiB
  EXPECT_EQ(RoundSize(5 * kMiB, c), 5 * kMiB);                    // interval 2: off
  EXPECT_EQ(RoundSize(100 * kGiB + 1, c), 128 * kGiB);
}

TEST(RoundSize, SaturatesInsteadOfOverflowing) {
  const AllocatorConfig c;
  EXPECT_EQ(RoundSize(uint64_t{1} << 62, c), uint64_t{1} << 62);
  EXPECT_EQ(RoundSize(kUnlimited, c), kUnlimited);
  EXPECT_EQ(RoundSize(kUnlimited - 3, Divisions(4)), kUnlimited);
}

TEST(SegmentSizeFor, FollowsGetAllocationSize) {
  EXPECT_EQ(SegmentSizeFor(512), 2 * kMiB);
  EXPECT_EQ(SegmentSizeFor(kMiB), 2 * kMiB);
  EXPECT_EQ(SegmentSizeFor(kMiB + 512), 20 * kMiB);
  EXPECT_EQ(SegmentSizeFor(10 * kMiB - 512), 20 * kMiB);
  EXPECT_EQ(SegmentSizeFor(10 * kMiB), 10 * kMiB);
  EXPECT_EQ(SegmentSizeFor(11 * kMiB), 12 * kMiB);
  EXPECT_EQ(SegmentSizeFor(12 * kMiB + 1), 14 * kMiB);
  EXPECT_EQ(SegmentSizeFor(uint64_t{1} << 62), uint64_t{1} << 62);
  EXPECT_EQ(SegmentSizeFor(kUnlimited - 5), kUnlimited);
}

TEST(FormatSize, MatchesPyTorchFormatSize) {
  EXPECT_EQ(alloc::FormatSize(0), "0 bytes");
  EXPECT_EQ(alloc::FormatSize(1024), "1024 bytes");
  EXPECT_EQ(alloc::FormatSize(1025), "1.00 KiB");
  EXPECT_EQ(alloc::FormatSize(kMiB), "1024.00 KiB");
  EXPECT_EQ(alloc::FormatSize(20 * kMiB), "20.00 MiB");
  EXPECT_EQ(alloc::FormatSize(kGiB), "1024.00 MiB");
  EXPECT_EQ(alloc::FormatSize(79 * kGiB + kGiB / 4), "79.25 GiB");
}

}  // namespace
}  // namespace vramscope
