#include "vramscope/category.h"

#include <set>
#include <string>

#include <gtest/gtest.h>

namespace vramscope {
namespace {

TEST(Category, TokenAndJsonKeyParseBackToTheSameCategory) {
  for (Category c : kAllCategories) {
    EXPECT_EQ(ParseCategory(CategoryToken(c)), c) << CategoryToken(c);
    EXPECT_EQ(ParseCategory(CategoryJsonKey(c)), c) << CategoryJsonKey(c);
  }
}

TEST(Category, NamesMatchTheDocumentedTable) {
  EXPECT_EQ(CategoryToken(Category::kParameters), "param");
  EXPECT_EQ(CategoryJsonKey(Category::kParameters), "parameters");
  EXPECT_EQ(CategoryToken(Category::kOptimizerState), "optim");
  EXPECT_EQ(CategoryJsonKey(Category::kOptimizerState), "optimizer_state");
  EXPECT_EQ(CategoryToken(Category::kWorkspace), "work");
  EXPECT_EQ(CategoryJsonKey(Category::kWorkspace), "workspace");
  EXPECT_EQ(CategoryToken(Category::kOther), "other");
}

TEST(Category, AllNamesAreDistinct) {
  std::set<std::string> tokens;
  std::set<std::string> keys;
  for (Category c : kAllCategories) {
    tokens.emplace(CategoryToken(c));
    keys.emplace(CategoryJsonKey(c));
  }
  EXPECT_EQ(tokens.size(), static_cast<size_t>(kNumCategories));
  EXPECT_EQ(keys.size(), static_cast<size_t>(kNumCategories));
}

TEST(Category, UnknownAndNearMissNamesAreRejected) {
  EXPECT_FALSE(ParseCategory(""));
  EXPECT_FALSE(ParseCategory("Param"));
  EXPECT_FALSE(ParseCategory("params"));
  EXPECT_FALSE(ParseCategory("param "));
  EXPECT_FALSE(ParseCategory("weights"));
}

}  // namespace
}  // namespace vramscope
