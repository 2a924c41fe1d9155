// Speed of the pipeline: Simulate() on a 1M-event stream (issue: >= 5M
// events/s on one core) and estimate = lower + simulate for real models
// (targets: an 8B model <= 5 ms; Llama-3-70B, seq 8192, batch 8 <= 20 ms).
#include <cstdlib>
#include <string>

#include <benchmark/benchmark.h>

#include <random>

#include "vramscope/gpu.h"
#include "vramscope/lower.h"
#include "vramscope/model.h"
#include "vramscope/simulate.h"

namespace vramscope {
namespace {

// A training-like stream: persistent weights, then steps of many
// same-sized activations freed in reverse, a few large gradients, temporaries.
EventStream TrainingLikeStream(size_t target_events) {
  EventStream s;
  std::mt19937_64 rng(7);
  uint64_t id = 1;
  for (int i = 0; i < 200; ++i) s.Alloc(id++, (50 + rng() % 200) << 20, Category::kParameters);
  uint32_t step = 0;
  while (s.size() < target_events) {
    ++step;
    s.BeginPhase(step, Phase::kForward);
    std::vector<uint64_t> acts;
    for (int i = 0; i < 20000; ++i) {
      const uint64_t bytes = (uint64_t{1} << (10 + rng() % 16)) + 512 * (rng() % 4);
      s.Alloc(id, bytes, Category::kActivations);
      acts.push_back(id++);
      s.Alloc(id, bytes / 2, Category::kTemporaries);
      s.Free(id++);
    }
    s.BeginPhase(step, Phase::kBackward);
    while (!acts.empty()) {
      s.Alloc(id, 4 << 20, Category::kTemporaries);
      s.Free(id++);
      s.Free(acts.back());
      acts.pop_back();
    }
  }
  return s;
}

void BM_Simulate1M(benchmark::State& state) {
  const EventStream stream = TrainingLikeStream(1'000'000);
  SimOptions options;
  for (auto _ : state) {
    auto r = Simulate(stream, options);
    benchmark::DoNotOptimize(r);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * stream.size()));
}
BENCHMARK(BM_Simulate1M)->Unit(benchmark::kMillisecond);

void Estimate(benchmark::State& state, const char* model, uint64_t batch, uint64_t seq) {
  auto spec = LoadCatalogModel(model);
  auto gpu = FindGpu("h100-80g");
  if (!spec.ok() || !gpu.ok()) {
    state.SkipWithError("catalog lookup failed");
    return;
  }
  TrainingSetup setup;
  setup.batch = batch;
  setup.seq = seq;
  setup.precision = Precision::kBf16;
  setup.grad_ckpt = GradCkpt::kFull;
  size_t events = 0;
  for (auto _ : state) {
    auto lowered = LowerTraining(*spec, setup, *gpu);
    SimOptions options;
    options.device_limit_bytes = kUnlimited;
    auto r = Simulate(lowered->stream, options);
    events = lowered->stream.size();
    benchmark::DoNotOptimize(r);
  }
  state.counters["events"] = static_cast<double>(events);
}
BENCHMARK_CAPTURE(Estimate, llama_3_8b_seq2048, "llama-3-8b", 1, 2048)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(Estimate, llama_3_70b_seq8192_b8, "llama-3-70b", 8, 8192)
    ->Unit(benchmark::kMillisecond);

// The whole process, startup included: `vramscope estimate llama-3-8b` with
// its default knobs (issue 3's "≤ 100 ms" target), output to /dev/null.
#ifdef VS_CLI_BINARY
void ProcessEstimate(benchmark::State& state) {
  const std::string command =
      std::string(VS_CLI_BINARY) + " estimate llama-3-8b --json > /dev/null";
  for (auto _ : state) {
    if (std::system(command.c_str()) != 0) {
      state.SkipWithError("vramscope estimate failed");
      return;
    }
  }
}
BENCHMARK(ProcessEstimate)->Unit(benchmark::kMillisecond)->UseRealTime();
#endif

}  // namespace
}  // namespace vramscope

BENCHMARK_MAIN();
