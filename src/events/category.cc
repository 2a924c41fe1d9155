// Category tokens and JSON keys (docs/event-stream.md, table "CATEGORY").
#include "vramscope/category.h"

namespace vramscope {
namespace {

struct CategoryNames {
  std::string_view token;     // event-stream files
  std::string_view json_key;  // report JSON "breakdown_at_peak"
};

// Indexed by the enum value; the order of kAllCategories.
constexpr std::array<CategoryNames, kNumCategories> kNames = {{
    {"param", "parameters"},
    {"grad", "gradients"},
    {"optim", "optimizer_state"},
    {"act", "activations"},
    {"loss", "loss"},
    {"temp", "temporaries"},
    {"comm", "communication"},
    {"work", "workspace"},
    {"other", "other"},
}};

}  // namespace

std::string_view CategoryToken(Category c) {
  const auto index = static_cast<size_t>(c);
  return index < kNames.size() ? kNames[index].token : std::string_view("other");
}

std::string_view CategoryJsonKey(Category c) {
  const auto index = static_cast<size_t>(c);
  return index < kNames.size() ? kNames[index].json_key : std::string_view("other");
}

std::optional<Category> ParseCategory(std::string_view text) {
  // Nine short strings: a linear scan is faster than any map here, and this
  // runs once per alloc line of the reader.
  for (size_t i = 0; i < kNames.size(); ++i) {
    if (text == kNames[i].token || text == kNames[i].json_key) {
      return static_cast<Category>(i);
    }
  }
  return std::nullopt;
}

}  // namespace vramscope
