// FindLargestFitting (search.h).
//
// Why interpolation: a training step's memory grows almost linearly in the
// micro-batch and in the sequence length (activations and logits scale with
// tokens; weights and optimizer state do not), so two fitting estimates
// predict where the limit is crossed, usually to within one value. Estimates
// cost milliseconds each; a guess that lands next to the boundary saves the
// ten-odd probes of a plain bisection. The guess is only ever a choice of the
// next probe inside the bracket, so correctness rests on the bracket alone.
#include "search.h"

#include <algorithm>
#include <cmath>

namespace vramscope::plan_internal {
namespace {

struct Known {
  uint64_t value = 0;
  uint64_t needed_bytes = 0;
};

class Searcher {
 public:
  Searcher(uint64_t cap, uint64_t limit_bytes, const Probe& probe)
      : cap_(cap), limit_bytes_(limit_bytes), probe_(probe) {}

  Result<SearchOutcome> Run(uint64_t start) {
    start = std::clamp<uint64_t>(start, 1, cap_);
    VS_TRY(first, Call(start));
    if (first.fits) {
      Fitting(start, first.needed_bytes);
    } else {
      Failing(start, first.needed_bytes);
      if (start == 1) return out_;
      VS_TRY(one, Call(1));
      if (!one.fits) return out_;  // monotone: nothing in between fits either
      Fitting(1, one.needed_bytes);
    }
    while (lo_.value < cap_ && !(has_hi_ && hi_.value == lo_.value + 1)) {
      const uint64_t next = NextProbe();
      VS_TRY(r, Call(next));
      if (r.fits) {
        Fitting(next, r.needed_bytes);
      } else {
        Failing(next, r.needed_bytes);
        if (last_was_guess_) OvershotGuess();
      }
    }
    out_.max_value = lo_.value;
    out_.capped = lo_.value == cap_;
    out_.next_needed_bytes = out_.capped ? 0 : hi_.needed_bytes;
    return out_;
  }

 private:
  Result<ProbeResult> Call(uint64_t value) {
    ++out_.probes;
    return probe_(value);
  }

  void Fitting(uint64_t value, uint64_t needed) {
    if (has_lo_) {
      if (needed < lo_.needed_bytes) out_.non_monotone = true;
      prev_ = lo_;
      has_prev_ = true;
    }
    lo_ = {value, needed};
    has_lo_ = true;
  }

  void Failing(uint64_t value, uint64_t needed) {
    hi_ = {value, needed};
    has_hi_ = true;
  }

  // A guess that does not fit has overshot: memory curves upwards near the
  // limit (reserved memory grows in steps, and the allocator can fail a
  // little below the limit), so a line through smaller values predicts too
  // far. The boundary is then usually just below the guess: one probe a
  // sixteenth of the bracket below it, then plain bisection, which a line
  // would only slow down from here on.
  void OvershotGuess() {
    interpolations_ = kMaxInterpolationProbes;
    probe_below_overshoot_ = true;
  }

  // Candidates are (lo, upper]; lo fits, upper + 1 failed or is past the cap.
  uint64_t NextProbe() {
    const uint64_t upper = has_hi_ ? hi_.value - 1 : cap_;
    last_was_guess_ = false;
    if (probe_below_overshoot_) {
      probe_below_overshoot_ = false;
      const uint64_t step = std::max<uint64_t>(1, (hi_.value - lo_.value) / 16);
      return std::clamp(hi_.value - step, lo_.value + 1, upper);
    }
    // One interpolation per new largest fitting probe: the same line would
    // only guess the same value again.
    if (interpolations_ < kMaxInterpolationProbes && lo_.value != interpolated_from_) {
      if (const uint64_t guess = InterpolatedGuess(); guess != 0) {
        ++interpolations_;
        interpolated_from_ = lo_.value;
        last_was_guess_ = true;
        return std::clamp(guess, lo_.value + 1, upper);
      }
    }
    if (!has_hi_) {
      // Doubling: lo_ >= 1, and the cap bounds it (no overflow: cap <= 2^63).
      return std::min(lo_.value * 2, upper);
    }
    return lo_.value + (hi_.value - lo_.value) / 2;
  }

  // The last value at or below the limit on the line through the two largest
  // fitting probes; 0 when there is no such line (one probe, or flat or
  // falling memory, where a line predicts nothing).
  uint64_t InterpolatedGuess() const {
    if (!has_prev_ || lo_.needed_bytes <= prev_.needed_bytes || lo_.value <= prev_.value) return 0;
    const double slope = static_cast<double>(lo_.needed_bytes - prev_.needed_bytes) /
                         static_cast<double>(lo_.value - prev_.value);
    const double room =
        static_cast<double>(limit_bytes_ - std::min(limit_bytes_, lo_.needed_bytes));
    const double steps = std::floor(room / slope);
    // Far beyond the cap (or not finite): the cap bounds it anyway.
    if (!(steps < static_cast<double>(cap_))) return cap_;
    return lo_.value + static_cast<uint64_t>(steps);
  }

  const uint64_t cap_;
  const uint64_t limit_bytes_;
  const Probe& probe_;
  SearchOutcome out_;
  Known lo_, prev_, hi_;
  bool has_lo_ = false, has_prev_ = false, has_hi_ = false;
  int interpolations_ = 0;
  uint64_t interpolated_from_ = 0;  // lo_ of the last interpolation
  bool last_was_guess_ = false;     // the probe in flight is an interpolation
  bool probe_below_overshoot_ = false;
};

}  // namespace

Result<SearchOutcome> FindLargestFitting(uint64_t start, uint64_t cap, uint64_t limit_bytes,
                                         const Probe& probe) {
  VS_CHECK(cap >= 1);
  return Searcher(cap, limit_bytes, probe).Run(start);
}

}  // namespace vramscope::plan_internal
