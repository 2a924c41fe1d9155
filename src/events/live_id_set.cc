#include "live_id_set.h"

#include "vramscope/event_stream.h"

namespace vramscope::events_internal {
namespace {

constexpr size_t kInitialSlots = 64;

}  // namespace

size_t LiveIdSet::HomeSlot(uint64_t id) const {
  return static_cast<size_t>(MixAllocationId(id)) & (slots_.size() - 1);
}

bool LiveIdSet::Contains(uint64_t id) const {
  if (id == kEmptySlot) return has_empty_slot_id_;
  if (slots_.empty()) return false;
  const size_t mask = slots_.size() - 1;
  for (size_t i = HomeSlot(id);; i = (i + 1) & mask) {
    if (slots_[i] == id) return true;
    if (slots_[i] == kEmptySlot) return false;
  }
}

bool LiveIdSet::Insert(uint64_t id) {
  if (id == kEmptySlot) {
    if (has_empty_slot_id_) return false;
    has_empty_slot_id_ = true;
    ++size_;
    return true;
  }
  // Keep at least half the slots empty so that every probe ends quickly.
  if (2 * (size_ + 1) > slots_.size()) Grow();
  const size_t mask = slots_.size() - 1;
  for (size_t i = HomeSlot(id);; i = (i + 1) & mask) {
    if (slots_[i] == id) return false;
    if (slots_[i] == kEmptySlot) {
      slots_[i] = id;
      ++size_;
      return true;
    }
  }
}

bool LiveIdSet::Erase(uint64_t id) {
  if (id == kEmptySlot) {
    if (!has_empty_slot_id_) return false;
    has_empty_slot_id_ = false;
    --size_;
    return true;
  }
  if (slots_.empty()) return false;
  const size_t mask = slots_.size() - 1;
  size_t hole = HomeSlot(id);
  while (slots_[hole] != id) {
    if (slots_[hole] == kEmptySlot) return false;
    hole = (hole + 1) & mask;
  }
  // Backward shift: move later members of the probe run into the hole when
  // their home slot does not lie cyclically in (hole, j]; otherwise a later
  // lookup would stop at the hole before reaching them.
  for (size_t j = (hole + 1) & mask; slots_[j] != kEmptySlot; j = (j + 1) & mask) {
    const size_t home = HomeSlot(slots_[j]);
    const bool stays = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
    if (stays) continue;
    slots_[hole] = slots_[j];
    hole = j;
  }
  slots_[hole] = kEmptySlot;
  --size_;
  return true;
}

void LiveIdSet::Grow() {
  std::vector<uint64_t> old = std::move(slots_);
  slots_.assign(old.empty() ? kInitialSlots : old.size() * 2, kEmptySlot);
  const size_t mask = slots_.size() - 1;
  for (uint64_t id : old) {
    if (id == kEmptySlot) continue;
    size_t i = HomeSlot(id);
    while (slots_[i] != kEmptySlot) i = (i + 1) & mask;
    slots_[i] = id;
  }
}

}  // namespace vramscope::events_internal
