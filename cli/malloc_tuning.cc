// glibc malloc tuning for a process that runs many estimates (fit, sweep,
// plan, validate, --explain).
//
// Each estimate builds event and graph vectors of a few MB. With glibc's
// defaults, blocks that large are mmap'ed and unmapped again on free, so every
// estimate pays the kernel's page faults anew: about three quarters of an 8B
// estimate's time (measured with perf; docs/plan.md). Keeping such blocks in
// the heap (mmap threshold 32 MiB, the 64-bit maximum) and not trimming the
// heap lets later estimates reuse pages already mapped. A static initializer
// so that main() stays as it is.
#include <malloc.h>

namespace {

struct MallocTuning {
  MallocTuning() {
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 512 << 20);
  }
};

const MallocTuning kMallocTuning;

}  // namespace
