// vramscope explain SNAPSHOT: what a measured run (a PyTorch memory snapshot)
// allocated, when, for what, and, for an OOM, why it failed.
#include <memory>
#include <nlohmann/json.hpp>

#include "command.h"
#include "output.h"
#include "vramscope/gpu.h"
#include "vramscope/snapshot.h"

namespace vramscope::cli {
namespace {

struct ExplainArgs {
  std::string snapshot_path;
  std::string gpu = "h100-80g";
  int device = -1;
  size_t top = 20;
  OutputOptions out;
};

nlohmann::ordered_json LiveJson(const LiveAllocation& a) {
  nlohmann::ordered_json j;
  j["block_bytes"] = a.block_bytes;
  j["requested_bytes"] = a.requested_bytes;
  j["category"] = CategoryJsonKey(a.category);
  j["op"] = a.op;
  j["module"] = a.module;
  return j;
}

// docs/json-schema.md, "snapshot": what only a measured run has.
nlohmann::ordered_json SnapshotJson(const SnapshotRun& run, const Snapshot& snapshot) {
  nlohmann::ordered_json j;
  j["format"] = snapshot.format;
  j["device"] = run.device;
  j["trace_entries"] = run.trace_entries;
  j["allocations"] = run.allocations;
  j["has_frames"] = run.has_frames;
  j["alloc_conf"] = snapshot.settings ? nlohmann::ordered_json(snapshot.settings->conf_text)
                                      : nlohmann::ordered_json();
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
  nlohmann::ordered_json sites = nlohmann::ordered_json::array();
  for (const SiteBytes& s : run.top_sites) {
    nlohmann::ordered_json site;
    site["site"] = s.site;
    site["category"] = CategoryJsonKey(s.category);
    site["bytes"] = s.bytes;
    site["blocks"] = s.blocks;
    sites.push_back(site);
  }
  j["top_sites"] = sites;
  if (run.sim.oom) {
    nlohmann::ordered_json breakdown;
    for (Category c : kAllCategories) {
      breakdown[std::string(CategoryJsonKey(c))] = run.breakdown_at_oom[static_cast<int>(c)];
    }
    j["breakdown_at_oom"] = breakdown;
    nlohmann::ordered_json live = nlohmann::ordered_json::array();
    for (const LiveAllocation& a : run.live_at_oom) live.push_back(LiveJson(a));
    j["live_at_oom"] = live;
  }
  return j;
}

int RunExplain(const ExplainArgs& args) {
  auto gpu = FindGpu(args.gpu);
  if (!gpu.ok()) return FailBadInput(gpu.error());
  auto snapshot = ReadSnapshotFile(args.snapshot_path);
  if (!snapshot.ok()) return FailBadInput(snapshot.error());
  ExplainOptions options;
  options.device = args.device;
  options.top_allocations = args.top;
  auto run = MeasureSnapshot(*snapshot, options);
  if (!run.ok()) return FailBadInput(MakeError(args.snapshot_path + ": " + run.error().message));
  const Report report = MeasuredReport(*run, *snapshot, *gpu, args.snapshot_path);
  if (!args.out.json) return EmitReport(report, args.out);

  // The standard report plus the "snapshot" object; files as EmitReport writes them.
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(RenderJson(report));
  j["snapshot"] = SnapshotJson(*run, *snapshot);
  OutputOptions files = args.out;
  files.json = false;
  const std::string text =
      j.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
  std::fwrite(text.data(), 1, text.size(), stdout);
  const std::pair<const std::string*, std::string (*)(const Report&)> outputs[] = {
      {&files.html_path, &RenderHtml},
      {&files.svg_path, &RenderSvg},
      {&files.csv_path, &RenderTimelineCsv}};
  for (const auto& [path, render] : outputs) {
    if (path->empty()) continue;
    if (Status s = WriteTextFile(*path, render(report)); !s.ok()) return FailBadInput(s.error());
  }
  return kExitOk;
}

RunFn SetupExplain(CLI::App* sub) {
  auto args = std::make_shared<ExplainArgs>();
  sub->add_option("SNAPSHOT", args->snapshot_path,
                  "File written by torch.cuda.memory._dump_snapshot() (pickle) or its JSON form")
      ->required();
  sub->add_option("--device", args->device,
                  "CUDA device of the snapshot to explain (default: the one with the most trace "
                  "entries)");
  sub->add_option(
      "--gpu", args->gpu,
      "GPU catalog entry for the device total and the fit verdict (see `vramscope gpus`)");
  sub->add_option("--top", args->top, "How many allocations alive at the peak to list");
  AddOutputFlags(sub, &args->out);
  return [args] { return RunExplain(*args); };
}

}  // namespace

extern const CommandSpec kExplainCommand = {
    "explain", "Explain a measured run from a PyTorch memory snapshot", &SetupExplain};

}  // namespace vramscope::cli
