// vramscope explain SNAPSHOT: what a measured run (a PyTorch memory snapshot)
// allocated, when, for what, and, for an OOM, why it failed.
#include <cstdio>
#include <memory>
#include <utility>

#include "command.h"
#include "output.h"
#include "vramscope/gpu.h"
#include "vramscope/snapshot.h"

namespace vramscope::cli {
namespace {

struct ExplainArgs {
  std::string snapshot_path;
  std::string gpu;  // "": not named (no verdict unless the snapshot ran out of memory)
  int device = -1;
  size_t top = 20;
  OutputOptions out;
};

// explain --json: the report and its "snapshot" object on stdout, and the
// files EmitReport would write.
int EmitExplainJson(const MeasuredSnapshot& measured, const OutputOptions& out) {
  const std::string text = RenderExplainJson(measured);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return WriteReportFiles(measured.report, out);
}

Result<MeasuredSnapshot> ComputeExplain(const ExplainArgs& args) {
  // Unnamed, the default entry lends its CUDA context to the device total.
  VS_TRY(gpu, FindGpu(args.gpu.empty() ? kDefaultGpuName : args.gpu));
  ExplainOptions options;
  options.gpu_named = !args.gpu.empty();
  options.device = args.device;
  options.top_allocations = args.top;
  return ExplainSnapshotFile(args.snapshot_path, gpu, options);
}

int RunExplain(const ExplainArgs& args) {
  auto measured = ComputeExplain(args);
  if (!measured.ok()) return FailBadInput(measured.error());
  if (!args.out.json) return EmitReport(measured->report, args.out);
  return EmitExplainJson(*measured, args.out);
}

std::shared_ptr<ExplainArgs> DeclareExplain(CLI::App* sub) {
  auto args = std::make_shared<ExplainArgs>();
  sub->add_option("SNAPSHOT", args->snapshot_path,
                  "File written by torch.cuda.memory._dump_snapshot() (pickle) or its JSON form")
      ->required();
  sub->add_option("--device", args->device,
                  "CUDA device of the snapshot to explain (default: the one with the most trace "
                  "entries)");
  sub->add_option(
      "--gpu", args->gpu,
      "GPU catalog entry the run is judged against (the fit verdict; see `vramscope gpus`). "
      "Default: none, so no verdict, unless the snapshot ran out of memory (its own device); "
      "the device total then adds h100-80g's CUDA context");
  sub->add_option("--top", args->top, "How many allocations alive at the peak to list");
  AddOutputFlags(sub, &args->out);
  return args;
}

RunFn SetupExplain(CLI::App* sub) {
  auto args = DeclareExplain(sub);
  return [args] { return RunExplain(*args); };
}

// The value's JSON is explain --json's (the report and its "snapshot" object).
ValueFn SetupExplainValue(CLI::App* sub) {
  auto args = DeclareExplain(sub);
  return [args](const ModelIo&) -> Result<CommandValue> {
    VS_TRY(measured, ComputeExplain(*args));
    CommandValue value = ReportValue(measured.report);
    value.json = RenderExplainJson(measured);
    return value;
  };
}

}  // namespace

extern const CommandSpec kExplainCommand = {"explain",
                                            "Explain a measured run from a PyTorch memory snapshot",
                                            &SetupExplain, &SetupExplainValue};

}  // namespace vramscope::cli
