// Estimate: model + training setup -> Report, the one entry point that the
// estimate, fit, sweep, plan, validate and compare commands share. Calls
// lower + simulate only (DESIGN.md: "the planner only calls lower + simulate").
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "vramscope/alloc_config.h"
#include "vramscope/gpu.h"
#include "vramscope/lower.h"
#include "vramscope/model.h"
#include "vramscope/report.h"
#include "vramscope/result.h"
#include "vramscope/setup.h"

namespace vramscope {

struct EstimateOptions {
  size_t top_allocations = 20;
  // Keep the timeline (reports drawn as charts). Searches turn it off.
  bool timeline = true;
  // Also return the lowered event stream (estimate --events).
  bool keep_events = false;
  // Also say in plain words what is alive at the peak and what each
  // applicable knob would change (estimate --explain): report.explanation is
  // ExplainPeak's lines, then ExplainWhatIf's (one more estimate per knob).
  bool explain = false;
};

struct Estimated {
  Report report;
  EventStream events;  // filled only with keep_events: the first rank class's
  // The other rank classes' streams (keep_events, several classes: DeepSpeed
  // ZeRO-1/2 ranks, pipeline stages). Every stream of a multi-class estimate
  // carries its class in its metadata: "rank_class" and "ranks" (comma-
  // separated global ranks).
  std::vector<EventStream> other_class_events;
};

// Validates the setup (GPU name, allocator configuration, knobs against the
// model) and simulates it. Errors are bad input: one line naming the knob.
Result<Estimated> Estimate(const ModelSpec& model, const TrainingSetup& setup,
                           const EstimateOptions& options = {});

// Host memory of the fullest node: the host peaks of the ranks on it
// (parallel.gpus_per_node a node), a rank no class lists charged the largest;
// 0 for one GPU or no host memory (Report::host_peak_per_node_bytes).
uint64_t HostPeakPerNodeBytes(const ParallelLayout& parallel, const std::vector<RankReport>& ranks);

// The defaults an estimate of `setup` rests on, each with the flag that
// changes it (the report's "Assumed" section, JSON `assumptions`).
std::vector<Assumption> DescribeAssumptions(const TrainingSetup& setup);
// The same for `model`: a diffusers UNet rests on other defaults (inputs, the
// MSE loss, diffusers' attention processor).
std::vector<Assumption> DescribeAssumptions(const ModelSpec& model, const TrainingSetup& setup);
// DescribeSetup, with a UNet's image knobs in place of the sequence and the
// transformers-only ones.
std::vector<std::pair<std::string, std::string>> DescribeKnobs(const ModelSpec& model,
                                                               const TrainingSetup& setup);

// Plain-words lines about the peak of a report: when it happens, what is
// alive, the largest tensor.
std::vector<std::string> ExplainPeak(const Report& report);

// What-if lines: the knobs that would change this setup's memory, each
// re-estimated ("gradient checkpointing (--grad-ckpt full): -12.3 GiB peak
// allocated, about +33% step time"). Only knobs applicable to the setup.
std::vector<std::string> ExplainWhatIf(const ModelSpec& model, const TrainingSetup& setup,
                                       const Report& base);

}  // namespace vramscope
