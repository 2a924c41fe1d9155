// Throughput of the event-stream reader and writer. Target (see the task
// brief of docs/event-stream.md): parsing at 50 MB/s or more.
//
//   build/src/events/events_bench --benchmark_filter=Parse
#include <string>

#include <benchmark/benchmark.h>

#include "vramscope/event_io.h"

namespace vramscope {
namespace {

// A realistic stream: a few hundred strings, steps of forward / backward /
// optimizer with activations saved and freed, about 50 MB of text.
EventStream MakeStream(size_t target_events) {
  EventStream s;
  s.metadata()["source"] = "bench";
  uint64_t next_id = 1;
  for (int layer = 0; layer < 32; ++layer) {
    s.Alloc(next_id++, 33554432, Category::kParameters, "aten::empty",
            "model.layers." + std::to_string(layer) + ".mlp");
  }
  std::vector<uint64_t> saved;
  for (uint32_t step = 1; s.size() < target_events; ++step) {
    s.BeginPhase(step, Phase::kForward);
    for (int layer = 0; layer < 32; ++layer) {
      const std::string module = "model.layers." + std::to_string(layer) + ".mlp";
      for (int op = 0; op < 20; ++op) {
        const uint64_t temp = next_id++;
        s.Alloc(temp, 1048576 + op * 4096, Category::kTemporaries, "aten::mm", module);
        saved.push_back(next_id);
        s.Alloc(next_id++, 8388608, Category::kActivations, "aten::gelu", module);
        s.Free(temp);
      }
    }
    s.BeginPhase(step, Phase::kBackward);
    for (uint64_t id : saved) s.Free(id);
    saved.clear();
    s.BeginPhase(step, Phase::kOptimizer);
    s.EmptyCache();
  }
  return s;
}

const std::string& BenchText() {
  static const std::string text = WriteEventText(MakeStream(2'000'000));
  return text;
}

void BM_ParseEventText(benchmark::State& state) {
  const std::string& text = BenchText();
  for (auto _ : state) {
    Result<EventStream> result = ParseEventText(text, "bench");
    if (!result.ok()) state.SkipWithError(result.error().message.c_str());
    benchmark::DoNotOptimize(result);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
}
BENCHMARK(BM_ParseEventText)->Unit(benchmark::kMillisecond);

void BM_WriteEventText(benchmark::State& state) {
  const EventStream stream = MakeStream(2'000'000);
  size_t bytes = 0;
  for (auto _ : state) {
    std::string text = WriteEventText(stream);
    bytes = text.size();
    benchmark::DoNotOptimize(text);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}
BENCHMARK(BM_WriteEventText)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace vramscope

BENCHMARK_MAIN();
