// BlockSizer: the size PyTorch counted in allocated_bytes for each traced
// allocation, which the trace itself does not record (alloc entries carry
// the requested size).
//
// DeviceCachingAllocator::malloc (c10/cuda/CUDACachingAllocator.cpp) carves
// a block from the front of the best-fitting free block and splits off the
// rest only when it is worth keeping: in the large pool when more than
// kSmallSize (1 MiB) would remain and the request is below max_split_size
// (oversize requests are never split). Free blocks merge with free
// neighbours, so the free block an allocation at address A came from spans
// from A to the next block still in use (allocated or pending free) or the
// end of A's segment; from that span the split decision, and so the block
// size, follows. Small-pool blocks and expandable segments split whenever
// 512 bytes or more remain, so their size is always round_size(request).
#pragma once

#include <cstdint>
#include <map>
#include <set>

#include "reconstruct.h"

namespace vramscope::snapshot {

class BlockSizer {
 public:
  // Starts from the segments and the blocks alive when the trace began.
  explicit BlockSizer(const Reconstruction& r);

  // The block size of `rec`, allocated now (trace order).
  uint64_t OnAlloc(const AllocRecord& rec);
  // The block became reusable (free_completed).
  void OnRelease(const AllocRecord& rec);
  void OnSegmentAlloc(uint64_t address, uint64_t size_bytes);
  void OnSegmentFree(uint64_t address);

 private:
  bool IsLarge(uint64_t rounded_bytes) const;

  const Reconstruction& r_;
  const AllocatorConfig& config_;
  bool infer_;
  std::map<uint64_t, uint64_t> segments_;  // start -> end
  std::set<uint64_t> large_in_use_;        // starts of large-pool blocks in use
};

}  // namespace vramscope::snapshot
