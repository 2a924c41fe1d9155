#include "timeline_sampler.h"

#include <algorithm>

namespace vramscope::snapshot {
namespace {

bool SamePhase(const TimelinePoint& a, const TimelinePoint& b) {
  return a.phase == b.phase && a.step == b.step;
}

}  // namespace

void TimelineSampler::Merge(TimelinePoint& into, const TimelinePoint& other) {
  const uint64_t reserved = std::max(into.reserved_bytes, other.reserved_bytes);
  if (other.allocated_bytes >= into.allocated_bytes) into = other;
  into.reserved_bytes = reserved;
}

void TimelineSampler::Add(const TimelinePoint& point) {
  if (max_points_ == 0) return;
  if (has_open_ && SamePhase(open_, point)) {
    Merge(open_, point);
    ++in_bucket_;
  } else {
    if (has_open_) points_.push_back(open_);
    open_ = point;
    has_open_ = true;
    in_bucket_ = 1;
  }
  if (in_bucket_ >= bucket_width_) {
    points_.push_back(open_);
    has_open_ = false;
    in_bucket_ = 0;
  }
  if (points_.size() >= 2 * max_points_) Compact();
}

void TimelineSampler::Compact() {
  std::vector<TimelinePoint> merged;
  merged.reserve(points_.size() / 2 + 1);
  for (size_t i = 0; i < points_.size(); i += 2) {
    TimelinePoint p = points_[i];
    if (i + 1 < points_.size()) {
      if (SamePhase(p, points_[i + 1])) {
        Merge(p, points_[i + 1]);
      } else {
        merged.push_back(p);
        p = points_[i + 1];
      }
    }
    merged.push_back(p);
  }
  points_ = std::move(merged);
  bucket_width_ *= 2;
  if (points_.size() >= 2 * max_points_) {
    // Phases kept every pair apart: merge across them to guarantee progress.
    std::vector<TimelinePoint> forced;
    forced.reserve(points_.size() / 2 + 1);
    for (size_t i = 0; i < points_.size(); i += 2) {
      TimelinePoint p = points_[i];
      if (i + 1 < points_.size()) Merge(p, points_[i + 1]);
      forced.push_back(p);
    }
    points_ = std::move(forced);
  }
}

std::vector<TimelinePoint> TimelineSampler::Finish() {
  if (has_open_) {
    points_.push_back(open_);
    has_open_ = false;
  }
  return std::move(points_);
}

}  // namespace vramscope::snapshot
