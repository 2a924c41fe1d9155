// libFuzzer target for the readers of `vramscope validate`: ground-truth
// result files (JSON Lines, docs/groundtruth.md) and accuracy thresholds.
//
// Checks, beyond "no crash, no hang, no sanitizer report":
//  - every error is one line starting with the input's name;
//  - every parsed run is within the ranges the reader promises (knobs in
//    range, peak reserved >= peak allocated > 0 for status ok);
//  - every parsed threshold is a fraction in [0, 10].
// Nothing is estimated: Validate() would resolve models (and could reach the
// Hub), so only the parsing is fuzzed.
//
//   scripts/fuzz.sh fuzz_groundtruth      (or, by hand:)
//   build-fuzz/fuzz/fuzz_groundtruth -max_len=8192 -max_total_time=60 CORPUS_COPY
// where CORPUS_COPY is a copy of fuzz/corpus/groundtruth (libFuzzer adds to it).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "vramscope/validate.h"

namespace {

void Die(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_groundtruth: %s\n%s\n", what, detail.c_str());
  std::abort();
}

void CheckError(const vramscope::Error& error, std::string_view label) {
  const std::string& message = error.message;
  if (message.rfind(label, 0) != 0) Die("error does not name the input", message);
  if (message.find('\n') != std::string::npos) Die("error is not one line", message);
}

void CheckRun(const vramscope::MeasuredRun& run) {
  const vramscope::TrainingSetup& s = run.setup;
  if (run.model.empty()) Die("run without a model", run.where);
  if (s.batch < 1 || s.batch > (1u << 20) || s.seq < 1 || s.seq > (1u << 24) || s.grad_accum < 1 ||
      s.grad_accum > (1u << 16) || s.steps < 1 || s.steps > 100 || s.lora_rank < 1 ||
      s.lora_rank > (1u << 20) || !(s.lora_dropout >= 0 && s.lora_dropout < 1)) {
    Die("knob out of the reader's range", run.where);
  }
  if (run.status == "ok") {
    if (run.peak_allocated_bytes == 0 || run.peak_reserved_bytes < run.peak_allocated_bytes) {
      Die("inconsistent peaks accepted", run.where);
    }
  } else if (run.status != "oom") {
    Die("run with a status that is not compared", run.where);
  }
}

void CheckFraction(const std::optional<double>& limit) {
  if (limit && !(*limit >= 0 && *limit <= 10))
    Die("threshold outside [0, 10]", std::to_string(*limit));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  constexpr std::string_view kResults = "fuzz.jsonl";
  // The first byte picks whether records name their GPU or --gpu overrides it.
  const std::string_view gpu_override = size > 0 && (data[0] & 1) ? "h100-80g" : "";
  auto file = vramscope::ParseGroundTruth(text, kResults, gpu_override);
  if (file.ok()) {
    for (const vramscope::MeasuredRun& run : file->runs) CheckRun(run);
    for (const std::string& line : file->not_compared) {
      if (line.rfind(kResults, 0) != 0) Die("not-compared line does not name the input", line);
    }
  } else {
    CheckError(file.error(), kResults);
  }

  constexpr std::string_view kThresholds = "fuzz-thresholds.json";
  auto thresholds = vramscope::ParseThresholds(text, kThresholds);
  if (thresholds.ok()) {
    const vramscope::Thresholds& t = *thresholds;
    for (const auto* limit : {&t.allocated_median_abs, &t.allocated_max_abs, &t.allocated_max_under,
                              &t.reserved_median_abs, &t.reserved_max_abs, &t.reserved_max_under,
                              &t.device_median_abs, &t.device_max_abs, &t.device_max_under}) {
      CheckFraction(*limit);
    }
  } else {
    CheckError(thresholds.error(), kThresholds);
  }
  return 0;
}
