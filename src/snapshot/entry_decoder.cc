#include "entry_decoder.h"

#include <utility>

#include "vramscope/event_stream.h"

namespace vramscope::snapshot {

bool ParseAction(std::string_view s, TraceAction* out) {
  static constexpr std::pair<std::string_view, TraceAction> kActions[] = {
      {"alloc", TraceAction::kAlloc},
      {"free_requested", TraceAction::kFreeRequested},
      {"free_completed", TraceAction::kFreeCompleted},
      {"segment_alloc", TraceAction::kSegmentAlloc},
      {"segment_free", TraceAction::kSegmentFree},
      {"segment_map", TraceAction::kSegmentMap},
      {"segment_unmap", TraceAction::kSegmentUnmap},
      {"snapshot", TraceAction::kSnapshot},
      {"oom", TraceAction::kOom},
  };
  for (const auto& [text, action] : kActions) {
    if (s == text) {
      *out = action;
      return true;
    }
  }
  return false;
}

EntryKey EntryDecoder::Classify(std::string_view key) {
  if (key == "action") return EntryKey::kAction;
  if (key == "addr" || key == "device_free") return EntryKey::kAddr;
  if (key == "size") return EntryKey::kSize;
  if (key == "stream") return EntryKey::kStream;
  if (key == "frames") return EntryKey::kFrames;
  return EntryKey::kOther;
}

void EntryDecoder::Set(EntryKey key, Value v, EntryFields* f) {
  switch (key) {
    case EntryKey::kAction: f->action = v, f->has_action = true; break;
    case EntryKey::kAddr: f->addr = v, f->has_addr = true; break;
    case EntryKey::kSize: f->size = v, f->has_size = true; break;
    case EntryKey::kStream: f->stream = v, f->has_stream = true; break;
    case EntryKey::kFrames: f->frames = v, f->has_frames = true; break;
    case EntryKey::kOther: break;
  }
}

bool EntryDecoder::Scan(const Document& doc, const uint64_t* pairs, uint64_t n, EntryFields* f) {
  for (uint64_t i = 0; i + 1 < n; i += 2) {
    const Value key = Value::FromBits(pairs[i]);
    if (key.kind() != Kind::kStr) return false;
    Set(KeyOf(doc, key), Value::FromBits(pairs[i + 1]), f);
  }
  return true;
}

void EntryDecoder::Scan(const Document& doc, Value dict, EntryFields* f) {
  bool is_key = true;
  EntryKey key = EntryKey::kOther;
  doc.ForEachWord(dict, [&](Value w) {
    if (is_key) {
      key = w.kind() == Kind::kStr ? KeyOf(doc, w) : EntryKey::kOther;
    } else {
      Set(key, w, f);
    }
    is_key = !is_key;
  });
}

bool EntryDecoder::Action(const Document& doc, Value action, TraceAction* out) {
  ActionSlot& slot = actions_[(action.bits() >> 4) & (kCacheSize - 1)];
  if (slot.bits != action.bits()) {
    slot.bits = action.bits();
    slot.known = ParseAction(doc.AsString(action), &slot.action);
  }
  *out = slot.action;
  return slot.known;
}

namespace {

// Extractor::Size: an int in [0, 2^62].
bool SizeOf(const Document& doc, Value v, uint64_t* out) {
  if (v.kind() == Kind::kInt && v.inline_int() >= 0) {
    *out = static_cast<uint64_t>(v.inline_int());
    return *out <= kMaxSizeBytes;
  }
  int64_t s = 0;
  if (!doc.ToInt64(v, &s) || s < 0 || static_cast<uint64_t>(s) > kMaxSizeBytes) return false;
  *out = static_cast<uint64_t>(s);
  return true;
}

// Extractor::Address: any int that fits 64 bits, signed or not.
bool AddressOf(const Document& doc, Value v, uint64_t* out) {
  if (v.kind() == Kind::kInt && v.inline_int() >= 0) {
    *out = static_cast<uint64_t>(v.inline_int());
    return true;
  }
  if (doc.ToUint64(v, out)) return true;
  int64_t s = 0;
  if (!doc.ToInt64(v, &s)) return false;
  *out = static_cast<uint64_t>(s);
  return true;
}

}  // namespace

bool EntryDecoder::TryDecode(Document& doc, const EntryFields& f, TraceEntry* entry) {
  *entry = TraceEntry{};
  if (!f.has_action || f.action.kind() != Kind::kStr) return false;
  TraceAction action;
  if (!Action(doc, f.action, &action)) {
    // A newer release's action: kept (indices stay the file's), ignored.
    entry->action = TraceAction::kOther;
    return true;
  }
  entry->action = action;
  if (!f.has_size || !SizeOf(doc, f.size, &entry->size_bytes)) return false;
  if (action != TraceAction::kSnapshot) {
    if (!f.has_addr || !AddressOf(doc, f.addr, &entry->addr)) return false;
  }
  if (f.has_stream) {
    uint64_t raw = 0;
    if (!AddressOf(doc, f.stream, &raw) || !doc.InternStream(raw, &entry->stream)) return false;
  }
  if (f.has_frames) {
    const Kind k = f.frames.kind();
    if (k != Kind::kNone && k != Kind::kList && k != Kind::kTuple) return false;
    // Frames are stored as container index + 1 in 32 bits.
    if (k != Kind::kNone && f.frames.payload() >= 0xffffffffu) return false;
  }
  return true;
}

}  // namespace vramscope::snapshot
