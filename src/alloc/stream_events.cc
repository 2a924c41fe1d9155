// Blocks used on more than one CUDA stream (Tensor.record_stream), following
// DeviceCachingAllocator in c10/cuda/CUDACachingAllocator.cpp of torch
// 2.4-2.11: recordStream, insert_events, process_events and
// synchronize_and_free_events.
//
// A block belongs to the stream it was allocated on. When work on another
// stream also reads or writes it, freeing it on the CPU must not let the
// allocation stream reuse the memory before that work is done: free() records
// a CUDA event on every other stream that used the block and keeps the block
// out of its pool until all of them have completed. The model has no clock,
// so the event stream says when the GPU has finished (CompleteFreeEvents).
#include <algorithm>

#include "allocator_impl.h"

namespace vramscope {

using alloc::Block;
using alloc::kNil;

// torch: recordStream ignores uses on the block's own stream (the stream
// order already protects them) and keeps each other stream once.
void CachingAllocator::Impl::RecordStream(uint32_t b, uint32_t stream) {
  const Block& block = blocks[b];
  if (block.zero_size || config.ideal || pools[block.pool].stream == stream) return;
  std::vector<uint32_t>& uses = stream_uses[b];
  if (std::find(uses.begin(), uses.end(), stream) == uses.end()) uses.push_back(stream);
}

// torch: insert_events: one event per stream that used the block, each
// counted in event_count; stream_uses is cleared. The block is now pending.
FreeTicket CachingAllocator::Impl::InsertEvents(uint32_t b) {
  auto uses = stream_uses.extract(b);
  VS_CHECK(!uses.empty() && !uses.mapped().empty());
  const FreeTicket ticket = next_ticket++;
  std::vector<alloc::TicketEvent>& recorded = tickets[ticket];
  for (uint32_t stream : uses.mapped()) {
    alloc::StreamEvents& events = events_by_stream[stream];
    const uint64_t seq = ++events.recorded;
    events.queue.push_back({seq, b, ticket});
    recorded.push_back({stream, seq});
    ++blocks[b].event_count;
  }
  return ticket;
}

void CachingAllocator::Impl::CompleteFreeEvents(FreeTicket ticket) {
  auto it = tickets.find(ticket);
  if (it == tickets.end()) return;
  for (const alloc::TicketEvent& e : it->second) {
    alloc::StreamEvents& events = events_by_stream[e.stream];
    events.completed = std::max(events.completed, e.seq);
  }
  tickets.erase(it);
  events_to_process = true;
}

void CachingAllocator::Impl::FinishEvent(uint32_t b, FreeTicket ticket) {
  Block& block = blocks[b];
  VS_CHECK(block.event_count > 0 && !block.allocated);
  if (--block.event_count != 0) return;
  FreeBlock(b);
  // Completed through a later ticket of the same streams: this one is moot.
  tickets.erase(ticket);
}

// torch: process_events: per stream, in recording order, every event that
// has completed is popped; the first incomplete one stops that stream.
void CachingAllocator::Impl::ProcessEvents() {
  events_to_process = false;
  for (auto& [stream, events] : events_by_stream) {
    while (!events.queue.empty() && events.queue.front().seq <= events.completed) {
      const alloc::PendingEvent e = events.queue.front();
      events.queue.pop_front();
      FinishEvent(e.block, e.ticket);
    }
  }
}

// torch: synchronize_and_free_events (empty_cache and the OOM path's
// release_cached_blocks): wait for every event, then process them all.
void CachingAllocator::Impl::SynchronizeAndFreeEvents() {
  for (auto& [stream, events] : events_by_stream) events.completed = events.recorded;
  tickets.clear();
  ProcessEvents();
}

}  // namespace vramscope
