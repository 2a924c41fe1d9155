// explain and compare as library calls: a snapshot file measured into the
// standard report, its JSON, and the comparison with a prediction.
#include <nlohmann/json.hpp>

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

}  // namespace

Result<MeasuredSnapshot> ExplainSnapshotFile(const std::string& path, const GpuSpec& gpu,
                                             const ExplainOptions& options) {
  auto snapshot = ReadSnapshotFile(path);
  if (!snapshot.ok()) return snapshot.error();
  auto run = MeasureSnapshot(*snapshot, options);
  if (!run.ok()) return MakeError(path + ": " + run.error().message);
  MeasuredSnapshot measured;
  measured.report = MeasuredReport(*run, *snapshot, gpu, path);
  measured.run = std::move(*run);
  measured.format = snapshot->format;
  if (snapshot->settings) measured.alloc_conf = snapshot->settings->conf_text;
  return measured;
}

std::string RenderExplainJson(const MeasuredSnapshot& measured) {
  nlohmann::ordered_json j = ReportToJson(measured.report);
  j["snapshot"] = SnapshotJson(measured);
  return j.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

Comparison CompareMeasured(const MeasuredSnapshot& measured, const Report& predicted) {
  Comparison comparison = CompareReports(measured.report, predicted);
  if (!measured.run.has_frames) {
    comparison.notes.push_back(
        "The snapshot has no stacks: every measured block is \"other\", so only the totals "
        "and phases compare.");
  }
  return comparison;
}

}  // namespace vramscope
