// Helpers shared by the sweep renderers (vramscope/sweep.h). Private to
// src/report.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "vramscope/sweep.h"

namespace vramscope::report_internal {

// The bytes a point is drawn and judged by: its device total, or, when the
// simulation ran out of memory, what it needs at least.
uint64_t SweepPointBytes(const SweepPoint& point);

// One line (plain ASCII apart from input names) saying where the grid stops
// fitting: "Fits up to --seq 1830 in this grid; --seq 1840 needs at least
// 79.20 GiB, above the 79.10 GiB usable on NVIDIA H100 80GB HBM3." With two
// axes, the largest fitting value of the first per value of the second.
std::string SweepSummaryLine(const SweepResult& sweep);

// The SVG chart (RenderSweepSvg); `id_prefix` (letters, digits, '-') starts
// every element id so the chart can sit inside an HTML page.
std::string RenderSweepChart(const SweepResult& sweep, std::string_view id_prefix);

// "seq 1024, batch 2".
std::string SweepPointLabel(const SweepResult& sweep, const SweepPoint& point);

}  // namespace vramscope::report_internal
