// The catalog's data/models/*.json files, embedded at build time by
// embed_catalog.cmake into a generated catalog_data.cc (no runtime file access).
#pragma once

#include <cstddef>
#include <string_view>

namespace vramscope::ingest {

struct EmbeddedFile {
  std::string_view file_name;  // "llama-3-8b.json"
  std::string_view text;       // the file's bytes
};

extern const EmbeddedFile kCatalogFiles[];
extern const size_t kCatalogFileCount;

}  // namespace vramscope::ingest
