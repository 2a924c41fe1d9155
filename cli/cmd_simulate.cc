// vramscope simulate TRACE: replay a recorded or hand-written event stream
// through the allocator model and report it like `estimate` does.
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "command.h"
#include "output.h"
#include "vramscope/event_io.h"
#include "vramscope/gpu.h"
#include "vramscope/retention.h"
#include "vramscope/setup.h"
#include "vramscope/simulate.h"

namespace vramscope::cli {
namespace {

struct SimulateArgs {
  std::string trace_path;
  std::string gpu = "h100-80g";
  std::string alloc_conf;
  size_t top = 20;
  bool retain_graph = false;
  uint64_t max_events = kDefaultMaxEvents;
  OutputOptions out;
};

// Live allocations a replayed trace may hold at once (docs/hardening.md).
constexpr uint64_t kMaxLiveAllocations = uint64_t{1} << 20;

// The most allocations alive at once in `stream`.
uint64_t MaxLiveAllocations(const EventStream& stream) {
  uint64_t live = 0, most = 0;
  for (const Event& e : stream.events()) {
    if (e.kind == EventKind::kAlloc) most = std::max(most, ++live);
    if (e.kind == EventKind::kFree && live > 0) --live;
  }
  return most;
}

// True when the regular file at `path` has more than `max_lines` lines. Read
// in 1 MiB chunks at disk speed, nothing kept, stopping as soon as the count
// is over. False for anything the reader refuses at once by itself: not a
// regular file (a pipe is bounded while read), over its size limit, a line
// over its line limit (a sparse 16 GiB file of zeros is one such line).
bool HasMoreLinesThan(const std::string& path, uint64_t max_lines, const EventReadLimits& limits) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  if (static_cast<uint64_t>(st.st_size) > limits.max_file_bytes) return false;
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  std::vector<char> chunk(1 << 20);
  uint64_t lines = 0, line_bytes = 0;
  size_t got = 0;
  while (lines <= max_lines && line_bytes <= limits.max_line_bytes &&
         (got = std::fread(chunk.data(), 1, chunk.size(), f)) > 0) {
    const char* end = chunk.data() + got;
    for (const char* p = chunk.data(); p < end;) {
      const char* nl = static_cast<const char*>(std::memchr(p, '\n', static_cast<size_t>(end - p)));
      if (nl == nullptr) {
        line_bytes += static_cast<uint64_t>(end - p);
        break;
      }
      line_bytes = 0;
      ++lines;
      p = nl + 1;
    }
  }
  std::fclose(f);
  return lines > max_lines;
}

// The work budget of a replay (docs/hardening.md): each record of the trace
// is at most one event, and --retain-graph-until-end replays them all once
// more (with every backward tensor alive to the end of its pass). A regular
// file is measured before it is parsed, so an oversized one is refused in
// the time it takes to read it, without memory; a pipe is bounded by the
// reader's event limit while it is read.
Result<EventReadLimits> TraceLimits(const SimulateArgs& args) {
  const uint64_t replays = args.retain_graph ? 2 : 1;
  EventReadLimits limits;
  limits.max_events = std::min(limits.max_events, args.max_events / replays);
  // What the simulator holds per live block is about 150 bytes; a training
  // step keeps thousands alive, not millions.
  limits.max_live_allocations = std::min(limits.max_live_allocations, kMaxLiveAllocations);
  if (HasMoreLinesThan(args.trace_path, limits.max_events, limits)) {
    return MakeError(fmt::format(
        "{}: work budget: more than {} records x {} replay(s) is above the limit of {} events "
        "(--max-events; raise it to replay this trace anyway)",
        args.trace_path, limits.max_events, replays, args.max_events));
  }
  return limits;
}

Result<Report> ComputeSimulate(const SimulateArgs& args) {
  VS_TRY(gpu, FindGpu(args.gpu));
  VS_TRY(conf, ParseAllocConf(args.alloc_conf));
  VS_TRY(limits, TraceLimits(args));
  VS_TRY(stream, ReadEventFile(args.trace_path, limits));

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
    rank.saved = SavedAtEndOfForward(events);
    return rank;
  };

  Report report;
  report.command = "simulate";
  report.source = args.trace_path;
  report.gpu = gpu;
  report.knobs = {{"gpu", gpu.name}, {"alloc_conf", args.alloc_conf}};
  // Checked before anything is simulated: a refusal costs only the replay.
  EventStream retained_stream;
  if (args.retain_graph) {
    retained_stream = RetainGraphUntilEnd(stream);
    if (const uint64_t live = MaxLiveAllocations(retained_stream); live > kMaxLiveAllocations) {
      return MakeError(fmt::format(
          "{}: --retain-graph-until-end: {} allocations would be alive at once, above the limit "
          "of {}",
          args.trace_path, live, kMaxLiveAllocations));
    }
  }
  auto as_recorded = run(stream, args.retain_graph ? "as recorded (PyTorch frees early)" : "all");
  if (!as_recorded.ok()) return as_recorded.error();
  report.ranks.push_back(std::move(*as_recorded));
  if (args.retain_graph) {
    report.knobs.emplace_back("retain_graph_until_end", "true");
    auto retained = run(retained_stream, "retain graph until end of backward");
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
  sub->add_option("--max-events", args->max_events,
                  "Work budget: the most events to replay, counting each record once more with "
                  "--retain-graph-until-end (default 2^24 = 16777216)");
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
