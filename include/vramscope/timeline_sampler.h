// Bounded, peak-preserving timeline sampling: the simulator's timeline
// (src/sim) and the timeline of a measured snapshot (src/snapshot/measure.cc)
// use this one policy.
//
// Keeps at most ~2x max_points points whatever the number of events: each point
// stands for a bucket of consecutive events and holds the state at the moment
// allocated memory was highest in that bucket (reserved is the bucket's
// maximum). When the buffer fills, neighbouring buckets merge pairwise and the
// bucket width doubles, so memory stays O(max_points) and every local maximum
// that is a bucket maximum (in particular the global peak) survives. A phase
// change always opens a bucket, so phase boundaries stay exact.
#pragma once

#include <cstdint>
#include <vector>

#include "vramscope/simulate.h"

namespace vramscope {

class TimelineSampler {
 public:
  explicit TimelineSampler(size_t max_points) : max_points_(max_points) {}

  // Offers the state after event `point.event_index`.
  void Add(const TimelinePoint& point);
  // Final list, in event order.
  std::vector<TimelinePoint> Finish();

 private:
  void Compact();
  static void Merge(TimelinePoint& into, const TimelinePoint& other);

  size_t max_points_;
  uint64_t bucket_width_ = 1;
  uint64_t in_bucket_ = 0;
  bool has_open_ = false;
  TimelinePoint open_;
  std::vector<TimelinePoint> points_;
};

}  // namespace vramscope
