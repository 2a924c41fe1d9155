// Shared renderer helpers (report_format.h).
#include "report_format.h"

#include <algorithm>
#include <array>
#include <limits>

#include <fmt/format.h>

namespace vramscope::report_internal {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

bool IsContinuation(unsigned char b) { return (b & 0xC0) == 0x80; }

// Length of the valid UTF-8 sequence starting at text[i], or 0 when invalid
// (overlong forms, surrogates and values above U+10FFFF are invalid).
size_t ValidSequenceLength(std::string_view text, size_t i) {
  const auto b0 = static_cast<unsigned char>(text[i]);
  auto at = [&](size_t k) -> unsigned char {
    return i + k < text.size() ? static_cast<unsigned char>(text[i + k]) : 0;
  };
  if (b0 < 0x80) return 1;
  if (b0 >= 0xC2 && b0 <= 0xDF) return IsContinuation(at(1)) ? 2 : 0;
  if (b0 >= 0xE0 && b0 <= 0xEF) {
    const unsigned char b1 = at(1);
    if (!IsContinuation(b1) || !IsContinuation(at(2))) return 0;
    if (b0 == 0xE0 && b1 < 0xA0) return 0;  // overlong
    if (b0 == 0xED && b1 > 0x9F) return 0;  // UTF-16 surrogate
    return 3;
  }
  if (b0 >= 0xF0 && b0 <= 0xF4) {
    const unsigned char b1 = at(1);
    if (!IsContinuation(b1) || !IsContinuation(at(2)) || !IsContinuation(at(3))) return 0;
    if (b0 == 0xF0 && b1 < 0x90) return 0;  // overlong
    if (b0 == 0xF4 && b1 > 0x8F) return 0;  // above U+10FFFF
    return 4;
  }
  return 0;
}

}  // namespace

std::string SanitizeText(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const size_t n = ValidSequenceLength(text, i);
    if (n == 0) {
      out += kReplacement;
      ++i;
      continue;
    }
    const auto b0 = static_cast<unsigned char>(text[i]);
    const auto b1 = n > 1 ? static_cast<unsigned char>(text[i + 1]) : 0;
    const auto b2 = n > 2 ? static_cast<unsigned char>(text[i + 2]) : 0;
    if (n == 1 && (b0 < 0x20 || b0 == 0x7F)) {
      out += '?';
    } else if (n == 2 && b0 == 0xC2 && b1 < 0xA0) {
      out += '?';  // C1 controls: 0x9B is a terminal escape (CSI) on its own
    } else if (n == 3 && b0 == 0xEF && b1 == 0xBF && b2 >= 0xBE) {
      out += kReplacement;  // U+FFFE, U+FFFF: not characters, rejected by XML
    } else {
      out.append(text.substr(i, n));
    }
    i += n;
  }
  return out;
}

std::string EscapeMarkup(std::string_view text) {
  const std::string clean = SanitizeText(text);
  std::string out;
  out.reserve(clean.size());
  for (char c : clean) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

size_t DisplayWidth(std::string_view utf8) {
  size_t n = 0;
  for (char c : utf8) n += IsContinuation(static_cast<unsigned char>(c)) ? 0 : 1;
  return n;
}

std::string ClipText(std::string_view text, size_t max_chars) {
  const std::string clean = SanitizeText(text);
  if (DisplayWidth(clean) <= max_chars) return clean;
  const size_t keep = max_chars > 3 ? max_chars - 3 : 0;
  size_t chars = 0;
  size_t end = 0;
  while (end < clean.size()) {
    if (!IsContinuation(static_cast<unsigned char>(clean[end]))) {
      if (chars == keep) break;
      ++chars;
    }
    ++end;
  }
  return clean.substr(0, end) + "...";
}

std::string PadRight(std::string_view utf8, size_t width) {
  std::string out(utf8);
  const size_t w = DisplayWidth(utf8);
  if (w < width) out.append(width - w, ' ');
  return out;
}

int64_t SignedDifference(uint64_t a, uint64_t b) {
  constexpr auto kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  if (a >= b)
    return a - b > kMax ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(a - b);
  return b - a > kMax ? std::numeric_limits<int64_t>::min() : -static_cast<int64_t>(b - a);
}

std::string GroupThousands(uint64_t value) {
  const std::string digits = fmt::format("{}", value);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string TableCell(std::string_view html, const char* cls) {
  return cls ? fmt::format("<td class=\"{}\">{}</td>", cls, html)
             : fmt::format("<td>{}</td>", html);
}

std::string FormatPercent(uint64_t part, uint64_t whole) {
  if (whole == 0) return "-";
  return fmt::format("{:.1f}%", 100.0 * static_cast<double>(part) / static_cast<double>(whole));
}

std::string GiBNumber(uint64_t bytes) {
  return fmt::format("{:.2f}", static_cast<double>(bytes) / static_cast<double>(uint64_t{1} << 30));
}

std::string FormatRanks(const std::vector<int>& ranks) {
  if (ranks.empty()) return "-";
  std::string out;
  size_t i = 0;
  while (i < ranks.size()) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += j > i ? fmt::format("{}-{}", ranks[i], ranks[j]) : fmt::format("{}", ranks[i]);
    i = j + 1;
  }
  return out;
}

std::string CategoryLabel(Category c) {
  std::string label(CategoryJsonKey(c));
  for (char& ch : label) {
    if (ch == '_') ch = ' ';
  }
  return label;
}

std::string_view CategoryColour(Category c) {
  // Indexed by the enum value: neighbours in the stack get contrasting hues.
  static constexpr std::array<std::string_view, kNumCategories> kColours = {
      "#3a6ea5",  // parameters: blue
      "#f08a24",  // gradients: orange
      "#3f9e4d",  // optimizer state: green
      "#d64550",  // activations: red
      "#7d5ba6",  // loss: purple
      "#9c6b4e",  // temporaries: brown
      "#d873b5",  // communication: pink
      "#7f7f7f",  // workspace: grey
      "#b8b23a",  // other: olive
  };
  const auto index = static_cast<size_t>(c);
  return index < kColours.size() ? kColours[index] : kColours.back();
}

std::string GpuLabel(const GpuSpec& gpu) {
  return SanitizeText(gpu.display_name.empty() ? gpu.name : gpu.display_name);
}

std::string DeviceLabel(const Report& report) {
  return report.has_device_limit ? GpuLabel(report.gpu) : "a GPU the snapshot does not name";
}

std::string_view PhaseLabel(Phase phase) { return PhaseName(phase); }

std::string StepPhaseLabel(uint32_t step, Phase phase) {
  return fmt::format("step {}, {}", step, PhaseLabel(phase));
}

namespace {

bool SameRows(const std::vector<const PhasePeak*>& a, const std::vector<const PhasePeak*>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i]->phase != b[i]->phase || a[i]->peak_allocated_bytes != b[i]->peak_allocated_bytes ||
        a[i]->peak_reserved_bytes != b[i]->peak_reserved_bytes ||
        a[i]->allocated_at_end_bytes != b[i]->allocated_at_end_bytes) {
      return false;
    }
  }
  return true;
}

}  // namespace

std::vector<PhaseRowGroup> GroupPhaseRows(const std::vector<PhasePeak>& phases) {
  // One group per step first (rows of a step are consecutive), then folded.
  std::vector<PhaseRowGroup> steps;
  for (const PhasePeak& p : phases) {
    if (steps.empty() || steps.back().first_step != p.step) {
      steps.push_back({p.step, p.step, {}});
    }
    steps.back().rows.push_back(&p);
  }
  std::vector<PhaseRowGroup> groups;
  for (PhaseRowGroup& step : steps) {
    PhaseRowGroup* last = groups.empty() ? nullptr : &groups.back();
    if (last != nullptr && step.first_step != 0 && last->first_step != 0 &&
        step.first_step == last->last_step + 1 && SameRows(last->rows, step.rows)) {
      last->last_step = step.first_step;
    } else {
      groups.push_back(std::move(step));
    }
  }
  return groups;
}

std::string StepRange(const PhaseRowGroup& group) {
  if (group.first_step == group.last_step) return std::to_string(group.first_step);
  return fmt::format("{}-{}", group.first_step, group.last_step);
}

uint64_t RankNeededBytes(const RankReport& rank) {
  const uint64_t total = DeviceTotalBytes(rank);
  if (!rank.sim.oom) return total;
  if (rank.full) return std::max(total, FullDeviceTotalBytes(*rank.full, rank.extras));
  // At the failure the allocator needed the failed block on top of what was
  // allocated; caching can only add to that, so this is a lower bound.
  const OomInfo& oom = *rank.sim.oom;
  uint64_t needed = common::SaturatingAdd(oom.allocated_bytes, oom.alloc_size_bytes);
  needed = common::SaturatingAdd(needed, rank.extras.cuda_context_bytes);
  needed = common::SaturatingAdd(needed, rank.extras.nccl_bytes);
  needed = common::SaturatingAdd(needed, rank.extras.other_bytes);
  return std::max(total, needed);
}

bool RankFits(const Report& report, const RankReport& rank) {
  return !rank.sim.oom && DeviceTotalBytes(rank) <= report.gpu.usable_bytes;
}

size_t WorstIndex(const Report& report) {
  size_t worst = 0;
  uint64_t worst_bytes = 0;
  for (size_t i = 0; i < report.ranks.size(); ++i) {
    const uint64_t bytes = RankNeededBytes(report.ranks[i]);
    if (i == 0 || bytes > worst_bytes) {
      worst = i;
      worst_bytes = bytes;
    }
  }
  return worst;
}

uint64_t FragmentationAtPeakBytes(const SimResult& sim) {
  return sim.reserved_at_peak_bytes > sim.peak_allocated_bytes
             ? sim.reserved_at_peak_bytes - sim.peak_allocated_bytes
             : 0;
}

std::string VerdictLine(const Report& report) {
  if (report.ranks.empty()) return "NO RESULT: the report holds no simulated rank";
  if (!report.has_device_limit) {
    return "MEASURED, no fit verdict: the snapshot does not record its GPU's memory (no "
           "out-of-memory entry); --gpu NAME judges the run against a catalog GPU";
  }
  const std::string gpu = GpuLabel(report.gpu);
  const uint64_t usable = report.gpu.usable_bytes;
  const uint64_t needed = report.needed_bytes();
  if (report.fits()) {
    return fmt::format("FITS on {} with {} to spare", gpu, FormatBytes(usable - needed));
  }
  // The first rank class that ran out of memory says where it happened.
  for (const RankReport& rank : report.ranks) {
    if (!rank.sim.oom) continue;
    if (rank.full) {
      return fmt::format(
          "DOES NOT FIT: needs {}, the GPU has {} usable ({} short); out of memory in {}",
          FormatBytes(needed), FormatBytes(usable), FormatBytes(needed - std::min(needed, usable)),
          StepPhaseLabel(rank.sim.oom_step, rank.sim.oom_phase));
    }
    if (needed <= usable) {
      // The bytes would fit in sum; the block did not: the cached segments'
      // free space was in pieces too small or the new segment too large.
      return fmt::format(
          "DOES NOT FIT: out of memory in {}: a {} block could not be placed (needs at least {} "
          "in all, the GPU has {} usable: fragmentation or segment rounding)",
          StepPhaseLabel(rank.sim.oom_step, rank.sim.oom_phase),
          FormatBytes(rank.sim.oom->alloc_size_bytes), FormatBytes(needed), FormatBytes(usable));
    }
    return fmt::format(
        "DOES NOT FIT: out of memory in {}; needs at least {}, the GPU has {} usable",
        StepPhaseLabel(rank.sim.oom_step, rank.sim.oom_phase), FormatBytes(needed),
        FormatBytes(usable));
  }
  return fmt::format("DOES NOT FIT: needs {}, the GPU has {} usable", FormatBytes(needed),
                     FormatBytes(usable));
}

}  // namespace vramscope::report_internal
