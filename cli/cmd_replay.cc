// vramscope replay SNAPSHOT --alloc-conf ...: the measured allocation stream
// through the allocator model, with the snapshot's own settings (how well the
// model reproduces the run) and with others (what they would have reserved).
#include <cstdio>
#include <memory>
#include <utility>

#include "command.h"
#include "output.h"
#include "vramscope/gpu.h"
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

// replay --json: the report and its "replay" object on stdout, and the
// files EmitReport would write.
int EmitReplayJson(const SnapshotReplay& replay, const OutputOptions& out) {
  const std::string text = RenderReplayJson(replay);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return WriteReportFiles(replay.report, out);
}

int RunReplay(const ReplayArgs& args) {
  auto gpu = FindGpu(args.gpu);
  if (!gpu.ok()) return FailBadInput(gpu.error());
  ReplayOptions options;
  options.device = args.device;
  options.top_allocations = args.top;
  options.gpu = *gpu;
  if (args.alloc_conf_given) options.alloc_conf = args.alloc_conf;
  auto replay = ReplaySnapshotFile(args.snapshot_path, options);
  if (!replay.ok()) return FailBadInput(replay.error());
  if (!args.out.json) return EmitReport(replay->report, args.out);
  return EmitReplayJson(*replay, args.out);
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
