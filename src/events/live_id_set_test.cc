#include "live_id_set.h"

#include <random>
#include <unordered_set>

#include <gtest/gtest.h>

namespace vramscope::events_internal {
namespace {

TEST(LiveIdSet, InsertEraseContains) {
  LiveIdSet set;
  EXPECT_FALSE(set.Contains(0));
  EXPECT_FALSE(set.Erase(0));
  EXPECT_TRUE(set.Insert(0));
  EXPECT_FALSE(set.Insert(0));
  EXPECT_TRUE(set.Contains(0));
  EXPECT_EQ(set.size(), 1u);
  EXPECT_TRUE(set.Erase(0));
  EXPECT_FALSE(set.Erase(0));
  EXPECT_EQ(set.size(), 0u);
}

// ~0 is the table's empty-slot marker and is kept outside the table.
TEST(LiveIdSet, LargestIdIsAnOrdinaryMember) {
  LiveIdSet set;
  const uint64_t max_id = ~uint64_t{0};
  EXPECT_TRUE(set.Insert(max_id));
  EXPECT_FALSE(set.Insert(max_id));
  EXPECT_TRUE(set.Contains(max_id));
  EXPECT_FALSE(set.Contains(max_id - 1));
  EXPECT_EQ(set.size(), 1u);
  EXPECT_TRUE(set.Erase(max_id));
  EXPECT_FALSE(set.Contains(max_id));
}

// Randomized against std::unordered_set; small id ranges force long probe
// runs, wrap-around and many backward shifts.
TEST(LiveIdSet, MatchesStdUnorderedSet) {
  for (uint64_t id_range : {16u, 1000u, 1u << 20}) {
    std::mt19937_64 rng(id_range);
    LiveIdSet set;
    std::unordered_set<uint64_t> reference;
    for (int i = 0; i < 200000; ++i) {
      const uint64_t id = rng() % id_range;
      if (rng() % 3 != 0) {
        ASSERT_EQ(set.Insert(id), reference.insert(id).second);
      } else {
        ASSERT_EQ(set.Erase(id), reference.erase(id) == 1);
      }
      ASSERT_EQ(set.size(), reference.size());
    }
    for (uint64_t id = 0; id < std::min<uint64_t>(id_range, 5000); ++id) {
      ASSERT_EQ(set.Contains(id), reference.count(id) == 1) << id;
    }
  }
}

TEST(LiveIdSet, ManySequentialIdsThenAllFreed) {
  LiveIdSet set;
  for (uint64_t id = 0; id < 100000; ++id) ASSERT_TRUE(set.Insert(id * 4096));
  for (uint64_t id = 0; id < 100000; ++id) ASSERT_TRUE(set.Erase(id * 4096));
  EXPECT_EQ(set.size(), 0u);
  EXPECT_FALSE(set.Contains(0));
}

}  // namespace
}  // namespace vramscope::events_internal
