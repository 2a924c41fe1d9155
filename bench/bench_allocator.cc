// Replays a synthetic 1M-event malloc/free stream shaped like a transformer
// training run (a few large weights, many same-size activations, small
// temporaries) through the allocator model. items/s = events per second.
//
//   cmake --build build-alloc --target bench_allocator
//   build-alloc/bench/bench_allocator --benchmark_min_time=2
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "vramscope/alloc_config.h"
#include "vramscope/allocator.h"

namespace vramscope {
namespace {

constexpr size_t kEvents = 1'000'000;

struct Event {
  uint32_t slot;
  uint64_t bytes;  // > 0: malloc into slot; 0: free slot
};

class StreamBuilder {
 public:
  uint32_t Alloc(uint64_t bytes) {
    uint32_t slot;
    if (!free_slots_.empty()) {
      slot = free_slots_.back();
      free_slots_.pop_back();
    } else {
      slot = next_slot_++;
    }
    events_.push_back({slot, bytes});
    return slot;
  }
  void Free(uint32_t slot) {
    events_.push_back({slot, 0});
    free_slots_.push_back(slot);
  }
  void Temp(uint64_t bytes) { Free(Alloc(bytes)); }
  size_t size() const { return events_.size(); }
  uint32_t slots() const { return next_slot_; }
  std::vector<Event> Take() { return std::move(events_); }

 private:
  std::vector<Event> events_;
  std::vector<uint32_t> free_slots_;
  uint32_t next_slot_ = 0;
};

// A 32-layer, 4096-hidden decoder in bf16 with 2048 tokens per step.
std::vector<Event> TrainingStream(uint32_t* slots) {
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  constexpr int kLayers = 32;
  constexpr uint64_t kAct = 2048ull * 4096 * 2;   // 16 MiB
  constexpr uint64_t kMlp = 2048ull * 11008 * 2;  // 43 MiB
  const uint64_t weight_sizes[] = {4096ull * 4096 * 2,
                                   4096ull * 4096 * 2,
                                   4096ull * 4096 * 2,
                                   4096ull * 4096 * 2,
                                   4096ull * 11008 * 2,
                                   4096ull * 11008 * 2,
                                   4096ull * 11008 * 2,
                                   8 * 1024,
                                   8 * 1024};
  StreamBuilder s;
  std::vector<uint32_t> weights, grads, saved;
  weights.push_back(s.Alloc(128256ull * 4096 * 2));  // embedding, ~1 GiB
  for (int l = 0; l < kLayers; ++l) {
    for (uint64_t w : weight_sizes) weights.push_back(s.Alloc(w));
  }
  for (int step = 0; s.size() < kEvents; ++step) {
    for (int l = 0; l < kLayers && s.size() < kEvents; ++l) {  // forward
      for (uint64_t a : {kAct, kAct, kAct, kAct, kAct, kMlp, kMlp, kMlp}) {
        saved.push_back(s.Alloc(a));
        s.Temp(4 * 1024);  // small index / scale tensors
        s.Temp(512);
      }
      s.Temp(64 * 1024);  // softmax statistics
      s.Temp(kAct);       // attention workspace
      s.Temp(1 * kMiB + 4096);
    }
    for (int l = kLayers - 1; l >= 0 && s.size() < kEvents; --l) {  // backward
      for (int i = 0; i < 8; ++i) {
        const uint32_t grad_in = s.Alloc(i < 5 ? kAct : kMlp);
        s.Temp(2 * 1024);
        s.Free(saved.back());
        saved.pop_back();
        s.Free(grad_in);
      }
      if (step == 0) {
        for (uint64_t w : weight_sizes) grads.push_back(s.Alloc(w));
      }
      s.Temp(kMlp);
    }
    for (size_t w = 1; w < weights.size() && s.size() < kEvents; ++w) {  // optimizer
      s.Temp(weight_sizes[(w - 1) % 9]);
    }
  }
  *slots = s.slots();
  std::vector<Event> events = s.Take();
  events.resize(kEvents);
  return events;
}

void Replay(benchmark::State& state, const char* conf) {
  uint32_t slots = 0;
  const std::vector<Event> events = TrainingStream(&slots);
  const AllocatorConfig config = ParseAllocConf(conf).value();
  std::vector<BlockHandle> handles(slots);
  for (auto _ : state) {
    CachingAllocator allocator(config, kUnlimited);
    for (const Event& e : events) {
      if (e.bytes != 0) {
        handles[e.slot] = *allocator.Malloc(e.bytes);
      } else {
        allocator.Free(handles[e.slot]);
      }
    }
    benchmark::DoNotOptimize(allocator.stats().peak_reserved_bytes);
    state.counters["peak_reserved_GiB"] =
        static_cast<double>(allocator.stats().peak_reserved_bytes) / (1u << 30);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * events.size()));
}

void BM_ReplayTraining_Default(benchmark::State& state) { Replay(state, ""); }
void BM_ReplayTraining_Expandable(benchmark::State& state) {
  Replay(state, "expandable_segments:True");
}
void BM_ReplayTraining_Ideal(benchmark::State& state) { Replay(state, "ideal:True"); }

BENCHMARK(BM_ReplayTraining_Default)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ReplayTraining_Expandable)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ReplayTraining_Ideal)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace vramscope

BENCHMARK_MAIN();
