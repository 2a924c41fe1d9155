// vramscope replay SNAPSHOT --alloc-conf ...: the measured allocation stream
// through the allocator model, with the snapshot's own settings (how well the
// model reproduces the run) and with others (what they would have reserved).
#include <fmt/format.h>

#include <memory>
#include <nlohmann/json.hpp>

#include "command.h"
#include "output.h"
#include "vramscope/gpu.h"
#include "vramscope/simulate.h"
#include "vramscope/snapshot.h"

namespace vramscope::cli {
namespace {

struct ReplayArgs {
  std::string snapshot_path;
  std::string alloc_conf;
  bool alloc_conf_given = false;
  std::string gpu = "h100-80g";
  int device = -1;
  size_t top = 20;
  OutputOptions out;
};

std::string Percent(uint64_t value, uint64_t reference) {
  if (reference == 0) return "n/a";
  return fmt::format("{:+.2f}%", 100.0 *
                                     (static_cast<double>(value) - static_cast<double>(reference)) /
                                     static_cast<double>(reference));
}

std::string ConfLabel(const std::string& text) {
  return text.empty() ? std::string("PyTorch's defaults") : "'" + text + "'";
}

int RunReplay(const ReplayArgs& args) {
  auto gpu = FindGpu(args.gpu);
  if (!gpu.ok()) return FailBadInput(gpu.error());
  Result<AllocatorConfig> requested = AllocatorConfig{};
  if (args.alloc_conf_given) {
    requested = ParseAllocConf(args.alloc_conf);
    if (!requested.ok()) return FailBadInput(requested.error());
  }
  auto snapshot = ReadSnapshotFile(args.snapshot_path);
  if (!snapshot.ok()) return FailBadInput(snapshot.error());
  ExplainOptions explain;
  explain.device = args.device;
  auto measured = MeasureSnapshot(*snapshot, explain);
  if (!measured.ok()) {
    return FailBadInput(MakeError(args.snapshot_path + ": " + measured.error().message));
  }
  auto stream = SnapshotToEventStream(*snapshot, measured->device);
  if (!stream.ok())
    return FailBadInput(MakeError(args.snapshot_path + ": " + stream.error().message));

  // The memory PyTorch could hold: at an OOM the trace says (reserved + free
  // then); otherwise the GPU catalog's usable memory minus the CUDA context.
  uint64_t limit =
      gpu->usable_bytes > gpu->cuda_context_bytes ? gpu->usable_bytes - gpu->cuda_context_bytes : 0;
  if (measured->sim.oom) limit = measured->sim.oom->device_limit_bytes;

  SimOptions options;
  options.device_limit_bytes = limit;
  options.top_allocations = args.top;
  options.alloc = SnapshotAllocatorConfig(*snapshot);
  auto baseline = Simulate(*stream, options);
  if (!baseline.ok())
    return FailBadInput(MakeError(args.snapshot_path + ": " + baseline.error().message));
  Result<SimResult> replayed = *baseline;
  if (args.alloc_conf_given) {
    options.alloc = *requested;
    replayed = Simulate(*stream, options);
    if (!replayed.ok())
      return FailBadInput(MakeError(args.snapshot_path + ": " + replayed.error().message));
  }
  const std::string own_conf = SnapshotAllocatorConfig(*snapshot).text;
  const std::string used_conf = args.alloc_conf_given ? args.alloc_conf : own_conf;
  const uint64_t measured_reserved = measured->sim.peak_reserved_bytes;

  Report report;
  report.command = "replay";
  report.source = args.snapshot_path;
  report.gpu = SnapshotDevice(*measured, *gpu);  // an OOM snapshot's own device
  report.knobs = {
      {"gpu", gpu->name}, {"device", std::to_string(measured->device)}, {"alloc_conf", used_conf}};
  RankReport rank;
  rank.rank_class = "all";
  rank.ranks = {measured->device};
  rank.sim = *replayed;
  rank.extras.cuda_context_bytes = gpu->cuda_context_bytes;
  rank.device_total_bytes = DeviceTotalBytes(rank.sim, rank.extras);
  report.ranks.push_back(std::move(rank));
  report.explanation.push_back(
      fmt::format("Measured in the snapshot: peak allocated {}, peak reserved {}.",
                  FormatBytes(measured->sim.peak_allocated_bytes), FormatBytes(measured_reserved)));
  report.explanation.push_back(fmt::format(
      "Replayed with the snapshot's own settings ({}): peak reserved {} ({} vs measured).",
      ConfLabel(own_conf), FormatBytes(baseline->peak_reserved_bytes),
      Percent(baseline->peak_reserved_bytes, measured_reserved)));
  if (args.alloc_conf_given) {
    const int64_t saved = static_cast<int64_t>(baseline->peak_reserved_bytes) -
                          static_cast<int64_t>(replayed->peak_reserved_bytes);
    report.explanation.push_back(fmt::format(
        "Replayed with {}: peak reserved {} ({} vs measured); {} {} than the snapshot's "
        "settings in the same model.",
        ConfLabel(args.alloc_conf), FormatBytes(replayed->peak_reserved_bytes),
        Percent(replayed->peak_reserved_bytes, measured_reserved),
        FormatBytes(static_cast<uint64_t>(saved < 0 ? -saved : saved)),
        saved >= 0 ? "less" : "more"));
  }
  report.notes.push_back(
      "Replay feeds the measured allocations (requested sizes, streams, order) to the allocator "
      "model; a block is freed when PyTorch could reuse it (free_completed), and each run of "
      "segment frees in the trace replays as torch.cuda.empty_cache().");
  report.notes.push_back(fmt::format("Device limit of the replay: {}{}.", FormatBytes(limit),
                                     measured->sim.oom ? " (reserved + free at the measured OOM)"
                                                       : " (GPU usable minus CUDA context)"));
  if (!args.out.json) return EmitReport(report, args.out);

  nlohmann::ordered_json j = nlohmann::ordered_json::parse(RenderJson(report));
  nlohmann::ordered_json replay;
  replay["measured_peak_allocated_bytes"] = measured->sim.peak_allocated_bytes;
  replay["measured_peak_reserved_bytes"] = measured_reserved;
  replay["baseline_alloc_conf"] = own_conf;
  replay["baseline_peak_allocated_bytes"] = baseline->peak_allocated_bytes;
  replay["baseline_peak_reserved_bytes"] = baseline->peak_reserved_bytes;
  replay["alloc_conf"] = used_conf;
  replay["predicted_peak_allocated_bytes"] = replayed->peak_allocated_bytes;
  replay["predicted_peak_reserved_bytes"] = replayed->peak_reserved_bytes;
  replay["device_limit_bytes"] = limit;
  replay["events"] = stream->size();
  j["replay"] = replay;
  const std::string text =
      j.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
  std::fwrite(text.data(), 1, text.size(), stdout);
  const std::pair<const std::string*, std::string (*)(const Report&)> outputs[] = {
      {&args.out.html_path, &RenderHtml},
      {&args.out.svg_path, &RenderSvg},
      {&args.out.csv_path, &RenderTimelineCsv}};
  for (const auto& [path, render] : outputs) {
    if (path->empty()) continue;
    if (Status s = WriteTextFile(*path, render(report)); !s.ok()) return FailBadInput(s.error());
  }
  return kExitOk;
}

RunFn SetupReplay(CLI::App* sub) {
  auto args = std::make_shared<ReplayArgs>();
  sub->add_option("SNAPSHOT", args->snapshot_path,
                  "File written by torch.cuda.memory._dump_snapshot() (pickle) or its JSON form")
      ->required();
  sub->add_option("--alloc-conf", args->alloc_conf,
                  "Allocator settings to replay with, PYTORCH_CUDA_ALLOC_CONF syntax "
                  "(default: the snapshot's own)")
      ->each([args](const std::string&) { args->alloc_conf_given = true; });
  sub->add_option("--device", args->device, "CUDA device of the snapshot (default: most traced)");
  sub->add_option("--gpu", args->gpu, "GPU catalog entry: the device limit of the replay");
  sub->add_option("--top", args->top, "How many allocations alive at the peak to list");
  AddOutputFlags(sub, &args->out);
  return [args] { return RunReplay(*args); };
}

}  // namespace

extern const CommandSpec kReplayCommand = {
    "replay", "Replay a snapshot's allocations through the allocator model with other settings",
    &SetupReplay};

}  // namespace vramscope::cli
