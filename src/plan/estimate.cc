#include "vramscope/estimate.h"

#include <algorithm>
#include <mutex>
#include <utility>

namespace vramscope {

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
  for (size_t i = 0; i < classes.size(); ++i) {
    LoweredRank& cls = classes[i];
    Lowered& lowered = cls.lowered;
    RankReport& simulated = sims[i];
    if (!report.model) {
      report.model = ModelSummary{model.name, model.model_type, lowered.parameters,
                                  lowered.trainable_parameters};
    }
    RankReport rank;
    rank.rank_class = classes.size() == 1 && !setup.parallel.multi_gpu() ? "all" : cls.rank_class;
    rank.ranks = std::move(cls.ranks);
    rank.sim = std::move(simulated.sim);
    rank.full = simulated.full;
    rank.extras.cuda_context_bytes = gpu.cuda_context_bytes;
    rank.extras.nccl_bytes = cls.nccl_bytes;
    rank.extras.other_bytes = lowered.managed_bytes;
    rank.device_total_bytes = DeviceTotalBytes(rank.sim, rank.extras);
    rank.host_peak_bytes = lowered.host_peak_bytes;
    rank.saved = SavedAtEndOfForward(lowered.stream);
    report.ranks.push_back(std::move(rank));
    for (auto& note : lowered.notes) {
      if (std::find(report.notes.begin(), report.notes.end(), note) == report.notes.end()) {
        report.notes.push_back(std::move(note));
      }
    }
  }
  if (options.keep_events) {
    for (size_t i = 0; i < classes.size(); ++i) {
      EventStream& stream = classes[i].lowered.stream;
      if (classes.size() > 1) {
        std::string ranks;
        for (int r : report.ranks[i].ranks) ranks += (ranks.empty() ? "" : ",") + std::to_string(r);
        stream.metadata()["rank_class"] = classes[i].rank_class;
        stream.metadata()["ranks"] = ranks;
      }
      if (i == 0) {
        out.events = std::move(stream);
      } else {
        out.other_class_events.push_back(std::move(stream));
      }
    }
  }
  if (options.explain) {
    report.explanation = ExplainPeak(report);
    for (auto& line : ExplainWhatIf(model, setup, report))
      report.explanation.push_back(std::move(line));
  }
  return out;
}

}  // namespace vramscope
