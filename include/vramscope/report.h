// The report: what every report-producing command prints.
//
// Knows nothing of where events came from. Built from one SimResult per rank
// class plus the device view; rendered as a human table (GiB), JSON (integer
// bytes, keys of the interface contract in docs/json-schema.md), a timeline
// CSV, an SVG chart, or a self-contained HTML page.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "vramscope/gpu.h"
#include "vramscope/saved_activations.h"
#include "vramscope/simulate.h"

namespace vramscope {

struct ModelSummary {
  std::string name;
  std::string architecture;
  uint64_t parameters = 0;
  uint64_t trainable_parameters = 0;
};

// Memory outside PyTorch's allocator, as nvidia-smi sees it.
struct DeviceExtras {
  uint64_t cuda_context_bytes = 0;
  uint64_t nccl_bytes = 0;   // communicator buffers (multi-GPU)
  uint64_t other_bytes = 0;  // anything else outside the allocator
};

// The whole run replayed without the GPU's limit, for a rank class whose
// simulation ran out of memory: what the run needs, not what it held when the
// allocation failed.
struct FullRequirement {
  uint64_t peak_allocated_bytes = 0;
  uint64_t peak_reserved_bytes = 0;
  uint32_t peak_step = 0;
  Phase peak_phase = Phase::kSetup;
};

struct RankReport {
  std::string rank_class;  // "all", "first stage", ...
  std::vector<int> ranks;  // which ranks share this report
  SimResult sim;
  std::optional<FullRequirement> full;  // set when sim.oom (see AddFullRequirement)
  // The numbers are a state, not peaks: a memory snapshot without a trace
  // (segments only) says what was held when it was taken.
  bool state_only = false;
  DeviceExtras extras;
  uint64_t device_total_bytes = 0;  // peak reserved + extras
  uint64_t host_peak_bytes = 0;
  // What the forward left alive for backward, by block and op (estimates only).
  std::optional<SavedActivations> saved;
};

// Version of the JSON report layout (docs/json-schema.md). Raised when a key
// changes meaning or disappears; new keys do not raise it.
inline constexpr int kReportSchemaVersion = 1;

// A default the estimate rests on, in words, with the flag that changes it.
struct Assumption {
  std::string what;     // "weights", "optimizer", ...
  std::string assumed;  // what the lowering models
  std::string flag;     // the flag that changes it ("" for none)
};

struct Report {
  std::string command;  // "estimate", "simulate", ...
  std::string source;   // trace path or model name
  GpuSpec gpu;
  std::optional<ModelSummary> model;
  std::vector<std::pair<std::string, std::string>> knobs;  // as used
  std::vector<RankReport> ranks;                           // at least one
  // Plain-words lines: what is alive at the peak, why, what knobs would save.
  std::vector<std::string> explanation;
  std::vector<std::string> notes;       // assumptions, modelled library versions
  std::vector<Assumption> assumptions;  // the defaults an estimate rests on
  // False for a measured run on a GPU nobody named: a PyTorch snapshot records
  // its device's memory only at an OOM, so `explain` without --gpu judges
  // nothing (no verdict; JSON "fits" is null). True for every estimate.
  bool has_device_limit = true;
  // Host memory of the fullest node (estimates on several GPUs with host
  // offload): the host peaks of the ranks that share it (--gpus-per-node),
  // added as if they peaked together, which ranks in lockstep do. 0 when no
  // rank uses host memory or the run has one GPU.
  uint64_t host_peak_per_node_bytes = 0;

  // The rank class with the largest device total (the reported maximum); a
  // class that ran out of memory counts with its needed bytes (see below). The
  // first of equals. A Report without ranks yields an empty RankReport.
  const RankReport& worst() const;
  // Every rank class ran without a simulated OOM and its device total is
  // within gpu.usable_bytes.
  bool fits() const;
  // What the run needs on the device: the worst device total; for a rank class
  // that ran out of memory, the device total of its full requirement (the run
  // replayed without the GPU's limit), or, without one, what it held when the
  // allocation failed plus that allocation plus the memory outside the
  // allocator (a lower bound: the simulation stopped there).
  uint64_t needed_bytes() const;
  // usable - needed_bytes() (negative: short by that much); saturates at the
  // int64 range.
  int64_t headroom_bytes() const;
};

// Device total = peak reserved + context + NCCL + other (saturating).
uint64_t DeviceTotalBytes(const SimResult& sim, const DeviceExtras& extras);
// Peak allocated of the whole run: the full requirement's where the rank ran
// out of memory, else the simulation's.
uint64_t FullPeakAllocatedBytes(const RankReport& rank);
// Likewise peak reserved and the device total.
uint64_t FullPeakReservedBytes(const RankReport& rank);
uint64_t FullDeviceTotalBytes(const RankReport& rank);
// The full requirement's device total: its peak reserved + the extras.
uint64_t FullDeviceTotalBytes(const FullRequirement& full, const DeviceExtras& extras);

// Sets rank->full when rank->sim ran out of memory: `stream` (what rank->sim
// replayed) replayed again with `options` but no device limit, so the report
// can say what the whole run needs. Errors are Simulate's.
Status AddFullRequirement(const EventStream& stream, const SimOptions& options, RankReport* rank);
// The rank's device_total_bytes when set (non-zero), else computed from its
// simulation and extras. Every renderer and Report method uses this.
uint64_t DeviceTotalBytes(const RankReport& rank);

// Renderers. Pure functions of the Report: deterministic output (golden-tested,
// tests/golden/report/), never fail. Text taken from inputs (names, ops,
// modules, messages) is made safe for each format: control characters and
// invalid UTF-8 are replaced, markup is escaped.
//
// Human report in GiB: headline verdict, the three numbers, when the peak
// happens, breakdown, phases, top allocations, OOM point, explanation, notes;
// one section per rank class when there are several.
std::string RenderText(const Report& report);
// JSON of the interface contract plus documented extras (docs/json-schema.md);
// integer bytes; top-level numbers from worst(); keys in the document's order.
// The object, for commands that embed a report in their own JSON (fit, explain,
// replay) without printing and parsing it again. Strings are as given: dump it
// with error_handler_t::replace, as RenderJson does, since input text may hold
// invalid UTF-8. (Include <nlohmann/json.hpp> to use it.)
nlohmann::ordered_json ReportToJson(const Report& report);
// ReportToJson dumped, with a final newline. indent < 0: one line.
std::string RenderJson(const Report& report, int indent = 2);
// One row per timeline point of the worst rank class; with several rank
// classes, every class's rows behind a leading rank_class column.
std::string RenderTimelineCsv(const Report& report);
// Standalone SVG chart of the worst rank class's timeline: no scripts, no
// external resources.
std::string RenderSvg(const Report& report);
// One self-contained offline HTML page (inline CSS, SVG and script; a
// Content-Security-Policy that forbids every network request).
std::string RenderHtml(const Report& report);

// In the unit that fits: "12.34 GiB" from 1 GiB up (2^30 bytes, two decimals),
// "512.00 MiB" below, "3.50 KiB" below 1 MiB, "12 B" below 1 KiB.
std::string FormatBytes(uint64_t bytes);

// Text from outside (model names, file names, module paths) made safe for
// HTML/XML element content and quoted attributes: invalid UTF-8 bytes become
// U+FFFD, control characters '?', and &, <, >, ", ' entities. The one escape
// every HTML page of vramscope uses (reports here, plans in src/plan).
std::string EscapeHtml(std::string_view text);

}  // namespace vramscope
