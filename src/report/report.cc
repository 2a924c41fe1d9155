// Report: the fit verdict and the device total, shared by every renderer.
#include "vramscope/report.h"

#include <algorithm>

#include <fmt/format.h>

#include "report_format.h"

namespace vramscope {

using common::SaturatingAdd;
using report_internal::RankFits;
using report_internal::RankNeededBytes;

uint64_t DeviceTotalBytes(const SimResult& sim, const DeviceExtras& extras) {
  // Saturating: each term may be up to 2^62 (kMaxSizeBytes) in hostile input.
  uint64_t total = SaturatingAdd(sim.peak_reserved_bytes, extras.cuda_context_bytes);
  total = SaturatingAdd(total, extras.nccl_bytes);
  return SaturatingAdd(total, extras.other_bytes);
}

uint64_t DeviceTotalBytes(const RankReport& rank) {
  // A caller that forgot to fill the field must not get a report that claims
  // zero bytes: an under-estimate is the worst error this tool can make.
  return rank.device_total_bytes != 0 ? rank.device_total_bytes
                                      : DeviceTotalBytes(rank.sim, rank.extras);
}

const RankReport& Report::worst() const {
  static const RankReport kEmpty;  // immutable: no shared mutable state
  if (ranks.empty()) return kEmpty;
  return ranks[report_internal::WorstIndex(*this)];
}

bool Report::fits() const {
  if (ranks.empty()) return false;
  for (const RankReport& rank : ranks) {
    if (!RankFits(*this, rank)) return false;
  }
  return true;
}

uint64_t Report::needed_bytes() const {
  uint64_t needed = 0;
  for (const RankReport& rank : ranks) needed = std::max(needed, RankNeededBytes(rank));
  return needed;
}

int64_t Report::headroom_bytes() const {
  return report_internal::SignedDifference(gpu.usable_bytes, needed_bytes());
}

uint64_t FullPeakAllocatedBytes(const RankReport& rank) {
  return rank.full ? rank.full->peak_allocated_bytes : rank.sim.peak_allocated_bytes;
}

uint64_t FullPeakReservedBytes(const RankReport& rank) {
  return rank.full ? rank.full->peak_reserved_bytes : rank.sim.peak_reserved_bytes;
}

uint64_t FullDeviceTotalBytes(const RankReport& rank) {
  return rank.full ? FullDeviceTotalBytes(*rank.full, rank.extras) : DeviceTotalBytes(rank);
}

uint64_t FullDeviceTotalBytes(const FullRequirement& full, const DeviceExtras& extras) {
  SimResult sim;
  sim.peak_reserved_bytes = full.peak_reserved_bytes;
  return DeviceTotalBytes(sim, extras);
}

Status AddFullRequirement(const EventStream& stream, const SimOptions& options, RankReport* rank) {
  if (!rank->sim.oom) return Ok{};
  SimOptions unbounded = options;
  unbounded.device_limit_bytes = kUnlimited;
  unbounded.max_timeline_points = 0;
  unbounded.top_allocations = 0;
  VS_TRY(sim, Simulate(stream, unbounded));
  rank->full = FullRequirement{sim.peak_allocated_bytes, sim.peak_reserved_bytes, sim.peak_step,
                               sim.peak_phase};
  return Ok{};
}

std::string FormatBytes(uint64_t bytes) {
  constexpr uint64_t kKiB = uint64_t{1} << 10, kMiB = uint64_t{1} << 20, kGiB = uint64_t{1} << 30;
  const auto in = [bytes](uint64_t unit) {
    return static_cast<double>(bytes) / static_cast<double>(unit);
  };
  if (bytes >= kGiB) return fmt::format("{} GiB", report_internal::GiBNumber(bytes));
  if (bytes >= kMiB) return fmt::format("{:.2f} MiB", in(kMiB));
  if (bytes >= kKiB) return fmt::format("{:.2f} KiB", in(kKiB));
  return fmt::format("{} B", bytes);
}

std::string EscapeHtml(std::string_view text) { return report_internal::EscapeMarkup(text); }

}  // namespace vramscope
