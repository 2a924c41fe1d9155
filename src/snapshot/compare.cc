// CompareReports and its renderers: measured (a snapshot) next to predicted
// (an estimate), per total, per category at each side's peak, per phase.
#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>

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

int64_t Difference(uint64_t measured, uint64_t predicted) {
  constexpr auto kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  if (predicted >= measured) return static_cast<int64_t>(std::min(predicted - measured, kMax));
  return -static_cast<int64_t>(std::min(measured - predicted, kMax));
}

std::string SignedGiB(int64_t bytes) {
  const uint64_t magnitude =
      bytes < 0 ? 0 - static_cast<uint64_t>(bytes) : static_cast<uint64_t>(bytes);
  std::string text(bytes < 0 ? "-" : "+");
  text += FormatBytes(magnitude);
  return text;
}

std::string Percent(const CompareRow& row) {
  if (row.measured_bytes == 0) return row.predicted_bytes == 0 ? "" : "(measured 0)";
  const double pct =
      100.0 * (static_cast<double>(row.predicted_bytes) - static_cast<double>(row.measured_bytes)) /
      static_cast<double>(row.measured_bytes);
  return fmt::format("({:+.1f}%)", pct);
}

std::string RowText(const CompareRow& row, std::string_view label) {
  return fmt::format("  {:<22}{:>13}  {:>13}  {:>13} {}\n", label, FormatBytes(row.measured_bytes),
                     FormatBytes(row.predicted_bytes),
                     SignedGiB(Difference(row.measured_bytes, row.predicted_bytes)), Percent(row));
}

nlohmann::ordered_json RowJson(const CompareRow& row) {
  nlohmann::ordered_json j;
  j["measured_bytes"] = row.measured_bytes;
  j["predicted_bytes"] = row.predicted_bytes;
  j["difference_bytes"] = Difference(row.measured_bytes, row.predicted_bytes);
  return j;
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

std::string RenderComparisonText(const Comparison& c) {
  std::string out =
      fmt::format("vramscope compare: {} (measured) vs {} (predicted)\n", c.snapshot, c.model);
  std::string knobs;
  for (const auto& [k, v] : c.knobs) {
    if (!knobs.empty()) knobs += ", ";
    knobs += k + "=" + v;
  }
  out += fmt::format("GPU: {}\nKnobs: {}\n\n", c.gpu, knobs);
  out += fmt::format("  {:<22}{:>13}  {:>13}  {:>13}\n", "", "measured", "predicted", "difference");
  const char* const total_labels[] = {"peak allocated", "peak reserved", "device total"};
  for (size_t i = 0; i < c.totals.size(); ++i) out += RowText(c.totals[i], total_labels[i]);
  out += "\nBreakdown at the peak (allocated bytes)\n";
  for (const CompareRow& row : c.categories) out += RowText(row, row.name);
  out += "\nLargest allocated per phase\n";
  for (const CompareRow& row : c.phases) out += RowText(row, row.name);
  out += "\nLargest reserved per phase\n";
  for (const CompareRow& row : c.phases_reserved) out += RowText(row, row.name);
  if (!c.notes.empty()) {
    out += "\nNotes\n";
    for (const std::string& note : c.notes) out += "  - " + note + "\n";
  }
  return out;
}

std::string RenderComparisonJson(const Comparison& c, int indent) {
  nlohmann::ordered_json j;
  j["schema_version"] = kReportSchemaVersion;
  j["command"] = "compare";
  j["snapshot"] = c.snapshot;
  j["model"] = c.model;
  j["gpu"] = c.gpu;
  nlohmann::ordered_json knobs = nlohmann::ordered_json::object();
  for (const auto& [k, v] : c.knobs) knobs[k] = v;
  j["knobs"] = knobs;
  nlohmann::ordered_json totals = nlohmann::ordered_json::object();
  for (const CompareRow& row : c.totals) totals[row.name + "_bytes"] = RowJson(row);
  j["totals"] = totals;
  nlohmann::ordered_json categories = nlohmann::ordered_json::object();
  for (const CompareRow& row : c.categories) categories[row.name] = RowJson(row);
  j["breakdown_at_peak"] = categories;
  nlohmann::ordered_json phases = nlohmann::ordered_json::array();
  for (size_t i = 0; i < c.phases.size(); ++i) {
    nlohmann::ordered_json p;
    p["phase"] = c.phases[i].name;
    p["peak_allocated_bytes"] = RowJson(c.phases[i]);
    p["peak_reserved_bytes"] = RowJson(c.phases_reserved[i]);
    phases.push_back(p);
  }
  j["phases"] = phases;
  j["notes"] = c.notes;
  // Text from inputs may hold invalid UTF-8: replace rather than throw.
  return j.dump(indent, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

}  // namespace vramscope
