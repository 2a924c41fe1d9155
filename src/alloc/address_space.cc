#include "address_space.h"

#include "sizing.h"
#include "vramscope/result.h"

namespace vramscope::alloc {

AddressSpace::AddressSpace(uint64_t base, uint64_t end, uint64_t granule_bytes)
    : granule_bytes_(granule_bytes) {
  VS_CHECK(granule_bytes > 0 && base % granule_bytes == 0 && end % granule_bytes == 0);
  VS_CHECK(base < end);
  Insert(base, end - base);
}

uint64_t AddressSpace::Granules(uint64_t size_bytes) const {
  return RoundUpSaturating(size_bytes, granule_bytes_);
}

std::optional<uint64_t> AddressSpace::Reserve(uint64_t size_bytes) {
  const uint64_t need = Granules(size_bytes == 0 ? 1 : size_bytes);
  if (need == kUnlimited) return std::nullopt;
  auto it = free_by_size_.lower_bound({need, 0});
  if (it == free_by_size_.end()) return std::nullopt;
  const auto [range_bytes, start] = *it;
  free_by_size_.erase(it);
  free_by_address_.erase(start);
  if (range_bytes > need) {
    free_by_address_.emplace(start + need, range_bytes - need);
    free_by_size_.emplace(range_bytes - need, start + need);
  }
  return start;
}

void AddressSpace::Release(uint64_t address, uint64_t size_bytes) {
  Insert(address, Granules(size_bytes == 0 ? 1 : size_bytes));
}

void AddressSpace::Insert(uint64_t address, uint64_t size_bytes) {
  uint64_t start = address;
  uint64_t bytes = size_bytes;
  // Coalesce with the free neighbours so large ranges can be reserved again.
  auto next = free_by_address_.lower_bound(address);
  VS_CHECK(next == free_by_address_.end() || next->first >= address + size_bytes);
  if (next != free_by_address_.begin()) {
    auto prev = std::prev(next);
    VS_CHECK(prev->first + prev->second <= address);
    if (prev->first + prev->second == address) {
      start = prev->first;
      bytes += prev->second;
      free_by_size_.erase({prev->second, prev->first});
      free_by_address_.erase(prev);
    }
  }
  if (next != free_by_address_.end() && next->first == address + size_bytes) {
    bytes += next->second;
    free_by_size_.erase({next->second, next->first});
    free_by_address_.erase(next);
  }
  free_by_address_.emplace(start, bytes);
  free_by_size_.emplace(bytes, start);
}

}  // namespace vramscope::alloc
