// std::thread without threads, for the WebAssembly build only.
//
// Why: the engine runs independent pieces of work on std::thread (one per
// rank class in src/lower/lower.cc, a sweep's grid in src/plan/parallel_for.h).
// Real threads in WebAssembly need -pthread, which needs SharedArrayBuffer,
// which a page needs cross-origin isolation for, which a page opened from
// file:// cannot have. Without -pthread, emscripten's libc answers
// pthread_create with EAGAIN, and std::thread's constructor then throws.
//
// These two definitions take the place of emscripten's stubs (weak symbols
// in its libc): pthread_create runs the thread's function at once, to the
// end, on the caller's stack, and pthread_join returns what it returned. Each
// piece of work the engine spreads over threads writes only its own result
// slot and shares nothing mutable (DESIGN.md: no global state), so running
// them one after another gives the same results as running them at once;
// the CLI's numbers and the page's are compared by tests/web_test.py.
// (libc++'s thread trampoline leaves a small per-thread record behind, which
// a real thread's exit would free: a few dozen bytes per rank class per
// estimate, in a page that lives as long as a tab.)
#include <pthread.h>

#include <cstdint>

namespace {

// Result slots of finished "threads", keyed by the pthread_t handed out.
constexpr int kMaxFinished = 4096;
void* g_results[kMaxFinished];
uintptr_t g_next_id = 1;

}  // namespace

extern "C" int pthread_create(pthread_t* thread, const pthread_attr_t* /*attr*/,
                              void* (*start)(void*), void* arg) {
  const uintptr_t id = g_next_id++;
  *thread = (pthread_t)id;  // a pointer or an integer, depending on the language
  void* result = start(arg);
  g_results[id % kMaxFinished] = result;
  return 0;
}

extern "C" int pthread_join(pthread_t thread, void** result) {
  if (result) *result = g_results[(uintptr_t)thread % kMaxFinished];
  return 0;
}
