// CheckSegmentLayout: the final segments describe one address space per
// device. CUDACachingAllocator never hands out overlapping device memory, so
// overlapping segments, or reserved bytes past 2^64, mean a corrupt or forged
// file: explaining it would print numbers that no run could have had.
#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "readers.h"
#include "vramscope/common/checked.h"

namespace vramscope::snapshot {

Status CheckSegmentLayout(const std::vector<SnapshotSegment>& segments, std::string_view name) {
  // Indices sorted by (device, address): overlaps are then neighbours.
  std::vector<size_t> order(segments.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const SnapshotSegment& x = segments[a];
    const SnapshotSegment& y = segments[b];
    return x.device != y.device ? x.device < y.device : x.address < y.address;
  });
  uint64_t reserved_bytes = 0;
  for (size_t k = 0; k < order.size(); ++k) {
    const SnapshotSegment& seg = segments[order[k]];
    const bool same_device = k > 0 && segments[order[k - 1]].device == seg.device;
    if (!same_device) reserved_bytes = 0;
    const auto sum = common::CheckedAdd(reserved_bytes, seg.total_bytes);
    if (!sum) {
      return MakeError(fmt::format(
          "{}: segments[{}]: the segments of device {} reserve more than 2^64 bytes in all", name,
          order[k], seg.device));
    }
    reserved_bytes = *sum;
    if (!same_device) continue;
    const SnapshotSegment& prev = segments[order[k - 1]];
    // The reader checked that each segment ends within 64 bits.
    if (prev.address + prev.total_bytes > seg.address) {
      return MakeError(fmt::format(
          "{}: segments[{}]: overlaps segments[{}] (addresses 0x{:x} and 0x{:x} on device {}); "
          "the allocator never hands out the same memory twice",
          name, order[k], order[k - 1], seg.address, prev.address, seg.device));
    }
  }
  return Ok{};
}

}  // namespace vramscope::snapshot
