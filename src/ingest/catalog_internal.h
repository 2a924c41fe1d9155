// Catalog look-ups shared by catalog.cc and resolve.cc.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "vramscope/model.h"

namespace vramscope::ingest {

// The entry whose alias or hub id equals `name` ignoring ASCII case; nullptr if none.
const CatalogEntry* FindCatalogEntry(std::string_view name);

// Up to `max_count` catalog aliases close to `name` (edit distance on aliases
// and hub ids, or containing it), best first.
std::vector<std::string> SuggestCatalogAliases(std::string_view name, size_t max_count);

// ", did you mean a, b?" or "" when nothing is close.
std::string DidYouMean(std::string_view name);

// For an instruction- or chat-tuned Hub id ("org/Name-Instruct", "-chat",
// "-it") whose base id is in the catalog: "; its base model ... is in the
// catalog ..." naming the base's alias; "" otherwise.
std::string BaseModelHint(std::string_view repo_id);

}  // namespace vramscope::ingest
