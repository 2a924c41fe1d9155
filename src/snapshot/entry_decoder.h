// EntryDecoder: one trace entry dict -> TraceEntry, while a file is read.
//
// The readers call it for every dict they complete; a dict that decodes as
// a valid trace entry becomes a 16-byte record (Document::AddEntry) instead
// of a container, which is what keeps a multi-gigabyte snapshot's memory
// bounded (docs/snapshot.md, "Memory"). A dict that does not decode cleanly
// (not an entry, or an entry with a bad field) stays a dict, and the
// extractor reports the problem with its path ("device_traces[0][7].size:
// -5 is negative"), so every rule here must accept only what the extractor's
// Entry() accepts and decode it the same way; the tests read every file both
// ways and compare.
//
// Keys follow THCPModule_memorySnapshot (torch/csrc/cuda/Module.cpp):
// action, addr (device_free for oom), size, stream, time_us, frames; newer
// releases add compile_context, user_metadata (ignored, as time_us).
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "document.h"
#include "vramscope/snapshot.h"

namespace vramscope::snapshot {

enum class EntryKey : uint8_t { kOther, kAction, kAddr, kSize, kStream, kFrames };

// The values of the keys that matter; the last pair with a key wins.
struct EntryFields {
  Value action, addr, size, stream, frames;
  bool has_action = false, has_addr = false, has_size = false, has_stream = false,
       has_frames = false;
};

// The action names of c10/cuda/CUDACachingAllocator.cpp's TraceEntry.
bool ParseAction(std::string_view s, TraceAction* out);

class EntryDecoder {
 public:
  // Collects the fields of pairs[0, n) (key, value, ...). False when a key
  // is not a str (not an entry PyTorch writes).
  bool Scan(const Document& doc, const uint64_t* pairs, uint64_t n, EntryFields* f);
  // The same for a dict of the document.
  void Scan(const Document& doc, Value dict, EntryFields* f);

  // Whether the action is a str naming an action this reader knows (cached
  // by value: every entry references one memoized str per action).
  bool Action(const Document& doc, Value action, TraceAction* out);

  // Decodes what Scan found into *entry (stack 0; the frames are interned
  // later) when every field is valid; false otherwise, with nothing decoded
  // that matters (a stream may have been interned). The stream is interned
  // in `doc`.
  bool TryDecode(Document& doc, const EntryFields& f, TraceEntry* entry);

 private:
  static constexpr size_t kCacheSize = 64;
  struct KeySlot {
    uint64_t bits = 0;  // never a str's bits (kind 0 = None)
    EntryKey key = EntryKey::kOther;
  };
  struct ActionSlot {
    uint64_t bits = 0;
    bool known = false;
    TraceAction action = TraceAction::kOther;
  };
  EntryKey KeyOf(const Document& doc, Value key) {
    KeySlot& slot = keys_[(key.bits() >> 4) & (kCacheSize - 1)];
    if (slot.bits != key.bits()) slot = KeySlot{key.bits(), Classify(doc.AsString(key))};
    return slot.key;
  }
  static EntryKey Classify(std::string_view key);
  static void Set(EntryKey key, Value v, EntryFields* f);

  std::array<KeySlot, kCacheSize> keys_{};
  std::array<ActionSlot, kCacheSize> actions_{};
};

}  // namespace vramscope::snapshot
