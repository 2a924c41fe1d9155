// The --from readers' shared layer: one file's reading state and the typed
// member readers every format uses (cli/from_config.cc), and each format's
// entry point (from_config.cc: DeepSpeed, TrainingArguments, accelerate,
// Axolotl; from_trl.cc, from_torchtune.cc, from_litgpt.cc).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "from_config.h"

namespace vramscope::cli {
// A named namespace, not an anonymous one: the CLI is a unity build, and these
// short names must not meet another file's helpers.
namespace fromcfg {

using Json = nlohmann::json;

// Deeper than any real config; guards nlohmann's recursion (docs/hardening.md).
constexpr size_t kMaxConfigDepth = 64;
// Items in one list a config holds (PEFT's target modules, FSDP's options):
// real ones have tens. A longer list is refused before its items are read, so
// that a file of millions of names costs neither time nor a line per name.
constexpr size_t kMaxListItems = 1024;
// Lines of "not modelled" keys one reading lists; more are summed up in one.
constexpr size_t kMaxNotModelled = 64;

// The state of reading one file: where knobs and errors go.
struct Reader {
  std::string file;
  FromConfig* out;
  int transformers_major;
  const ConfigFileReader* read;
  // Key names as the file spells them, when the keys read are a DeepSpeed
  // config built from another format's (accelerate's deepspeed_config).
  const std::vector<std::pair<std::string, std::string>>* rename = nullptr;

  std::string Key(std::string_view key) const {
    if (rename) {
      for (const auto& [from, to] : *rename) {
        if (key == from) return to;
      }
    }
    return std::string(key);
  }
  Error Bad(std::string_view key, std::string_view why) const {
    return MakeError(fmt::format("{}: {}: {}", file, Key(key), why));
  }
  void Set(std::string flag, std::string value, std::string key) const {
    out->knobs.push_back({std::move(flag), std::move(value), file, Key(key), {}, {}});
  }
  // A whole-number knob (the number kept as read, not as text).
  void SetCount(std::string flag, int64_t value, std::string key) const {
    out->knobs.push_back(
        {std::move(flag), std::to_string(value), file, Key(key), value, std::nullopt});
  }
  // A fraction knob (--lora-dropout).
  void SetFraction(std::string flag, double value, std::string key) const {
    out->knobs.push_back(
        {std::move(flag), fmt::format("{}", value), file, Key(key), std::nullopt, value});
  }
  // A knob another reading produced, under this reading's key.
  void Copy(const FileKnob& knob, std::string key) const {
    FileKnob k = knob;
    k.file = file;
    k.key = Key(key);
    out->knobs.push_back(std::move(k));
  }
  // Each line once, and at most kMaxNotModelled of them: a key repeated in a
  // list (an FSDP option given a million times) is one warning, not a million.
  void NotModelled(std::string_view key, std::string_view why) const {
    std::string line = fmt::format("{}: {} ({})", file, Key(key), why);
    std::vector<std::string>& lines = out->not_modelled;
    if (lines.size() > kMaxNotModelled) return;
    for (const std::string& l : lines) {
      if (l == line) return;
    }
    if (lines.size() == kMaxNotModelled) line = file + ": more keys not modelled (not listed)";
    lines.push_back(std::move(line));
  }
  void Note(std::string_view what, std::string_view key, std::string_view why) const {
    out->notes.push_back(fmt::format("{} (from {}: {}): {}", what, file, Key(key), why));
  }
};

// A value as an error message shows it: quoted, control characters escaped.
std::string Shown(const Json& v);

// A list of at most kMaxListItems items (checked before any is read).
inline Status ShortList(const Reader& r, const Json& list, std::string_view path) {
  if (!list.is_array() || list.size() <= kMaxListItems) return Ok{};
  return r.Bad(path, fmt::format("a list of {} items; a config lists at most {}", list.size(),
                                 kMaxListItems));
}

// An object member that must be an object when present (null: absent).
Result<const Json*> Object(const Reader& r, const Json& parent, const char* key,
                           const std::string& path);
// A whole number in lo..hi, or "auto" (nullopt), or absent (nullopt).
Result<std::optional<int64_t>> Number(const Reader& r, const Json& parent, const char* key,
                                      const std::string& path, int64_t lo, int64_t hi);
// A boolean, or "auto" / absent (nullopt).
Result<std::optional<bool>> Bool(const Reader& r, const Json& parent, const char* key,
                                 const std::string& path);
// A number in [0, 1) (a dropout probability), or absent / null (nullopt).
Result<std::optional<double>> Fraction(const Reader& r, const Json& parent, const char* key,
                                       const std::string& path);
// A string member, or "" when absent / null.
Result<std::string> String(const Reader& r, const Json& parent, const char* key,
                           const std::string& path);

template <size_t N>
bool HasAny(const Json& root, const char* const (&keys)[N]) {
  for (const char* key : keys) {
    if (root.contains(key)) return true;
  }
  return false;
}

// TrainingArguments' keys (from_config.cc), which TRL's configs extend.
Status ReadTrainingArguments(const Reader& r, const Json& root);
Status ReadHfCheckpointing(const Reader& r, const Json& root);

// Each format: whether a parsed file is one, and its reader.
bool LooksLikeTrl(const Json& root);
Status ReadTrl(const Reader& r, const Json& root);
bool LooksLikeTorchtune(const Json& root);
Status ReadTorchtune(const Reader& r, const Json& root);
bool LooksLikeLitgpt(const Json& root);
Status ReadLitgpt(const Reader& r, const Json& root);

}  // namespace fromcfg
}  // namespace vramscope::cli
