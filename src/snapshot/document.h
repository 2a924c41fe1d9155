// Document: a compact, read-only tree (in fact a DAG) of plain Python values,
// what the pickle and JSON readers build and the snapshot extractor walks.
//
// Why not a DOM of heap nodes: a PyTorch snapshot of a long run is gigabytes
// of small dicts; one heap node per value would cost 10x the file. Here every
// value is one 64-bit word (a 4-bit kind plus a 60-bit payload: the integer
// itself, or an index into a side table), containers store their items as
// words in shared blocks, dicts that repeat a key sequence store only their
// values (the keys once per "shape"), and strings point into the input
// (pickle) or a pooled copy (JSON). A trace entry of ~50 pickle bytes costs
// ~80 bytes (values, a 16-byte container record, its memo entry).
// Storage grows in pages and blocks that never move, so reading costs one
// write per word, never a reallocation's copy.
//
// Sharing: a pickle memo reference stores the same word twice, so shared
// frame lists cost nothing extra. Cycles are rejected by the pickle reader
// (incrementally, or by CheckGraph when a container is filled after being
// stored), and JSON cannot express them, so every walk of a Document ends.
//
// Ownership: a Document built from pickle bytes points into them; the bytes
// must outlive it. Not thread-safe for mutation; const access is safe.
#pragma once

#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

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

// Page allocation of the readers' tables: `bytes` rounded up; 2 MiB-aligned
// and advised for transparent huge pages when at least 2 MiB. Aborts with
// std::bad_alloc when the host has no memory left.
void* AllocateWords(uint64_t bytes);
void FreePage(void* p);

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
    if ((size_ & mask_) == 0) pages_.emplace_back(AllocatePage((mask_ + 1) * sizeof(T)));
    new (&(*this)[size_++]) T(value);
  }
  uint64_t MemoryBytes() const { return pages_.size() * (mask_ + 1) * sizeof(T); }

 private:
  struct Free {
    void operator()(T* p) const { FreePage(p); }
  };
  static T* AllocatePage(uint64_t bytes) { return static_cast<T*>(AllocateWords(bytes)); }
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
    void operator()(uint64_t* p) const { FreePage(p); }
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
        strings_(input_bytes >= (uint64_t{64} << 20) ? 16 : 10) {}
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
  // has Size() == 2n.
  uint64_t Size(Value container) const {
    const Container& c = containers_[container.payload()];
    if (c.tag == 0) return c.first_count;
    if (c.tag & kMorePieces) return extras_[c.tag & ~kMorePieces].total;
    return uint64_t{c.first_count} * 2;  // shaped: values only
  }
  // Calls f(Value) for each word in order.
  template <typename F>
  void ForEachWord(Value container, F&& f) const {
    const Container& c = containers_[container.payload()];
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
  // Bytes held by the tables (not counting the input the strings point into).
  uint64_t MemoryBytes() const;

  // --- Building (the readers) ---
  void set_root(Value v) { root_ = v; }
  Value AddFloat(double d);
  Value AddBigInt(const BigInt& b);
  // Integer, inline when it fits, else a BigInt.
  Value AddInt(int64_t v);
  Value AddUint(uint64_t v);
  // `data` must outlive the Document (input bytes or the string pool).
  Value AddString(Kind kind, const char* data, uint64_t size);
  // Copies `text` into the Document's own pool (JSON strings, unescaped).
  Value AddOwnedString(Kind kind, std::string_view text);
  Value NewContainer(Kind kind);
  // Appends words to a list or dict (its last chunk grows in place when it
  // ends the arena, else a chunk is linked). The caller keeps
  // Size(container) + n and num_chunks() below 2^32 (reader limits).
  void Append(Value container, const uint64_t* words, uint64_t n);

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
    const uint64_t* first = nullptr;
    uint32_t first_count = 0;  // words in the first piece
    // 0: one piece. kMorePieces | i: more pieces, described by extras_[i].
    // Otherwise a shape id: a dict whose keys are shapes_[tag] and whose one
    // piece holds only the values. Snapshot dicts repeat a few key sequences
    // millions of times (every trace entry has the same six keys), so
    // storing each sequence once halves their words.
    uint32_t tag = 0;
  };
  static constexpr uint32_t kMorePieces = 0x80000000u;
  struct Extra {
    uint32_t more = 0;   // first extra chunk
    uint32_t last = 0;   // last extra chunk
    uint64_t total = 0;  // words in all pieces
  };
  // Finds or adds the shape of `pairs` (key, value, ...); 0 when not shapeable.
  uint32_t ShapeOf(const uint64_t* pairs, uint64_t n);
  void Unshape(Container& c);

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
  std::vector<std::unique_ptr<char[]>> pool_;  // owned string bytes
};

}  // namespace vramscope::snapshot
