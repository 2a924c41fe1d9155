// Document: a compact, read-only tree (in fact a DAG) of plain Python values,
// what the pickle and JSON readers build and the snapshot extractor walks.
//
// Why not a DOM of heap nodes: a PyTorch snapshot of a long run is gigabytes
// of small dicts; one heap node per value would cost 10x the file. Here every
// value is one 64-bit word (a 4-bit kind plus a 60-bit payload: the integer
// itself, or an index into a side table), containers store their items as
// words in shared blocks, dicts that repeat a key sequence store only their
// values (the keys once per "shape"), and strings are copied once each into
// a pool (a pickle memoizes every str, so that is once per distinct string).
//
// Trace entries, the bulk of any snapshot, are not containers at all: a
// reader that completes a dict which decodes as a trace entry (EntryDecoder)
// stores it as a 16-byte record in a TraceStore and uses a kEntry word for
// it, and a list of consecutive entries is stored as a range of records, no
// words. The trace of a 2 GB snapshot so costs 16 bytes per entry, plus 4
// for its frames until they are interned.
//
// Storage grows in pages and blocks that never move, so reading costs one
// write per word, never a reallocation's copy.
//
// Sharing: a pickle memo reference stores the same word twice, so shared
// frame lists cost nothing extra. Cycles are rejected by the pickle reader
// (incrementally, or by CheckGraph when a container is filled after being
// stored), and JSON cannot express them, so every walk of a Document ends.
//
// Ownership: a Document owns everything it holds (it never points into the
// input). Not thread-safe for mutation; const access is safe.
#pragma once

#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "vramscope/snapshot.h"

namespace vramscope::snapshot {

enum class Kind : uint8_t {
  kNone = 0,
  kBool,
  kInt,     // fits in 60 bits signed: stored inline
  kBigInt,  // any other integer: index into big_ints
  kFloat,   // index into floats
  kStr,     // index into strings (UTF-8 as written; not validated)
  kBytes,   // index into strings
  kList,    // index into containers
  kTuple,   // index into containers
  kDict,    // index into containers; items are key, value, key, value, ...
  kEntry,   // a dict read as a trace entry: index into the entry table
};

class Value {
 public:
  Value() = default;
  static Value Make(Kind kind, uint64_t payload) {
    return Value((payload << 4) | static_cast<uint64_t>(kind));
  }
  static Value None() { return Make(Kind::kNone, 0); }
  static Value Bool(bool b) { return Make(Kind::kBool, b ? 1 : 0); }
  // Requires InlineInt(v).
  static Value Int(int64_t v) {
    return Value((static_cast<uint64_t>(v) << 4) | static_cast<uint64_t>(Kind::kInt));
  }
  static bool InlineInt(int64_t v) { return v >= -(int64_t{1} << 59) && v < (int64_t{1} << 59); }
  static Value FromBits(uint64_t bits) { return Value(bits); }

  Kind kind() const { return static_cast<Kind>(bits_ & 0xf); }
  uint64_t payload() const { return bits_ >> 4; }
  int64_t inline_int() const { return static_cast<int64_t>(bits_) >> 4; }  // arithmetic shift
  uint64_t bits() const { return bits_; }
  // kEntry is not a container: its values are decoded, nothing to walk.
  bool is_container() const {
    const Kind k = kind();
    return k == Kind::kList || k == Kind::kTuple || k == Kind::kDict;
  }
  friend bool operator==(Value a, Value b) { return a.bits_ == b.bits_; }

 private:
  explicit Value(uint64_t bits) : bits_(bits) {}
  uint64_t bits_ = 0;
};

// An integer outside the inline range: sign and magnitude, or "too large"
// for any 64-bit use (Python ints are unbounded; snapshots never need that).
struct BigInt {
  bool negative = false;
  bool overflow = false;  // |value| >= 2^64
  uint64_t magnitude = 0;
};

// Page allocation of the readers' tables. From 64 KiB up the pages are
// mapped from the kernel directly and given back when freed: malloc would
// keep freed pages of the parse resident under its own thresholds (which
// earlier allocations of the program move), and the trace analysis that
// follows the parse would come on top of them. 2 MiB and up is advised for
// transparent huge pages. Throws std::bad_alloc when the host has no memory.
void* AllocateWords(uint64_t bytes);
void FreeWords(void* p, uint64_t bytes);  // `bytes` as allocated

// Human name of a kind, for error messages ("int", "str", ...).
std::string_view KindName(Kind k);

// Append-only storage in fixed pages: growing never moves (or copies) what
// is stored, which for a multi-gigabyte snapshot is most of the reading cost
// a std::vector's doubling would add. Large pages go on transparent huge
// pages where the kernel offers them (fewer page faults).
template <typename T>
class PagedVector {
 public:
  explicit PagedVector(int page_bits = 12)
      : bits_(page_bits), mask_((uint64_t{1} << page_bits) - 1) {}
  T& operator[](uint64_t i) { return pages_[i >> bits_].get()[i & mask_]; }
  const T& operator[](uint64_t i) const { return pages_[i >> bits_].get()[i & mask_]; }
  uint64_t size() const { return size_; }
  void push_back(const T& value) {
    if ((size_ & mask_) == 0) {
      const uint64_t bytes = (mask_ + 1) * sizeof(T);
      pages_.emplace_back(static_cast<T*>(AllocateWords(bytes)), Free{bytes});
    }
    new (&(*this)[size_++]) T(value);
  }
  // Drops the last element (its page stays for the next push_back).
  void pop_back() { --size_; }
  uint64_t MemoryBytes() const { return pages_.size() * (mask_ + 1) * sizeof(T); }

 private:
  struct Free {
    uint64_t bytes = 0;
    void operator()(T* p) const { FreeWords(p, bytes); }
  };
  int bits_;
  uint64_t mask_;
  std::vector<std::unique_ptr<T, Free>> pages_;
  uint64_t size_ = 0;
};

// Words of all containers, in blocks that are never reallocated (large ones
// on transparent huge pages where the kernel offers them).
class WordArena {
 public:
  WordArena() = default;
  WordArena(WordArena&&) noexcept = default;
  WordArena& operator=(WordArena&&) noexcept = default;
  // Room for n words contiguous at the end: returns where they go (the
  // caller writes them and calls Commit(n)).
  uint64_t* Reserve(uint64_t n);
  void Commit(uint64_t n) { cur_ += n; }
  const uint64_t* end() const { return cur_; }
  uint64_t room() const { return static_cast<uint64_t>(limit_ - cur_); }
  uint64_t MemoryBytes() const { return bytes_; }

 private:
  struct Free {
    uint64_t bytes = 0;
    void operator()(uint64_t* p) const { FreeWords(p, bytes); }
  };
  std::vector<std::unique_ptr<uint64_t, Free>> blocks_;
  uint64_t* cur_ = nullptr;
  uint64_t* limit_ = nullptr;
  uint64_t bytes_ = 0;
  uint64_t next_block_words_ = 8192;
};

class Document {
 public:
  // `input_bytes`: the size of what is read, to size the tables' pages.
  explicit Document(uint64_t input_bytes = 0)
      : containers_(input_bytes >= (uint64_t{64} << 20) ? 17 : 10),
        chunks_(10),
        strings_(input_bytes >= (uint64_t{64} << 20) ? 16 : 10),
        entry_store_(std::make_shared<TraceStore>()),
        entry_frames_(input_bytes >= (uint64_t{64} << 20) ? 18 : 10) {}
  Document(Document&&) noexcept = default;
  Document& operator=(Document&&) noexcept = default;

  Value root() const { return root_; }

  // Scalars. Callers check kind() first.
  bool AsBool(Value v) const { return v.payload() != 0; }
  double AsFloat(Value v) const { return floats_[v.payload()]; }
  const BigInt& AsBigInt(Value v) const { return big_ints_[v.payload()]; }
  std::string_view AsString(Value v) const {  // kStr or kBytes
    const StrRef& s = strings_[v.payload()];
    return {s.data, s.size};
  }
  // Integer as int64 / uint64 when it fits; false otherwise (or not an int).
  bool ToInt64(Value v, int64_t* out) const;
  bool ToUint64(Value v, uint64_t* out) const;

  // Containers (kList, kTuple, kDict). Size counts words: a dict of n pairs
  // has Size() == 2n. A dict forwarded to a trace entry has none.
  uint64_t Size(Value container) const {
    const Container& c = containers_[container.payload()];
    if (c.tag == 0 || c.tag == kRangeTag) return c.first_count;
    if (c.tag == kForwardTag) return 0;
    if (c.tag & kMorePieces) return extras_[c.tag & ~kMorePieces].total;
    return uint64_t{c.first_count} * 2;  // shaped: values only
  }
  // Calls f(Value) for each word in order.
  template <typename F>
  void ForEachWord(Value container, F&& f) const {
    const Container& c = containers_[container.payload()];
    if (c.tag == kRangeTag) {  // consecutive trace entries
      for (uint32_t i = 0; i < c.first_count; ++i) f(Value::Make(Kind::kEntry, c.range_begin + i));
      return;
    }
    if (c.tag == kForwardTag) return;
    if (c.tag != 0 && !(c.tag & kMorePieces)) {  // a dict stored as values; keys from its shape
      const uint64_t* keys = shapes_[c.tag].data();
      for (uint32_t i = 0; i < c.first_count; ++i) {
        f(Value::FromBits(keys[i]));
        f(Value::FromBits(c.first[i]));
      }
      return;
    }
    for (uint32_t i = 0; i < c.first_count; ++i) f(Value::FromBits(c.first[i]));
    if (c.tag == 0) return;
    for (uint32_t k = extras_[c.tag & ~kMorePieces].more; k != 0; k = chunks_[k].next) {
      const Chunk& ch = chunks_[k];
      for (uint32_t i = 0; i < ch.count; ++i) f(Value::FromBits(ch.data[i]));
    }
  }
  // Dict lookup by string key; the last pair with that key wins, as Python's
  // SETITEM overwrites. False when absent.
  bool Find(Value dict, std::string_view key, Value* out) const;

  uint64_t num_containers() const { return containers_.size(); }
  uint64_t num_chunks() const { return chunks_.size(); }
  // Bytes held by the tables, the strings and the trace entries.
  uint64_t MemoryBytes() const;

  // --- Trace entries ---
  // A list (or tuple) holding only consecutive entries: their range.
  bool EntryRange(Value list, uint64_t* begin, uint64_t* count) const {
    const Container& c = containers_[list.payload()];
    if (c.tag != kRangeTag) return false;
    *begin = c.range_begin;
    *count = c.first_count;
    return true;
  }
  // A dict the pickle reader turned into an entry after it had been shared
  // (DUP, memo): the entry. kEntry words are the common case.
  bool ForwardedEntry(Value dict, uint64_t* entry) const {
    const Container& c = containers_[dict.payload()];
    if (c.tag != kForwardTag) return false;
    *entry = c.range_begin;
    return true;
  }
  uint64_t num_entries() const { return entry_store_->size(); }
  // The entry's frames as its reader found them: a list or tuple (to intern
  // after reading, when no reader can still add to it), or None (0).
  Value EntryFrames(uint64_t entry) const {
    const uint32_t f = entry_frames_[entry];
    return f == 0 ? Value::None() : Value::Make(Kind::kList, f - 1);
  }
  // The store of all entries; the extractor fills in the stacks and hands
  // out views of it.
  const std::shared_ptr<TraceStore>& entry_store() const { return entry_store_; }
  // Stream handles seen so far; index 0 is stream 0. False past 65535.
  bool InternStream(uint64_t raw, uint16_t* index);
  std::vector<uint64_t> TakeStreams() { return std::move(streams_); }

  // --- Building (the readers) ---
  void set_root(Value v) { root_ = v; }
  Value AddFloat(double d);
  Value AddBigInt(const BigInt& b);
  // Integer, inline when it fits, else a BigInt.
  Value AddInt(int64_t v);
  Value AddUint(uint64_t v);
  // Copies the bytes into the Document's pool.
  Value AddString(Kind kind, const char* data, uint64_t size);
  Value AddString(Kind kind, std::string_view text) {
    return AddString(kind, text.data(), text.size());
  }
  Value NewContainer(Kind kind);
  // Drops the most recent container (a dict the pickle reader turned into
  // an entry before anything else referred to it).
  void PopContainer() { containers_.pop_back(); }
  // Appends words to a list or dict (its last chunk grows in place when it
  // ends the arena, else a chunk is linked). Consecutive entries appended to
  // an empty list or continuing its range stay a range. The caller keeps
  // Size(container) + n and num_chunks() below 2^32 (reader limits).
  void Append(Value container, const uint64_t* words, uint64_t n);
  // A decoded entry; `frames` is a list/tuple value or None.
  Value AddEntry(const TraceEntry& entry, Value frames);
  // Makes an empty dict stand for `entry` (see ForwardedEntry).
  void ForwardToEntry(Value dict, uint64_t entry) {
    Container& c = containers_[dict.payload()];
    c.range_begin = entry;
    c.first_count = 0;
    c.tag = kForwardTag;
  }
  bool IsForwarded(Value dict) const { return containers_[dict.payload()].tag == kForwardTag; }

 private:
  struct StrRef {
    const char* data;
    uint64_t size;
  };
  struct Chunk {
    const uint64_t* data;
    uint32_t count;
    uint32_t next;  // index into chunks_, 0 = none
  };
  // 16 bytes: most containers are one piece of words.
  struct Container {
    union {
      const uint64_t* first = nullptr;  // the first piece
      uint64_t range_begin;             // kRangeTag / kForwardTag: an entry index
    };
    uint32_t first_count = 0;  // words in the first piece (kRangeTag: entries)
    // 0: one piece. kMorePieces | i: more pieces, described by extras_[i].
    // kRangeTag: a list of first_count consecutive entries from range_begin.
    // kForwardTag: a dict that is entry range_begin. Otherwise a shape id: a
    // dict whose keys are shapes_[tag] and whose one piece holds only the
    // values. Snapshot dicts repeat a few key sequences many times (every
    // segment and block has the same keys), so storing each sequence once
    // halves their words.
    uint32_t tag = 0;
  };
  static constexpr uint32_t kMorePieces = 0x80000000u;
  static constexpr uint32_t kRangeTag = 0x7fffffffu;
  static constexpr uint32_t kForwardTag = 0x7ffffffeu;
  struct Extra {
    uint32_t more = 0;   // first extra chunk
    uint32_t last = 0;   // last extra chunk
    uint64_t total = 0;  // words in all pieces
  };
  // Finds or adds the shape of `pairs` (key, value, ...); 0 when not shapeable.
  uint32_t ShapeOf(const uint64_t* pairs, uint64_t n);
  void Unshape(Container& c);
  // A range list that receives something else goes back to words.
  void Unrange(Container& c);
  // Entries words[0, n) continue `next` (the entry index they must start at).
  static bool ConsecutiveEntries(const uint64_t* words, uint64_t n, uint64_t next);
  const char* CopyBytes(const char* data, uint64_t size);

  Value root_;
  WordArena words_;
  PagedVector<Container> containers_;
  PagedVector<Chunk> chunks_;  // [0] is the "none" sentinel
  PagedVector<StrRef> strings_;
  std::vector<double> floats_;
  std::vector<BigInt> big_ints_;
  std::vector<Extra> extras_;
  std::vector<std::vector<uint64_t>> shapes_{{}};  // [0]: no shape
  std::unordered_map<std::string, uint32_t> shape_index_;
  uint32_t recent_shape_ = 0;
  // String bytes, in blocks (a string larger than a block gets its own).
  std::vector<std::unique_ptr<char[]>> pool_;
  char* pool_cur_ = nullptr;
  uint64_t pool_left_ = 0;
  uint64_t pool_bytes_ = 0;
  // Trace entries.
  std::shared_ptr<TraceStore> entry_store_;
  PagedVector<uint32_t> entry_frames_;  // container index + 1, 0 = none
  std::vector<uint64_t> streams_{0};
  std::unordered_map<uint64_t, uint16_t> stream_index_{{0, 0}};
  uint64_t last_stream_ = 0;
  uint16_t last_stream_index_ = 0;
};

}  // namespace vramscope::snapshot
