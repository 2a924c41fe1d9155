// The one-dimensional search behind Fit(): the largest integer in [1, cap]
// whose probe fits, for a probe that is monotone (fits up to some value, not
// above). Private to src/plan; kept apart from Estimate() so that it can be
// tested on synthetic memory curves.
#pragma once

#include <cstdint>
#include <functional>

#include "vramscope/result.h"

namespace vramscope::plan_internal {

struct ProbeResult {
  bool fits = false;
  // What the setup needs on the device. Exact when it fits; a lower bound
  // when it does not (the simulation stopped at the OOM), so only fitting
  // probes feed the interpolation.
  uint64_t needed_bytes = 0;
};

using Probe = std::function<Result<ProbeResult>(uint64_t value)>;

struct SearchOutcome {
  uint64_t max_value = 0;          // 0: not even 1 fits
  bool capped = false;             // max_value == cap
  uint64_t next_needed_bytes = 0;  // probe(max_value + 1), 0 when capped or nothing fits
  bool non_monotone = false;       // a fitting probe needed less than a smaller fitting one
  uint64_t probes = 0;             // probe calls made
};

// Interpolation probes allowed per search; past them the search only doubles
// and bisects, so it ends within 2 * log2(cap) + this many probes.
inline constexpr int kMaxInterpolationProbes = 8;

// Starts at `start` (clamped to [1, cap]); a failing start is followed by a
// probe at 1, so "nothing fits" costs two probes. Then doubles until a probe
// fails or `cap` fits, then narrows the bracket (largest fitting, smallest
// failing) to adjacent values: by linear interpolation of the needed bytes of
// the two largest fitting probes towards `limit_bytes` where that is
// possible (once per new largest fitting probe, and no more after a guess
// overshoots: then one probe just below the guess), by bisection otherwise. On return, max_value
// fits and max_value + 1 failed (or max_value == cap). The first probe error ends the search and is
// returned. cap must be >= 1.
Result<SearchOutcome> FindLargestFitting(uint64_t start, uint64_t cap, uint64_t limit_bytes,
                                         const Probe& probe);

}  // namespace vramscope::plan_internal
