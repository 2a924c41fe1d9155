// The SVG chart of one rank class's timeline, shared by RenderSvg (standalone
// file) and RenderHtml (inline, one per rank class). Private to src/report.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "vramscope/report.h"

namespace vramscope::report_internal {

// Fixed layout in SVG user units (pixels at 100% zoom).
struct ChartLayout {
  static constexpr double kWidth = 960;
  static constexpr double kHeight = 520;
  static constexpr double kPlotLeft = 76;
  static constexpr double kPlotRight = 740;
  static constexpr double kPlotTop = 48;
  static constexpr double kPlotBottom = 448;
  static constexpr double kLegendLeft = 760;
};

// Shared by the timeline and the sweep chart, so that both read the same way.
inline constexpr double kChartGiB = static_cast<double>(uint64_t{1} << 30);
inline constexpr const char* kAllocatedColour = "#1a1a1a";
inline constexpr const char* kDeviceTotalColour = "#7a2e8e";
inline constexpr const char* kLimitColour = "#c0392b";

// Memory over time stacked by category, allocated and reserved lines, phase
// markers, the device-total level and the GPU limit, axes in GiB.
//
// Element ids start with `id_prefix` (letters, digits, '-'), so several charts
// can share one HTML page. The root's data-* attributes and the class names
// vs-content (zoomable paths), vs-pin (labels pinned to an event, data-px) and
// vs-xticks are the hooks of the HTML page's hover-and-zoom script; a
// standalone SVG ignores them.
std::string RenderRankSvg(const Report& report, const RankReport& rank, std::string_view id_prefix);

}  // namespace vramscope::report_internal
