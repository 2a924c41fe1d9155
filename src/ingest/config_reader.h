// ConfigReader: typed, validated access to the keys of one config.json object.
//
// Each getter returns the key's value when present, or the default that the
// transformers config class applies when the key is absent. A JSON `null`
// counts as absent (transformers treats `None` like a missing argument) except
// where a caller asks IsNull() to tell them apart. The first problem found is
// kept as a one-line Error naming the file, the field and the problem; later
// getters then return their defaults, so family readers stay straight-line code
// and check error() once at the end. Not thread-safe; cheap to construct.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "vramscope/common/json_depth.h"
#include "vramscope/common/quote.h"
#include "vramscope/result.h"

namespace vramscope::ingest {

class ConfigReader {
 public:
  // `object` must outlive the reader. `context` prefixes every message, e.g.
  // "models/x/config.json" or "config.json: text_config".
  ConfigReader(const nlohmann::json& object, std::string context);

  bool Has(std::string_view key) const;      // present and not null
  bool IsNull(std::string_view key) const;   // present and null
  bool IsArray(std::string_view key) const;  // present and a JSON array

  // Integer in [min, max]; `def` when absent. Rejects strings, floats, bools.
  uint64_t Uint(std::string_view key, uint64_t def, uint64_t min, uint64_t max);
  // Same, but nullopt when absent or null.
  std::optional<uint64_t> OptUint(std::string_view key, uint64_t min, uint64_t max);
  // First present key of `keys` (aliases such as n_embd / hidden_size).
  std::optional<uint64_t> OptUintAny(std::initializer_list<std::string_view> keys, uint64_t min,
                                     uint64_t max);
  bool Bool(std::string_view key, bool def);
  double Number(std::string_view key, double def, double min, double max);
  std::string String(std::string_view key, std::string def);
  std::vector<uint64_t> UintList(std::string_view key, uint64_t max);
  std::vector<std::string> StringList(std::string_view key);
  // The nested object at `key`, or nullptr when absent or null.
  const nlohmann::json* Object(std::string_view key);

  // Records a problem with `field` unless one is already recorded.
  void Fail(std::string_view field, std::string_view problem);
  // Adopts the error of a nested reader (its context already names the path).
  void Adopt(const ConfigReader& nested);
  bool ok() const { return !error_.has_value(); }
  const Error& error() const { return *error_; }
  const std::string& context() const { return context_; }

 private:
  const nlohmann::json* Find(std::string_view key) const;

  const nlohmann::json& object_;
  std::string context_;
  std::optional<Error> error_;
};

// "string \"4096\"", "number 4096.5", "true", "array", ... for messages.
// Strings are quoted, escaped and cut after 40 bytes by
// common::QuoteForMessage, so a message stays one printable line.
std::string DescribeJson(const nlohmann::json& value);

// Arrays and objects nested deeper than this are rejected before parsing
// (docs/hardening.md): nlohmann::json builds every level, about 100 bytes
// each, so a 16 MiB file of '[' would take over a gigabyte. config.json and
// safetensors headers nest 3 or 4 levels.
inline constexpr size_t kMaxJsonDepth = 64;

// The check itself: common::JsonNestsDeeperThan (vramscope/common/json_depth.h).

}  // namespace vramscope::ingest
