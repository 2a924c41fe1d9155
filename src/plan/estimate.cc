#include "vramscope/estimate.h"

#include <utility>

namespace vramscope {

Result<Estimated> Estimate(const ModelSpec& model, const TrainingSetup& setup,
                           const EstimateOptions& options) {
  VS_TRY(gpu, FindGpu(setup.gpu));
  VS_TRY(conf, ParseAllocConf(setup.alloc_conf));
  VS_TRY(lowered, LowerTraining(model, setup, gpu));

  SimOptions sim_options;
  sim_options.alloc = conf;
  sim_options.top_allocations = options.top_allocations;
  if (!options.timeline) sim_options.max_timeline_points = 0;
  // The allocator may reserve what the GPU offers minus what lives outside it:
  // the CUDA context and memory managed elsewhere (paged optimizer state).
  const uint64_t outside = gpu.cuda_context_bytes + lowered.managed_bytes;
  sim_options.device_limit_bytes = gpu.usable_bytes > outside ? gpu.usable_bytes - outside : 0;
  VS_TRY(sim, Simulate(lowered.stream, sim_options));

  Estimated out;
  Report& report = out.report;
  report.command = "estimate";
  report.source = model.name;
  report.gpu = gpu;
  report.model = ModelSummary{model.name, model.model_type, lowered.parameters,
                              lowered.trainable_parameters};
  report.knobs = DescribeSetup(setup);
  RankReport rank;
  rank.rank_class = "all";
  rank.ranks = {0};
  rank.sim = std::move(sim);
  rank.extras.cuda_context_bytes = gpu.cuda_context_bytes;
  rank.extras.other_bytes = lowered.managed_bytes;
  rank.device_total_bytes = DeviceTotalBytes(rank.sim, rank.extras);
  rank.host_peak_bytes = lowered.host_peak_bytes;
  report.ranks.push_back(std::move(rank));
  // Where the model came from (catalog, file, Hub cache) first, then the
  // lowering's assumptions.
  report.notes = model.notes;
  for (auto& note : lowered.notes) report.notes.push_back(std::move(note));
  if (options.keep_events) out.events = std::move(lowered.stream);
  return out;
}

}  // namespace vramscope
