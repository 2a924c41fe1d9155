// Sweep results: one estimate per point of a grid over one or two knobs, and
// their renderers.
//
// The data types live here, apart from the planner that fills them
// (vramscope/plan.h: Sweep()), so that the report stage can render them
// without depending on the planner (dependencies point one way:
// report -> plan).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "vramscope/gpu.h"
#include "vramscope/report.h"

namespace vramscope {

// The knobs a sweep can vary (flag names of DESIGN.md).
// kImageSize: a diffusion UNet's --image-size (fit searches it in place of --seq).
enum class SweepVariable : uint8_t { kSeq, kBatch, kLoraRank, kGradAccum, kImageSize };

// "seq", "batch", "lora_rank", "grad_accum": JSON keys and CSV columns.
std::string_view SweepVariableKey(SweepVariable v);
// "--seq", "--batch", "--lora-rank", "--grad-accum".
std::string_view SweepVariableFlag(SweepVariable v);

// One swept knob and its values: ascending, distinct, each >= 1.
struct SweepAxis {
  SweepVariable variable = SweepVariable::kSeq;
  std::vector<uint64_t> values;
};

// One estimate. For a point that does not fit, the simulation stopped at the
// simulated OOM (as PyTorch would raise), so its peaks are what was reached by
// then; needed_bytes is the lower bound of what the run needs
// (Report::needed_bytes()).
struct SweepPoint {
  std::vector<uint64_t> at;           // one value per axis, in axis order
  uint64_t peak_allocated_bytes = 0;  // torch.cuda.max_memory_allocated()
  uint64_t peak_reserved_bytes = 0;   // torch.cuda.max_memory_reserved()
  uint64_t device_total_bytes = 0;    // what nvidia-smi shows
  uint64_t needed_bytes = 0;          // Report::needed_bytes()
  bool oom = false;                   // the simulation ran out of memory
  bool fits = false;                  // Report::fits()
};

struct SweepResult {
  std::string source;  // MODEL as given
  GpuSpec gpu;
  std::optional<ModelSummary> model;  // at the first point
  // The fixed knobs (DESIGN.md flag names); swept ones show their grid.
  std::vector<std::pair<std::string, std::string>> knobs;
  std::vector<SweepAxis> axes;  // one or two
  // Every combination, first axis outermost: with axes {seq: s1,s2} and
  // {batch: b1,b2} the order is (s1,b1), (s1,b2), (s2,b1), (s2,b2).
  std::vector<SweepPoint> points;
};

// Renderers: pure, deterministic, never fail. Human output in GiB, machine
// output in integer bytes.
//
// A table, one row per point, with a fit column and a closing line saying
// where the GPU's usable memory is crossed.
std::string RenderSweepText(const SweepResult& sweep);
// {"command": "sweep", "model", "gpu", "knobs", "variables", "points": [...]};
// docs/plan.md lists the keys. indent < 0: one line.
std::string RenderSweepJson(const SweepResult& sweep, int indent = 2);
// Header row, then one row per point: the swept knobs, then the byte columns.
std::string RenderSweepCsv(const SweepResult& sweep);
// Standalone SVG chart against the first swept knob: peak allocated, peak
// reserved and device total (one device-total line per value of a second
// knob), points that do not fit marked, the GPU's usable memory as a line. No
// scripts, no external resources.
std::string RenderSweepSvg(const SweepResult& sweep);
// One self-contained offline page: the chart, the table and the knobs, under a
// Content-Security-Policy that forbids every network request.
std::string RenderSweepHtml(const SweepResult& sweep);

}  // namespace vramscope
