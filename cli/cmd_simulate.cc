// vramscope simulate TRACE: replay a recorded or hand-written event stream
// through the allocator model and report it like `estimate` does.
#include <memory>

#include <fmt/format.h>

#include "command.h"
#include "output.h"
#include "vramscope/event_io.h"
#include "vramscope/gpu.h"
#include "vramscope/retention.h"
#include "vramscope/simulate.h"

namespace vramscope::cli {
namespace {

struct SimulateArgs {
  std::string trace_path;
  std::string gpu = "h100-80g";
  std::string alloc_conf;
  size_t top = 20;
  bool retain_graph = false;
  OutputOptions out;
};

Result<Report> ComputeSimulate(const SimulateArgs& args) {
  VS_TRY(gpu, FindGpu(args.gpu));
  VS_TRY(conf, ParseAllocConf(args.alloc_conf));
  VS_TRY(stream, ReadEventFile(args.trace_path));

  SimOptions options;
  options.alloc = conf;
  options.top_allocations = args.top;
  // The allocator may reserve what the GPU has left after the CUDA context.
  options.device_limit_bytes =
      gpu.usable_bytes > gpu.cuda_context_bytes ? gpu.usable_bytes - gpu.cuda_context_bytes : 0;
  auto run = [&](const EventStream& events, const char* rank_class) -> Result<RankReport> {
    auto sim = Simulate(events, options);
    if (!sim.ok()) return MakeError(args.trace_path + ": " + sim.error().message);
    RankReport rank;
    rank.rank_class = rank_class;
    rank.ranks = {0};
    rank.sim = std::move(*sim);
    if (auto full = AddFullRequirement(events, options, &rank); !full.ok()) {
      return MakeError(args.trace_path + ": " + full.error().message);
    }
    rank.extras.cuda_context_bytes = gpu.cuda_context_bytes;
    rank.device_total_bytes = DeviceTotalBytes(rank.sim, rank.extras);
    return rank;
  };

  Report report;
  report.command = "simulate";
  report.source = args.trace_path;
  report.gpu = gpu;
  report.knobs = {{"gpu", gpu.name}, {"alloc_conf", args.alloc_conf}};
  auto as_recorded = run(stream, args.retain_graph ? "as recorded (PyTorch frees early)" : "all");
  if (!as_recorded.ok()) return as_recorded.error();
  report.ranks.push_back(std::move(*as_recorded));
  if (args.retain_graph) {
    report.knobs.emplace_back("retain_graph_until_end", "true");
    auto retained = run(RetainGraphUntilEnd(stream), "retain graph until end of backward");
    if (!retained.ok()) return retained.error();
    const uint64_t a = report.ranks[0].sim.peak_allocated_bytes;
    const uint64_t b = retained->sim.peak_allocated_bytes;
    report.explanation.push_back(fmt::format(
        "Peak allocated as recorded (PyTorch releases saved tensors and intermediate gradients "
        "as soon as backward no longer needs them): {}; if they lived until the end of each "
        "backward pass, as in engines that keep the graph: {} ({}{}).",
        FormatBytes(a), FormatBytes(b), b >= a ? "+" : "-", FormatBytes(b >= a ? b - a : a - b)));
    report.ranks.push_back(std::move(*retained));
  }
  report.notes.push_back(
      "A recorded trace holds only what PyTorch allocated through its caching "
      "allocator; the device total adds the CUDA context of the GPU catalog entry.");
  return report;
}

int RunSimulate(const SimulateArgs& args) {
  auto report = ComputeSimulate(args);
  if (!report.ok()) return FailBadInput(report.error());
  return EmitReport(*report, args.out);
}

std::shared_ptr<SimulateArgs> DeclareSimulate(CLI::App* sub) {
  auto args = std::make_shared<SimulateArgs>();
  sub->add_option("TRACE", args->trace_path, "Event-stream file (docs/event-stream.md)")
      ->required();
  sub->add_option("--gpu", args->gpu, "GPU catalog entry (see `vramscope gpus`)");
  sub->add_option("--alloc-conf", args->alloc_conf,
                  "Allocator settings, PYTORCH_CUDA_ALLOC_CONF syntax "
                  "(e.g. expandable_segments:True; ideal:True for no caching)");
  sub->add_option("--top", args->top, "How many allocations alive at the peak to list");
  sub->add_flag("--retain-graph-until-end", args->retain_graph,
                "Also replay as if saved tensors and intermediate gradients lived until the end "
                "of each backward pass; report both side by side");
  AddOutputFlags(sub, &args->out);
  return args;
}

RunFn SetupSimulate(CLI::App* sub) {
  auto args = DeclareSimulate(sub);
  return [args] { return RunSimulate(*args); };
}

ValueFn SetupSimulateValue(CLI::App* sub) {
  auto args = DeclareSimulate(sub);
  return [args](const ModelIo&) -> Result<CommandValue> {
    VS_TRY(report, ComputeSimulate(*args));
    return ReportValue(std::move(report));
  };
}

}  // namespace

extern const CommandSpec kSimulateCommand = {
    "simulate", "Replay an event-stream file through the allocator model", &SetupSimulate,
    &SetupSimulateValue};

}  // namespace vramscope::cli
