// Helpers shared by the report renderers: safe text, number formatting, the
// fit verdict and the category palette. Private to src/report.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "vramscope/category.h"
#include "vramscope/common/checked.h"
#include "vramscope/report.h"

namespace vramscope::report_internal {

// --- Safe text -------------------------------------------------------------

// Valid UTF-8 without control characters: each invalid byte becomes U+FFFD,
// each C0 control (tab and newline included) and DEL becomes '?'. Names come
// from traces and config files; a raw escape sequence must not reach a
// terminal, and XML rejects control characters outright.
std::string SanitizeText(std::string_view text);
// SanitizeText, then &, <, >, " and ' as entities: safe in XML/HTML element
// content and in quoted attribute values.
std::string EscapeMarkup(std::string_view text);
// SanitizeText, then cut to at most `max_chars` code points ("..." marks a cut).
std::string ClipText(std::string_view text, size_t max_chars);
// Code points in a valid UTF-8 string (for column alignment).
size_t DisplayWidth(std::string_view utf8);
// Pads (left-aligned) to `width` code points.
std::string PadRight(std::string_view utf8, size_t width);

// --- Numbers ---------------------------------------------------------------

// Sums of byte counts saturate: common::SaturatingAdd (vramscope/common/checked.h).
// a - b as a signed value, clamped to the int64 range.
int64_t SignedDifference(uint64_t a, uint64_t b);
// 1234567 -> "1,234,567" (locale-independent).
std::string GroupThousands(uint64_t value);
// part / whole as "12.3%"; "-" when whole is 0.
std::string FormatPercent(uint64_t part, uint64_t whole);
// Bytes as GiB without the unit, two decimals ("12.34").
std::string GiBNumber(uint64_t bytes);
// {0,1,2,3,8} -> "0-3, 8"; empty -> "-".
std::string FormatRanks(const std::vector<int>& ranks);

// --- HTML ------------------------------------------------------------------

// A table cell around `html` (markup, already escaped), with a class when
// `cls` is not null: <td class="num">12</td>.
std::string TableCell(std::string_view html, const char* cls = nullptr);

// --- Vocabulary --------------------------------------------------------------

// "optimizer state" (the JSON key with spaces).
std::string CategoryLabel(Category c);
// Fixed fill colour of a category in charts ("#3a6ea5"); distinct hues, the
// same in SVG and HTML so a reader learns them once.
std::string_view CategoryColour(Category c);
std::string GpuLabel(const GpuSpec& gpu);  // display name, else catalog key
// The report's GPU in words: GpuLabel, or that the snapshot names none.
std::string DeviceLabel(const Report& report);
std::string_view PhaseLabel(Phase phase);  // PhaseName
// "step 1, backward".
std::string StepPhaseLabel(uint32_t step, Phase phase);

// The phase table's rows with runs of identical steps folded: consecutive
// steps whose rows (the same phases in the same order, the same peaks and end
// bytes) repeat the step before them are one group, so a measured run of 30
// steady steps reads once as steps "2-30". Setup (step 0) stays its own.
struct PhaseRowGroup {
  uint32_t first_step = 0;
  uint32_t last_step = 0;
  std::vector<const PhasePeak*> rows;  // the first step's, pointing into the input
  bool Contains(uint32_t step) const { return step >= first_step && step <= last_step; }
};
std::vector<PhaseRowGroup> GroupPhaseRows(const std::vector<PhasePeak>& phases);
// "3" or "2-30".
std::string StepRange(const PhaseRowGroup& group);

// --- Verdicts ----------------------------------------------------------------

// One rank class fits: no simulated OOM and device total within usable.
bool RankFits(const Report& report, const RankReport& rank);
// What one rank class needs at least (see Report::needed_bytes).
uint64_t RankNeededBytes(const RankReport& rank);
// Headline, plain ASCII apart from input names, e.g.
// "FITS on NVIDIA H100 80GB HBM3 with 12.34 GiB to spare" or
// "DOES NOT FIT: needs 91.20 GiB, the GPU has 79.10 GiB usable".
std::string VerdictLine(const Report& report);
// reserved - allocated when the allocated peak happened.
uint64_t FragmentationAtPeakBytes(const SimResult& sim);
// Index of worst() in report.ranks (0 when empty).
size_t WorstIndex(const Report& report);

}  // namespace vramscope::report_internal
