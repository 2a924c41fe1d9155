// Speed of the planner (issue 7 targets): fit for an 8B model <= 100 ms; a
// 200-point sweep <= 1 s; plan over >= 100 strategies <= 2 s. Every figure is whole Estimate()
// calls (lower + simulate), no timeline, no top-allocation list.
#include <benchmark/benchmark.h>

#include "vramscope/model.h"
#include "vramscope/plan.h"

namespace vramscope {
namespace {

TrainingSetup Defaults() { return TrainingSetup{}; }  // full fine-tune, bf16-mixed, AdamW, h100-80g

TrainingSetup LoraCkpt() {
  TrainingSetup s;
  s.finetune = Finetune::kLora;
  s.grad_ckpt = GradCkpt::kFull;
  return s;
}

void BM_Fit(benchmark::State& state, const char* model_name, TrainingSetup (*make)()) {
  auto model = LoadCatalogModel(model_name);
  if (!model.ok()) {
    state.SkipWithError(model.error().message.c_str());
    return;
  }
  const TrainingSetup setup = make();
  uint64_t estimates = 0, max_batch = 0, max_seq = 0;
  for (auto _ : state) {
    auto fit = Fit(*model, setup, {});
    if (!fit.ok()) {
      state.SkipWithError(fit.error().message.c_str());
      return;
    }
    estimates = fit->estimates;
    max_batch = fit->batch.max_value;
    max_seq = fit->seq.max_value;
    benchmark::DoNotOptimize(fit);
  }
  state.counters["estimates"] = static_cast<double>(estimates);
  state.counters["max_batch"] = static_cast<double>(max_batch);
  state.counters["max_seq"] = static_cast<double>(max_seq);
}
BENCHMARK_CAPTURE(BM_Fit, llama_3_8b_defaults, "llama-3-8b", &Defaults)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Fit, llama_3_8b_lora_ckpt, "llama-3-8b", &LoraCkpt)
    ->Unit(benchmark::kMillisecond);

void BM_Sweep(benchmark::State& state, const char* model_name, TrainingSetup (*make)()) {
  auto model = LoadCatalogModel(model_name);
  auto seqs = ParseGrid("1:2048:200", "--seq");
  if (!model.ok() || !seqs.ok()) {
    state.SkipWithError("setup failed");
    return;
  }
  const TrainingSetup setup = make();
  const std::vector<SweepAxis> axes = {{SweepVariable::kSeq, *seqs}};
  for (auto _ : state) {
    auto sweep = Sweep(*model, setup, axes);
    if (!sweep.ok()) {
      state.SkipWithError(sweep.error().message.c_str());
      return;
    }
    benchmark::DoNotOptimize(sweep);
  }
  state.counters["points"] = static_cast<double>(seqs->size());
  state.counters["ms_per_point"] = benchmark::Counter(
      static_cast<double>(seqs->size()),
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}
// Sweep() runs its points on several threads: the figure that counts is wall
// time (the CPU column is then only the calling thread's share).
BENCHMARK_CAPTURE(BM_Sweep, llama_3_8b_seq_200_defaults, "llama-3-8b", &Defaults)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Sweep, llama_3_8b_seq_200_lora_ckpt, "llama-3-8b", &LoraCkpt)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Issue 7 part 2: ranking >= 100 strategies <= 2 s. Counts: strategies
// considered (knob sets x micro-batch splits) and estimated.
void BM_Plan(benchmark::State& state, const char* model_name) {
  auto model = LoadCatalogModel(model_name);
  if (!model.ok()) {
    state.SkipWithError(model.error().message.c_str());
    return;
  }
  uint64_t considered = 0, estimates = 0;
  for (auto _ : state) {
    auto plan = Plan(*model, TrainingSetup{}, {});
    if (!plan.ok()) {
      state.SkipWithError(plan.error().message.c_str());
      return;
    }
    considered = plan->considered;
    estimates = plan->estimates;
    benchmark::DoNotOptimize(plan);
  }
  state.counters["considered"] = static_cast<double>(considered);
  state.counters["estimates"] = static_cast<double>(estimates);
}
BENCHMARK_CAPTURE(BM_Plan, llama_3_8b_defaults, "llama-3-8b")->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace vramscope

BENCHMARK_MAIN();
