// WriteEventText: the documented text format (docs/event-stream.md).
//
// Strings are renumbered in order of first use and each `s` record is written
// just before the first event that uses it, so a file can be streamed and
// read top to bottom. Equal texts share one index; an empty text is index 0.
// Writing what ParseEventText returns and reading it back gives the same
// events, strings and metadata when the file's strings were already in
// first-use order with no duplicates (the writer's own output always is).
#include <charconv>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "event_text.h"
#include "vramscope/event_io.h"

namespace vramscope {
namespace {

using events_internal::SanitizeText;
using events_internal::SanitizeToken;

// Free text is cut so that its whole record stays far below the reader's
// default 65 536-byte line limit ("s 4294967295 " is 13 bytes).
constexpr size_t kMaxTextBytes = 60000;
constexpr size_t kMaxKeyBytes = 1024;

class Writer {
 public:
  explicit Writer(const EventStream& stream)
      : stream_(stream), file_index_(stream.strings().size(), kUnassigned) {
    file_index_[0] = 0;
  }

  std::string Write() {
    // About 30 bytes per event; one reservation avoids regrowth on large streams.
    out_.reserve(64 + stream_.size() * 30);
    // Version 1 readers know every record but `u` and `x`: files without
    // them stay version 1.
    out_ += UsesStreamRecords(stream_.events()) ? "vramscope-events 2\n" : "vramscope-events 1\n";
    // Keys that differ only past the cut (or in what sanitizing replaces)
    // would be written twice, and a reader keeps the last: write each
    // written key once, with the value a reader would keep.
    std::map<std::string, std::string> written;
    for (const auto& [key, value] : stream_.metadata()) {
      written[SanitizeToken(key, kMaxKeyBytes)] = SanitizeText(value, kMaxTextBytes);
    }
    for (const auto& [key, text] : written) {
      out_ += "meta ";
      out_ += key;
      if (!text.empty()) {
        out_ += ' ';
        out_ += text;
      }
      out_ += '\n';
    }
    for (const Event& e : stream_.events()) WriteEvent(e);
    return std::move(out_);
  }

 private:
  static constexpr uint32_t kUnassigned = ~uint32_t{0};

  void WriteEvent(const Event& e) {
    switch (e.kind) {
      case EventKind::kAlloc: {
        // Both `s` records must precede the alloc line that uses them.
        const uint32_t op = FileIndex(e.op);
        const uint32_t module = FileIndex(e.module);
        out_ += "a ";
        AppendNumber(e.id);
        out_ += ' ';
        AppendNumber(e.size_bytes);
        out_ += ' ';
        out_ += CategoryToken(e.category);
        // Optional fields are written up to the last non-zero one.
        if (op != 0 || module != 0 || e.stream != 0) {
          out_ += ' ';
          AppendNumber(op);
        }
        if (module != 0 || e.stream != 0) {
          out_ += ' ';
          AppendNumber(module);
        }
        if (e.stream != 0) {
          out_ += ' ';
          AppendNumber(e.stream);
        }
        out_ += '\n';
        return;
      }
      case EventKind::kFree:
        out_ += "f ";
        AppendNumber(e.id);
        out_ += '\n';
        return;
      case EventKind::kPhase:
        out_ += "p ";
        AppendNumber(e.step);
        out_ += ' ';
        out_ += PhaseName(e.phase);
        out_ += '\n';
        return;
      case EventKind::kEmptyCache: out_ += "e\n"; return;
      case EventKind::kRecordStream:
        out_ += "u ";
        AppendNumber(e.id);
        out_ += ' ';
        AppendNumber(e.stream);
        out_ += '\n';
        return;
      case EventKind::kUsesDone:
        out_ += "x ";
        AppendNumber(e.id);
        out_ += '\n';
        return;
    }
  }

  // The file index of stream string `index`, writing its `s` record on first use.
  uint32_t FileIndex(uint32_t index) {
    VS_CHECK(index < file_index_.size());  // AllocInterned with an undefined string
    if (file_index_[index] != kUnassigned) return file_index_[index];
    std::string text = SanitizeText(stream_.String(index), kMaxTextBytes);
    uint32_t assigned = 0;
    if (!text.empty()) {
      const auto [it, inserted] = by_text_.emplace(std::move(text), next_file_index_);
      assigned = it->second;
      if (inserted) {
        out_ += "s ";
        AppendNumber(assigned);
        out_ += ' ';
        out_ += it->first;
        out_ += '\n';
        ++next_file_index_;
      }
    }
    file_index_[index] = assigned;
    return assigned;
  }

  void AppendNumber(uint64_t value) {
    char buffer[24];
    const auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
    out_.append(buffer, result.ptr);
  }

  const EventStream& stream_;
  std::vector<uint32_t> file_index_;                   // stream string index -> file index
  std::unordered_map<std::string, uint32_t> by_text_;  // sanitized text -> file index
  uint32_t next_file_index_ = 1;
  std::string out_;
};

}  // namespace

std::string WriteEventText(const EventStream& stream) { return Writer(stream).Write(); }

}  // namespace vramscope
