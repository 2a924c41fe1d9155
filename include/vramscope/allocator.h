// A model of PyTorch's CUDACachingAllocator (native backend), torch 2.4-2.11.
//
// Knows nothing of models: it serves Malloc/Free/EmptyCache calls the way
// c10/cuda/CUDACachingAllocator.cpp does and keeps PyTorch's statistics
// (allocated, reserved, active, requested bytes and their peaks). Each rule in
// the implementation cites the PyTorch behaviour it follows.
//
// Deterministic, single-threaded; one instance models one device.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "vramscope/alloc_config.h"
#include "vramscope/result.h"

namespace vramscope {

// Handle of an allocated block; valid until passed to Free().
using BlockHandle = uint32_t;

// Names the CUDA events a Free() recorded on the other streams that used the
// block (torch: insert_events); kNoPendingFree when the block was cached at
// once. See CachingAllocator::CompleteFreeEvents.
using FreeTicket = uint64_t;
inline constexpr FreeTicket kNoPendingFree = 0;

// Reserved memory of one stream's pools (segments are never shared).
struct StreamReserved {
  uint32_t stream = 0;
  uint64_t reserved_bytes = 0;
  friend bool operator==(const StreamReserved&, const StreamReserved&) = default;
};

struct AllocatorStats {
  uint64_t allocated_bytes = 0;  // memory_allocated(): sizes of allocated blocks
  uint64_t reserved_bytes = 0;   // memory_reserved(): segments / mapped pages
  uint64_t active_bytes = 0;     // allocated + pending-free blocks (record_stream)
  uint64_t requested_bytes = 0;  // caller sizes before rounding
  uint64_t peak_allocated_bytes = 0;
  uint64_t peak_reserved_bytes = 0;
  uint64_t peak_active_bytes = 0;
  uint64_t peak_requested_bytes = 0;
  uint64_t num_segments = 0;       // live cudaMalloc segments (expandable: live ranges)
  uint64_t num_device_alloc = 0;   // cudaMalloc / cuMemMap calls
  uint64_t num_device_free = 0;    // cudaFree / cuMemUnmap calls
  uint64_t num_alloc_retries = 0;  // mallocs that freed the cache and retried
  uint64_t num_ooms = 0;
};

// What an out-of-memory looked like, with a message in PyTorch's wording.
struct OomInfo {
  uint64_t requested_bytes = 0;   // the caller's size
  uint64_t alloc_size_bytes = 0;  // what PyTorch tried to get from the device
  uint64_t device_limit_bytes = 0;
  uint64_t allocated_bytes = 0;
  uint64_t reserved_bytes = 0;
  uint64_t free_device_bytes = 0;  // limit - reserved
  std::string message;
};

// A block as PyTorch's snapshot shows it.
struct BlockView {
  uint64_t address = 0;
  uint64_t size_bytes = 0;
  uint64_t requested_bytes = 0;  // 0 for free blocks
  bool allocated = false;
  // Freed, but another stream's work on it has not completed yet (torch
  // snapshot state "active_pending_free"): neither allocated nor reusable.
  bool pending_free = false;
};
struct SegmentView {
  uint64_t address = 0;
  uint64_t total_bytes = 0;
  uint32_t stream = 0;
  bool small_pool = false;  // segment_type "small"
  bool expandable = false;
  std::vector<BlockView> blocks;  // address order; sizes sum to total_bytes
};

class CachingAllocator {
 public:
  // device_limit_bytes: memory the allocator may reserve in all (the GPU's
  // memory minus the CUDA context and other processes); kUnlimited for none.
  CachingAllocator(const AllocatorConfig& config, uint64_t device_limit_bytes);
  ~CachingAllocator();
  CachingAllocator(CachingAllocator&&) noexcept;
  CachingAllocator& operator=(CachingAllocator&&) noexcept;

  // torch: DeviceCachingAllocator::malloc. Returns nullopt when the device
  // limit (or the memory fraction) is hit after freeing the cache and
  // retrying; last_oom() says why. Requests of 1 EiB (2^60) or more fail
  // the same way without touching the statistics, as PyTorch's allocate()
  // rejects them up front. A zero-byte request returns a handle to an empty
  // block that costs nothing.
  std::optional<BlockHandle> Malloc(uint64_t size_bytes, uint32_t stream = 0);
  // torch: DeviceCachingAllocator::free. A block that was used on other
  // streams (RecordStream) stops counting as allocated but stays active and
  // out of every pool until the events recorded now on those streams
  // complete (insert_events); the ticket names them. Otherwise the block is
  // cached at once and the ticket is kNoPendingFree.
  FreeTicket Free(BlockHandle handle);
  // torch: recordStream (Tensor.record_stream): the allocated block is also
  // used by work queued on `stream`. Uses on the block's own stream, on a
  // zero-byte block or in ideal mode change nothing.
  void RecordStream(BlockHandle handle, uint32_t stream);
  // The GPU has finished the work that the events of `ticket` wait for.
  // CUDA events of one stream complete in order, so every older event on the
  // same streams is complete too. The blocks whose events are all complete
  // return to their pools at the next Malloc (torch: process_events) or
  // EmptyCache. Unknown or already completed tickets are ignored.
  void CompleteFreeEvents(FreeTicket ticket);
  // torch.cuda.empty_cache(): wait for every pending event
  // (synchronize_and_free_events), then release every fully free segment /
  // page.
  void EmptyCache();

  // Rounded size of an allocated block, as counted in allocated_bytes.
  uint64_t BlockSize(BlockHandle handle) const;
  // True while `handle` is allocated. Handles are reused after Free(), so a
  // stale handle may name a newer allocation: callers that replay untrusted
  // streams check their own ids first and use this as a guard. Free() and
  // BlockSize() require IsAllocated(handle).
  bool IsAllocated(BlockHandle handle) const;
  // Simulated device address of an allocated block (0 for zero-byte ones);
  // stable while allocated, as a tensor's data_ptr() is.
  uint64_t BlockAddress(BlockHandle handle) const;

  const AllocatorStats& stats() const;
  // reserved_bytes split by stream, ascending stream ids; streams that
  // never reserved memory are left out.
  std::vector<StreamReserved> ReservedByStream() const;
  // Resets peaks to current values (torch.cuda.reset_peak_memory_stats).
  void ResetPeaks();
  const std::optional<OomInfo>& last_oom() const;
  const AllocatorConfig& config() const;

  // Current state, like torch.cuda.memory_snapshot()["segments"].
  std::vector<SegmentView> Segments() const;

  // Checks: no overlap, every block in exactly one segment, block sizes sum to
  // the segment, allocated/reserved/active sums match the stats, free blocks
  // are in their pool and adjacent free blocks were merged. Error describes
  // the first violation. O(blocks): meant for tests.
  Status CheckInvariants() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Free functions exposing the sizing rules (tested one by one).
// torch: round_size (512-byte multiples, optional power-of-two divisions).
uint64_t RoundSize(uint64_t size_bytes, const AllocatorConfig& config);
// torch: get_allocation_size (2 MiB / 20 MiB / round up to 2 MiB).
uint64_t SegmentSizeFor(uint64_t rounded_bytes);

}  // namespace vramscope
