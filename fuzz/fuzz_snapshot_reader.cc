// libFuzzer target for the snapshot reader (pickle and JSON) and the
// analyses that run on whatever it accepts (docs/snapshot.md).
//
// Checks, beyond "no crash, no hang, no sanitizer report":
//  - every error is one printable line starting with the input's name;
//  - a parsed snapshot measures without error or with a one-line error, and
//    the measured breakdown at the peak sums to the peak allocated bytes;
//  - its replay stream passes EventStream::Validate() and simulates.
//  - trace entries decoded as records while reading give the same snapshot
//    (or the same error) as the general value table
//    (SnapshotReadLimits::compact_trace_entries = false).
// The input is parsed with the default limits and with tiny ones, so the
// limit paths (depth, items, strings, memo, stack, memory) are reached.
//
//   CC=clang CXX=clang++ cmake -S . -B build-fuzz-snap -G Ninja -DVRAMSCOPE_FUZZ=ON
//   cmake --build build-fuzz-snap --target fuzz_snapshot_reader
//   build-fuzz-snap/fuzz/fuzz_snapshot_reader -max_total_time=60 -max_len=65536 \
//       fuzz/corpus/snapshot
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "vramscope/simulate.h"
#include "vramscope/snapshot.h"

namespace {

void Die(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_snapshot_reader: %s\n%s\n", what, detail.c_str());
  std::abort();
}

void CheckError(const vramscope::Error& error) {
  const std::string& message = error.message;
  if (message.rfind("fuzz", 0) != 0) Die("error does not name the input", message);
  for (char c : message) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte >= 0x7f) Die("unprintable byte in error", message);
  }
}

void Analyse(const vramscope::Snapshot& snapshot) {
  vramscope::ExplainOptions options;
  options.max_timeline_points = 16;
  auto run = vramscope::MeasureSnapshot(snapshot, options);
  if (!run.ok()) {
    if (run.error().message.find('\n') != std::string::npos)
      Die("multi-line error", run.error().message);
    return;
  }
  uint64_t sum = 0;
  for (uint64_t b : run->sim.breakdown_at_peak) sum += b;
  if (sum != run->sim.peak_allocated_bytes) Die("breakdown does not sum to the peak", "");
  if (run->sim.timeline.size() > 2 * options.max_timeline_points + 2) Die("timeline unbounded", "");
  (void)vramscope::ExplainMeasured(*run);
  auto stream = vramscope::SnapshotToEventStream(snapshot, run->device);
  if (!stream.ok()) Die("replay stream failed after measure succeeded", stream.error().message);
  if (auto status = stream->Validate(); !status.ok()) {
    Die("replay stream fails Validate()", status.error().message);
  }
  vramscope::SimOptions sim;
  sim.alloc = vramscope::SnapshotAllocatorConfig(snapshot);
  sim.device_limit_bytes = uint64_t{1} << 40;
  sim.max_timeline_points = 16;
  auto result = vramscope::Simulate(*stream, sim);
  if (!result.ok()) Die("replay stream does not simulate", result.error().message);
}

void ParseWith(std::string_view bytes, const vramscope::SnapshotReadLimits& limits) {
  auto snapshot = vramscope::ParseSnapshot(bytes, "fuzz", limits);
  if (snapshot.ok()) {
    Analyse(*snapshot);
  } else {
    CheckError(snapshot.error());
  }
}

// Stack `s` of snapshot `snap` as text (indices differ between readers).
std::string StackText(const vramscope::Snapshot& snap, uint32_t s) {
  std::string out;
  for (uint32_t f : snap.stacks[s]) {
    const vramscope::SnapshotFrame& frame = snap.frames[f];
    out += frame.name + "@" + frame.filename + ":" + std::to_string(frame.line) + ";";
  }
  return out;
}

void CompareWithGeneralPath(std::string_view bytes) {
  vramscope::SnapshotReadLimits general;
  general.compact_trace_entries = false;
  auto a = vramscope::ParseSnapshot(bytes, "fuzz");
  auto b = vramscope::ParseSnapshot(bytes, "fuzz", general);
  // The documented differences (docs/snapshot.md): a dict decoded as a trace
  // entry is refused where PyTorch puts something else, or when pairs are
  // added to it after it was complete. A cycle or deep nesting inside a value
  // an entry drops (an unknown key's) is never walked there.
  const auto graph = [](const vramscope::Error& e) {
    return e.message.find("contains itself") != std::string::npos ||
           e.message.find("max_depth") != std::string::npos;
  };
  if (!a.ok() && a.error().message.find("trace entry") != std::string::npos) return;
  if ((!a.ok() && graph(a.error())) || (!b.ok() && graph(b.error()))) return;
  if (a.ok() != b.ok()) {
    Die("compact and general reads disagree", a.ok() ? b.error().message : a.error().message);
  }
  if (!a.ok()) return;  // both refuse it (the first problem each meets may differ)
  if (a->device_traces.size() != b->device_traces.size() ||
      a->unknown_actions != b->unknown_actions) {
    Die("compact and general traces differ", "");
  }
  for (size_t d = 0; d < a->device_traces.size(); ++d) {
    const vramscope::Trace& x = a->device_traces[d];
    const vramscope::Trace& y = b->device_traces[d];
    if (x.size() != y.size()) Die("compact and general trace lengths differ", "");
    for (size_t i = 0; i < x.size(); ++i) {
      const vramscope::TraceEntry p = x[i], q = y[i];
      if (p.action != q.action || p.addr != q.addr || p.size_bytes != q.size_bytes ||
          a->streams[p.stream] != b->streams[q.stream] ||
          StackText(*a, p.stack) != StackText(*b, q.stack)) {
        Die("compact and general entries differ", std::to_string(d) + " " + std::to_string(i));
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  ParseWith(bytes, vramscope::SnapshotReadLimits{});
  CompareWithGeneralPath(bytes);
  vramscope::SnapshotReadLimits tiny;
  tiny.max_depth = 4;
  tiny.max_container_items = 8;
  tiny.max_string_bytes = 16;
  tiny.max_memo_entries = 8;
  tiny.max_stack_items = 16;
  tiny.max_memory_bytes = 1 << 16;
  ParseWith(bytes, tiny);
  return 0;
}
