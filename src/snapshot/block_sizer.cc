#include "block_sizer.h"

#include "vramscope/allocator.h"

namespace vramscope::snapshot {

namespace {
constexpr uint64_t kSmallSizeBytes = kMiB;  // torch kSmallSize
}  // namespace

BlockSizer::BlockSizer(const Reconstruction& r)
    : r_(r),
      config_(r.rounding),
      infer_(!r.expandable),
      segments_(r.initial_segments.begin(), r.initial_segments.end()) {
  for (const AllocRecord& rec : r.records) {
    if (!rec.initial()) continue;
    const uint64_t size = rec.exact() ? rec.block_bytes : RoundSize(r.Requested(rec), config_);
    if (IsLarge(size)) large_in_use_.insert(r.Address(rec));
  }
}

bool BlockSizer::IsLarge(uint64_t rounded_bytes) const { return rounded_bytes > kSmallSizeBytes; }

uint64_t BlockSizer::OnAlloc(const AllocRecord& rec) {
  const uint64_t requested = r_.Requested(rec);
  const uint64_t address = r_.Address(rec);
  if (requested == 0) return 0;  // allocate(0) hands out no block
  const uint64_t rounded = RoundSize(requested, config_);
  uint64_t size = rec.exact() ? rec.block_bytes : rounded;
  if (!IsLarge(rounded)) return size;
  if (!rec.exact() && infer_) {
    auto seg = segments_.upper_bound(address);
    if (seg != segments_.begin()) {
      --seg;
      uint64_t end = seg->second;
      if (address < end) {
        auto next = large_in_use_.upper_bound(address);
        if (next != large_in_use_.end() && *next < end) end = *next;
        const uint64_t span = end - address;
        if (span >= rounded) {
          const uint64_t remaining = span - rounded;
          const bool oversize = rounded >= config_.max_split_size_bytes;
          // Oversize: never split, and get_free_block only hands out a block
          // less than max_non_split_rounding larger than the request.
          if ((oversize && remaining < config_.max_non_split_rounding_bytes) ||
              (!oversize && remaining <= kSmallSizeBytes)) {
            size = span;
          }
        }
      }
    }
  }
  large_in_use_.insert(address);
  return size;
}

void BlockSizer::OnRelease(const AllocRecord& rec) { large_in_use_.erase(r_.Address(rec)); }

void BlockSizer::OnSegmentAlloc(uint64_t address, uint64_t size_bytes) {
  segments_[address] = address + size_bytes;
}

void BlockSizer::OnSegmentFree(uint64_t address) { segments_.erase(address); }

}  // namespace vramscope::snapshot
