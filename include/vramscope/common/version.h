// ParseMajorMinor: the "MAJOR.MINOR" at the start of a package version.
//
// Rules that follow a library's behaviour are keyed by the library's release
// ("4.57" for transformers, "2.4" for torch), given on the command line or
// read from a results file ("2.11.0+cu128"). Pure and thread-safe.
#pragma once

#include <optional>
#include <string_view>

namespace vramscope::common {

struct MajorMinor {
  int major = 0;  // 0..99
  int minor = 0;  // 0..99
  // 4.57 -> 457: the form the rules compare against.
  int Packed() const { return major * 100 + minor; }
};

// Reads MAJOR '.' MINOR from the start of `text`: decimal digits only (no
// sign, no blank, leading zeros allowed), each at most 99. Returns nullopt
// otherwise. What follows MINOR is left to the caller, in `*rest` when `rest`
// is not null: "2.11.0+cu128" gives 2.11 and rest ".0+cu128"; "4.46rc1" gives
// 4.46 and rest "rc1".
std::optional<MajorMinor> ParseMajorMinor(std::string_view text, std::string_view* rest = nullptr);

}  // namespace vramscope::common
