// Nice tick steps (chart_scale.h).
#include "chart_scale.h"

#include <algorithm>
#include <cmath>

namespace vramscope::report_internal {
namespace {

// Smallest 1/2/2.5/5 x 10^k step at least `raw` (> 0).
double NiceStep(double raw) {
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  for (double mantissa : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    // The small slack keeps 0.2000000001 (a rounding artefact) at 0.2.
    if (mantissa * magnitude >= raw * (1 - 1e-9)) return mantissa * magnitude;
  }
  return 10 * magnitude;
}

int DecimalsFor(double step) {
  for (int decimals = 0; decimals < 9; ++decimals) {
    const double scaled = step * std::pow(10.0, decimals);
    if (std::fabs(scaled - std::round(scaled)) < 1e-6 * scaled) return decimals;
  }
  return 9;
}

}  // namespace

LinearTicks ValueTicks(double max_value, int intervals) {
  LinearTicks ticks;
  if (!(max_value > 0) || !std::isfinite(max_value)) max_value = 1;
  intervals = std::max(intervals, 1);
  // 4% air above the highest value, then round the top up to a whole step.
  const double padded = max_value * 1.04;
  ticks.step = NiceStep(padded / intervals);
  ticks.top = ticks.step * std::ceil(padded / ticks.step - 1e-9);
  ticks.decimals = DecimalsFor(ticks.step);
  const auto count = static_cast<int>(std::lround(ticks.top / ticks.step));
  for (int i = 0; i <= count; ++i) ticks.values.push_back(ticks.step * i);
  return ticks;
}

std::vector<uint64_t> IndexTicks(uint64_t lo, uint64_t hi, int intervals) {
  std::vector<uint64_t> out;
  if (hi < lo) return out;
  intervals = std::max(intervals, 1);
  const double raw = std::max(1.0, static_cast<double>(hi - lo) / intervals);
  double step = NiceStep(raw);
  if (step != std::floor(step)) step = std::floor(step);  // 2.5 -> 2: whole events only
  const auto step_events = static_cast<uint64_t>(step);
  uint64_t tick = lo / step_events * step_events;
  if (tick < lo) {
    if (tick > hi - step_events) return out;  // the next multiple is past hi (or 2^64)
    tick += step_events;
  }
  while (out.size() < 64 && tick <= hi) {
    out.push_back(tick);
    if (tick > hi - step_events) break;  // also stops before uint64 overflow
    tick += step_events;
  }
  return out;
}

}  // namespace vramscope::report_internal
