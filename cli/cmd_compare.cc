// vramscope compare SNAPSHOT -- MODEL [knobs]: measured (a PyTorch memory
// snapshot) next to predicted (vramscope estimate with those knobs), per
// total, category and phase.
#include <fmt/format.h>

#include <algorithm>
#include <memory>

#include "command.h"
#include "knobs.h"
#include "output.h"
#include "vramscope/estimate.h"
#include "vramscope/model.h"
#include "vramscope/snapshot.h"

namespace vramscope::cli {
namespace {

struct CompareArgs {
  std::string snapshot_path;
  std::vector<std::string> estimate_args;  // after "--"
  int device = -1;
  bool json = false;
};

struct CompareEstimateArgs {
  std::string model;
  KnobArgs knobs;
  bool json = false;
};

// The part after "--" is an estimate command line of its own.
Result<CompareEstimateArgs> ParseCompareEstimateArgs(const std::vector<std::string>& args) {
  if (args.empty()) {
    return MakeError(
        "compare needs the model and knobs of the prediction after --, e.g. "
        "`vramscope compare snapshot.pickle -- llama-3-8b --batch 4 --seq 2048`");
  }
  CompareEstimateArgs out;
  CLI::App app{"compare: the prediction"};
  app.add_option("MODEL", out.model, "Catalog alias, Hugging Face id, config.json or model dir")
      ->required();
  AddKnobFlags(&app, &out.knobs);
  app.add_flag("--json", out.json, "Print JSON");
  CheckNumericFlags(&app);
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes them reversed
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    std::string what = e.what();
    std::replace(what.begin(), what.end(), '\n', ' ');
    return MakeError("compare: after --: " + what);
  }
  out.knobs.KeepGiven();  // `app` goes out of scope here
  return out;
}

int RunCompare(const CompareArgs& args) {
  auto estimate_args = ParseCompareEstimateArgs(args.estimate_args);
  if (!estimate_args.ok()) return FailBadInput(estimate_args.error());
  auto setup = estimate_args->knobs.ToSetup();
  if (!setup.ok()) return FailBadInput(setup.error());
  auto gpu = FindGpu(setup->gpu);
  if (!gpu.ok()) return FailBadInput(gpu.error());
  auto snapshot = ReadSnapshotFile(args.snapshot_path);
  if (!snapshot.ok()) return FailBadInput(snapshot.error());
  ExplainOptions options;
  options.device = args.device;
  auto run = MeasureSnapshot(*snapshot, options);
  if (!run.ok()) return FailBadInput(MakeError(args.snapshot_path + ": " + run.error().message));
  auto model = ResolveModel(estimate_args->model);
  if (!model.ok()) return FailBadInput(model.error());
  estimate_args->knobs.Warn(*model, *setup);
  auto predicted = Estimate(*model, *setup);
  if (!predicted.ok()) return FailBadInput(predicted.error());
  predicted->report.source = estimate_args->model;

  const Report measured = MeasuredReport(*run, *snapshot, *gpu, args.snapshot_path);
  Comparison comparison = CompareReports(measured, predicted->report);
  if (!run->has_frames) {
    comparison.notes.push_back(
        "The snapshot has no stacks: every measured block is \"other\", so only the totals "
        "and phases compare.");
  }
  const std::string text = (args.json || estimate_args->json) ? RenderComparisonJson(comparison)
                                                              : RenderComparisonText(comparison);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return kExitOk;
}

RunFn SetupCompare(CLI::App* sub) {
  auto args = std::make_shared<CompareArgs>();
  sub->add_option("SNAPSHOT", args->snapshot_path,
                  "File written by torch.cuda.memory._dump_snapshot() (pickle) or its JSON form")
      ->required();
  sub->add_option("ESTIMATE", args->estimate_args,
                  "After --: MODEL and the knobs of `vramscope estimate`");
  sub->add_option("--device", args->device, "CUDA device of the snapshot (default: most traced)");
  sub->add_flag("--json", args->json, "Print the comparison as JSON (integer bytes)");
  return [args] { return RunCompare(*args); };
}

}  // namespace

extern const CommandSpec kCompareCommand = {
    "compare", "Measured (snapshot) vs predicted (estimate) memory, side by side", &SetupCompare};

}  // namespace vramscope::cli
