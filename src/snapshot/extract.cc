// Document -> Snapshot: checks the structure PyTorch writes (docs/snapshot.md)
// and keeps what the analyses need in compact typed form.
//
// Keys follow THCPModule_memorySnapshot (torch/csrc/cuda/Module.cpp) and
// torch::cuda::_memory_snapshot_pickled (torch/csrc/cuda/memory_snapshot.cpp)
// of torch 2.0-2.11: older files lack "address" on blocks (computed here from
// the segment address, as PyTorch does when writing it), "frames" on
// segments and blocks (blocks then carry "history"), "time_us", and the
// "allocator_settings" / "external_annotations" keys. Unknown keys are
// ignored so newer files still read.
#include <fmt/format.h>

#include <array>
#include <unordered_map>

#include "entry_decoder.h"
#include "frame_table.h"
#include "readers.h"
#include "vramscope/alloc_config.h"
#include "vramscope/common/checked.h"
#include "vramscope/common/quote.h"

namespace vramscope {
namespace snapshot {
namespace {

// A path into the document, built on the call stack and turned into text
// only for an error message: "device_traces[0][12].size".
struct Path {
  const Path* parent = nullptr;
  std::string_view key;
  uint64_t index = 0;
  bool is_index = false;

  Path Key(std::string_view k) const { return Path{this, k, 0, false}; }
  Path Index(uint64_t i) const { return Path{this, {}, i, true}; }
  std::string Text() const {
    std::string text = parent ? parent->Text() : std::string();
    if (is_index) {
      text += fmt::format("[{}]", index);
    } else if (!key.empty()) {
      if (!text.empty()) text += '.';
      text += key;
    }
    return text;
  }
};

class Extractor {
 public:
  Extractor(Document& doc, std::string_view name, bool shared, Snapshot* out)
      : doc_(doc), name_(name), out_(out), frames_(doc, &out->frames, &out->stacks, shared) {}

  Status Run();

 private:
  Error Fail(const Path& path, const std::string& problem) const {
    const std::string where = path.Text();
    return MakeError(
        fmt::format("{}: {}: {}", name_, where.empty() ? "top level" : where, problem));
  }
  Error WrongKind(const Path& path, std::string_view expected, Value got) const {
    return Fail(path, fmt::format("expected {}, got {}", expected, KindName(got.kind())));
  }
  // A dict the reader decoded as a trace entry (it has "action" and valid
  // entry fields) where PyTorch puts something else: its other keys are
  // gone, so it is refused rather than read as an empty dict.
  bool IsEntry(Value v) const {
    return v.kind() == Kind::kEntry || (v.kind() == Kind::kDict && doc_.IsForwarded(v));
  }
  Error EntryWhere(const Path& path, std::string_view expected) const {
    return Fail(
        path, fmt::format("a trace entry (a dict with \"action\") where {} is expected", expected));
  }

  Result<uint64_t> Size(Value v, const Path& path) const;
  Result<uint64_t> Address(Value v, const Path& path) const;
  Result<uint16_t> Stream(Value v, const Path& path);
  Result<uint32_t> Stack(Value v, const Path& path);
  Result<std::string_view> Str(Value v, const Path& path) const {
    if (v.kind() != Kind::kStr) return WrongKind(path, "a str", v);
    return doc_.AsString(v);
  }

  Status Segments(Value list, const Path& path);
  Status Segment(Value dict, const Path& path);
  Status Blocks(Value list, const Path& segment_path, SnapshotSegment* seg);
  Status Block(Value dict, uint64_t computed_address, const Path& path, SnapshotBlock* block);
  Status Traces(Value list, const Path& path);
  Status Entry(Value dict, const Path& path, TraceEntry* entry);
  Status Record(uint64_t record, const Path& path, TraceEntry* entry);
  Status Settings(Value dict, const Path& path);

  Document& doc_;
  std::string_view name_;
  Snapshot* out_;
  FrameTable frames_;
  EntryDecoder decoder_;
};

Result<uint64_t> Extractor::Size(Value v, const Path& path) const {
  int64_t signed_value = 0;
  if (doc_.ToInt64(v, &signed_value)) {
    if (signed_value < 0) return Fail(path, fmt::format("{} is negative", signed_value));
    if (static_cast<uint64_t>(signed_value) > kMaxSizeBytes) {
      return Fail(path, fmt::format("{} bytes is above 2^62", signed_value));
    }
    return static_cast<uint64_t>(signed_value);
  }
  if (v.kind() == Kind::kInt || v.kind() == Kind::kBigInt) {
    return Fail(path, "the number is out of range (above 2^62 bytes)");
  }
  return WrongKind(path, "an int", v);
}

// Addresses and stream handles are pointers PyTorch writes as int64 or as
// Python ints of a size_t: either fits 64 bits.
Result<uint64_t> Extractor::Address(Value v, const Path& path) const {
  uint64_t u = 0;
  if (doc_.ToUint64(v, &u)) return u;
  int64_t s = 0;
  if (doc_.ToInt64(v, &s)) return static_cast<uint64_t>(s);
  if (v.kind() == Kind::kInt || v.kind() == Kind::kBigInt) {
    return Fail(path, "the number does not fit 64 bits");
  }
  return WrongKind(path, "an int", v);
}

// Stream handles are interned in the document, which the readers' decoded
// trace entries already used.
Result<uint16_t> Extractor::Stream(Value v, const Path& path) {
  VS_TRY(raw, Address(v, path));
  uint16_t index = 0;
  if (!doc_.InternStream(raw, &index)) return Fail(path, "more than 65535 distinct streams");
  return index;
}

Result<uint32_t> Extractor::Stack(Value v, const Path& path) {
  if (v.kind() == Kind::kNone) return uint32_t{0};
  if (v.kind() != Kind::kList && v.kind() != Kind::kTuple) return WrongKind(path, "a list", v);
  Result<uint32_t> stack = frames_.Intern(v);
  if (!stack.ok()) return Fail(path, stack.error().message);
  return stack;
}

Status Extractor::Run() {
  const Value root = doc_.root();
  const Path top;
  if (root.kind() == Kind::kList) {
    // torch.cuda.memory_snapshot() returns only the segments.
    out_->segments_only = true;
    return Segments(root, top);
  }
  if (IsEntry(root)) return EntryWhere(top, "the snapshot dict");
  if (root.kind() != Kind::kDict) {
    return WrongKind(top, "a dict with \"segments\" and \"device_traces\" (or a list of segments)",
                     root);
  }
  Value v;
  if (doc_.Find(root, "segments", &v)) {
    if (Status s = Segments(v, top.Key("segments")); !s.ok()) return s;
  }
  if (doc_.Find(root, "device_traces", &v)) {
    if (Status s = Traces(v, top.Key("device_traces")); !s.ok()) return s;
  }
  if (doc_.Find(root, "allocator_settings", &v)) {
    if (Status s = Settings(v, top.Key("allocator_settings")); !s.ok()) return s;
  }
  if (doc_.Find(root, "external_annotations", &v)) {
    if (v.kind() != Kind::kList) return WrongKind(top.Key("external_annotations"), "a list", v);
    out_->external_annotations = doc_.Size(v);
  }
  if (!doc_.Find(root, "segments", &v) && !doc_.Find(root, "device_traces", &v)) {
    return Fail(top, "neither \"segments\" nor \"device_traces\": not a memory snapshot");
  }
  return Ok{};
}

// A record the reader decoded: its frames interned now (nothing can add to
// them any more), the stack written back into the store.
Status Extractor::Record(uint64_t record, const Path& path, TraceEntry* entry) {
  TraceStore& store = *doc_.entry_store();
  *entry = store.Get(record);
  if (entry->action == TraceAction::kOther) {
    ++out_->unknown_actions;
    return Ok{};
  }
  const Value frames = doc_.EntryFrames(record);
  if (!frames.is_container()) return Ok{};
  VS_TRY(stack, Stack(frames, path.Key("frames")));
  if (entry->stack != stack) {
    entry->stack = stack;
    store.Set(record, *entry);
  }
  return Ok{};
}

Status Extractor::Segments(Value list, const Path& path) {
  if (list.kind() != Kind::kList) return WrongKind(path, "a list", list);
  out_->segments.reserve(doc_.Size(list));
  uint64_t i = 0;
  Status status = Ok{};
  doc_.ForEachWord(list, [&](Value seg) {
    if (status.ok()) status = Segment(seg, path.Index(i));
    ++i;
  });
  if (!status.ok()) return status;
  return CheckSegmentLayout(out_->segments, name_);
}

Status Extractor::Segment(Value dict, const Path& path) {
  if (IsEntry(dict)) return EntryWhere(path, "a segment");
  if (dict.kind() != Kind::kDict) return WrongKind(path, "a dict", dict);
  SnapshotSegment seg;
  Value v;
  if (!doc_.Find(dict, "address", &v)) return Fail(path, "no \"address\"");
  VS_TRY(address, Address(v, path.Key("address")));
  seg.address = address;
  if (!doc_.Find(dict, "total_size", &v)) return Fail(path, "no \"total_size\"");
  VS_TRY(total, Size(v, path.Key("total_size")));
  seg.total_bytes = total;
  if (!common::CheckedAdd(seg.address, seg.total_bytes)) {
    return Fail(path, fmt::format("address 0x{:x} + total_size {} runs past 2^64", seg.address,
                                  seg.total_bytes));
  }
  if (doc_.Find(dict, "device", &v)) {
    int64_t device = 0;
    if (!doc_.ToInt64(v, &device) || device < 0 || device > 1 << 20) {
      return Fail(path.Key("device"), "expected a device ordinal");
    }
    seg.device = static_cast<int32_t>(device);
  }
  if (doc_.Find(dict, "stream", &v)) {
    VS_TRY(stream, Stream(v, path.Key("stream")));
    seg.stream = stream;
  }
  if (doc_.Find(dict, "segment_type", &v)) {
    VS_TRY(type, Str(v, path.Key("segment_type")));
    if (type != "small" && type != "large") {
      return Fail(path.Key("segment_type"), fmt::format("{} is neither \"small\" nor \"large\"",
                                                        common::QuoteForMessage(type)));
    }
    seg.small_pool = type == "small";
  }
  if (doc_.Find(dict, "is_expandable", &v)) {
    if (v.kind() != Kind::kBool) return WrongKind(path.Key("is_expandable"), "a bool", v);
    seg.expandable = doc_.AsBool(v);
  }
  if (doc_.Find(dict, "frames", &v)) {
    VS_TRY(stack, Stack(v, path.Key("frames")));
    seg.stack = stack;
  }
  if (!doc_.Find(dict, "blocks", &v)) return Fail(path, "no \"blocks\"");
  if (Status s = Blocks(v, path, &seg); !s.ok()) return s;
  out_->segments.push_back(std::move(seg));
  return Ok{};
}

// A segment's blocks tile it, as the allocator's block chain does
// (Block::prev/next are address neighbours): in address order, none before
// the previous one's end or past the segment's, sizes summing to total_size
// (checked sums: sizes of 2^62 each would wrap to a plausible total).
Status Extractor::Blocks(Value list, const Path& segment_path, SnapshotSegment* seg) {
  const Path path = segment_path.Key("blocks");
  if (list.kind() != Kind::kList) return WrongKind(path, "a list", list);
  seg->blocks.reserve(doc_.Size(list));
  const uint64_t segment_end = seg->address + seg->total_bytes;  // checked by the caller
  uint64_t i = 0;
  uint64_t next_address = seg->address;
  uint64_t sum = 0;  // <= total_bytes: the blocks do not overlap and lie inside
  Status status = Ok{};
  doc_.ForEachWord(list, [&](Value b) {
    if (!status.ok()) return;
    SnapshotBlock block;
    const Path at = path.Index(i++);
    status = Block(b, next_address, at, &block);
    if (!status.ok()) return;
    const auto end = common::CheckedAdd(block.address, block.size_bytes);
    if (block.address < next_address || !end || *end > segment_end) {
      status =
          Fail(at, fmt::format("block at 0x{:x} of {} bytes does not follow the previous "
                               "block inside its segment (0x{:x}, {} bytes)",
                               block.address, block.size_bytes, seg->address, seg->total_bytes));
      return;
    }
    next_address = *end;
    sum += block.size_bytes;
    seg->blocks.push_back(block);
  });
  if (!status.ok()) return status;
  if (sum != seg->total_bytes) {
    return Fail(segment_path, fmt::format("block sizes sum to {} bytes but total_size is {}", sum,
                                          seg->total_bytes));
  }
  return Ok{};
}

Status Extractor::Block(Value dict, uint64_t computed_address, const Path& path,
                        SnapshotBlock* block) {
  if (IsEntry(dict)) return EntryWhere(path, "a block");
  if (dict.kind() != Kind::kDict) return WrongKind(path, "a dict", dict);
  Value v;
  if (!doc_.Find(dict, "size", &v)) return Fail(path, "no \"size\"");
  VS_TRY(size, Size(v, path.Key("size")));
  block->size_bytes = size;
  block->address = computed_address;
  if (doc_.Find(dict, "address", &v)) {
    VS_TRY(address, Address(v, path.Key("address")));
    block->address = address;
  }
  if (!doc_.Find(dict, "state", &v)) return Fail(path, "no \"state\"");
  VS_TRY(state, Str(v, path.Key("state")));
  if (state == "active_allocated") {
    block->state = BlockState::kActiveAllocated;
  } else if (state == "active_pending_free" || state == "active_awaiting_free") {
    block->state = BlockState::kActivePendingFree;
  } else if (state == "inactive") {
    block->state = BlockState::kInactive;
  } else {
    return Fail(path.Key("state"),
                fmt::format("unknown block state {}", common::QuoteForMessage(state)));
  }
  block->requested_bytes = block->state == BlockState::kInactive ? 0 : block->size_bytes;
  if (doc_.Find(dict, "requested_size", &v)) {
    VS_TRY(requested, Size(v, path.Key("requested_size")));
    block->requested_bytes = requested;
  }
  if (doc_.Find(dict, "frames", &v)) {
    VS_TRY(stack, Stack(v, path.Key("frames")));
    block->stack = stack;
  } else if (doc_.Find(dict, "history", &v) && v.kind() == Kind::kList && doc_.Size(v) > 0) {
    // torch <= 2.0: the newest history entry describes the live allocation.
    Value last;
    doc_.ForEachWord(v, [&](Value h) { last = h; });
    const Path hist = path.Key("history");
    if (IsEntry(last)) return EntryWhere(hist, "a history entry");
    if (last.kind() != Kind::kDict) return WrongKind(hist, "a dict", last);
    if (doc_.Find(last, "real_size", &v) && block->state != BlockState::kInactive) {
      VS_TRY(real, Size(v, hist.Key("real_size")));
      block->requested_bytes = real;
    }
    if (doc_.Find(last, "frames", &v)) {
      VS_TRY(stack, Stack(v, hist.Key("frames")));
      block->stack = stack;
    }
  }
  return Ok{};
}

// Each device's trace: a range of decoded records (the common case, shared
// with the document's store, no copy), else entry by entry.
Status Extractor::Traces(Value list, const Path& path) {
  if (list.kind() != Kind::kList) return WrongKind(path, "a list (one per device)", list);
  uint64_t device = 0;
  Status status = Ok{};
  doc_.ForEachWord(list, [&](Value trace) {
    if (!status.ok()) return;
    const Path device_path = path.Index(device++);
    if (trace.kind() != Kind::kList) {
      status = WrongKind(device_path, "a list of trace entries", trace);
      return;
    }
    uint64_t begin = 0, count = 0;
    if (doc_.EntryRange(trace, &begin, &count)) {
      TraceEntry entry;
      for (uint64_t i = 0; i < count && status.ok(); ++i) {
        status = Record(begin + i, device_path.Index(i), &entry);
      }
      out_->device_traces.emplace_back(doc_.entry_store(), begin, count);
      return;
    }
    Trace& entries = out_->device_traces.emplace_back();
    uint64_t i = 0;
    doc_.ForEachWord(trace, [&](Value e) {
      if (!status.ok()) return;
      TraceEntry entry;
      uint64_t record = 0;
      if (e.kind() == Kind::kEntry) {
        status = Record(e.payload(), device_path.Index(i), &entry);
      } else if (e.kind() == Kind::kDict && doc_.ForwardedEntry(e, &record)) {
        status = Record(record, device_path.Index(i), &entry);
      } else {
        status = Entry(e, device_path.Index(i), &entry);
      }
      ++i;
      if (status.ok()) entries.push_back(entry);
    });
  });
  return status;
}

// An entry the reader left a dict (every entry when compact_trace_entries
// is off, else only one with a bad field): decoded with errors that name
// the field. EntryDecoder::TryDecode accepts exactly what this accepts.
Status Extractor::Entry(Value dict, const Path& path, TraceEntry* entry) {
  if (dict.kind() != Kind::kDict) return WrongKind(path, "a dict", dict);
  EntryFields f;
  decoder_.Scan(doc_, dict, &f);
  const Value action = f.action, addr = f.addr, size = f.size, stream = f.stream, frames = f.frames;
  const bool has_action = f.has_action, has_addr = f.has_addr, has_size = f.has_size,
             has_stream = f.has_stream, has_frames = f.has_frames;
  if (!has_action) return Fail(path, "no \"action\"");
  if (action.kind() != Kind::kStr) return WrongKind(path.Key("action"), "a str", action);
  TraceAction known_action;
  if (!decoder_.Action(doc_, action, &known_action)) {
    // A newer release's action ("annotate", "user_defined", ...): kept as
    // kOther so indices stay those of the file, ignored by the analyses.
    entry->action = TraceAction::kOther;
    ++out_->unknown_actions;
    return Ok{};
  }
  entry->action = known_action;
  if (!has_size) return Fail(path, "no \"size\"");
  if (size.kind() == Kind::kInt && size.inline_int() >= 0) {
    entry->size_bytes = static_cast<uint64_t>(size.inline_int());  // < 2^59: in range
  } else {
    VS_TRY(size_bytes, Size(size, path.Key("size")));
    entry->size_bytes = size_bytes;
  }
  if (entry->action != TraceAction::kSnapshot) {
    if (!has_addr) {
      return Fail(path, entry->action == TraceAction::kOom ? "no \"device_free\"" : "no \"addr\"");
    }
    if (addr.kind() == Kind::kInt && addr.inline_int() >= 0) {
      entry->addr = static_cast<uint64_t>(addr.inline_int());
    } else {
      VS_TRY(address,
             Address(addr, path.Key(entry->action == TraceAction::kOom ? "device_free" : "addr")));
      entry->addr = address;
    }
  }
  if (has_stream) {
    VS_TRY(stream_index, Stream(stream, path.Key("stream")));
    entry->stream = stream_index;
  }
  if (has_frames) {
    VS_TRY(stack, Stack(frames, path.Key("frames")));
    entry->stack = stack;
  }
  return Ok{};
}

// allocator_settings (Module.cpp, torch >= 2.5): the effective values.
Status Extractor::Settings(Value dict, const Path& path) {
  if (IsEntry(dict)) return EntryWhere(path, "the allocator settings");
  if (dict.kind() != Kind::kDict) return WrongKind(path, "a dict", dict);
  SnapshotSettings settings;
  Value v;
  if (doc_.Find(dict, "PYTORCH_CUDA_ALLOC_CONF", &v) && v.kind() == Kind::kStr) {
    settings.conf_text = std::string(doc_.AsString(v).substr(0, 4096));
    // The text carries what the fields do not (max_non_split_rounding_mb,
    // per_process_memory_fraction); the fields below win where both exist.
    if (auto parsed = ParseAllocConf(settings.conf_text); parsed.ok()) settings.config = *parsed;
  }
  AllocatorConfig& c = settings.config;
  if (doc_.Find(dict, "expandable_segments", &v) && v.kind() == Kind::kBool) {
    c.expandable_segments = doc_.AsBool(v);
  }
  if (doc_.Find(dict, "max_split_size", &v)) {
    int64_t max_split = 0;
    uint64_t max_split_u = 0;
    // SIZE_MAX (no limit) arrives as -1 (int64 cast) or as 2^64-1.
    if (doc_.ToInt64(v, &max_split) && max_split > 0) {
      c.max_split_size_bytes = static_cast<uint64_t>(max_split);
    } else if (doc_.ToUint64(v, &max_split_u) && max_split_u > 0) {
      c.max_split_size_bytes = max_split_u;
    } else {
      c.max_split_size_bytes = kUnlimited;
    }
  }
  if (doc_.Find(dict, "garbage_collection_threshold", &v) && v.kind() == Kind::kFloat) {
    const double t = doc_.AsFloat(v);
    if (t > 0.0 && t < 1.0) c.garbage_collection_threshold = t;
  }
  if (doc_.Find(dict, "roundup_power2_divisions", &v) && v.kind() == Kind::kDict) {
    // Keys "1", "2", "4", ... (MiB, one per power-of-two interval) in order.
    bool is_key = true;
    int index = -1;
    doc_.ForEachWord(v, [&](Value w) {
      if (is_key) {
        index = -1;
        if (w.kind() == Kind::kStr) {
          uint64_t mib = 0;
          for (char ch : doc_.AsString(w)) {
            const bool digit = ch >= '0' && ch <= '9';
            mib = digit && mib < (1u << 20) ? mib * 10 + static_cast<uint64_t>(ch - '0') : 0;
            if (!digit) break;
          }
          for (int bit = 0; bit < 16; ++bit) {
            if (mib == (uint64_t{1} << bit)) index = bit;
          }
        }
      } else if (index >= 0) {
        int64_t divisions = 0;
        if (doc_.ToInt64(w, &divisions) && divisions >= 0 && divisions <= (1 << 20)) {
          c.roundup_power2_divisions[static_cast<size_t>(index)] = static_cast<uint32_t>(divisions);
        }
      }
      is_key = !is_key;
    });
  }
  c.text = settings.conf_text;
  if (!ValidateAllocConfig(c).ok()) {
    // Values our model cannot take (a fork's allocator, say): fall back to
    // the defaults rather than fail the whole snapshot.
    AllocatorConfig fallback;
    fallback.expandable_segments = c.expandable_segments;
    fallback.text = c.text;
    c = fallback;
  }
  out_->settings = std::move(settings);
  return Ok{};
}

}  // namespace

Result<Snapshot> ExtractSnapshot(Document& doc, std::string_view name, std::string format,
                                 bool shared_containers) {
  Snapshot snapshot;
  snapshot.format = std::move(format);
  Extractor extractor(doc, name, shared_containers, &snapshot);
  if (Status s = extractor.Run(); !s.ok()) return s.error();
  snapshot.streams = doc.TakeStreams();
  return snapshot;
}

}  // namespace snapshot

std::string_view TraceActionName(TraceAction action) {
  switch (action) {
    case TraceAction::kAlloc: return "alloc";
    case TraceAction::kFreeRequested: return "free_requested";
    case TraceAction::kFreeCompleted: return "free_completed";
    case TraceAction::kSegmentAlloc: return "segment_alloc";
    case TraceAction::kSegmentFree: return "segment_free";
    case TraceAction::kSegmentMap: return "segment_map";
    case TraceAction::kSegmentUnmap: return "segment_unmap";
    case TraceAction::kSnapshot: return "snapshot";
    case TraceAction::kOom: return "oom";
    case TraceAction::kOther: return "other";
  }
  return "other";
}

}  // namespace vramscope
