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
#include <utility>
#include <vector>

#include "vramscope/gpu.h"
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
  uint64_t nccl_bytes = 0;         // communicator buffers (multi-GPU)
  uint64_t other_bytes = 0;        // anything else outside the allocator
};

struct RankReport {
  std::string rank_class;          // "all", "first stage", ...
  std::vector<int> ranks;          // which ranks share this report
  SimResult sim;
  DeviceExtras extras;
  uint64_t device_total_bytes = 0; // peak reserved + extras
  uint64_t host_peak_bytes = 0;
};

struct Report {
  std::string command;             // "estimate", "simulate", ...
  std::string source;              // trace path or model name
  GpuSpec gpu;
  std::optional<ModelSummary> model;
  std::vector<std::pair<std::string, std::string>> knobs;  // as used
  std::vector<RankReport> ranks;   // at least one
  // Plain-words lines: what is alive at the peak, why, what knobs would save.
  std::vector<std::string> explanation;
  std::vector<std::string> notes;  // assumptions, modelled library versions

  // The rank class with the largest device total (the reported maximum).
  const RankReport& worst() const;
  bool fits() const;
  int64_t headroom_bytes() const;  // usable - device total (negative: short)
};

// Device total = peak reserved + context + NCCL + other.
uint64_t DeviceTotalBytes(const SimResult& sim, const DeviceExtras& extras);

std::string RenderText(const Report& report);
std::string RenderJson(const Report& report, int indent = 2);
std::string RenderTimelineCsv(const Report& report);
std::string RenderSvg(const Report& report);
std::string RenderHtml(const Report& report);

// "12.34 GiB" (2^30 bytes, two decimals).
std::string FormatGiB(uint64_t bytes);

}  // namespace vramscope
