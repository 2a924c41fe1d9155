// A virtual address space for simulated segments (internal).
//
// cudaMalloc and cuMemAddressReserve hand out device virtual addresses; the
// model needs addresses only to order blocks (best fit breaks ties by
// address, as BlockComparatorSize does) and to show snapshots. Freed ranges
// are reused, so addresses stay bounded by what is live, not by how many
// segments were ever created, and byte counts up to 2^62 cannot overflow.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>

namespace vramscope::alloc {

class AddressSpace {
 public:
  // Addresses are handed out in [base, end) in multiples of granule_bytes;
  // base and end must be multiples of granule_bytes.
  AddressSpace(uint64_t base, uint64_t end, uint64_t granule_bytes);

  // Best fit: the smallest free range that holds size_bytes (rounded up to
  // the granule), lowest address first; carves from its front. nullopt when
  // no free range is large enough.
  std::optional<uint64_t> Reserve(uint64_t size_bytes);
  // Returns a range obtained from Reserve (same size_bytes).
  void Release(uint64_t address, uint64_t size_bytes);

  uint64_t granule_bytes() const { return granule_bytes_; }

 private:
  uint64_t Granules(uint64_t size_bytes) const;
  void Insert(uint64_t address, uint64_t size_bytes);

  uint64_t granule_bytes_;
  std::map<uint64_t, uint64_t> free_by_address_;          // start -> size
  std::set<std::pair<uint64_t, uint64_t>> free_by_size_;  // (size, start)
};

}  // namespace vramscope::alloc
