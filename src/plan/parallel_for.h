// ParallelFor: runs independent work items on a few threads (private to
// src/plan).
//
// Why: a sweep is hundreds of independent estimates (lower + simulate), each
// a few milliseconds of single-threaded work, and the library shares nothing
// mutable between estimates (DESIGN.md: no global state). Spreading them
// over the machine's cores divides a sweep's wall time; results do not
// depend on the number of threads or on scheduling, because each item writes
// only its own output slot.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

namespace vramscope::plan_internal {

// Threads for `items` work items: one per hardware thread, at most one per
// item, at least one.
inline size_t WorkerCount(size_t items) {
  const size_t hardware = std::max<size_t>(1, std::thread::hardware_concurrency());
  return std::max<size_t>(1, std::min(hardware, items));
}

// Calls body(i) for every i in [0, count), on WorkerCount(count) threads
// (the calling thread is one of them). Items are handed out in increasing
// order. body returns false to stop: items not yet handed out are skipped,
// while those already running finish, so every item below the lowest item
// that returned false has run. An exception thrown by body stops the work
// the same way and is rethrown here once all threads have finished.
template <typename Body>
void ParallelFor(size_t count, const Body& body) {
  std::atomic<size_t> next{0};
  std::atomic<bool> stop{false};
  std::exception_ptr failure;
  std::mutex failure_mutex;
  auto work = [&] {
    while (!stop.load(std::memory_order_relaxed)) {
      const size_t i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= count) return;
      try {
        if (!body(i)) stop = true;
      } catch (...) {
        const std::lock_guard<std::mutex> lock(failure_mutex);
        if (!failure) failure = std::current_exception();
        stop = true;
      }
    }
  };
  std::vector<std::thread> helpers;
  const size_t workers = WorkerCount(count);
  helpers.reserve(workers - 1);
  for (size_t t = 1; t < workers; ++t) {
    // No more threads to be had: the ones running (at least this one) do
    // all the work.
    try {
      helpers.emplace_back(work);
    } catch (const std::system_error&) {
      break;
    }
  }
  work();
  for (std::thread& helper : helpers) helper.join();
  if (failure) std::rethrow_exception(failure);
}

}  // namespace vramscope::plan_internal
