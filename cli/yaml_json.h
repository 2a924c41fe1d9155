// A YAML document (an accelerate config, docs/configs.md) as the
// nlohmann::json value the --from readers consume, through libyaml. Only plain
// mappings, sequences and scalars: anchors, aliases, tags and a second
// document are refused, so the value is exactly what PyYAML's safe_load gives
// for the files `accelerate config` writes.
#pragma once

#include <cstddef>
#include <string>

#include <nlohmann/json.hpp>

#include "vramscope/result.h"

namespace vramscope::cli {

// False in a build without libyaml (the YAML reader is then an error).
bool YamlSupported();

// The document of `text` (no NUL byte: the caller checks) nested at most
// `max_depth` mappings / sequences deep. Plain scalars resolve as YAML 1.1
// does in PyYAML (null, ~, true/false/yes/no/on/off, integers, floats with a
// dot, .inf, .nan); quoted scalars are strings. An Error is one line without
// the file name: "not valid YAML (line L, column C: why)" or what is refused.
// At most `max_values` scalars, mappings and sequences in all (a 16 MiB file
// of tiny items would be millions of values, hundreds of megabytes parsed).
Result<nlohmann::json> YamlToJson(const std::string& text, size_t max_depth,
                                  size_t max_values = size_t{1} << 18);

}  // namespace vramscope::cli
