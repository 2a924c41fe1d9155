#include "vramscope/timeline_sampler.h"

namespace vramscope {

void TimelineSampler::Merge(TimelinePoint& into, const TimelinePoint& other) {
  const uint64_t reserved = std::max(into.reserved_bytes, other.reserved_bytes);
  // A phase change inside a bucket must stay visible: keep the later point's
  // phase when the allocated maximum ties.
  if (other.allocated_bytes >= into.allocated_bytes) into = other;
  into.reserved_bytes = reserved;
}

void TimelineSampler::Add(const TimelinePoint& point) {
  if (max_points_ == 0) return;
  if (!has_open_) {
    open_ = point;
    has_open_ = true;
    in_bucket_ = 1;
  } else {
    // A new phase always starts a new bucket so phase markers stay exact.
    if (point.phase != open_.phase || point.step != open_.step) {
      points_.push_back(open_);
      open_ = point;
      in_bucket_ = 1;
    } else {
      Merge(open_, point);
      ++in_bucket_;
    }
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
      const TimelinePoint& q = points_[i + 1];
      if (q.phase == p.phase && q.step == p.step) {
        Merge(p, q);
      } else {
        merged.push_back(p);
        p = q;
      }
    }
    merged.push_back(p);
  }
  // If phases kept every pair apart, widen anyway to guarantee progress.
  points_ = std::move(merged);
  bucket_width_ *= 2;
  if (points_.size() >= 2 * max_points_) {
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

}  // namespace vramscope
