// Report: the fit verdict and the device total, shared by every renderer.
#include "vramscope/report.h"

#include <limits>

#include <fmt/format.h>

#include "report_format.h"

namespace vramscope {

using report_internal::RankFits;
using report_internal::RankNeededBytes;
using report_internal::SaturatingAdd;

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
  constexpr uint64_t kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  const uint64_t usable = gpu.usable_bytes;
  const uint64_t needed = needed_bytes();
  if (usable >= needed) {
    const uint64_t spare = usable - needed;
    return spare > kMax ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(spare);
  }
  const uint64_t short_by = needed - usable;
  return short_by > kMax ? std::numeric_limits<int64_t>::min()
                         : -static_cast<int64_t>(short_by);
}

std::string FormatGiB(uint64_t bytes) {
  return fmt::format("{} GiB", report_internal::GiBNumber(bytes));
}

}  // namespace vramscope
