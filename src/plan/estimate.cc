#include "vramscope/estimate.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <utility>

namespace vramscope {

namespace {

// One RankReport per lowered rank class, from its simulation; the lowering's
// notes join the report's, each once.
void AddRankReports(const ModelSpec& model, const TrainingSetup& setup, const GpuSpec& gpu,
                    std::vector<LoweredRank>* classes, std::vector<RankReport>* sims,
                    Report* report) {
  for (size_t i = 0; i < classes->size(); ++i) {
    LoweredRank& cls = (*classes)[i];
    Lowered& lowered = cls.lowered;
    RankReport& simulated = (*sims)[i];
    if (!report->model) {
      report->model = ModelSummary{model.name, model.model_type, lowered.parameters,
                                   lowered.trainable_parameters};
    }
    RankReport rank;
    rank.rank_class = classes->size() == 1 && !setup.parallel.multi_gpu() ? "all" : cls.rank_class;
    rank.ranks = std::move(cls.ranks);
    rank.sim = std::move(simulated.sim);
    rank.full = simulated.full;
    rank.extras.cuda_context_bytes = gpu.cuda_context_bytes;
    rank.extras.nccl_bytes = cls.nccl_bytes;
    rank.extras.other_bytes = lowered.managed_bytes;
    rank.device_total_bytes = DeviceTotalBytes(rank.sim, rank.extras);
    rank.host_peak_bytes = lowered.host_peak_bytes;
    rank.saved = SavedAtEndOfForward(lowered.stream);
    report->ranks.push_back(std::move(rank));
    for (auto& note : lowered.notes) {
      if (std::find(report->notes.begin(), report->notes.end(), note) == report->notes.end()) {
        report->notes.push_back(std::move(note));
      }
    }
  }
}

// The event streams --events writes: the first class's, then the others',
// each naming its class and ranks.
void KeepEvents(std::vector<LoweredRank>* classes, const Report& report, Estimated* out) {
  for (size_t i = 0; i < classes->size(); ++i) {
    EventStream& stream = (*classes)[i].lowered.stream;
    if (classes->size() > 1) {
      std::string ranks;
      for (int r : report.ranks[i].ranks) ranks += (ranks.empty() ? "" : ",") + std::to_string(r);
      stream.metadata()["rank_class"] = (*classes)[i].rank_class;
      stream.metadata()["ranks"] = ranks;
    }
    if (i == 0) {
      out->events = std::move(stream);
    } else {
      out->other_class_events.push_back(std::move(stream));
    }
  }
}

}  // namespace

uint64_t HostPeakPerNodeBytes(const ParallelLayout& parallel,
                              const std::vector<RankReport>& ranks) {
  if (parallel.gpus <= 1) return 0;
  // A rank no class lists (classes past 8 ranks stand for the ranks between)
  // is charged the largest host peak of any class.
  uint64_t largest_bytes = 0;
  std::map<int, uint64_t> host_by_rank;
  for (const RankReport& rank : ranks) {
    largest_bytes = std::max(largest_bytes, rank.host_peak_bytes);
    for (int r : rank.ranks) host_by_rank[r] = rank.host_peak_bytes;
  }
  if (largest_bytes == 0) return 0;
  const uint64_t gpus = parallel.gpus;
  const uint64_t per_node = std::max<uint64_t>(1, std::min<uint64_t>(parallel.gpus_per_node, gpus));
  uint64_t fullest_bytes = 0;
  for (uint64_t first = 0; first < gpus; first += per_node) {
    uint64_t node_bytes = 0;
    for (uint64_t r = first; r < std::min(gpus, first + per_node); ++r) {
      auto it = host_by_rank.find(static_cast<int>(r));
      node_bytes += it == host_by_rank.end() ? largest_bytes : it->second;
    }
    fullest_bytes = std::max(fullest_bytes, node_bytes);
  }
  return fullest_bytes;
}

Result<Estimated> Estimate(const ModelSpec& model, const TrainingSetup& setup,
                           const EstimateOptions& options) {
  VS_TRY(gpu, FindGpu(setup.gpu));
  VS_TRY(conf, ParseAllocConf(setup.alloc_conf));
  // Each rank class is simulated on the thread that lowered it.
  std::vector<RankReport> sims;  // the simulations, per rank class
  std::mutex sims_mutex;         // guards only the resize below
  auto simulate = [&](size_t i, LoweredRank& cls) -> Status {
    const Lowered& lowered = cls.lowered;
    SimOptions sim_options;
    sim_options.alloc = conf;
    sim_options.top_allocations = options.top_allocations;
    if (!options.timeline) sim_options.max_timeline_points = 0;
    // The allocator may reserve what the GPU offers minus what lives outside
    // it: the CUDA context, NCCL's buffers and memory managed elsewhere (paged
    // optimizer state).
    const uint64_t outside = gpu.cuda_context_bytes + lowered.managed_bytes + cls.nccl_bytes;
    sim_options.device_limit_bytes = gpu.usable_bytes > outside ? gpu.usable_bytes - outside : 0;
    RankReport rank;
    VS_TRY(sim, Simulate(lowered.stream, sim_options));
    rank.sim = std::move(sim);
    // A setup that does not fit is also replayed without the GPU's limit, so
    // the report says what it needs rather than where it failed.
    if (auto full = AddFullRequirement(lowered.stream, sim_options, &rank); !full.ok()) {
      return full.error();
    }
    std::lock_guard<std::mutex> lock(sims_mutex);
    if (sims.size() <= i) sims.resize(i + 1);
    sims[i] = std::move(rank);
    return Ok{};
  };
  VS_TRY(classes, LowerRankClasses(model, setup, gpu, simulate));

  Estimated out;
  Report& report = out.report;
  report.command = "estimate";
  report.source = model.name;
  report.gpu = gpu;
  report.knobs = DescribeKnobs(model, setup);
  report.assumptions = DescribeAssumptions(model, setup);
  // Where the model came from (catalog, file, Hub cache) first, then the
  // lowering's assumptions.
  report.notes = model.notes;
  AddRankReports(model, setup, gpu, &classes, &sims, &report);
  report.host_peak_per_node_bytes = HostPeakPerNodeBytes(setup.parallel, report.ranks);
  if (options.keep_events) KeepEvents(&classes, report, &out);
  if (options.explain) {
    report.explanation = ExplainPeak(report);
    for (auto& line : ExplainWhatIf(model, setup, report))
      report.explanation.push_back(std::move(line));
  }
  return out;
}

}  // namespace vramscope
