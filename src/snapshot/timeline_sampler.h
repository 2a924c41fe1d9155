// Bounded, peak-preserving timeline for measured runs of any length.
//
// The same policy as the simulator's sampler (src/sim/timeline.h, private to
// that stage): each kept point stands for a bucket of consecutive trace
// entries and holds the state where allocated was highest in it (reserved is
// the bucket's maximum); when the buffer fills, neighbours merge pairwise and
// buckets double, so 10M entries keep at most ~2x max_points points and
// every bucket maximum, the global peak included, survives. A phase change
// always opens a bucket so phase boundaries stay exact.
#pragma once

#include <cstdint>
#include <vector>

#include "vramscope/simulate.h"

namespace vramscope::snapshot {

class TimelineSampler {
 public:
  explicit TimelineSampler(size_t max_points) : max_points_(max_points) {}
  void Add(const TimelinePoint& point);
  std::vector<TimelinePoint> Finish();

 private:
  static void Merge(TimelinePoint& into, const TimelinePoint& other);
  void Compact();

  size_t max_points_;
  uint64_t bucket_width_ = 1;
  uint64_t in_bucket_ = 0;
  bool has_open_ = false;
  TimelinePoint open_;
  std::vector<TimelinePoint> points_;
};

}  // namespace vramscope::snapshot
