// Sweep(): one Estimate() per grid point (plan.h). Each point is an
// independent estimate, so a sweep's numbers are exactly what
// `vramscope estimate` prints for those knobs. Points run on several threads
// (parallel_for.h); each writes only its own slot, so the result does not
// depend on the number of threads.
#include <algorithm>
#include <mutex>
#include <optional>
#include <utility>

#include <fmt/format.h>

#include "parallel_for.h"
#include "vramscope/common/checked.h"
#include "vramscope/estimate.h"
#include "vramscope/lower.h"
#include "vramscope/plan.h"

namespace vramscope {
namespace {

Status CheckAxes(const std::vector<SweepAxis>& axes) {
  if (axes.empty() || axes.size() > 2) {
    return MakeError(
        "sweep: give one or two of --seq, --batch, --lora-rank, --grad-accum as a grid "
        "(START:STOP:COUNT or A,B,C)");
  }
  if (axes.size() == 2 && axes[0].variable == axes[1].variable) {
    return MakeError(fmt::format("sweep: {} is swept twice", SweepVariableFlag(axes[0].variable)));
  }
  uint64_t points = 1;
  for (const SweepAxis& axis : axes) {
    if (axis.values.empty()) {
      return MakeError(fmt::format("{}: the grid has no values", SweepVariableFlag(axis.variable)));
    }
    for (size_t i = 0; i < axis.values.size(); ++i) {
      if (axis.values[i] == 0 || (i > 0 && axis.values[i] <= axis.values[i - 1])) {
        return MakeError(fmt::format("{}: grid values must be ascending, distinct and at least 1",
                                     SweepVariableFlag(axis.variable)));
      }
    }
    // Both factors are at most kMaxSweepPoints before the check, so no overflow.
    if (axis.values.size() > kMaxSweepPoints) points = kMaxSweepPoints + 1;
    points *= axis.values.size();
    if (points > kMaxSweepPoints) {
      return MakeError(
          fmt::format("sweep: more than {} points; use fewer values", kMaxSweepPoints));
    }
  }
  return Ok{};
}

std::string GridLabel(const SweepAxis& axis) {
  if (axis.values.size() == 1) return std::to_string(axis.values.front());
  return fmt::format("{}..{} ({} values)", axis.values.front(), axis.values.back(),
                     axis.values.size());
}

std::string PointLabel(const std::vector<SweepAxis>& axes, const std::vector<uint64_t>& at) {
  std::string label;
  for (size_t i = 0; i < axes.size(); ++i) {
    label += fmt::format("{}{} {}", i ? " " : "", SweepVariableFlag(axes[i].variable), at[i]);
  }
  return label;
}

}  // namespace

namespace {

// The work budget of a sweep (docs/hardening.md): points x events, the sum
// of every point's bound, within kBatchBudgetFactor x --max-events before any
// point runs. A point over its own budget is left to fail as the sweep
// reaches it (the sweep ends there, so the points after it are not counted).
Status CheckSweepWork(const ModelSpec& model, const TrainingSetup& setup,
                      const std::vector<SweepAxis>& axes) {
  const size_t inner = axes.size() == 2 ? axes[1].values.size() : 1;
  const size_t total = axes[0].values.size() * inner;
  const uint64_t limit =
      common::CheckedMul(setup.max_events, kBatchBudgetFactor).value_or(UINT64_MAX);
  uint64_t sum = 0, largest = 0;
  size_t counted = 0;
  // Counting stops at the first point past the limit: bounding a point costs
  // a copy of the model, and 10 000 points of a 30B MoE took 20 s to count.
  for (size_t i = 0; i < total && sum <= limit; ++i, ++counted) {
    TrainingSetup s = WithKnob(setup, axes[0].variable, axes[0].values[i / inner]);
    if (axes.size() == 2) s = WithKnob(std::move(s), axes[1].variable, axes[1].values[i % inner]);
    auto work = EstimateLoweringWork(model, s);
    // The sweep ends at a point that cannot run (its own budget, a bad
    // layout), so nothing after it needs counting.
    if (!work.ok() || work->events > setup.max_events) break;
    sum = common::SaturatingAdd(sum, work->events);
    largest = std::max(largest, work->events);
  }
  if (sum <= limit) return Ok{};
  return MakeError(fmt::format(
      "{}: work budget: the {} points of this sweep lower to more than {} events in all (about "
      "{} for the first {}, up to {} each), above the limit of {} ({} x --max-events; raise "
      "--max-events, or sweep fewer points)",
      model.name, total, limit, sum, counted, largest, limit, kBatchBudgetFactor));
}

}  // namespace

TrainingSetup WithKnob(TrainingSetup setup, SweepVariable variable, uint64_t value) {
  switch (variable) {
    case SweepVariable::kSeq: setup.seq = value; break;
    case SweepVariable::kBatch: setup.batch = value; break;
    case SweepVariable::kLoraRank: setup.lora_rank = value; break;
    case SweepVariable::kGradAccum: setup.grad_accum = value; break;
    case SweepVariable::kImageSize: setup.image_size = value; break;
  }
  return setup;
}

Result<SweepResult> Sweep(const ModelSpec& model, const TrainingSetup& setup,
                          const std::vector<SweepAxis>& axes, const Progress& progress) {
  if (Status s = CheckAxes(axes); !s.ok()) return s.error();
  if (Status s = CheckSweepWork(model, setup, axes); !s.ok()) return s.error();
  SweepResult out;
  out.source = model.name;
  out.axes = axes;
  out.knobs = DescribeKnobs(model, setup);  // a UNet's: image, latent scale, text length
  for (const SweepAxis& axis : axes) {
    for (auto& [key, value] : out.knobs) {
      if (key == SweepVariableKey(axis.variable)) value = GridLabel(axis);
    }
  }
  const size_t inner = axes.size() == 2 ? axes[1].values.size() : 1;
  const size_t total = axes[0].values.size() * inner;
  EstimateOptions options;
  options.timeline = false;  // the peaks are all a sweep shows
  options.top_allocations = 0;
  auto coordinates = [&](size_t i) {
    std::vector<uint64_t> at{axes[0].values[i / inner]};
    if (axes.size() == 2) at.push_back(axes[1].values[i % inner]);
    return at;
  };
  // One slot per point, written by whichever thread runs the point.
  std::vector<std::optional<Result<SweepPoint>>> points(total);
  size_t done = 0;
  std::mutex progress_mutex;  // one progress call at a time
  auto report_progress = [&] {
    if (!progress) return;
    const std::lock_guard<std::mutex> lock(progress_mutex);
    progress(++done, total);
  };
  plan_internal::ParallelFor(total, [&](size_t i) {
    SweepPoint point;
    point.at = coordinates(i);
    TrainingSetup s = setup;
    for (size_t a = 0; a < axes.size(); ++a)
      s = WithKnob(std::move(s), axes[a].variable, point.at[a]);
    auto est = Estimate(model, s, options);
    if (!est.ok()) {
      points[i].emplace(
          MakeError(fmt::format("{}: {}", PointLabel(axes, point.at), est.error().message)));
      return false;  // ends the sweep; the points below this one still run
    }
    const Report& report = est->report;
    const RankReport& worst = report.worst();
    point.peak_allocated_bytes = FullPeakAllocatedBytes(worst);
    // A point that does not fit reports its whole requirement, so the chart
    // draws the curve past the GPU's line.
    point.peak_reserved_bytes = FullPeakReservedBytes(worst);
    point.device_total_bytes = FullDeviceTotalBytes(worst);
    point.needed_bytes = report.needed_bytes();
    point.oom = worst.sim.oom.has_value();
    point.fits = report.fits();
    if (i == 0) {  // only this item writes these
      out.gpu = report.gpu;
      out.model = report.model;
    }
    points[i].emplace(std::move(point));
    report_progress();
    return true;
  });

  // In point order, so the error reported is the first failing point's, as
  // if the points had run one after another.
  out.points.reserve(total);
  for (std::optional<Result<SweepPoint>>& point : points) {
    VS_CHECK(point.has_value());  // every point below a failing one ran
    if (!point->ok()) return point->error();
    out.points.push_back(std::move(point->value()));
  }
  return out;
}

}  // namespace vramscope
