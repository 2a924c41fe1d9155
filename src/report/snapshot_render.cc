// The renderers of the snapshot commands' results (explain, replay and compare
// JSON, compare's text): pure functions of the types in vramscope/snapshot.h.
#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>

#include "vramscope/report.h"
#include "vramscope/snapshot.h"

namespace vramscope {
namespace {

using Json = nlohmann::ordered_json;

Json LiveAllocationJson(const LiveAllocation& a) {
  Json j;
  j["block_bytes"] = a.block_bytes;
  j["requested_bytes"] = a.requested_bytes;
  j["category"] = CategoryJsonKey(a.category);
  j["op"] = a.op;
  j["module"] = a.module;
  return j;
}

Json TopSitesJson(const std::vector<SiteBytes>& top_sites) {
  Json sites = Json::array();
  for (const SiteBytes& s : top_sites) {
    Json site;
    site["site"] = s.site;
    site["category"] = CategoryJsonKey(s.category);
    site["bytes"] = s.bytes;
    site["blocks"] = s.blocks;
    sites.push_back(site);
  }
  return sites;
}

// docs/json-schema.md, "snapshot": what only a measured run has.
Json SnapshotJson(const MeasuredSnapshot& m) {
  const SnapshotRun& run = m.run;
  Json j;
  j["format"] = m.format;
  j["device"] = run.device;
  j["trace_entries"] = run.trace_entries;
  j["allocations"] = run.allocations;
  j["has_frames"] = run.has_frames;
  j["alloc_conf"] = m.alloc_conf ? Json(*m.alloc_conf) : Json();
  j["initially_live_blocks"] = run.initially_live_blocks;
  j["initially_live_bytes"] = run.initially_live_bytes;
  j["initial_reserved_bytes"] = run.initial_reserved_bytes;
  j["peak_requested_bytes"] = run.sim.peak_requested_bytes;
  j["max_fragmentation_bytes"] = run.max_fragmentation_bytes;
  j["max_fragmentation_entry"] = run.max_fragmentation_entry;
  j["end_allocated_bytes"] = run.end_allocated_bytes;
  j["end_reserved_bytes"] = run.end_reserved_bytes;
  j["segments_allocated_bytes"] = run.segments_allocated_bytes;
  j["segments_reserved_bytes"] = run.segments_reserved_bytes;
  j["top_sites"] = TopSitesJson(run.top_sites);
  if (run.sim.oom) {
    Json breakdown;
    for (Category c : kAllCategories) {
      breakdown[std::string(CategoryJsonKey(c))] = run.breakdown_at_oom[static_cast<int>(c)];
    }
    j["breakdown_at_oom"] = breakdown;
    Json live = Json::array();
    for (const LiveAllocation& a : run.live_at_oom) live.push_back(LiveAllocationJson(a));
    j["live_at_oom"] = live;
  }
  return j;
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

std::string RenderExplainJson(const MeasuredSnapshot& measured) {
  nlohmann::ordered_json j = ReportToJson(measured.report);
  j["snapshot"] = SnapshotJson(measured);
  return j.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

std::string RenderReplayJson(const SnapshotReplay& r) {
  nlohmann::ordered_json replay;
  replay["measured_peak_allocated_bytes"] = r.measured_peak_allocated_bytes;
  replay["measured_peak_reserved_bytes"] = r.measured_peak_reserved_bytes;
  replay["baseline_alloc_conf"] = r.baseline_alloc_conf;
  replay["baseline_peak_allocated_bytes"] = r.baseline_peak_allocated_bytes;
  replay["baseline_peak_reserved_bytes"] = r.baseline_peak_reserved_bytes;
  replay["alloc_conf"] = r.alloc_conf;
  replay["predicted_peak_allocated_bytes"] = r.predicted_peak_allocated_bytes;
  replay["predicted_peak_reserved_bytes"] = r.predicted_peak_reserved_bytes;
  replay["device_limit_bytes"] = r.device_limit_bytes;
  replay["events"] = r.events;
  nlohmann::ordered_json j = ReportToJson(r.report);
  j["replay"] = std::move(replay);
  return j.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
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
