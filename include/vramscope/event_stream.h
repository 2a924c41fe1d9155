// The event stream: the one intermediate form of vramscope.
//
// An ordered list of memory events of one or more training steps on one GPU
// rank. Model lowering writes it, traces recorded from real PyTorch programs
// and measured snapshots become it, the allocator simulator replays it.
// The on-disk format is documented in docs/event-stream.md (event_io.h).
//
// Ownership: an EventStream owns its events and its interned strings (op names,
// module paths). Not thread-safe for concurrent mutation; const access is safe.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "vramscope/category.h"
#include "vramscope/result.h"

namespace vramscope {

// A bijective 64-bit mixer for allocation ids (the splitmix64 finalizer),
// shared by the id tables of src/events and src/sim: ids are often sequential
// or strided, and mixing spreads them over a power-of-two table.
inline uint64_t MixAllocationId(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// Phase of a training step. kSetup is everything before the first forward
// (model load, optimizer construction).
enum class Phase : uint8_t { kSetup = 0, kForward, kBackward, kOptimizer };
inline constexpr int kNumPhases = 4;
std::string_view PhaseName(Phase p);  // "setup", "forward", "backward", "optimizer"
bool ParsePhase(std::string_view text, Phase* out);

enum class EventKind : uint8_t {
  kAlloc = 0,     // id, size_bytes, category, op, module, stream
  kFree,          // id
  kPhase,         // step, phase: everything after belongs to this step and phase
  kEmptyCache,    // torch.cuda.empty_cache(): cached, fully free segments go back
  kRecordStream,  // id, stream: Tensor.record_stream(stream) on the live allocation
  kUsesDone,      // id: the other streams' work on the freed allocation id is done
};

// 40 bytes. Strings are indices into EventStream::strings(); index 0 is "".
struct Event {
  EventKind kind = EventKind::kAlloc;
  Category category = Category::kOther;
  Phase phase = Phase::kSetup;  // kPhase only
  uint8_t reserved_ = 0;
  uint32_t stream = 0;      // kAlloc: CUDA stream index, 0 = default stream
  uint32_t op = 0;          // kAlloc: producing op (string index)
  uint32_t module = 0;      // kAlloc: module path (string index)
  uint32_t step = 0;        // kPhase: step number (1-based by convention)
  uint64_t id = 0;          // kAlloc / kFree: allocation id, unique while live
  uint64_t size_bytes = 0;  // kAlloc: requested bytes (before any rounding)

  friend bool operator==(const Event&, const Event&) = default;
};

// Whether events hold kRecordStream / kUsesDone, which need version 2 of the
// file format (docs/event-stream.md).
bool UsesStreamRecords(const std::vector<Event>& events);

// Largest requested size accepted anywhere (2^62 bytes): sums of many such
// values still fit in uint64_t without overflow checks on every add.
inline constexpr uint64_t kMaxSizeBytes = uint64_t{1} << 62;

class EventStream {
 public:
  EventStream();

  // Builders. They do not validate lifetimes (see Validate()). Alloc interns
  // `op` and `module`; AllocInterned takes indices into strings(), which must
  // exist (checked by Validate(), not here).
  void Alloc(uint64_t id, uint64_t size_bytes, Category category, std::string_view op = {},
             std::string_view module = {}, uint32_t stream = 0);
  void AllocInterned(uint64_t id, uint64_t size_bytes, Category category, uint32_t op,
                     uint32_t module, uint32_t stream = 0);
  void Free(uint64_t id);
  void BeginPhase(uint32_t step, Phase phase);
  void EmptyCache();
  // torch: Tensor.record_stream: the live allocation `id` is also used by
  // work queued on `stream`, so its free waits for that work.
  void RecordStream(uint64_t id, uint32_t stream);
  // The work queued on the other streams before allocation `id` was freed
  // has completed (a CUDA event query or synchronize says so); `id` was
  // freed after a RecordStream. Its memory is reusable from the next
  // allocation on.
  void UsesDone(uint64_t id);

  // Interns a string and returns its index (stable for the stream's life).
  // The empty string is always index 0.
  uint32_t Intern(std::string_view text);
  // Appends a string as the next index even if equal text exists (the reader
  // keeps a file's string indices unchanged); Intern of that text afterwards
  // returns the first index holding it.
  uint32_t AppendString(std::string_view text);
  std::string_view String(uint32_t index) const { return strings_[index]; }
  const std::vector<std::string>& strings() const { return strings_; }

  const std::vector<Event>& events() const { return events_; }
  std::vector<Event>& mutable_events() { return events_; }
  size_t size() const { return events_.size(); }
  void Reserve(size_t n) { events_.reserve(n); }

  // Free-form metadata written in the file header ("source", "model", ...).
  std::map<std::string, std::string>& metadata() { return metadata_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Checks what the builders do not: sizes within kMaxSizeBytes, string
  // indices defined, ids unique while live, frees of live ids only, stream
  // uses of live ids only, kUsesDone of ids freed after a use. The Error
  // names the event ("event 12 (alloc id 5): ..."). Streams read by
  // ParseEventText always pass. Memory: proportional to live allocations.
  Status Validate() const;

 private:
  std::vector<Event> events_;
  std::vector<std::string> strings_;
  // Transparent hash and equality, so that Intern looks a string_view up
  // without building a std::string (most op names and module paths are
  // longer than the small-string buffer, so that would be a heap allocation
  // per call).
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view text) const noexcept {
      return std::hash<std::string_view>{}(text);
    }
  };
  std::unordered_map<std::string, uint32_t, StringHash, std::equal_to<>> string_index_;
  // Intern's recent answers by the caller's character pointer. Lowering
  // interns the same few literals (op names) tens of thousands of times per
  // stream; a hit costs one comparison with the stored text instead of
  // hashing it. The comparison makes a stale pointer harmless.
  struct RecentString {
    const char* data = nullptr;
    size_t size = 0;
    uint32_t index = 0;
  };
  std::array<RecentString, 64> recent_{};
  std::map<std::string, std::string> metadata_;
};

}  // namespace vramscope
