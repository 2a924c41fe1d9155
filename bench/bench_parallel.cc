// Speed of multi-GPU estimates (issue: Llama-3.1-405B with TP 8 x PP 8 x DP 8
// estimated in <= 50 ms): Estimate() as `vramscope estimate` runs it, every
// rank class lowered and simulated with the allocator, timeline included.
//
//   build/bench/bench_parallel --benchmark_repetitions=5
#include <benchmark/benchmark.h>

#include "vramscope/estimate.h"
#include "vramscope/model.h"

namespace vramscope {
namespace {

void EstimateLayout(benchmark::State& state, const char* model, const ParallelLayout& layout,
                    uint64_t seq, GradCkpt ckpt) {
  auto spec = LoadCatalogModel(model);
  if (!spec.ok()) {
    state.SkipWithError("catalog lookup failed");
    return;
  }
  TrainingSetup setup;
  setup.seq = seq;
  setup.grad_ckpt = ckpt;
  setup.parallel = layout;
  size_t classes = 0;
  for (auto _ : state) {
    auto r = Estimate(*spec, setup);
    if (!r.ok()) {
      state.SkipWithError(r.error().message.c_str());
      return;
    }
    classes = r->report.ranks.size();
    benchmark::DoNotOptimize(r);
  }
  state.counters["rank_classes"] = static_cast<double>(classes);
}

void BM_Llama405B_Tp8Pp8Dp8(benchmark::State& state) {
  ParallelLayout l;
  l.gpus = 512;
  l.tp = 8;
  l.pp = 8;
  l.dp_mode = DataParallel::kZero1;  // Megatron distributed optimizer
  l.microbatches = 16;
  EstimateLayout(state, "llama-3.1-405b", l, 8192, GradCkpt::kFull);
}
BENCHMARK(BM_Llama405B_Tp8Pp8Dp8)
    ->Unit(benchmark::kMillisecond)
    ->MeasureProcessCPUTime()
    ->UseRealTime();

void BM_Llama8B_Zero3_8Gpus(benchmark::State& state) {
  ParallelLayout l;
  l.gpus = 8;
  l.dp_mode = DataParallel::kZero3;
  EstimateLayout(state, "llama-3-8b", l, 2048, GradCkpt::kNone);
}
BENCHMARK(BM_Llama8B_Zero3_8Gpus)
    ->Unit(benchmark::kMillisecond)
    ->MeasureProcessCPUTime()
    ->UseRealTime();

}  // namespace
}  // namespace vramscope

BENCHMARK_MAIN();
