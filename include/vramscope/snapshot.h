// Measured memory: PyTorch memory snapshots read, explained, replayed and
// compared with a prediction (docs/snapshot.md).
//
// A snapshot is what torch.cuda.memory._dump_snapshot() writes: a pickle
// (protocol 4 or 5 from Python, protocol 2 from the C++ API) of a dict with
// "segments" (the allocator's state when the snapshot was taken),
// "device_traces" (the allocator's recent actions per device, oldest first)
// and, in newer releases, "allocator_settings" and "external_annotations".
// The same structure as JSON is accepted too.
//
// Reading never executes anything from the file and holds memory bounded by
// the trace, not the file: a file is memory-mapped and dropped behind the
// reader, each trace entry becomes a 16-byte record as its dict completes,
// and a run peaks at about 28 bytes per trace entry + 40 MB through explain
// (docs/snapshot.md, "Memory"). Any malformed or hostile input becomes an
// Error naming the byte offset or the field. Everything here is pure and
// deterministic; nothing prints.
#pragma once

#include <array>
#include <cstdint>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "vramscope/alloc_config.h"
#include "vramscope/category.h"
#include "vramscope/event_stream.h"
#include "vramscope/gpu.h"
#include "vramscope/report.h"
#include "vramscope/result.h"
#include "vramscope/simulate.h"

namespace vramscope {

// ---------------------------------------------------------------------------
// Reading
// ---------------------------------------------------------------------------

// Limits of the reader; exceeding one is an Error naming it.
struct SnapshotReadLimits {
  uint64_t max_file_bytes = uint64_t{16} << 30;  // 16 GiB
  // Nesting of lists, dicts and tuples (a snapshot needs 6).
  uint32_t max_depth = 64;
  // Items in one list or tuple, or twice the pairs of one dict.
  uint64_t max_container_items = (uint64_t{1} << 31) - 1;
  uint64_t max_string_bytes = uint64_t{1} << 30;
  uint64_t max_memo_entries = uint64_t{1} << 28;
  uint64_t max_stack_items = uint64_t{1} << 28;
  // Bytes the reader's tables may hold; 0 = 8 x the input + 64 MiB (a real
  // snapshot needs about 2x; hostile input that would expand further,
  // such as a file of empty lists, stops with an Error instead).
  uint64_t max_memory_bytes = 0;
  // Not a limit: false reads every trace entry through the general value
  // table (about 5x the memory) instead of decoding it as its dict
  // completes. The result is the same; tests compare the two.
  bool compact_trace_entries = true;
};

// What one trace entry records ("action" in the file).
enum class TraceAction : uint8_t {
  kAlloc,          // a block was handed out; size = requested bytes
  kFreeRequested,  // the tensor died; allocated_bytes drops now
  kFreeCompleted,  // the block is reusable (after record_stream events)
  kSegmentAlloc,   // cudaMalloc of a segment; size = segment bytes
  kSegmentFree,    // cudaFree (empty_cache, OOM retry, GC)
  kSegmentMap,     // expandable segments: pages mapped
  kSegmentUnmap,   // expandable segments: pages unmapped
  kSnapshot,       // a snapshot was taken; size = active bytes
  kOom,            // an allocation failed; addr = free device bytes
  kOther,          // an action this version does not know (kept, ignored)
};
std::string_view TraceActionName(TraceAction action);

// One trace entry, as the analyses see it (a Trace stores it packed).
struct TraceEntry {
  uint64_t addr = 0;        // block / segment address; kOom: "device_free"
  uint64_t size_bytes = 0;  // see TraceAction
  uint32_t stack = 0;       // index into Snapshot::stacks (0 = no frames)
  uint16_t stream = 0;      // index into Snapshot::streams
  TraceAction action = TraceAction::kOther;
};

// Storage of trace entries: 16 bytes each in 1 MiB pages that never move.
// Packed: the address in 48 bits with the stream index, the size in 36 bits
// (64 GiB) with the stack index (24 bits) and the action. An entry whose
// values do not fit (an address above 2^48, a size of 64 GiB or more, more
// than 2^24 stacks) is kept whole in a side table, 24 bytes more; real
// traces have next to none. The snapshot reader writes one store for every
// device and hands out views of it (Trace); not thread-safe for mutation.
class TraceStore {
 public:
  static constexpr int kPageBits = 16;  // 64 Ki entries, 1 MiB per page
  uint64_t size() const { return size_; }
  TraceEntry Get(uint64_t i) const {
    const Packed& p = pages_[i >> kPageBits][i & kPageMask];
    if ((p.hi >> 60) == kEscape) return overflow_[p.lo];
    TraceEntry e;
    e.addr = p.lo & kAddrMask;
    e.stream = static_cast<uint16_t>(p.lo >> 48);
    e.size_bytes = p.hi & kSizeMask;
    e.stack = static_cast<uint32_t>((p.hi >> 36) & kStackMask);
    e.action = static_cast<TraceAction>(p.hi >> 60);
    return e;
  }
  void Set(uint64_t i, const TraceEntry& e);
  void Append(const TraceEntry& e);
  uint64_t MemoryBytes() const {
    return pages_.size() * (kPageMask + 1) * sizeof(Packed) +
           overflow_.capacity() * sizeof(TraceEntry);
  }

 private:
  struct Packed {
    uint64_t lo;  // addr (48 bits) | stream << 48; escaped: index into overflow_
    uint64_t hi;  // size (36 bits) | stack << 36 (24 bits) | action << 60
  };
  static constexpr uint64_t kPageMask = (uint64_t{1} << kPageBits) - 1;
  static constexpr uint64_t kAddrMask = (uint64_t{1} << 48) - 1;
  static constexpr uint64_t kSizeMask = (uint64_t{1} << 36) - 1;
  static constexpr uint64_t kStackMask = (uint64_t{1} << 24) - 1;
  static constexpr uint64_t kEscape = 15;  // no TraceAction has this value
  struct FreePage {
    void operator()(Packed* p) const { delete[] p; }
  };
  Packed Pack(const TraceEntry& e);
  std::vector<std::unique_ptr<Packed[], FreePage>> pages_;
  std::vector<TraceEntry> overflow_;
  uint64_t size_ = 0;
};

// One device's trace, oldest first: a view of entries [begin, begin + size)
// of a TraceStore. Copies share the store; push_back on a view that does not
// own the end of its store copies the view first (copy on write).
class Trace {
 public:
  Trace() = default;
  Trace(std::shared_ptr<TraceStore> store, uint64_t begin, uint64_t size)
      : store_(std::move(store)), begin_(begin), size_(size) {}

  size_t size() const { return static_cast<size_t>(size_); }
  bool empty() const { return size_ == 0; }
  TraceEntry operator[](size_t i) const { return store_->Get(begin_ + i); }
  void push_back(const TraceEntry& e);
  // Bytes of the store this view shares (all of it, not only the view).
  uint64_t StoreBytes() const { return store_ ? store_->MemoryBytes() : 0; }

  class const_iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = TraceEntry;
    using difference_type = std::ptrdiff_t;
    using pointer = void;
    using reference = TraceEntry;
    const_iterator(const TraceStore* store, uint64_t i) : store_(store), i_(i) {}
    TraceEntry operator*() const { return store_->Get(i_); }
    const_iterator& operator++() {
      ++i_;
      return *this;
    }
    bool operator==(const const_iterator& o) const { return i_ == o.i_; }
    bool operator!=(const const_iterator& o) const { return i_ != o.i_; }

   private:
    const TraceStore* store_;
    uint64_t i_;
  };
  const_iterator begin() const { return const_iterator(store_.get(), begin_); }
  const_iterator end() const { return const_iterator(store_.get(), begin_ + size_); }

 private:
  std::shared_ptr<TraceStore> store_;
  uint64_t begin_ = 0;
  uint64_t size_ = 0;
};

struct SnapshotFrame {
  std::string name;      // function ("forward", "at::native::mm(...)")
  std::string filename;  // "…/modeling_llama.py", "??" for unknown C++
  int64_t line = 0;
};

enum class BlockState : uint8_t { kActiveAllocated, kActivePendingFree, kInactive };

struct SnapshotBlock {
  uint64_t address = 0;
  uint64_t size_bytes = 0;       // as counted in allocated_bytes
  uint64_t requested_bytes = 0;  // stale or 0 for inactive blocks
  uint32_t stack = 0;            // where it was allocated (0 = unknown)
  BlockState state = BlockState::kInactive;
};

struct SnapshotSegment {
  int32_t device = 0;
  uint64_t address = 0;
  uint64_t total_bytes = 0;
  uint16_t stream = 0;  // index into Snapshot::streams
  bool small_pool = false;
  bool expandable = false;
  uint32_t stack = 0;
  std::vector<SnapshotBlock> blocks;  // address order; sizes sum to total_bytes
};

// "allocator_settings" (torch >= 2.5).
struct SnapshotSettings {
  std::string conf_text;   // "PYTORCH_CUDA_ALLOC_CONF" as last set ("" if none)
  AllocatorConfig config;  // built from the recorded fields
};

struct Snapshot {
  std::string format;                         // "pickle protocol 4", "json", ...
  std::vector<SnapshotSegment> segments;      // every device
  std::vector<Trace> device_traces;           // index = device ordinal
  std::vector<uint64_t> streams;              // stream ids; [0] = 0
  std::vector<SnapshotFrame> frames;          // distinct frames
  std::vector<std::vector<uint32_t>> stacks;  // [0] = {}; innermost first
  std::optional<SnapshotSettings> settings;
  uint64_t external_annotations = 0;
  uint64_t unknown_actions = 0;  // entries with an action this reader skips
  bool segments_only = false;    // the file held a bare list of segments
};

// Parses snapshot bytes (pickle or JSON, told apart by the first byte).
// `name` prefixes every error: "NAME: offset 1234: opcode GLOBAL ...",
// "NAME: device_traces[0][7].size: expected an int, got str".
Result<Snapshot> ParseSnapshot(std::string_view bytes, std::string_view name,
                               const SnapshotReadLimits& limits = {});

// Reads a file (memory-mapped, so the bytes are not copied, and dropped
// behind the reader). Only a regular file is opened: a directory, FIFO,
// socket or device is an Error before anything is read. Errors name the
// path: missing, not a regular file, over max_file_bytes, or ParseSnapshot's.
Result<Snapshot> ReadSnapshotFile(const std::string& path, const SnapshotReadLimits& limits = {});

// ---------------------------------------------------------------------------
// Explaining: the measured timeline of one device
// ---------------------------------------------------------------------------

struct ExplainOptions {
  int device = -1;  // -1: the device with the most trace entries
  // The caller named the GPU (explain --gpu). When not, the catalog entry
  // only lends its CUDA context, and a run without an OOM (which records the
  // device's memory) gets no fit verdict: Report::has_device_limit false.
  bool gpu_named = true;
  size_t max_timeline_points = 2000;
  size_t top_allocations = 20;
  size_t top_sites = 10;
};

// Live bytes at the peak grouped by allocation site (innermost Python frame).
struct SiteBytes {
  std::string site;                      // "modeling_llama.py:312 forward"
  Category category = Category::kOther;  // of the largest block there
  uint64_t bytes = 0;
  uint64_t blocks = 0;
};

struct SnapshotRun {
  int device = 0;
  // The measured numbers in the simulator's shape: peaks, breakdown at the
  // peak, phases, timeline (downsampled, peaks kept), largest live blocks at
  // the peak, the first OOM. Event indices are trace entry indices.
  SimResult sim;
  uint64_t trace_entries = 0;
  uint64_t allocations = 0;  // allocs in the trace + blocks alive before it
  // Blocks alive before the first trace entry (ring buffer wrapped, or
  // recording started late), from frees without an alloc and final segments.
  uint64_t initially_live_blocks = 0;
  uint64_t initially_live_bytes = 0;
  uint64_t initial_reserved_bytes = 0;
  // Reserved minus allocated: its largest value and where.
  uint64_t max_fragmentation_bytes = 0;
  uint64_t max_fragmentation_entry = 0;
  // State at the end of the trace vs the final segments (a check).
  uint64_t end_allocated_bytes = 0;
  uint64_t end_reserved_bytes = 0;
  uint64_t segments_allocated_bytes = 0;
  uint64_t segments_reserved_bytes = 0;
  bool has_frames = false;  // stacks were recorded (context="alloc"/"all")
  std::vector<SiteBytes> top_sites;
  // At the first OOM: what was alive (largest first) and per category.
  std::vector<LiveAllocation> live_at_oom;
  CategoryBytes breakdown_at_oom{};
  std::vector<std::string> notes;
};

// Rebuilds the allocation timeline of one device from its trace and the
// final segments, attributes every block to a category (docs/snapshot.md,
// "Attribution") and measures it. Allocated counts block sizes: the exact
// size for blocks still in the final segments, PyTorch's round_size of the
// requested size otherwise. Errors: no such device, no data for it.
Result<SnapshotRun> MeasureSnapshot(const Snapshot& snapshot, const ExplainOptions& options = {});

// Plain-words lines: the peak and what was alive, the largest sites,
// fragmentation, a wrapped trace, and for an OOM what was requested, what
// was alive and why it failed.
std::vector<std::string> ExplainMeasured(const SnapshotRun& run);

// The device a run is judged against. A snapshot that ran out of memory
// records how much its device had: what the allocator held plus what was free
// when the allocation failed (the oom trace entry's device_free); `catalog`
// then keeps only its name and CUDA context, and its usable memory becomes
// that amount plus the context. Otherwise `catalog` as it is.
GpuSpec SnapshotDevice(const SnapshotRun& run, const GpuSpec& catalog);

// The standard report of a measured run (command "explain"): the measured
// numbers as the worst (only) rank, the device total with `gpu`'s CUDA
// context added (a snapshot does not record it), ExplainMeasured's lines and
// notes on what was measured and how. Judged against SnapshotDevice: an OOM
// snapshot's own device, else `gpu` when `gpu_named`, else nothing (no
// verdict: Report::has_device_limit false).
Report MeasuredReport(const SnapshotRun& run, const Snapshot& snapshot, const GpuSpec& gpu,
                      const std::string& source, bool gpu_named = true);

// ---------------------------------------------------------------------------
// Replaying: the measured allocation stream through the allocator model
// ---------------------------------------------------------------------------

// The settings the snapshot was taken with: "allocator_settings" when
// recorded, else inferred (expandable segments from the segments) on
// PyTorch's defaults.
AllocatorConfig SnapshotAllocatorConfig(const Snapshot& snapshot);

// The device's measured allocation stream as an event stream: blocks alive
// before the trace first, then every alloc (requested size, category, site,
// stream) and free (when the block became reusable: free_completed) in trace
// order, phase marks, and an empty_cache for each run of segment frees.
Result<EventStream> SnapshotToEventStream(const Snapshot& snapshot, int device = -1);

// ---------------------------------------------------------------------------
// Comparing measured with predicted
// ---------------------------------------------------------------------------

struct CompareRow {
  std::string name;  // category JSON key, phase name, or "peak_allocated" ...
  uint64_t measured_bytes = 0;
  uint64_t predicted_bytes = 0;
};

struct Comparison {
  std::string snapshot;  // source names
  std::string model;
  std::vector<std::pair<std::string, std::string>> knobs;
  std::string gpu;
  std::vector<CompareRow> totals;      // peak_allocated, peak_reserved, device_total
  std::vector<CompareRow> categories;  // breakdown at each side's peak, 9 rows
  std::vector<CompareRow> phases;      // largest allocated per phase kind
  std::vector<CompareRow> phases_reserved;
  std::vector<std::string> notes;
};

// Side by side: the worst rank of each report. Phases are grouped by kind
// (setup, forward, backward, optimizer), each the largest over its steps.
Comparison CompareReports(const Report& measured, const Report& predicted);
std::string RenderComparisonText(const Comparison& c);
std::string RenderComparisonJson(const Comparison& c, int indent = 2);

// ---------------------------------------------------------------------------
// The commands: explain, replay and compare, one call each
// ---------------------------------------------------------------------------
//
// What `vramscope explain`, `replay` and `compare` compute, from a snapshot
// file to a typed result, and the JSON each prints. The CLI only parses
// flags, calls these and prints; every number and line of the output comes
// from here. Every error names the snapshot file. Nothing here prints.

// A measured run as explain shows it: one device of a snapshot file,
// measured and turned into the standard report. The snapshot itself is
// dropped once measured; what the output still needs is copied here.
struct MeasuredSnapshot {
  SnapshotRun run;
  // The standard report (command "explain"): MeasuredReport.
  Report report;
  std::string format;  // Snapshot::format: "pickle protocol 4", "json", ...
  // The recorded PYTORCH_CUDA_ALLOC_CONF: nullopt when the snapshot has no
  // "allocator_settings" (older releases), "" when none was set.
  std::optional<std::string> alloc_conf;
};

// Reads the snapshot at `path` and measures one device (`options.device`;
// -1: the one with the most trace entries) into its report, judged against
// the catalog entry `gpu` (SnapshotDevice: an OOM snapshot's own device).
// On success the run and its report. On failure: ReadSnapshotFile's Error
// as it is (missing, not a regular file, malformed); MeasureSnapshot's
// ("no such device", an empty snapshot) prefixed with "PATH: ".
Result<MeasuredSnapshot> ExplainSnapshotFile(const std::string& path, const GpuSpec& gpu,
                                             const ExplainOptions& options = {});

// explain --json: RenderJson(measured.report) with one more key at the end,
// "snapshot", what only a measured run has (docs/json-schema.md,
// "snapshot"): format, trace and allocation counts, the blocks alive before
// the trace, fragmentation, the check against the final segments, the top
// sites and, after an OOM, the breakdown and the blocks alive then.
std::string RenderExplainJson(const MeasuredSnapshot& measured);

struct ReplayOptions {
  int device = -1;              // -1: the device with the most trace entries
  size_t top_allocations = 20;  // largest allocations alive at the peak to list
  // The catalog entry of the GPU: its usable memory minus its CUDA context is
  // the device limit of the replay, unless the snapshot ran out of memory
  // (then its own: reserved + free at the OOM).
  GpuSpec gpu;
  // PYTORCH_CUDA_ALLOC_CONF to replay with as well, as given; nullopt:
  // replay with the snapshot's own settings only.
  std::optional<std::string> alloc_conf;
};

// A replay: the measured allocation stream fed to the allocator model, with
// the snapshot's own settings (the baseline: how well the model reproduces
// the run) and with `ReplayOptions::alloc_conf` (what those would reserve).
struct SnapshotReplay {
  // The standard report (command "replay") of the replay with the settings
  // asked for (the baseline when none were): the replayed run as the only
  // rank, the measured and baseline peaks in plain words, the device limit.
  Report report;
  uint64_t measured_peak_allocated_bytes = 0;
  uint64_t measured_peak_reserved_bytes = 0;
  std::string baseline_alloc_conf;  // the snapshot's own settings ("" = PyTorch's defaults)
  uint64_t baseline_peak_allocated_bytes = 0;
  uint64_t baseline_peak_reserved_bytes = 0;
  std::string alloc_conf;  // the settings of `report`: asked for, else the baseline's
  uint64_t predicted_peak_allocated_bytes = 0;
  uint64_t predicted_peak_reserved_bytes = 0;
  uint64_t device_limit_bytes = 0;
  uint64_t events = 0;  // events of the replayed stream
};

// Parses `options.alloc_conf` (if any), reads the snapshot at `path`,
// measures the device, and replays its stream (SnapshotToEventStream)
// through the allocator model with the snapshot's settings and, if given,
// `options.alloc_conf`. A simulated OOM is part of the result, not an
// error. Errors: ParseAllocConf's as it is (nothing read); ReadSnapshotFile's
// as it is; measuring, converting or simulating failures prefixed with
// "PATH: ".
Result<SnapshotReplay> ReplaySnapshotFile(const std::string& path, const ReplayOptions& options);

// replay --json: RenderJson(replay.report) with one more key at the end,
// "replay", the peaks measured, replayed with the snapshot's settings and
// with the settings asked for (docs/json-schema.md).
std::string RenderReplayJson(const SnapshotReplay& replay);

// compare: a measured run next to a prediction (an estimate's report, made
// by the caller: the estimator is a stage above this one). CompareReports of
// the two, with a note when the snapshot has no stacks (every measured
// block is then "other"). Always succeeds.
Comparison CompareMeasured(const MeasuredSnapshot& measured, const Report& predicted);

}  // namespace vramscope
