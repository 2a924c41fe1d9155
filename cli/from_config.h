// --from FILE: the knobs of a DeepSpeed config JSON, of Hugging Face
// TrainingArguments saved as JSON, of an accelerate config or of an Axolotl
// training config (docs/configs.md), as flag assignments that flags given on
// the command line override.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "vramscope/result.h"

namespace vramscope::cli {

// One knob a file sets: `flag` (a flag of DESIGN.md) takes `value`, read from
// `key` of `file`. A numeric knob keeps the number as read (`count` or
// `fraction`; `value` is then only its text for the report): the setup takes
// the typed value, never the text parsed back (1e-320 is a valid dropout that
// std::stod refuses).
struct FileKnob {
  std::string flag, value, file, key;
  std::optional<int64_t> count;    // --batch, --gpus, --zero-*-size, ...
  std::optional<double> fraction;  // --lora-dropout
};

struct FromConfig {
  std::vector<FileKnob> knobs;  // in reading order: a later one wins
  // "FILE: KEY (why)" for each key that changes memory but is not modelled.
  std::vector<std::string> not_modelled;
  // "WHAT (from FILE: KEY): why" for a key read but given to no flag (an
  // Axolotl base_model: the MODEL argument names the model estimated).
  std::vector<std::string> notes;
};

// Largest --from file read (and largest DeepSpeed config it points to).
inline constexpr uint64_t kMaxConfigFileBytes = uint64_t{16} << 20;

// Reads a file named inside a config ("deepspeed": "ds.json"); the CLI's
// bounded ReadTextFile, or a map in tests. Errors name the path.
using ConfigFileReader = std::function<Result<std::string>(const std::string& path)>;

// Pure: the knobs of the config `text` that came from `file`, appended to
// *out. `transformers_major` picks HF's version-dependent defaults (the
// gradient-checkpointing mode). An Error is one line, "FILE: KEY: why".
Status ParseConfigText(const std::string& file, const std::string& text, int transformers_major,
                       const ConfigFileReader& read, FromConfig* out);

// Reads each of `paths` (at most kMaxConfigFileBytes each) and parses it.
Result<FromConfig> ReadConfigFiles(const std::vector<std::string>& paths, int transformers_major);

}  // namespace vramscope::cli
