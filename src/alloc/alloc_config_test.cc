// ParseAllocConf: PYTORCH_CUDA_ALLOC_CONF syntax and torch 2.4-2.8's checks
// (c10/cuda/CUDAAllocatorConfig.cpp).
#include <gtest/gtest.h>

#include <string>

#include "vramscope/alloc_config.h"

namespace vramscope {
namespace {

AllocatorConfig Parse(std::string_view text) {
  Result<AllocatorConfig> r = ParseAllocConf(text);
  EXPECT_TRUE(r.ok()) << text << ": " << (r.ok() ? "" : r.error().message);
  return r.ok() ? r.value() : AllocatorConfig{};
}

std::string ErrorOf(std::string_view text) {
  Result<AllocatorConfig> r = ParseAllocConf(text);
  EXPECT_FALSE(r.ok()) << text << " should be rejected";
  return r.ok() ? "" : r.error().message;
}

TEST(ParseAllocConf, EmptyStringGivesPyTorchDefaults) {
  const AllocatorConfig c = Parse("");
  EXPECT_FALSE(c.ideal);
  EXPECT_FALSE(c.expandable_segments);
  EXPECT_EQ(c.max_split_size_bytes, kUnlimited);
  EXPECT_EQ(c.max_non_split_rounding_bytes, 20 * kMiB);
  EXPECT_EQ(c.garbage_collection_threshold, 0.0);
  EXPECT_FALSE(c.per_process_memory_fraction.has_value());
  for (uint32_t d : c.roundup_power2_divisions) EXPECT_EQ(d, 0u);
}

TEST(ParseAllocConf, EveryModelledKey) {
  const AllocatorConfig c = Parse(
      "expandable_segments:True,max_split_size_mb:128,max_non_split_rounding_mb:64,"
      "garbage_collection_threshold:0.6,per_process_memory_fraction:0.9");
  EXPECT_TRUE(c.expandable_segments);
  EXPECT_EQ(c.max_split_size_bytes, 128 * kMiB);
  EXPECT_EQ(c.max_non_split_rounding_bytes, 64 * kMiB);
  EXPECT_DOUBLE_EQ(c.garbage_collection_threshold, 0.6);
  EXPECT_DOUBLE_EQ(*c.per_process_memory_fraction, 0.9);
  EXPECT_EQ(c.text,
            "expandable_segments:True,max_split_size_mb:128,max_non_split_rounding_mb:64,"
            "garbage_collection_threshold:0.6,per_process_memory_fraction:0.9");
  EXPECT_TRUE(Parse("ideal:True").ideal);
  EXPECT_FALSE(Parse("expandable_segments:False").expandable_segments);
}

TEST(ParseAllocConf, SpacesAreIgnoredAndTrailingCommaAccepted) {
  const AllocatorConfig c = Parse(" expandable_segments : True , max_split_size_mb: 21 ,");
  EXPECT_TRUE(c.expandable_segments);
  EXPECT_EQ(c.max_split_size_bytes, 21 * kMiB);
}

TEST(ParseAllocConf, RoundupSingleValueAppliesToEveryInterval) {
  const AllocatorConfig c = Parse("roundup_power2_divisions:4");
  for (uint32_t d : c.roundup_power2_divisions) EXPECT_EQ(d, 4u);
}

TEST(ParseAllocConf, RoundupListFillsIntervalsLikePyTorch) {
  // Keys are MB powers of two: 256 -> interval 8 (sizes 256-512 MiB).
  // Intervals below the first key get its value; ">" fills the intervals
  // after the last key's one (torch 2.9-2.11), so 1024's 4 stays.
  const AllocatorConfig c = Parse("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]");
  const auto& d = c.roundup_power2_divisions;
  for (int i = 0; i <= 8; ++i) EXPECT_EQ(d[i], 1u) << i;
  EXPECT_EQ(d[9], 2u);
  EXPECT_EQ(d[10], 4u);
  for (int i = 11; i < 16; ++i) EXPECT_EQ(d[i], 8u) << i;
}

TEST(ParseAllocConf, RoundupListMatchesTorchAllocatorConfigTest) {
  // The case of c10/test/core/AllocatorConfig_test.cpp (torch 2.9+):
  // [64:8,128:2,256:4,512:2,1024:4,>:1] gives 8 for 32 and 64 MB, 2 for 128,
  // 4 for 256, 2 for 512, 4 for 1024 and 1 from 2048 MB on. Interval index
  // = log2(MB), so 32 MB is interval 5.
  const AllocatorConfig c = Parse("roundup_power2_divisions:[64:8,128:2,256:4,512:2,1024:4,>:1]");
  const auto& d = c.roundup_power2_divisions;
  const uint32_t expected[16] = {8, 8, 8, 8, 8, 8, 8, 2, 4, 2, 4, 1, 1, 1, 1, 1};
  for (int i = 0; i < 16; ++i) EXPECT_EQ(d[i], expected[i]) << i;
}

TEST(ParseAllocConf, RoundupListGreaterThanAloneLeavesIntervalZero) {
  // With no key before it, ">" starts at interval 1 (last_index + 1 with
  // last_index 0): sizes below 2 MiB keep plain 512-byte rounding.
  const AllocatorConfig c = Parse("roundup_power2_divisions:[>:4]");
  EXPECT_EQ(c.roundup_power2_divisions[0], 0u);
  for (int i = 1; i < 16; ++i) EXPECT_EQ(c.roundup_power2_divisions[i], 4u) << i;
}

TEST(ParseAllocConf, RoundupListWithoutGreaterThanKeepsLaterIntervalsOff) {
  const AllocatorConfig c = Parse("roundup_power2_divisions:[1:2, 64:4]");
  EXPECT_EQ(c.roundup_power2_divisions[0], 2u);
  // Only intervals below the first key are filled; between keys stays 0.
  EXPECT_EQ(c.roundup_power2_divisions[5], 0u);
  EXPECT_EQ(c.roundup_power2_divisions[6], 4u);
  EXPECT_EQ(c.roundup_power2_divisions[7], 0u);
  EXPECT_EQ(c.roundup_power2_divisions[15], 0u);
}

TEST(ParseAllocConf, AcceptedKeysWithoutEffect) {
  Parse(
      "backend:native,release_lock_on_cudamalloc:True,pinned_use_cuda_host_register:True,"
      "pinned_num_register_threads:8,pinned_use_background_threads:False,"
      "pinned_reserve_segment_size_mb:16,graph_capture_record_stream_reuse:False");
}

TEST(ParseAllocConf, CudaMallocAsyncBackendIsRejectedAsNotModelled) {
  const std::string e = ErrorOf("backend:cudaMallocAsync");
  EXPECT_NE(e.find("backend"), std::string::npos);
  EXPECT_NE(e.find("not modelled"), std::string::npos);
  EXPECT_NE(ErrorOf("backend:jemalloc").find("\"jemalloc\""), std::string::npos);
}

TEST(ParseAllocConf, UnknownKeyIsNamed) {
  const std::string e = ErrorOf("expandable_segments:True,max_split_size:128");
  EXPECT_EQ(e, "PYTORCH_CUDA_ALLOC_CONF: unknown key \"max_split_size\"");
  EXPECT_EQ(e.find('\n'), std::string::npos);
}

TEST(ParseAllocConf, MaxSplitSizeMustBeAtLeast20MB) {
  // torch 2.9-2.11 parseMaxSplitSize / parseMaxNonSplitRoundingSize:
  // "must be >= 20" (kLargeBuffer / MB); 2.4-2.8 refused 20 itself.
  EXPECT_EQ(Parse("max_split_size_mb:20").max_split_size_bytes, 20 * kMiB);
  EXPECT_EQ(ErrorOf("max_split_size_mb:19"),
            "PYTORCH_CUDA_ALLOC_CONF: max_split_size_mb: \"19\" is too small, must be >= 20");
  EXPECT_EQ(Parse("max_split_size_mb:21").max_split_size_bytes, 21 * kMiB);
  EXPECT_EQ(Parse("max_non_split_rounding_mb:20").max_non_split_rounding_bytes, 20 * kMiB);
  EXPECT_NE(ErrorOf("max_non_split_rounding_mb:19").find("max_non_split_rounding_mb"),
            std::string::npos);
}

TEST(ParseAllocConf, BadValuesNameKeyAndValue) {
  EXPECT_EQ(ErrorOf("max_split_size_mb:big"),
            "PYTORCH_CUDA_ALLOC_CONF: max_split_size_mb: \"big\" is not a non-negative integer");
  EXPECT_NE(ErrorOf("max_split_size_mb:-5").find("\"-5\""), std::string::npos);
  EXPECT_NE(ErrorOf("max_split_size_mb:99999999999").find("out of range"), std::string::npos);
  EXPECT_EQ(ErrorOf("expandable_segments:true"),
            "PYTORCH_CUDA_ALLOC_CONF: expandable_segments: \"true\" must be True or False");
  EXPECT_NE(ErrorOf("garbage_collection_threshold:1.0").find("\"1.0\""), std::string::npos);
  EXPECT_NE(ErrorOf("garbage_collection_threshold:0").find("(0.0, 1.0)"), std::string::npos);
  EXPECT_NE(ErrorOf("garbage_collection_threshold:x").find("not a number"), std::string::npos);
  EXPECT_NE(ErrorOf("per_process_memory_fraction:1.5").find("[0.0, 1.0]"), std::string::npos);
  EXPECT_NE(ErrorOf("roundup_power2_divisions:3").find("power of 2"), std::string::npos);
  EXPECT_NE(ErrorOf("roundup_power2_divisions:0").find("\"0\""), std::string::npos);
  EXPECT_NE(ErrorOf("roundup_power2_divisions:[300:2]").find("\"300\""), std::string::npos);
  EXPECT_NE(ErrorOf("roundup_power2_divisions:[256:3]").find("\"3\""), std::string::npos);
  EXPECT_NE(ErrorOf("roundup_power2_divisions:[256:2").find("missing ']'"), std::string::npos);
  EXPECT_NE(ErrorOf("pinned_num_register_threads:256").find("<= 128"), std::string::npos);
  EXPECT_NE(ErrorOf("pinned_num_register_threads:3").find("power of 2"), std::string::npos);
  EXPECT_NE(ErrorOf("pinned_reserve_segment_size_mb:0").find("> 0"), std::string::npos);
  EXPECT_NE(ErrorOf("ideal:yes").find("ideal"), std::string::npos);
}

TEST(ParseAllocConf, MalformedSyntax) {
  EXPECT_NE(ErrorOf("expandable_segments").find("expected ':'"), std::string::npos);
  EXPECT_NE(ErrorOf("expandable_segments:").find("missing value"), std::string::npos);
  EXPECT_NE(ErrorOf("expandable_segments:True:30").find("expected ','"), std::string::npos);
  // Spaces are dropped before tokenizing (torch lexArgs), so a missing comma
  // glues two words together.
  EXPECT_NE(ErrorOf("expandable_segments:True max_split_size_mb:30")
                .find("\"Truemax_split_size_mb\" must be True or False"),
            std::string::npos);
  EXPECT_NE(ErrorOf(",expandable_segments:True").find("unknown key \",\""), std::string::npos);
}

TEST(ParseAllocConf, ValidateRejectsImpossibleProgrammaticConfigs) {
  AllocatorConfig c;
  EXPECT_TRUE(ValidateAllocConfig(c).ok());
  c.max_split_size_bytes = 4 * kMiB;
  EXPECT_FALSE(ValidateAllocConfig(c).ok());
  // torch 2.9-2.11: max_split_size_mb >= 20 (kLargeBuffer).
  c.max_split_size_bytes = 20 * kMiB;
  EXPECT_TRUE(ValidateAllocConfig(c).ok());
  c.max_split_size_bytes = 20 * kMiB - 1;
  EXPECT_FALSE(ValidateAllocConfig(c).ok());
  c = AllocatorConfig{};
  c.roundup_power2_divisions[3] = 3;
  EXPECT_FALSE(ValidateAllocConfig(c).ok());
}

}  // namespace
}  // namespace vramscope
