// vramscope estimate MODEL [knobs]: lower a training setup to events, simulate
// the allocator, report.
#include <memory>

#include <fmt/format.h>

#include "command.h"
#include "knobs.h"
#include "output.h"
#include "vramscope/estimate.h"
#include "vramscope/event_io.h"
#include "vramscope/model.h"

namespace vramscope::cli {
namespace {

struct EstimateArgs {
  std::string model;
  KnobArgs knobs;
  size_t top = 20;
  bool explain = false;
  std::string events_path;
  OutputOptions out;
};

// The estimate of `args`, the model resolved through `io` (the CLI's disk,
// environment and Hub, or the Python module's view of an in-memory model).
Result<Estimated> ComputeEstimate(const EstimateArgs& args, const ModelIo& io) {
  FromConfig from;
  VS_TRY(setup, args.knobs.ToSetup(&from));
  VS_TRY(model, ResolveModel(args.model, io));
  VS_TRY(encoders, args.knobs.ResolveTextEncoders(io, &setup));
  (void)encoders;
  if (Status v = ResolveVae(args.knobs, io, &setup); !v.ok()) return v.error();
  ApplyLibraryDefaults(model, &setup);
  args.knobs.Warn(model, setup);
  EstimateOptions options;
  options.top_allocations = args.top;
  options.keep_events = !args.events_path.empty();
  options.explain = args.explain;
  VS_TRY(est, Estimate(model, setup, options));
  est.report.source = args.model;
  AddFromAssumptions(from, &est.report);
  return std::move(est);
}

int RunEstimate(const EstimateArgs& args) {
  auto est = ComputeEstimate(args, LocalModelIo());
  if (!est.ok()) return FailBadInput(est.error());
  const int events =
      WriteOutputFiles({{args.events_path, [&] { return WriteEventText(est->events); }}});
  if (events != kExitOk) return events;
  // Several rank classes (ZeRO-1/2 ranks, pipeline stages): FILE.class1, ...
  // beside FILE, each naming its ranks in its metadata.
  for (size_t i = 0; i < est->other_class_events.size() && !args.events_path.empty(); ++i) {
    const std::string path = fmt::format("{}.class{}", args.events_path, i + 1);
    const EventStream& stream = est->other_class_events[i];
    const int more = WriteOutputFiles({{path, [&] { return WriteEventText(stream); }}});
    if (more != kExitOk) return more;
  }
  return EmitReport(est->report, args.out);
}

std::shared_ptr<EstimateArgs> DeclareEstimate(CLI::App* sub) {
  auto args = std::make_shared<EstimateArgs>();
  sub->add_option("MODEL", args->model,
                  "Catalog alias, Hugging Face id, config.json path or model directory")
      ->required();
  AddKnobFlags(sub, &args->knobs);
  AddFromFlag(sub, &args->knobs);
  sub->add_option("--top", args->top, "How many allocations alive at the peak to list");
  sub->add_flag("--explain", args->explain, "Say in plain words what is alive at the peak and why");
  AddOutputFileOption(sub, "--events", &args->events_path,
                      "Also write the lowered event stream to FILE");
  AddOutputFlags(sub, &args->out);
  return args;
}

RunFn SetupEstimate(CLI::App* sub) {
  auto args = DeclareEstimate(sub);
  return [args] { return RunEstimate(*args); };
}

ValueFn SetupEstimateValue(CLI::App* sub) {
  auto args = DeclareEstimate(sub);
  return [args](const ModelIo& io) -> Result<CommandValue> {
    VS_TRY(est, ComputeEstimate(*args, io));
    return ReportValue(std::move(est.report));
  };
}

}  // namespace

extern const CommandSpec kEstimateCommand = {
    "estimate", "Predict the GPU memory of training MODEL with the given knobs", &SetupEstimate,
    &SetupEstimateValue};

}  // namespace vramscope::cli
