// MeasuredReport: a SnapshotRun in the report every command prints.
#include <fmt/format.h>

#include <algorithm>

#include "vramscope/snapshot.h"

namespace vramscope {

GpuSpec SnapshotDevice(const SnapshotRun& run, const GpuSpec& catalog) {
  if (!run.sim.oom) return catalog;
  const OomInfo& oom = *run.sim.oom;
  GpuSpec device = catalog;
  const uint64_t held = oom.reserved_bytes + oom.free_device_bytes;
  device.usable_bytes = held + catalog.cuda_context_bytes;
  device.total_bytes = std::max(device.total_bytes, device.usable_bytes);
  device.display_name = fmt::format("the snapshot's device {} ({} reserved + free at its OOM)",
                                    run.device, FormatBytes(held));
  return device;
}

Report MeasuredReport(const SnapshotRun& run, const Snapshot& snapshot, const GpuSpec& catalog,
                      const std::string& source, bool gpu_named) {
  const GpuSpec gpu = SnapshotDevice(run, catalog);
  Report report;
  report.command = "explain";
  report.source = source;
  report.gpu = gpu;
  report.has_device_limit = gpu_named || run.sim.oom.has_value();
  if (report.has_device_limit) report.knobs.emplace_back("gpu", gpu.name);
  report.knobs.emplace_back("device", std::to_string(run.device));
  report.knobs.emplace_back("format", snapshot.format);
  if (snapshot.settings) {
    report.knobs.emplace_back("alloc_conf", snapshot.settings->conf_text);
  }
  RankReport rank;
  rank.rank_class = "all";
  rank.ranks = {run.device};
  rank.sim = run.sim;
  rank.state_only = snapshot.segments_only;
  rank.extras.cuda_context_bytes = gpu.cuda_context_bytes;
  rank.device_total_bytes = DeviceTotalBytes(rank.sim, rank.extras);
  report.ranks.push_back(std::move(rank));
  report.explanation = ExplainMeasured(run);
  report.notes.push_back(fmt::format(
      "Measured from a PyTorch memory snapshot ({}, device {}, {} trace entries). Allocated "
      "counts block sizes as torch.cuda.memory_allocated() does, rebuilt from the trace (exact "
      "for blocks in the final segments); reserved follows the segment actions.",
      snapshot.format, run.device, run.trace_entries));
  report.notes.push_back(
      "Categories come from each block's stack and lifetime (docs/snapshot.md, "
      "\"Attribution\"); phases and steps are inferred from the stacks.");
  report.notes.push_back(fmt::format(
      "The device total adds the CUDA context of the {} catalog entry; a snapshot does not "
      "record memory outside PyTorch's allocator.",
      gpu.name));
  if (run.end_allocated_bytes != run.segments_allocated_bytes && !snapshot.segments_only) {
    report.notes.push_back(fmt::format(
        "At the end of the trace the rebuilt allocated bytes ({}) differ from the final "
        "segments' ({}) by {} bytes.",
        run.end_allocated_bytes, run.segments_allocated_bytes,
        run.end_allocated_bytes > run.segments_allocated_bytes
            ? run.end_allocated_bytes - run.segments_allocated_bytes
            : run.segments_allocated_bytes - run.end_allocated_bytes));
  }
  for (const std::string& note : run.notes) report.notes.push_back(note);
  return report;
}

}  // namespace vramscope
