// ParseAllocConf: PYTORCH_CUDA_ALLOC_CONF syntax with torch 2.9-2.11's key
// validation. From 2.9 the device-generic keys (max_split_size_mb,
// max_non_split_rounding_mb, garbage_collection_threshold,
// roundup_power2_divisions, expandable_segments) are parsed by
// c10/core/AllocatorConfig.cpp (AcceleratorAllocatorConfig::parseArgs and its
// parse* helpers; CUDAAllocatorConfig only forwards to it); the CUDA-only keys
// stay in c10/cuda/CUDAAllocatorConfig.cpp. Where 2.4-2.8
// (CUDAAllocatorConfig::parseArgs) differed, the rule says so.
#include <fmt/format.h>

#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "sizing.h"
#include "vramscope/alloc_config.h"
#include "vramscope/common/quote.h"

namespace vramscope {
namespace {

using alloc::IsPowerOfTwo;
using alloc::Log2Floor;

constexpr std::string_view kWhat = "PYTORCH_CUDA_ALLOC_CONF";
// torch CUDAAllocatorConfig::pinned_max_register_threads().
constexpr uint64_t kPinnedMaxRegisterThreads = 128;
// torch parses MB and division counts with std::stoi: larger values throw.
constexpr uint64_t kMaxStoi = 2147483647;

// torch CUDAAllocatorConfig::lexArgs: ',', ':', '[' and ']' are tokens of
// their own, spaces are dropped, anything else accumulates into a word.
std::vector<std::string> Lex(std::string_view text) {
  std::vector<std::string> tokens;
  std::string word;
  for (char ch : text) {
    if (ch == ',' || ch == ':' || ch == '[' || ch == ']') {
      if (!word.empty()) tokens.push_back(std::move(word));
      word.clear();
      tokens.emplace_back(1, ch);
    } else if (ch != ' ') {
      word.push_back(ch);
    }
  }
  if (!word.empty()) tokens.push_back(std::move(word));
  return tokens;
}

class Parser {
 public:
  explicit Parser(std::string_view text) : tokens_(Lex(text)) {}

  Result<AllocatorConfig> Run(std::string_view text) {
    AllocatorConfig config;
    config.text = std::string(text);
    for (i_ = 0; i_ < tokens_.size(); ++i_) {
      const std::string key = tokens_[i_];
      if (Status s = ParseKey(key, config); !s.ok()) return s.error();
      // torch: every key:value but the last is followed by ','; a trailing
      // ',' is accepted.
      if (i_ + 1 < tokens_.size()) {
        ++i_;
        if (tokens_[i_] != ",") {
          return Fail(key, fmt::format("expected ',' after its value, found {}", Quote()));
        }
      }
    }
    if (Status s = ValidateAllocConfig(config); !s.ok()) return s.error();
    return config;
  }

 private:
  Status ParseKey(const std::string& key, AllocatorConfig& c) {
    if (key == "max_split_size_mb") {
      // torch 2.9-2.11 AcceleratorAllocatorConfig::parseMaxSplitSize: the
      // value must be >= kLargeBuffer / MB = 20 (torch 2.4-2.8 wanted > 20).
      return Megabytes(key, /*min_mb=*/20, c.max_split_size_bytes);
    }
    if (key == "max_non_split_rounding_mb") {
      // torch 2.9-2.11 parseMaxNonSplitRoundingSize: >= 20, like
      // max_split_size_mb (key added in 2.6).
      return Megabytes(key, /*min_mb=*/20, c.max_non_split_rounding_bytes);
    }
    if (key == "garbage_collection_threshold") {
      // torch parseGarbageCollectionThreshold: strictly inside (0, 1).
      VS_TRY(v, Double(key));
      if (!(v > 0.0 && v < 1.0)) return Fail(key, Quote() + " must be in (0.0, 1.0)");
      c.garbage_collection_threshold = v;
      return Ok{};
    }
    if (key == "roundup_power2_divisions") return Divisions(key, c);
    if (key == "expandable_segments") {
      VS_TRY(v, Bool(key));
      c.expandable_segments = v;
      return Ok{};
    }
    if (key == "ideal") {  // vramscope's own key
      VS_TRY(v, Bool(key));
      c.ideal = v;
      return Ok{};
    }
    if (key == "per_process_memory_fraction") {
      // torch >= 2.9 parsePerProcessMemoryFraction: [0.0, 1.0]. Accepted
      // here for every version; equivalent to set_per_process_memory_fraction.
      VS_TRY(v, Double(key));
      if (!(v >= 0.0 && v <= 1.0)) return Fail(key, Quote() + " must be in [0.0, 1.0]");
      c.per_process_memory_fraction = v;
      return Ok{};
    }
    if (key == "backend") {
      VS_TRY(v, Word(key));
      if (v == "native") return Ok{};
      if (v == "cudaMallocAsync") {
        return Fail(key,
                    "\"cudaMallocAsync\" is a valid torch backend but is not modelled "
                    "(only the native caching allocator is)");
      }
      return Fail(key, Quote() + " is not a backend (options are native and cudaMallocAsync)");
    }
    // Accepted for compatibility; no effect on device memory (locking,
    // pinned host memory, CUDA graphs). pinned_use_background_threads and
    // graph_capture_record_stream_reuse only exist in later 2.x releases.
    if (key == "release_lock_on_cudamalloc" || key == "release_lock_on_hipmalloc" ||
        key == "pinned_use_cuda_host_register" || key == "pinned_use_hip_host_register" ||
        key == "pinned_use_background_threads" || key == "graph_capture_record_stream_reuse") {
      VS_TRY(v, Bool(key));
      (void)v;
      return Ok{};
    }
    if (key == "pinned_num_register_threads") {
      // torch parsePinnedNumRegisterThreads: a power of two <= 128.
      VS_TRY(v, Integer(key));
      if (!IsPowerOfTwo(v) || v > kPinnedMaxRegisterThreads) {
        return Fail(key, Quote() + " must be a power of 2 <= 128");
      }
      return Ok{};
    }
    if (key == "pinned_reserve_segment_size_mb") {  // later 2.x releases
      VS_TRY(v, Integer(key));
      if (v == 0) return Fail(key, Quote() + " must be > 0");
      return Ok{};
    }
    return MakeError(fmt::format("{}: unknown key {}", kWhat, Quote(key)));
  }

  // ---- values -------------------------------------------------------------

  // Moves to the value after "key:" and returns it.
  Result<std::string> Word(const std::string& key) {
    if (i_ + 1 >= tokens_.size() || tokens_[i_ + 1] != ":") {
      return Fail(key, "expected ':' and a value");
    }
    i_ += 2;
    if (i_ >= tokens_.size() || IsPunct(tokens_[i_])) return Fail(key, "missing value");
    return tokens_[i_];
  }

  Result<bool> Bool(const std::string& key) {
    VS_TRY(v, Word(key));
    // torch accepts exactly "True" or "False".
    if (v == "True") return true;
    if (v == "False") return false;
    return Fail(key, Quote() + " must be True or False");
  }

  Result<uint64_t> Integer(const std::string& key) {
    VS_TRY(v, Word(key));
    return ToInteger(key, v);
  }

  Result<uint64_t> ToInteger(const std::string& key, const std::string& v) {
    uint64_t out = 0;
    auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
    if (ec != std::errc{} || end != v.data() + v.size()) {
      return Fail(key, Quote(v) + " is not a non-negative integer");
    }
    if (out > kMaxStoi) return Fail(key, Quote(v) + " is out of range");
    return out;
  }

  Result<double> Double(const std::string& key) {
    VS_TRY(v, Word(key));
    double out = 0;
    auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
    if (ec != std::errc{} || end != v.data() + v.size()) {
      return Fail(key, Quote() + " is not a number");
    }
    return out;
  }

  Status Megabytes(const std::string& key, uint64_t min_mb, uint64_t& out_bytes) {
    VS_TRY(mb, Integer(key));
    if (mb < min_mb) {
      return Fail(key, fmt::format("{} is too small, must be >= {}", Quote(), min_mb));
    }
    out_bytes = mb * kMiB;
    return Ok{};
  }

  // torch parseRoundUpPower2Divisions: either one power of two for every
  // interval, or "[MB:div,...,>:div]" (list rules of torch 2.9-2.11,
  // AcceleratorAllocatorConfig::parseRoundUpPower2Divisions).
  Status Divisions(const std::string& key, AllocatorConfig& c) {
    VS_TRY(first, Word(key));
    auto& div = c.roundup_power2_divisions;
    if (first != "[") {
      VS_TRY(v, ToInteger(key, first));
      // The single-value form requires a power of two (so 0 is rejected).
      if (!IsPowerOfTwo(v)) return Fail(key, Quote(first) + " must be a power of 2");
      div.fill(static_cast<uint32_t>(v));
      return Ok{};
    }
    bool first_value = true;
    size_t last_index = 0;
    while (++i_ < tokens_.size() && tokens_[i_] != "]") {
      const std::string interval = tokens_[i_];
      if (i_ + 2 >= tokens_.size() || tokens_[i_ + 1] != ":" || IsPunct(tokens_[i_ + 2])) {
        return Fail(key, fmt::format("expected MB:divisions in the list at {}", Quote(interval)));
      }
      i_ += 2;
      VS_TRY(value, ToInteger(key, tokens_[i_]));
      if (value != 0 && !IsPowerOfTwo(value)) {
        return Fail(key, Quote() + " must be 0 or a power of 2");
      }
      const auto v32 = static_cast<uint32_t>(value);
      if (interval == ">") {
        // torch 2.9-2.11 fills the intervals *after* the last key's one
        // (last_index + 1 to the end; with no key before it, from interval
        // 1, so interval 0 keeps its value). torch 2.4-2.8 filled from
        // last_index itself, overwriting the last key's value.
        std::fill(div.begin() + static_cast<ptrdiff_t>(last_index + 1), div.end(), v32);
      } else {
        VS_TRY(mb, ToInteger(key, interval));
        if (!IsPowerOfTwo(mb)) {
          return Fail(key, Quote(interval) + " must be a power of 2 (MB)");
        }
        const size_t index = std::min<size_t>(static_cast<size_t>(Log2Floor(mb)), div.size() - 1);
        // torch: intervals below the first key take the first key's value.
        if (first_value) {
          std::fill(div.begin(), div.begin() + static_cast<ptrdiff_t>(index), v32);
          first_value = false;
        }
        div[index] = v32;
        last_index = index;
      }
      if (i_ + 1 < tokens_.size() && tokens_[i_ + 1] != "]") {
        ++i_;
        if (tokens_[i_] != ",") return Fail(key, "expected ',' or ']' in the list");
      }
    }
    if (i_ >= tokens_.size()) return Fail(key, "missing ']'");
    return Ok{};
  }

  // ---- errors -------------------------------------------------------------

  static bool IsPunct(const std::string& t) { return t == "," || t == ":" || t == "]"; }
  std::string Quote() const { return Quote(tokens_[i_]); }
  static std::string Quote(std::string_view v) { return common::QuoteForMessage(v); }
  static Error Fail(const std::string& key, const std::string& what) {
    return MakeError(fmt::format("{}: {}: {}", kWhat, key, what));
  }

  std::vector<std::string> tokens_;
  size_t i_ = 0;
};

}  // namespace

Result<AllocatorConfig> ParseAllocConf(std::string_view text) { return Parser(text).Run(text); }

Status ValidateAllocConfig(const AllocatorConfig& c) {
  auto fail = [](std::string what) { return MakeError(fmt::format("{}: {}", kWhat, what)); };
  // torch 2.9-2.11: max_split_size_mb >= 20 (kLargeBuffer).
  if (c.max_split_size_bytes != kUnlimited && c.max_split_size_bytes < alloc::kLargeBufferBytes) {
    return fail("max_split_size must be >= 20 MiB or unlimited");
  }
  if (c.max_non_split_rounding_bytes == 0) return fail("max_non_split_rounding must be > 0");
  if (!(c.garbage_collection_threshold >= 0.0 && c.garbage_collection_threshold < 1.0)) {
    return fail("garbage_collection_threshold must be in [0, 1)");
  }
  if (c.per_process_memory_fraction &&
      !(*c.per_process_memory_fraction >= 0.0 && *c.per_process_memory_fraction <= 1.0)) {
    return fail("per_process_memory_fraction must be in [0, 1]");
  }
  for (uint32_t d : c.roundup_power2_divisions) {
    if (d != 0 && !IsPowerOfTwo(d))
      return fail("roundup_power2_divisions must be 0 or powers of 2");
  }
  return Ok{};
}

}  // namespace vramscope
