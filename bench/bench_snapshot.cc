// Speed of reading PyTorch memory snapshots (issue: >= 200 MB/s of snapshot
// parsed on one core) and of explaining them.
//
// The snapshot is generated here, byte for byte in the shape Python's pickle
// (protocol 4) gives torch.cuda.memory._snapshot(): 64 KiB FRAMEs, every dict,
// list and str memoized, keys and action names written once and referenced
// with BINGET / LONG_BINGET after, shared frame lists, LONG1 addresses and
// timestamps. bytes/s is snapshot bytes per second.
//
//   cmake --build build-snap --target bench_snapshot
//   build-snap/bench/bench_snapshot --benchmark_min_time=3
//   # writes the synthetic file, streamed (for memory measurements of the
//   # CLI; 41M entries make a ~2 GB file, docs/snapshot.md "Speed"):
//   VS_BENCH_SNAPSHOT_OUT=/tmp/big.pickle VS_BENCH_SNAPSHOT_ENTRIES=41000000
//       build-snap/bench/bench_snapshot --benchmark_filter=Write   (one line)
//   # reads and explains a file (ReadSnapshotFile + MeasureSnapshot), once:
//   VS_BENCH_SNAPSHOT_FILE=/tmp/big.pickle build-snap/bench/bench_snapshot
//       --benchmark_filter=ReadFile   (one line)
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <fstream>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "vramscope/snapshot.h"

namespace vramscope {
namespace {

// Writes into a string, or streams to `sink` (a file of any size without
// holding it in memory).
class PickleWriter {
 public:
  explicit PickleWriter(std::ostream* sink = nullptr) : sink_(sink) {
    frames_.assign("\x80\x04", 2);
  }
  std::string Finish() {
    Flush();
    frames_ += '.';
    if (sink_ != nullptr) {
      sink_->write(frames_.data(), static_cast<std::streamsize>(frames_.size()));
      frames_.clear();
    }
    return std::move(frames_);
  }
  void Op(char op) {
    MaybeFrame();
    chunk_ += op;
  }
  uint32_t Memoize() {
    chunk_ += '\x94';
    return memo_++;
  }
  void Get(uint32_t index) {
    if (index < 256) {
      chunk_ += 'h';
      chunk_ += static_cast<char>(index);
    } else {
      chunk_ += 'j';
      Le(index, 4);
    }
  }
  uint32_t Str(const std::string& s) {
    MaybeFrame();
    chunk_ += '\x8c';
    chunk_ += static_cast<char>(s.size());
    chunk_ += s;
    return Memoize();
  }
  void Int(uint64_t v) {
    if (v < 256) {
      chunk_ += 'K';
      chunk_ += static_cast<char>(v);
    } else if (v < 65536) {
      chunk_ += 'M';
      Le(v, 2);
    } else if (v < (uint64_t{1} << 31)) {
      chunk_ += 'J';
      Le(v, 4);
    } else {
      int n = 0;
      while (n < 8 && (v >> (8 * n)) != 0) ++n;
      if ((v >> (8 * n - 1)) & 1) ++n;  // keep the sign bit clear
      chunk_ += '\x8a';
      chunk_ += static_cast<char>(n);
      Le(v, n);
    }
  }

 private:
  void Le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) chunk_ += static_cast<char>(i < 8 ? (v >> (8 * i)) & 0xff : 0);
  }
  void MaybeFrame() {
    if (chunk_.size() >= 65536) Flush();
  }
  void Flush() {
    if (chunk_.empty()) return;
    frames_ += '\x95';
    const uint64_t n = chunk_.size();
    for (int i = 0; i < 8; ++i) frames_ += static_cast<char>((n >> (8 * i)) & 0xff);
    frames_ += chunk_;
    chunk_.clear();
    if (sink_ != nullptr && frames_.size() >= (1u << 22)) {
      sink_->write(frames_.data(), static_cast<std::streamsize>(frames_.size()));
      frames_.clear();
    }
  }
  std::ostream* sink_;
  std::string frames_, chunk_;
  uint32_t memo_ = 0;
};

// A training run's trace: `entries` alloc/free entries over 300 distinct
// stacks of 8 frames each, a few segments.
std::string SyntheticSnapshot(size_t entries, std::ostream* sink = nullptr) {
  PickleWriter w(sink);
  std::mt19937_64 rng(3);
  w.Op('}');
  w.Memoize();
  w.Op('(');
  const char* key_names[] = {"action",         "addr",          "size",          "stream",
                             "time_us",        "frames",        "name",          "filename",
                             "line",           "segments",      "device_traces", "alloc",
                             "free_requested", "free_completed"};
  uint32_t key[14];
  auto key_of = [&](int i) { return key[i]; };
  key[9] = w.Str("segments");
  w.Op(']');
  w.Memoize();
  key[10] = w.Str("device_traces");
  w.Op(']');
  w.Memoize();
  w.Op(']');  // device 0
  w.Memoize();
  bool defined[14] = {false};
  defined[9] = defined[10] = true;
  auto key_ref = [&](int i) {
    if (defined[i]) {
      w.Get(key_of(i));
    } else {
      key[i] = w.Str(key_names[i]);
      defined[i] = true;
    }
  };
  std::vector<int64_t> stack_memo(300, -1);
  std::vector<uint64_t> live;
  uint64_t time_us = 1700000000000000;
  size_t written = 0;
  uint64_t pending_free = 0;  // free_completed follows its free_requested
  while (written < entries) {
    w.Op('(');
    for (int batch = 0; batch < 1000 && written < entries; ++batch, ++written) {
      uint64_t addr;
      int action;
      if (pending_free != 0) {
        addr = pending_free;
        pending_free = 0;
        action = 13;
      } else if (live.size() < 64 || rng() % 2 == 0) {
        addr = 0x7f0000000000 + (rng() % (1u << 24)) * 512;
        live.push_back(addr);
        action = 11;
      } else {
        const size_t k = rng() % live.size();
        addr = live[k];
        live[k] = live.back();
        live.pop_back();
        pending_free = addr;
        action = 12;
      }
      w.Op('}');
      w.Memoize();
      w.Op('(');
      key_ref(0);
      key_ref(action);
      key_ref(1);
      w.Int(addr);
      key_ref(2);
      w.Int(512 * (1 + rng() % 100000));
      key_ref(3);
      w.Int(0);
      key_ref(4);
      w.Int(time_us += 7);
      key_ref(5);
      const size_t s = rng() % stack_memo.size();
      if (stack_memo[s] >= 0) {
        w.Get(static_cast<uint32_t>(stack_memo[s]));
      } else {
        w.Op(']');
        stack_memo[s] = w.Memoize();
        w.Op('(');
        for (int f = 0; f < 8; ++f) {
          w.Op('}');
          w.Memoize();
          w.Op('(');
          key_ref(6);
          w.Str("function_" + std::to_string(s) + "_" + std::to_string(f));
          key_ref(7);
          w.Str("/env/site-packages/project/module_" + std::to_string(f) + ".py");
          key_ref(8);
          w.Int(10 + f * 7);
          w.Op('u');
        }
        w.Op('e');
      }
      w.Op('u');
    }
    w.Op('e');
  }
  w.Op('a');  // device 0 -> device_traces
  w.Op('u');  // segments, device_traces -> root
  return w.Finish();
}

const std::string& Synthetic() {
  static const std::string bytes = SyntheticSnapshot(2'000'000);
  return bytes;
}

void BM_ParseSnapshotPickle(benchmark::State& state) {
  const std::string& bytes = Synthetic();
  for (auto _ : state) {
    auto s = ParseSnapshot(bytes, "bench");
    if (!s.ok()) state.SkipWithError(s.error().message.c_str());
    benchmark::DoNotOptimize(s);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes.size()));
  state.counters["file_MB"] = static_cast<double>(bytes.size()) / 1e6;
}
BENCHMARK(BM_ParseSnapshotPickle)->Unit(benchmark::kMillisecond);

void BM_MeasureSnapshot(benchmark::State& state) {
  auto s = ParseSnapshot(Synthetic(), "bench");
  if (!s.ok()) {
    state.SkipWithError(s.error().message.c_str());
    return;
  }
  for (auto _ : state) {
    auto run = MeasureSnapshot(*s);
    benchmark::DoNotOptimize(run);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * s->device_traces[0].size()));
}
BENCHMARK(BM_MeasureSnapshot)->Unit(benchmark::kMillisecond);

// Writes the synthetic snapshot for memory measurements of the CLI:
// VS_BENCH_SNAPSHOT_OUT=PATH [VS_BENCH_SNAPSHOT_ENTRIES=N].
void BM_WriteSynthetic(benchmark::State& state) {
  const char* path = std::getenv("VS_BENCH_SNAPSHOT_OUT");
  for (auto _ : state) {
    if (path == nullptr) continue;
    const char* n = std::getenv("VS_BENCH_SNAPSHOT_ENTRIES");
    std::ofstream file(path, std::ios::binary);
    SyntheticSnapshot(n ? std::strtoull(n, nullptr, 10) : 2'000'000, &file);
    if (!file) state.SkipWithError("cannot write VS_BENCH_SNAPSHOT_OUT");
  }
}
BENCHMARK(BM_WriteSynthetic)->Iterations(1);

// What `vramscope explain FILE` does before reporting, once, for
// /usr/bin/time -v: VS_BENCH_SNAPSHOT_FILE=PATH.
void BM_ReadFile(benchmark::State& state) {
  const char* path = std::getenv("VS_BENCH_SNAPSHOT_FILE");
  for (auto _ : state) {
    if (path == nullptr) continue;
    auto s = ReadSnapshotFile(path);
    if (!s.ok()) {
      state.SkipWithError(s.error().message.c_str());
      break;
    }
    auto run = MeasureSnapshot(*s);
    if (!run.ok()) {
      state.SkipWithError(run.error().message.c_str());
      break;
    }
    state.counters["entries"] = static_cast<double>(run->trace_entries);
    state.counters["timeline_points"] = static_cast<double>(run->sim.timeline.size());
  }
}
BENCHMARK(BM_ReadFile)->Iterations(1)->Unit(benchmark::kSecond);

}  // namespace
}  // namespace vramscope

BENCHMARK_MAIN();
