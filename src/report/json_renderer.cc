// ReportToJson and RenderJson: the machine-readable report. Keys and meanings are the interface
// contract of DESIGN.md plus the extras documented in docs/json-schema.md; key
// order follows that document so diffs and golden files stay readable.
#include <string>

#include <nlohmann/json.hpp>

#include "report_format.h"
#include "vramscope/report.h"

namespace vramscope {
namespace {

using report_internal::FragmentationAtPeakBytes;
using report_internal::RankFits;
using report_internal::RankNeededBytes;
using report_internal::SignedDifference;
using Json = nlohmann::ordered_json;

Json Breakdown(const CategoryBytes& bytes) {
  Json out = Json::object();
  for (Category c : kAllCategories) {
    out[std::string(CategoryJsonKey(c))] = bytes[static_cast<size_t>(c)];
  }
  return out;
}

Json Phases(const SimResult& sim) {
  Json out = Json::array();
  for (const PhasePeak& p : sim.phases) {
    out.push_back({{"step", p.step},
                   {"phase", PhaseName(p.phase)},
                   {"peak_allocated_bytes", p.peak_allocated_bytes},
                   {"peak_reserved_bytes", p.peak_reserved_bytes},
                   {"allocated_at_end_bytes", p.allocated_at_end_bytes}});
  }
  return out;
}

Json TopAllocations(const SimResult& sim) {
  Json out = Json::array();
  for (const LiveAllocation& a : sim.top_at_peak) {
    out.push_back({{"block_bytes", a.block_bytes},
                   {"requested_bytes", a.requested_bytes},
                   {"category", CategoryJsonKey(a.category)},
                   {"op", a.op},
                   {"module", a.module},
                   {"step", a.step},
                   {"phase", PhaseName(a.phase)}});
  }
  return out;
}

Json Oom(const SimResult& sim) {
  if (!sim.oom) return nullptr;
  const OomInfo& oom = *sim.oom;
  return {{"requested_bytes", oom.requested_bytes},
          {"alloc_size_bytes", oom.alloc_size_bytes},
          {"message", oom.message},
          {"step", sim.oom_step},
          {"phase", PhaseName(sim.oom_phase)},
          {"event_index", sim.oom_event_index},
          {"allocated_bytes", oom.allocated_bytes},
          {"reserved_bytes", oom.reserved_bytes},
          {"device_limit_bytes", oom.device_limit_bytes},
          {"free_device_bytes", oom.free_device_bytes}};
}

// Reserved bytes per CUDA stream when reserved peaked: side streams keep
// cached blocks of their own.
Json ReservedByStream(const SimResult& sim) {
  Json out = Json::array();
  for (const StreamBytes& s : sim.reserved_by_stream_at_peak) {
    out.push_back({{"stream", s.stream}, {"name", s.name}, {"reserved_bytes", s.reserved_bytes}});
  }
  return out;
}

Json Grouped(const std::vector<std::pair<std::string, uint64_t>>& rows, const char* key) {
  Json out = Json::array();
  for (const auto& [name, bytes] : rows) out.push_back({{key, name}, {"bytes", bytes}});
  return out;
}

// What the forward left alive for backward (null for snapshots and streams
// without a backward).
Json Saved(const RankReport& rank) {
  if (!rank.saved) return nullptr;
  const SavedActivations& s = *rank.saved;
  return {{"step", s.step},
          {"total_bytes", s.total_bytes},
          {"by_block", Grouped(s.by_block, "block")},
          {"by_layer", Grouped(s.by_layer, "layer")},
          {"by_op", Grouped(s.by_op, "op")}};
}

// The per-rank-class fields: the contract's numbers plus the extras. The top
// level repeats these for the worst class.
void AddRankFields(const Report& report, const RankReport& rank, Json* out) {
  const SimResult& sim = rank.sim;
  Json& o = *out;
  o["peak_allocated_bytes"] = sim.peak_allocated_bytes;
  o["peak_reserved_bytes"] = sim.peak_reserved_bytes;
  o["device_total_bytes"] = DeviceTotalBytes(rank);
  o["host_peak_bytes"] = rank.host_peak_bytes;
  o["fits"] = RankFits(report, rank);
  o["breakdown_at_peak"] = Breakdown(sim.breakdown_at_peak);
  o["phases"] = Phases(sim);
  o["headroom_bytes"] = SignedDifference(report.gpu.usable_bytes, RankNeededBytes(rank));
  o["peak"] = {{"step", sim.peak_step},
               {"phase", PhaseName(sim.peak_phase)},
               {"event_index", sim.peak_event_index},
               {"reserved_bytes", sim.reserved_at_peak_bytes}};
  o["fragmentation_at_peak_bytes"] = FragmentationAtPeakBytes(sim);
  if (sim.peak_active_bytes) {
    o["peak_active_bytes"] = *sim.peak_active_bytes;
  } else {
    o["peak_active_bytes"] = nullptr;
  }
  o["reserved_by_stream"] =
      sim.reserved_by_stream_at_peak.empty() ? Json(nullptr) : ReservedByStream(sim);
  o["device_view"] = {{"reserved_bytes", sim.peak_reserved_bytes},
                      {"cuda_context_bytes", rank.extras.cuda_context_bytes},
                      {"nccl_bytes", rank.extras.nccl_bytes},
                      {"other_bytes", rank.extras.other_bytes}};
  o["top_allocations"] = TopAllocations(sim);
  o["live_at_peak_count"] = sim.live_at_peak_count;
  o["oom"] = Oom(sim);
  o["state_only"] = rank.state_only;
  o["saved_for_backward"] = Saved(rank);
  if (rank.full) {
    o["full_requirement"] = {{"peak_allocated_bytes", rank.full->peak_allocated_bytes},
                             {"peak_reserved_bytes", rank.full->peak_reserved_bytes},
                             {"device_total_bytes", FullDeviceTotalBytes(*rank.full, rank.extras)},
                             {"step", rank.full->peak_step},
                             {"phase", PhaseName(rank.full->peak_phase)}};
  } else {
    o["full_requirement"] = nullptr;
  }
}

}  // namespace

Json ReportToJson(const Report& report) {
  const RankReport& worst = report.worst();
  Json root = Json::object();
  root["schema_version"] = kReportSchemaVersion;
  root["command"] = report.command;
  root["source"] = report.source;
  // Contract keys first, in DESIGN.md's order.
  root["peak_allocated_bytes"] = worst.sim.peak_allocated_bytes;
  root["peak_reserved_bytes"] = worst.sim.peak_reserved_bytes;
  root["device_total_bytes"] = DeviceTotalBytes(worst);
  root["host_peak_bytes"] = worst.host_peak_bytes;
  root["host_peak_per_node_bytes"] = report.host_peak_per_node_bytes;
  root["fits"] = report.has_device_limit ? Json(report.fits()) : Json(nullptr);
  root["gpu"] = {{"name", report.gpu.name},
                 {"display_name", report.gpu.display_name},
                 {"usable_bytes", report.gpu.usable_bytes},
                 {"total_bytes", report.gpu.total_bytes}};
  if (report.model) {
    root["model"] = {{"name", report.model->name},
                     {"architecture", report.model->architecture},
                     {"parameters", report.model->parameters},
                     {"trainable_parameters", report.model->trainable_parameters}};
  } else {
    root["model"] = nullptr;
  }
  Json worst_fields = Json::object();
  AddRankFields(report, worst, &worst_fields);
  for (const char* key : {"breakdown_at_peak", "phases"}) root[key] = worst_fields[key];
  Json ranks = Json::array();
  for (const RankReport& rank : report.ranks) {
    Json r = Json::object();
    r["rank_class"] = rank.rank_class;
    r["ranks"] = rank.ranks;
    AddRankFields(report, rank, &r);
    ranks.push_back(std::move(r));
  }
  root["ranks"] = std::move(ranks);
  // Extras (docs/json-schema.md): the report-wide verdict, then the worst
  // class's details.
  root["headroom_bytes"] = report.headroom_bytes();
  root["needed_bytes"] = report.needed_bytes();
  root["worst_rank_class"] = worst.rank_class;
  for (const char* key :
       {"peak", "fragmentation_at_peak_bytes", "peak_active_bytes", "reserved_by_stream",
        "device_view", "top_allocations", "live_at_peak_count", "oom", "full_requirement",
        "state_only", "saved_for_backward"}) {
    root[key] = worst_fields[key];
  }
  Json knobs = Json::object();
  for (const auto& [key, value] : report.knobs) knobs[key] = value;
  root["knobs"] = std::move(knobs);
  root["explanation"] = report.explanation;
  root["notes"] = report.notes;
  Json assumptions = Json::array();
  for (const Assumption& a : report.assumptions) {
    assumptions.push_back({{"what", a.what}, {"assumed", a.assumed}, {"flag", a.flag}});
  }
  root["assumptions"] = std::move(assumptions);
  return root;
}

std::string RenderJson(const Report& report, int indent) {
  // Input text may hold invalid UTF-8: replace it with U+FFFD rather than
  // throwing, because the library never throws.
  return ReportToJson(report).dump(indent, ' ', false, Json::error_handler_t::replace) + "\n";
}

}  // namespace vramscope
