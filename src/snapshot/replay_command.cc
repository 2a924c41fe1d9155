// replay as a library call: a snapshot file's measured allocation stream
// through the allocator model, with the snapshot's own settings (how well
// the model reproduces the run) and with others (what they would reserve),
// as the standard report (its JSON: src/report/snapshot_render.cc).
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "vramscope/snapshot.h"

namespace vramscope {
namespace {

// "+1.23%": `value` relative to the measured `reference`.
std::string PercentVsMeasured(uint64_t value, uint64_t reference) {
  if (reference == 0) return "n/a";
  return fmt::format("{:+.2f}%", 100.0 *
                                     (static_cast<double>(value) - static_cast<double>(reference)) /
                                     static_cast<double>(reference));
}

std::string ConfLabel(const std::string& text) {
  return text.empty() ? std::string("PyTorch's defaults") : "'" + text + "'";
}

// The memory PyTorch could hold: at an OOM the trace says (reserved + free
// then); otherwise the GPU catalog's usable memory minus the CUDA context.
uint64_t ReplayDeviceLimit(const SnapshotRun& measured, const GpuSpec& gpu) {
  if (measured.sim.oom) return measured.sim.oom->device_limit_bytes;
  return gpu.usable_bytes > gpu.cuda_context_bytes ? gpu.usable_bytes - gpu.cuda_context_bytes : 0;
}

// The two simulations: with the snapshot's settings (the baseline) and, if
// asked for, with `requested` (else the baseline again).
struct ReplayedRuns {
  SimResult baseline;
  SimResult replayed;
};

Result<ReplayedRuns> SimulateReplays(const EventStream& stream, SimOptions options,
                                     const std::optional<AllocatorConfig>& requested,
                                     const std::string& path) {
  auto baseline = Simulate(stream, options);
  if (!baseline.ok()) return MakeError(path + ": " + baseline.error().message);
  if (!requested) return ReplayedRuns{*baseline, *baseline};
  options.alloc = *requested;
  auto replayed = Simulate(stream, options);
  if (!replayed.ok()) return MakeError(path + ": " + replayed.error().message);
  return ReplayedRuns{std::move(*baseline), std::move(*replayed)};
}

// The plain-words lines: measured, the baseline, and the settings asked for
// against the baseline.
std::vector<std::string> ReplayExplanation(const SnapshotReplay& r, bool conf_given) {
  std::vector<std::string> lines;
  lines.push_back(fmt::format("Measured in the snapshot: peak allocated {}, peak reserved {}.",
                              FormatBytes(r.measured_peak_allocated_bytes),
                              FormatBytes(r.measured_peak_reserved_bytes)));
  lines.push_back(fmt::format(
      "Replayed with the snapshot's own settings ({}): peak reserved {} ({} vs measured).",
      ConfLabel(r.baseline_alloc_conf), FormatBytes(r.baseline_peak_reserved_bytes),
      PercentVsMeasured(r.baseline_peak_reserved_bytes, r.measured_peak_reserved_bytes)));
  if (!conf_given) return lines;
  const int64_t saved = static_cast<int64_t>(r.baseline_peak_reserved_bytes) -
                        static_cast<int64_t>(r.predicted_peak_reserved_bytes);
  lines.push_back(fmt::format(
      "Replayed with {}: peak reserved {} ({} vs measured); {} {} than the snapshot's "
      "settings in the same model.",
      ConfLabel(r.alloc_conf), FormatBytes(r.predicted_peak_reserved_bytes),
      PercentVsMeasured(r.predicted_peak_reserved_bytes, r.measured_peak_reserved_bytes),
      FormatBytes(static_cast<uint64_t>(saved < 0 ? -saved : saved)),
      saved >= 0 ? "less" : "more"));
  return lines;
}

// The standard report of the replay asked for: the replayed run as the only
// rank on the snapshot's device (an OOM snapshot's own), with the catalog
// entry's CUDA context added.
Report ReplayReport(const SnapshotReplay& r, const SnapshotRun& measured, SimResult replayed,
                    const std::string& path, const ReplayOptions& options) {
  Report report;
  report.command = "replay";
  report.source = path;
  report.gpu = SnapshotDevice(measured, options.gpu);
  report.knobs = {{"gpu", options.gpu.name},
                  {"device", std::to_string(measured.device)},
                  {"alloc_conf", r.alloc_conf}};
  RankReport rank;
  rank.rank_class = "all";
  rank.ranks = {measured.device};
  rank.sim = std::move(replayed);
  rank.extras.cuda_context_bytes = options.gpu.cuda_context_bytes;
  rank.device_total_bytes = DeviceTotalBytes(rank.sim, rank.extras);
  report.ranks.push_back(std::move(rank));
  report.explanation = ReplayExplanation(r, options.alloc_conf.has_value());
  report.notes.push_back(
      "Replay feeds the measured allocations (requested sizes, streams, order) to the allocator "
      "model; a block is freed when PyTorch could reuse it (free_completed), and each run of "
      "segment frees in the trace replays as torch.cuda.empty_cache().");
  report.notes.push_back(fmt::format("Device limit of the replay: {}{}.",
                                     FormatBytes(r.device_limit_bytes),
                                     measured.sim.oom ? " (reserved + free at the measured OOM)"
                                                      : " (GPU usable minus CUDA context)"));
  return report;
}

}  // namespace

Result<SnapshotReplay> ReplaySnapshotFile(const std::string& path, const ReplayOptions& options) {
  std::optional<AllocatorConfig> requested;
  if (options.alloc_conf) {
    auto parsed = ParseAllocConf(*options.alloc_conf);
    if (!parsed.ok()) return parsed.error();
    requested = std::move(*parsed);
  }
  auto snapshot = ReadSnapshotFile(path);
  if (!snapshot.ok()) return snapshot.error();
  ExplainOptions explain;
  explain.device = options.device;
  auto measured = MeasureSnapshot(*snapshot, explain);
  if (!measured.ok()) return MakeError(path + ": " + measured.error().message);
  auto stream = SnapshotToEventStream(*snapshot, measured->device);
  if (!stream.ok()) return MakeError(path + ": " + stream.error().message);

  SimOptions sim;
  sim.device_limit_bytes = ReplayDeviceLimit(*measured, options.gpu);
  sim.top_allocations = options.top_allocations;
  sim.alloc = SnapshotAllocatorConfig(*snapshot);
  auto runs = SimulateReplays(*stream, sim, requested, path);
  if (!runs.ok()) return runs.error();

  SnapshotReplay r;
  r.measured_peak_allocated_bytes = measured->sim.peak_allocated_bytes;
  r.measured_peak_reserved_bytes = measured->sim.peak_reserved_bytes;
  r.baseline_alloc_conf = sim.alloc.text;
  r.baseline_peak_allocated_bytes = runs->baseline.peak_allocated_bytes;
  r.baseline_peak_reserved_bytes = runs->baseline.peak_reserved_bytes;
  r.alloc_conf = options.alloc_conf.value_or(r.baseline_alloc_conf);
  r.predicted_peak_allocated_bytes = runs->replayed.peak_allocated_bytes;
  r.predicted_peak_reserved_bytes = runs->replayed.peak_reserved_bytes;
  r.device_limit_bytes = sim.device_limit_bytes;
  r.events = stream->size();
  r.report = ReplayReport(r, *measured, std::move(runs->replayed), path, options);
  return r;
}

}  // namespace vramscope
