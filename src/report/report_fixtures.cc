// The renderer test fixtures (report_fixtures.h).
#include "report_fixtures.h"

#include <algorithm>

namespace vramscope::testing {
namespace {

constexpr Phase kSetup = Phase::kSetup;
constexpr Phase kForward = Phase::kForward;
constexpr Phase kBackward = Phase::kBackward;
constexpr Phase kOptimizer = Phase::kOptimizer;

LiveAllocation Live(uint64_t block_bytes, Category category, std::string op, std::string module,
                    uint32_t step, Phase phase) {
  LiveAllocation a;
  a.id = block_bytes ^ (uint64_t{step} << 40);
  a.requested_bytes = block_bytes;
  a.block_bytes = block_bytes;
  a.category = category;
  a.op = std::move(op);
  a.module = std::move(module);
  a.step = step;
  a.phase = phase;
  return a;
}

GpuSpec Gpu(std::string name, std::string display_name, uint64_t total_bytes, uint64_t usable_bytes,
            uint64_t context_bytes) {
  GpuSpec gpu;
  gpu.name = std::move(name);
  gpu.display_name = std::move(display_name);
  gpu.vendor = "nvidia";
  gpu.total_bytes = total_bytes;
  gpu.usable_bytes = usable_bytes;
  gpu.cuda_context_bytes = context_bytes;
  return gpu;
}

constexpr uint64_t G = kGiB;
constexpr uint64_t M = kMiB;

}  // namespace

TimelinePoint Point(uint64_t event_index, uint32_t step, Phase phase, CategoryBytes bytes,
                    uint64_t reserved_bytes) {
  TimelinePoint p;
  p.event_index = event_index;
  p.step = step;
  p.phase = phase;
  p.by_category = bytes;
  p.reserved_bytes = reserved_bytes;
  return p;
}

void DerivePeaks(SimResult* sim) {
  sim->phases.clear();
  for (size_t i = 0; i < sim->timeline.size(); ++i) {
    TimelinePoint& p = sim->timeline[i];
    p.allocated_bytes = 0;
    for (uint64_t b : p.by_category) p.allocated_bytes += b;
    if (i == 0 || p.allocated_bytes > sim->peak_allocated_bytes) {
      sim->peak_allocated_bytes = p.allocated_bytes;
      sim->peak_event_index = p.event_index;
      sim->peak_step = p.step;
      sim->peak_phase = p.phase;
      sim->reserved_at_peak_bytes = p.reserved_bytes;
      sim->breakdown_at_peak = p.by_category;
    }
    sim->peak_reserved_bytes = std::max(sim->peak_reserved_bytes, p.reserved_bytes);
    if (sim->phases.empty() || sim->phases.back().step != p.step ||
        sim->phases.back().phase != p.phase) {
      sim->phases.push_back(PhasePeak{p.step, p.phase, 0, 0, 0});
    }
    PhasePeak& phase = sim->phases.back();
    phase.peak_allocated_bytes = std::max(phase.peak_allocated_bytes, p.allocated_bytes);
    phase.peak_reserved_bytes = std::max(phase.peak_reserved_bytes, p.reserved_bytes);
    phase.allocated_at_end_bytes = p.allocated_bytes;
  }
  sim->peak_requested_bytes = sim->peak_allocated_bytes;
  sim->num_events = sim->timeline.empty() ? 0 : sim->timeline.back().event_index + 1;
}

RankReport MakeRank(std::string rank_class, std::vector<int> ranks, SimResult sim,
                    DeviceExtras extras, uint64_t host_peak_bytes) {
  RankReport rank;
  rank.rank_class = std::move(rank_class);
  rank.ranks = std::move(ranks);
  rank.sim = std::move(sim);
  rank.extras = extras;
  rank.device_total_bytes = DeviceTotalBytes(rank.sim, rank.extras);
  rank.host_peak_bytes = host_peak_bytes;
  return rank;
}

Report SmallFitReport() {
  SimResult sim;
  //            param   grad     optim  act      loss     temp     comm work    other
  sim.timeline = {
      Point(0, 0, kSetup, {2 * G, 0, 0, 0, 0, 0, 0, 0, 0}, 2 * G),
      Point(10, 0, kSetup, {2 * G, 0, 0, 0, 0, 0, 0, 32 * M, 0}, 2 * G + 40 * M),
      Point(20, 1, kForward, {2 * G, 0, 0, 1 * G, 0, 0, 0, 32 * M, 64 * M}, 3 * G + 128 * M),
      Point(40, 1, kForward, {2 * G, 0, 0, 3 * G, 512 * M, 0, 0, 32 * M, 64 * M}, 6 * G),
      Point(60, 1, kBackward, {2 * G, 512 * M, 0, 3 * G, 512 * M, 256 * M, 0, 32 * M, 64 * M},
            6 * G + 512 * M),
      Point(80, 1, kBackward, {2 * G, 1536 * M, 0, 1536 * M, 0, 256 * M, 0, 32 * M, 64 * M},
            6 * G + 512 * M),
      Point(100, 1, kBackward, {2 * G, 2 * G, 0, 0, 0, 0, 0, 32 * M, 0}, 6 * G + 512 * M),
      Point(120, 1, kOptimizer, {2 * G, 2 * G, 4 * G, 0, 0, 512 * M, 0, 32 * M, 0}, 9 * G),
      Point(140, 1, kOptimizer, {2 * G, 2 * G, 4 * G, 0, 0, 0, 0, 32 * M, 0}, 9 * G),
      Point(160, 2, kForward, {2 * G, 0, 4 * G, 1 * G, 0, 0, 0, 32 * M, 64 * M}, 9 * G),
      Point(180, 2, kForward, {2 * G, 0, 4 * G, 3 * G, 512 * M, 0, 0, 32 * M, 64 * M}, 10 * G),
      Point(200, 2, kBackward, {2 * G, 512 * M, 4 * G, 3 * G, 512 * M, 256 * M, 0, 32 * M, 64 * M},
            11 * G),
      Point(220, 2, kBackward, {2 * G, 2 * G, 4 * G, 0, 0, 0, 0, 32 * M, 0}, 11 * G),
      Point(240, 2, kOptimizer, {2 * G, 2 * G, 4 * G, 0, 0, 512 * M, 0, 32 * M, 0}, 11 * G),
  };
  DerivePeaks(&sim);
  sim.top_at_peak = {
      Live(1 * G, Category::kParameters, "aten::empty", "fc1.weight", 0, kSetup),
      Live(1 * G, Category::kOptimizerState, "aten::zeros_like", "fc1.weight (exp_avg)", 1,
           kOptimizer),
      Live(1 * G, Category::kOptimizerState, "aten::zeros_like", "fc1.weight (exp_avg_sq)", 1,
           kOptimizer),
      Live(768 * M, Category::kActivations, "aten::relu", "fc1", 2, kForward),
      Live(512 * M, Category::kLoss, "aten::_log_softmax", "loss_fn", 2, kForward),
  };
  sim.live_at_peak_count = 42;

  Report report;
  report.command = "estimate";
  report.source = "tiny-mlp";
  report.gpu =
      Gpu("h100-80g", "NVIDIA H100 80GB HBM3", 80 * G - 480 * M, 79 * G + 512 * M, 512 * M);
  report.model = ModelSummary{"tiny-mlp", "MLP", 536'870'912, 536'870'912};
  report.knobs = {
      {"batch", "64"}, {"precision", "fp32"}, {"optimizer", "adamw"}, {"gpu", "h100-80g"}};
  report.ranks.push_back(MakeRank("all", {0}, std::move(sim), DeviceExtras{512 * M, 0, 0}));
  report.explanation = {
      "The peak is in the backward pass of step 2: the Adam moments (4.00 GiB) created by the "
      "first optimizer step are alive together with the activations saved for backward.",
      "Activations are 3.00 GiB of the peak; gradient checkpointing would keep about one layer's "
      "worth instead.",
  };
  report.notes = {"Allocator model: PyTorch 2.6 CUDACachingAllocator with default settings."};
  return report;
}

Report OomReport() {
  SimResult sim;
  //            param   grad optim act       loss   temp     comm work    other
  sim.timeline = {
      Point(0, 0, kSetup, {6 * G, 0, 0, 0, 0, 0, 0, 0, 0}, 6 * G),
      Point(5, 0, kSetup, {6 * G, 0, 0, 0, 0, 0, 0, 32 * M, 0}, 6 * G + 40 * M),
      Point(10, 1, kForward, {6 * G, 0, 0, 2 * G, 0, 0, 0, 32 * M, 16 * M}, 8 * G + 128 * M),
      Point(30, 1, kForward, {6 * G, 0, 0, 6 * G, 0, 0, 0, 32 * M, 16 * M}, 12 * G + 256 * M),
      Point(50, 1, kForward, {6 * G, 0, 0, 10 * G, 0, 0, 0, 32 * M, 16 * M}, 16 * G + 256 * M),
      Point(70, 1, kForward, {6 * G, 0, 0, 12 * G, 3 * G, 512 * M, 0, 32 * M, 16 * M}, 22 * G),
  };
  DerivePeaks(&sim);
  sim.top_at_peak = {
      Live(3 * G, Category::kLoss, "aten::mm", "lm_head", 1, kForward),
      Live(1002 * M, Category::kParameters, "aten::empty", "model.embed_tokens.weight", 0, kSetup),
      Live(512 * M, Category::kTemporaries, "aten::_to_copy", "model.norm & \"final\" <cast>", 1,
           kForward),
      Live(448 * M, Category::kActivations, "<lambda>", "model.layers.27.mlp.act_fn", 1, kForward),
  };
  sim.live_at_peak_count = 1234;
  OomInfo oom;
  oom.requested_bytes = 4'202'692'608;
  oom.alloc_size_bytes = 4'202'692'608;  // already a multiple of 2 MiB
  oom.device_limit_bytes = 22 * G + 768 * M;
  oom.allocated_bytes = 21 * G + 560 * M;
  oom.reserved_bytes = 22 * G;
  oom.free_device_bytes = 768 * M;
  oom.message =
      "CUDA out of memory. Tried to allocate 3.91 GiB. GPU 0 has a total capacity of 23.65 GiB of "
      "which 768.00 MiB is free. Of the allocated memory 21.55 GiB is allocated by PyTorch, and "
      "464.00 MiB is reserved by PyTorch but unallocated.";
  sim.oom = oom;
  sim.oom_event_index = 71;
  sim.oom_step = 1;
  sim.oom_phase = kForward;

  Report report;
  report.command = "estimate";
  report.source = "meta-llama/Llama-3.2-3B";
  report.gpu =
      Gpu("rtx-4090", "NVIDIA GeForce RTX 4090", 23 * G + 664 * M, 23 * G + 256 * M, 512 * M);
  report.model =
      ModelSummary{"meta-llama/Llama-3.2-3B", "LlamaForCausalLM", 3'212'749'824, 3'212'749'824};
  report.knobs = {{"batch", "8"},
                  {"seq", "2048"},
                  {"precision", "bf16"},
                  {"optimizer", "adamw"},
                  {"gpu", "rtx-4090"}};
  report.ranks.push_back(MakeRank("all", {0}, std::move(sim), DeviceExtras{512 * M, 0, 0}));
  report.explanation = {
      "The run stops in the first forward pass: the fp32 copy of the logits (8 x 2048 tokens x "
      "128,256 vocabulary = 3.91 GiB) does not fit next to 12.00 GiB of saved activations.",
      "A chunked or fused linear+loss (--loss chunked) avoids materialising the full logits.",
  };
  report.notes = {"Allocator model: PyTorch 2.6 CUDACachingAllocator with default settings.",
                  "Numbers after an out-of-memory point are not simulated."};
  return report;
}

Report TwoRankReport() {
  SimResult first;
  //             param   grad  optim  act      loss  temp     comm      work    other
  first.timeline = {
      Point(0, 0, kSetup, {4 * G, 0, 0, 0, 0, 0, 0, 0, 0}, 4 * G),
      Point(30, 1, kForward, {4 * G, 0, 0, 6 * G, 0, 0, 256 * M, 32 * M, 8 * M}, 11 * G),
      Point(60, 1, kBackward, {4 * G, 2 * G, 0, 4 * G, 0, 512 * M, 256 * M, 32 * M, 8 * M}, 12 * G),
      Point(90, 1, kBackward, {4 * G, 4 * G, 0, 0, 0, 0, 256 * M, 32 * M, 0}, 12 * G),
      Point(120, 1, kOptimizer, {4 * G, 4 * G, 8 * G, 0, 0, 0, 256 * M, 32 * M, 0},
            16 * G + 512 * M),
  };
  DerivePeaks(&first);
  first.top_at_peak = {
      Live(2 * G, Category::kOptimizerState, "aten::zeros_like", "exp_avg (flat)", 1, kOptimizer),
      Live(1 * G, Category::kGradients, "aten::empty", "grad bucket 0", 1, kBackward),
  };
  first.live_at_peak_count = 310;

  SimResult last;
  last.timeline = {
      Point(0, 0, kSetup, {5 * G, 0, 0, 0, 0, 0, 0, 0, 0}, 5 * G),
      Point(40, 1, kForward, {5 * G, 0, 0, 5 * G, 8 * G, 0, 256 * M, 32 * M, 8 * M}, 19 * G),
      Point(70, 1, kBackward, {5 * G, 2 * G, 0, 5 * G, 8 * G, 2 * G, 256 * M, 32 * M, 8 * M},
            24 * G),
      Point(100, 1, kBackward, {5 * G, 5 * G, 0, 0, 0, 0, 256 * M, 32 * M, 0}, 24 * G),
      Point(130, 1, kOptimizer, {5 * G, 5 * G, 10 * G, 0, 0, 0, 256 * M, 32 * M, 0}, 24 * G),
  };
  DerivePeaks(&last);
  last.top_at_peak = {
      Live(8 * G, Category::kLoss, "aten::_log_softmax", "lm_head", 1, kForward),
      Live(2 * G, Category::kTemporaries, "aten::_log_softmax_backward_data", "lm_head", 1,
           kBackward),
  };
  last.live_at_peak_count = 402;

  Report report;
  report.command = "estimate";
  report.source = "llama-3-8b";
  report.gpu =
      Gpu("a100-80g", "NVIDIA A100-SXM4-80GB", 79 * G + 640 * M, 79 * G + 256 * M, 512 * M);
  report.model = ModelSummary{"llama-3-8b", "LlamaForCausalLM", 8'030'261'248, 8'030'261'248};
  report.knobs = {
      {"gpus", "8"}, {"pp", "2"}, {"microbatches", "4"}, {"batch", "1"}, {"seq", "4096"}};
  report.ranks.push_back(MakeRank("first stage", {0, 1, 2, 3}, std::move(first),
                                  DeviceExtras{512 * M, 768 * M, 0}, 3 * G));
  report.ranks.push_back(MakeRank("last stage", {4, 5, 6, 7}, std::move(last),
                                  DeviceExtras{512 * M, 768 * M, 128 * M}));
  report.explanation = {
      "The last stage holds the logits and their gradient (8.00 GiB + 2.00 GiB) at its peak; the "
      "first stage peaks in the optimizer step."};
  return report;
}

std::vector<std::pair<std::string, Report>> GoldenFixtures() {
  return {{"small_fit", SmallFitReport()}, {"oom", OomReport()}, {"two_ranks", TwoRankReport()}};
}

Report ManyPointsReport(size_t n) {
  Report report = SmallFitReport();
  SimResult& sim = report.ranks[0].sim;
  sim.timeline.clear();
  for (size_t i = 0; i < n; ++i) {
    const auto step = static_cast<uint32_t>(1 + i / 300);
    const auto phase = static_cast<Phase>(1 + (i / 100) % 3);
    const uint64_t act = (i % 97) * 64 * M;  // a sawtooth of activations
    sim.timeline.push_back(Point(i * 50, step, phase, {2 * G, 1 * G, 4 * G, act, 0, 0, 0, 0, 0},
                                 7 * G + act + 512 * M));
  }
  DerivePeaks(&sim);
  report.ranks[0].device_total_bytes = DeviceTotalBytes(sim, report.ranks[0].extras);
  return report;
}

}  // namespace vramscope::testing
