// explain and compare as library calls: a snapshot file measured into the
// standard report and the comparison with a prediction (their JSON:
// src/report/snapshot_render.cc).
#include "vramscope/snapshot.h"

namespace vramscope {

Result<MeasuredSnapshot> ExplainSnapshotFile(const std::string& path, const GpuSpec& gpu,
                                             const ExplainOptions& options) {
  auto snapshot = ReadSnapshotFile(path);
  if (!snapshot.ok()) return snapshot.error();
  auto run = MeasureSnapshot(*snapshot, options);
  if (!run.ok()) return MakeError(path + ": " + run.error().message);
  MeasuredSnapshot measured;
  measured.report = MeasuredReport(*run, *snapshot, gpu, path, options.gpu_named);
  measured.run = std::move(*run);
  measured.format = snapshot->format;
  if (snapshot->settings) measured.alloc_conf = snapshot->settings->conf_text;
  return measured;
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
