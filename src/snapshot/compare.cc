// CompareReports: measured (a snapshot) next to predicted (an estimate), per
// total, per category at each side's peak, per phase (rendered by
// src/report/snapshot_render.cc).
#include <fmt/format.h>

#include <algorithm>

#include "vramscope/snapshot.h"

namespace vramscope {
namespace {

constexpr Phase kPhaseOrder[] = {Phase::kSetup, Phase::kForward, Phase::kBackward,
                                 Phase::kOptimizer};

uint64_t PhaseMax(const SimResult& sim, Phase phase, bool reserved) {
  uint64_t best = 0;
  for (const PhasePeak& p : sim.phases) {
    if (p.phase != phase) continue;
    best = std::max(best, reserved ? p.peak_reserved_bytes : p.peak_allocated_bytes);
  }
  return best;
}

bool HasPhase(const SimResult& sim, Phase phase) {
  return std::any_of(sim.phases.begin(), sim.phases.end(),
                     [phase](const PhasePeak& p) { return p.phase == phase; });
}

}  // namespace

Comparison CompareReports(const Report& measured, const Report& predicted) {
  Comparison c;
  c.snapshot = measured.source;
  c.model = predicted.model ? predicted.model->name : predicted.source;
  c.knobs = predicted.knobs;
  c.gpu = predicted.gpu.name;
  const RankReport& m = measured.worst();
  const RankReport& p = predicted.worst();
  c.totals.push_back({"peak_allocated", m.sim.peak_allocated_bytes, p.sim.peak_allocated_bytes});
  c.totals.push_back({"peak_reserved", m.sim.peak_reserved_bytes, p.sim.peak_reserved_bytes});
  c.totals.push_back({"device_total", DeviceTotalBytes(m), DeviceTotalBytes(p)});
  for (Category cat : kAllCategories) {
    const int i = static_cast<int>(cat);
    c.categories.push_back({std::string(CategoryJsonKey(cat)), m.sim.breakdown_at_peak[i],
                            p.sim.breakdown_at_peak[i]});
  }
  for (Phase phase : kPhaseOrder) {
    if (!HasPhase(m.sim, phase) && !HasPhase(p.sim, phase)) continue;
    const std::string name(PhaseName(phase));
    c.phases.push_back({name, PhaseMax(m.sim, phase, false), PhaseMax(p.sim, phase, false)});
    c.phases_reserved.push_back({name, PhaseMax(m.sim, phase, true), PhaseMax(p.sim, phase, true)});
  }
  c.notes.push_back(
      "Breakdowns are at each side's own peak; phases are the largest over all steps of that "
      "kind. Difference = predicted - measured.");
  if (m.sim.oom) {
    c.notes.push_back(
        "The measured run ran out of memory: its numbers stop at the failure, below what the "
        "run needed.");
  }
  return c;
}

}  // namespace vramscope
