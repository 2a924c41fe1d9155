// LiveMap against std::unordered_map on random insert / erase / find
// sequences with sequential, strided and arbitrary ids.
#include "live_map.h"

#include <gtest/gtest.h>

#include <random>
#include <unordered_map>
#include <vector>

namespace vramscope::sim {
namespace {

void CheckAgainstReference(uint64_t (*make_id)(std::mt19937_64&, uint64_t), uint64_t seed) {
  std::mt19937_64 rng(seed);
  LiveMap<uint64_t> map;
  std::unordered_map<uint64_t, uint64_t> want;
  std::vector<uint64_t> ids;
  for (uint64_t n = 0; n < 200000; ++n) {
    if (ids.empty() || rng() % 100 < 52) {
      const uint64_t id = make_id(rng, n);
      if (want.count(id) != 0) {
        ASSERT_NE(map.Find(id), nullptr);
        continue;
      }
      ASSERT_EQ(map.Find(id), nullptr);
      map.Insert(id) = n;
      want[id] = n;
      ids.push_back(id);
    } else {
      const size_t k = rng() % ids.size();
      const uint64_t id = ids[k];
      ids[k] = ids.back();
      ids.pop_back();
      const uint64_t* value = map.Find(id);
      ASSERT_NE(value, nullptr);
      EXPECT_EQ(*value, want[id]);
      ASSERT_TRUE(map.Erase(id));
      EXPECT_FALSE(map.Erase(id));
      want.erase(id);
    }
    ASSERT_EQ(map.size(), want.size());
  }
  size_t seen = 0;
  map.ForEach([&](uint64_t id, const uint64_t& value) {
    ++seen;
    auto it = want.find(id);
    ASSERT_NE(it, want.end());
    EXPECT_EQ(value, it->second);
  });
  EXPECT_EQ(seen, want.size());
}

TEST(LiveMap, SequentialIds) {
  CheckAgainstReference([](std::mt19937_64&, uint64_t n) { return n + 1; }, 1);
}

TEST(LiveMap, StridedIds) {
  // Device addresses: multiples of 512 and of 2 MiB.
  CheckAgainstReference([](std::mt19937_64&, uint64_t n) { return 0x7f0000000000 + n * 512; }, 2);
  CheckAgainstReference([](std::mt19937_64&, uint64_t n) { return n << 21; }, 3);
}

TEST(LiveMap, ArbitraryIdsIncludingExtremes) {
  CheckAgainstReference(
      [](std::mt19937_64& rng, uint64_t) {
        const uint64_t r = rng();
        return r % 8 == 0 ? ~uint64_t{0} - r % 4 : r % 8 == 1 ? r % 4 : r;
      },
      4);
}

}  // namespace
}  // namespace vramscope::sim
