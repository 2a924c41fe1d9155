// Axis scales of the SVG chart: "nice" tick steps (1, 2, 2.5, 5 times a power
// of ten) so that labels read as round numbers. Private to src/report.
#pragma once

#include <cstdint>
#include <vector>

namespace vramscope::report_internal {

struct LinearTicks {
  double step = 1;   // distance between ticks, in axis units
  double top = 1;    // axis end: a multiple of step (y axes start at 0)
  int decimals = 0;  // digits after the point that show every tick exactly
  std::vector<double> values;
};

// Ticks from 0 to at least max_value (> 0) in about `intervals` steps, with a
// little air above the data so the highest line does not touch the frame.
LinearTicks ValueTicks(double max_value, int intervals);

// Integer ticks within [lo, hi] (event indices) in about `intervals` steps.
std::vector<uint64_t> IndexTicks(uint64_t lo, uint64_t hi, int intervals);

}  // namespace vramscope::report_internal
