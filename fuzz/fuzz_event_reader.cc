// libFuzzer target for the event-stream reader (docs/event-stream.md).
//
// Checks, beyond "no crash, no hang, no sanitizer report":
//  - every error is one printable line starting with the input's name;
//  - whatever parses passes EventStream::Validate();
//  - writing a parsed stream and reading it back succeeds, and writing that
//    again gives the same bytes (the writer's output is a fixed point);
//  - a parsed stream replays through the caching allocator model (its
//    internal checks abort on a broken state, e.g. of record_stream's
//    pending frees) with and without expandable segments, unless its sizes
//    sum past 2^64 (Simulate refuses that in one clean line).
// The input is parsed twice: with the default limits and with tiny ones, so
// the limit paths (line length, event count, live allocations) are reached.
//
//   CC=clang CXX=clang++ cmake -S . -B build-fuzz -DVRAMSCOPE_FUZZ=ON
//   cmake --build build-fuzz --target fuzz_event_reader
//   build-fuzz/fuzz/fuzz_event_reader -dict=fuzz/event_reader.dict \
//       -max_total_time=60 fuzz/corpus/event_reader
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "vramscope/event_io.h"
#include "vramscope/simulate.h"

namespace {

void Die(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_event_reader: %s\n%s\n", what, detail.c_str());
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

void CheckParsed(const vramscope::EventStream& stream) {
  if (vramscope::Status status = stream.Validate(); !status.ok()) {
    Die("parsed stream fails Validate()", status.error().message);
  }
  const std::string written = vramscope::WriteEventText(stream);
  vramscope::Result<vramscope::EventStream> reread =
      vramscope::ParseEventText(written, "fuzz-rewritten");
  if (!reread.ok()) Die("writer output does not parse", reread.error().message);
  if (reread->size() != stream.size()) Die("event count changed in round trip", written);
  if (vramscope::WriteEventText(*reread) != written) Die("writer is not a fixed point", written);
  for (bool expandable : {false, true}) {
    vramscope::SimOptions options;
    options.alloc.expandable_segments = expandable;
    options.device_limit_bytes = uint64_t{1} << 30;  // reaches the OOM paths too
    options.stop_at_oom = false;
    vramscope::Result<vramscope::SimResult> sim = vramscope::Simulate(stream, options);
    // The one refusal a parsed stream may get: sizes that, each within the
    // format's 2^62, sum past 2^64 (Simulate's CheckSizesFit64Bits,
    // docs/hardening.md); any other failure is a bug.
    if (!sim.ok() && sim.error().message.find("sum past 2^64") == std::string::npos)
      Die("a valid stream fails to simulate", sim.error().message);
  }
}

void ParseWith(std::string_view text, const vramscope::EventReadLimits& limits) {
  vramscope::Result<vramscope::EventStream> result =
      vramscope::ParseEventText(text, "fuzz", limits);
  if (result.ok()) {
    CheckParsed(*result);
  } else {
    CheckError(result.error());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  ParseWith(text, vramscope::EventReadLimits{});
  vramscope::EventReadLimits tiny;
  tiny.max_file_bytes = 4096;
  tiny.max_events = 16;
  tiny.max_line_bytes = 64;
  tiny.max_live_allocations = 4;
  ParseWith(text, tiny);
  return 0;
}
