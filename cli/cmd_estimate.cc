// vramscope estimate MODEL [knobs]: lower a training setup to events, simulate
// the allocator, report.
#include <memory>

#include <fmt/format.h>

#include "command.h"
#include "knobs.h"
#include "output.h"
#include "vramscope/event_io.h"
#include "vramscope/lower.h"
#include "vramscope/model.h"
#include "vramscope/simulate.h"

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

int RunEstimate(const EstimateArgs& args) {
  auto setup = args.knobs.ToSetup();
  if (!setup.ok()) return FailBadInput(setup.error());
  auto gpu = FindGpu(setup->gpu);
  if (!gpu.ok()) return FailBadInput(gpu.error());
  auto conf = ParseAllocConf(setup->alloc_conf);
  if (!conf.ok()) return FailBadInput(conf.error());
  auto model = ResolveModel(args.model);
  if (!model.ok()) return FailBadInput(model.error());
  auto lowered = LowerTraining(*model, *setup, *gpu);
  if (!lowered.ok()) return FailBadInput(lowered.error());
  if (!args.events_path.empty()) {
    Status s = WriteTextFile(args.events_path, WriteEventText(lowered->stream));
    if (!s.ok()) return FailBadInput(s.error());
  }
  SimOptions options;
  options.alloc = *conf;
  options.top_allocations = args.top;
  const uint64_t outside = gpu->cuda_context_bytes + lowered->managed_bytes;
  options.device_limit_bytes = gpu->usable_bytes > outside ? gpu->usable_bytes - outside : 0;
  auto sim = Simulate(lowered->stream, options);
  if (!sim.ok()) return FailBadInput(sim.error());

  Report report;
  report.command = "estimate";
  report.source = args.model;
  report.gpu = *gpu;
  report.model = ModelSummary{model->name, model->model_type, lowered->parameters,
                              lowered->trainable_parameters};
  report.knobs = DescribeSetup(*setup);
  RankReport rank;
  rank.rank_class = "all";
  rank.ranks = {0};
  rank.sim = std::move(*sim);
  rank.extras.cuda_context_bytes = gpu->cuda_context_bytes;
  rank.extras.other_bytes = lowered->managed_bytes;
  rank.device_total_bytes = DeviceTotalBytes(rank.sim, rank.extras);
  report.ranks.push_back(std::move(rank));
  report.notes = lowered->notes;
  if (args.explain) report.explanation = ExplainPeak(report);
  return EmitReport(report, args.out);
}

RunFn SetupEstimate(CLI::App* sub) {
  auto args = std::make_shared<EstimateArgs>();
  sub->add_option("MODEL", args->model,
                  "Catalog alias, Hugging Face id, config.json path or model directory")
      ->required();
  AddKnobFlags(sub, &args->knobs);
  sub->add_option("--top", args->top, "How many allocations alive at the peak to list");
  sub->add_flag("--explain", args->explain, "Say in plain words what is alive at the peak and why");
  sub->add_option("--events", args->events_path, "Also write the lowered event stream to FILE");
  AddOutputFlags(sub, &args->out);
  return [args] { return RunEstimate(*args); };
}

}  // namespace

extern const CommandSpec kEstimateCommand = {
    "estimate", "Predict the GPU memory of training MODEL with the given knobs", &SetupEstimate};

}  // namespace vramscope::cli
