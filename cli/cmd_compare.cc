// vramscope compare SNAPSHOT -- MODEL [knobs]: measured (a PyTorch memory
// snapshot) next to predicted (vramscope estimate with those knobs), per
// total, category and phase.
#include <algorithm>
#include <cstdio>
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
    return MakeError("compare: after --: " + ParseErrorMessage(app, e));
  }
  out.knobs.KeepGiven();  // `app` goes out of scope here
  return out;
}

// The measured side comes from the snapshot stage, the predicted one from
// Estimate (a stage above it), so the two meet here.
Result<Comparison> ComputeCompare(const CompareArgs& args, const CompareEstimateArgs& estimate,
                                  const ModelIo& io) {
  VS_TRY(setup, estimate.knobs.ToSetup());
  VS_TRY(gpu, FindGpu(setup.gpu));
  ExplainOptions options;
  options.device = args.device;
  VS_TRY(measured, ExplainSnapshotFile(args.snapshot_path, gpu, options));
  VS_TRY(model, ResolveModel(estimate.model, io));
  VS_TRY(encoders, estimate.knobs.ResolveTextEncoders(io, &setup));
  (void)encoders;
  if (Status v = ResolveVae(estimate.knobs, io, &setup); !v.ok()) return v.error();
  ApplyLibraryDefaults(model, &setup);
  estimate.knobs.Warn(model, setup);
  VS_TRY(predicted, Estimate(model, setup));
  predicted.report.source = estimate.model;
  return CompareMeasured(measured, predicted.report);
}

int RunCompare(const CompareArgs& args) {
  auto estimate_args = ParseCompareEstimateArgs(args.estimate_args);
  if (!estimate_args.ok()) return FailBadInput(estimate_args.error());
  auto comparison = ComputeCompare(args, *estimate_args, LocalModelIo());
  if (!comparison.ok()) return FailBadInput(comparison.error());
  const std::string text = (args.json || estimate_args->json) ? RenderComparisonJson(*comparison)
                                                              : RenderComparisonText(*comparison);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return kExitOk;
}

std::shared_ptr<CompareArgs> DeclareCompare(CLI::App* sub) {
  auto args = std::make_shared<CompareArgs>();
  sub->add_option("SNAPSHOT", args->snapshot_path,
                  "File written by torch.cuda.memory._dump_snapshot() (pickle) or its JSON form")
      ->required();
  sub->add_option("ESTIMATE", args->estimate_args,
                  "After --: MODEL and the knobs of `vramscope estimate`");
  sub->add_option("--device", args->device, "CUDA device of the snapshot (default: most traced)");
  sub->add_flag("--json", args->json, "Print the comparison as JSON (integer bytes)");
  return args;
}

RunFn SetupCompare(CLI::App* sub) {
  auto args = DeclareCompare(sub);
  return [args] { return RunCompare(*args); };
}

ValueFn SetupCompareValue(CLI::App* sub) {
  auto args = DeclareCompare(sub);
  return [args](const ModelIo& io) -> Result<CommandValue> {
    VS_TRY(estimate_args, ParseCompareEstimateArgs(args->estimate_args));
    VS_TRY(comparison, ComputeCompare(*args, estimate_args, io));
    auto shared = std::make_shared<const Comparison>(std::move(comparison));
    CommandValue value;
    value.json = RenderComparisonJson(*shared);
    value.text = [shared] { return RenderComparisonText(*shared); };
    return value;
  };
}

}  // namespace

extern const CommandSpec kCompareCommand = {
    "compare", "Measured (snapshot) vs predicted (estimate) memory, side by side", &SetupCompare,
    &SetupCompareValue};

}  // namespace vramscope::cli
