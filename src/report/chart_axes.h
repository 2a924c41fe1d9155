// What the timeline chart (svg_renderer.cc) and the sweep chart
// (sweep_chart.cc) draw alike, in the layout of svg_chart.h: the background
// and headings, the y axis in GiB, the frame with the x ticks, and the line
// samples of the legend. Private to src/report.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "chart_scale.h"

namespace vramscope::report_internal {

// How a chart writes one coordinate. The timeline rounds to tenths half away
// from zero (its Coord), the sweep chart prints fmt's {:.1f}; each passes its
// own, so both charts print exactly what they printed before the axes were
// shared.
using CoordText = std::string (*)(double);

// The white background, the bold centred title and the grey subtitle line
// under it. Both are markup (already escaped).
void AppendHeadings(std::string* out, std::string_view title_markup,
                    std::string_view subtitle_markup);

// A grid line and a label (GiB, y.decimals digits) at each of y.values, 0 at
// the plot's bottom and y.top at its top, and the axis title, in a g.vs-yaxis.
void AppendYAxis(std::string* out, const LinearTicks& y, CoordText coord);

// The frame's left and bottom lines, a tick with its label at each of
// `ticks` (placed by `px`) in a g.vs-xticks, and the axis title
// `label_markup` (already escaped) centred under the plot.
void AppendXAxis(std::string* out, const std::vector<uint64_t>& ticks,
                 const std::function<double(uint64_t)>& px, std::string_view label_markup,
                 CoordText coord);

// A legend entry at height `y`: a line sample (`dash` empty for solid) and
// its label (markup, already escaped) to the right.
void AppendLegendLine(std::string* out, double y, const char* colour, const char* dash,
                      double width, std::string_view label_markup, CoordText coord);

}  // namespace vramscope::report_internal
