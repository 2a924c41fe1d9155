#include "document.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>

namespace vramscope::snapshot {

std::string_view KindName(Kind k) {
  switch (k) {
    case Kind::kNone: return "None";
    case Kind::kBool: return "bool";
    case Kind::kInt:
    case Kind::kBigInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kStr: return "str";
    case Kind::kBytes: return "bytes";
    case Kind::kList: return "list";
    case Kind::kTuple: return "tuple";
    case Kind::kDict: return "dict";
    case Kind::kEntry: return "trace entry";
  }
  return "?";
}

bool Document::ToInt64(Value v, int64_t* out) const {
  if (v.kind() == Kind::kInt) {
    *out = v.inline_int();
    return true;
  }
  if (v.kind() != Kind::kBigInt) return false;
  const BigInt& b = AsBigInt(v);
  if (b.overflow) return false;
  if (!b.negative) {
    if (b.magnitude > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    *out = static_cast<int64_t>(b.magnitude);
    return true;
  }
  if (b.magnitude > (uint64_t{1} << 63)) return false;
  *out = static_cast<int64_t>(0 - b.magnitude);  // two's complement, exact for -2^63
  return true;
}

bool Document::ToUint64(Value v, uint64_t* out) const {
  if (v.kind() == Kind::kInt) {
    if (v.inline_int() < 0) return false;
    *out = static_cast<uint64_t>(v.inline_int());
    return true;
  }
  if (v.kind() != Kind::kBigInt) return false;
  const BigInt& b = AsBigInt(v);
  if (b.overflow || (b.negative && b.magnitude != 0)) return false;
  *out = b.magnitude;
  return true;
}

bool Document::Find(Value dict, std::string_view key, Value* out) const {
  bool found = false;
  bool is_key = true;
  bool key_matches = false;
  ForEachWord(dict, [&](Value w) {
    if (is_key) {
      key_matches = w.kind() == Kind::kStr && AsString(w) == key;
    } else if (key_matches) {
      *out = w;
      found = true;
    }
    is_key = !is_key;
  });
  return found;
}

namespace {

constexpr uint64_t kBlockWords = uint64_t{1} << 20;  // 8 MiB blocks
constexpr uint64_t kHugePageBytes = uint64_t{2} << 20;
constexpr uint64_t kMappedBytes = uint64_t{64} << 10;  // from here on, mmap
constexpr uint64_t kPageBytes = 4096;

}  // namespace

void* AllocateWords(uint64_t bytes) {
  if (bytes < kMappedBytes) {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  const uint64_t rounded = (bytes + kPageBytes - 1) / kPageBytes * kPageBytes;
  void* p = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
  // Fewer page faults while the tables are first written (THP "madvise").
  if (rounded >= kHugePageBytes) madvise(p, rounded, MADV_HUGEPAGE);
#endif
  return p;
}

void FreeWords(void* p, uint64_t bytes) {
  if (p == nullptr) return;
  if (bytes < kMappedBytes) {
    std::free(p);
    return;
  }
  munmap(p, (bytes + kPageBytes - 1) / kPageBytes * kPageBytes);
}

uint64_t* WordArena::Reserve(uint64_t n) {
  if (room() >= n) return cur_;
  // Blocks double from 64 KiB to 8 MiB: small files stay small, large ones
  // take few blocks.
  const uint64_t words = std::max(next_block_words_, n);
  next_block_words_ = std::min(kBlockWords, next_block_words_ * 2);
  const uint64_t bytes = (words * sizeof(uint64_t) + 63) / 64 * 64;
  blocks_.emplace_back(static_cast<uint64_t*>(AllocateWords(bytes)), Free{bytes});
  bytes_ += bytes;
  cur_ = blocks_.back().get();
  limit_ = cur_ + bytes / sizeof(uint64_t);
  return cur_;
}

uint64_t Document::MemoryBytes() const {
  return words_.MemoryBytes() + containers_.MemoryBytes() + chunks_.MemoryBytes() +
         shapes_.size() * 160 + extras_.capacity() * sizeof(Extra) + strings_.MemoryBytes() +
         floats_.capacity() * sizeof(double) + big_ints_.capacity() * sizeof(BigInt) + pool_bytes_ +
         entry_store_->MemoryBytes() + entry_frames_.MemoryBytes() + streams_.capacity() * 8 +
         stream_index_.size() * 32;
}

bool Document::InternStream(uint64_t raw, uint16_t* index) {
  if (raw == last_stream_) {
    *index = last_stream_index_;
    return true;
  }
  auto it = stream_index_.find(raw);
  if (it == stream_index_.end()) {
    if (streams_.size() > 0xffff) return false;
    it = stream_index_.emplace(raw, static_cast<uint16_t>(streams_.size())).first;
    streams_.push_back(raw);
  }
  last_stream_ = raw;
  last_stream_index_ = it->second;
  *index = it->second;
  return true;
}

Value Document::AddEntry(const TraceEntry& entry, Value frames) {
  const uint64_t index = entry_store_->size();
  entry_store_->Append(entry);
  entry_frames_.push_back(frames.is_container() ? static_cast<uint32_t>(frames.payload() + 1) : 0);
  return Value::Make(Kind::kEntry, index);
}

Value Document::AddFloat(double d) {
  floats_.push_back(d);
  return Value::Make(Kind::kFloat, floats_.size() - 1);
}

Value Document::AddBigInt(const BigInt& b) {
  big_ints_.push_back(b);
  return Value::Make(Kind::kBigInt, big_ints_.size() - 1);
}

Value Document::AddInt(int64_t v) {
  if (Value::InlineInt(v)) return Value::Int(v);
  BigInt b;
  b.negative = v < 0;
  b.magnitude = b.negative ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
  return AddBigInt(b);
}

Value Document::AddUint(uint64_t v) {
  if (v < (uint64_t{1} << 59)) return Value::Int(static_cast<int64_t>(v));
  return AddBigInt(BigInt{false, false, v});
}

const char* Document::CopyBytes(const char* data, uint64_t size) {
  constexpr uint64_t kPoolBlock = uint64_t{256} << 10;
  if (size >= kPoolBlock / 4) {  // its own block; the current one stays in use
    pool_.push_back(std::make_unique_for_overwrite<char[]>(size));
    pool_bytes_ += size;
    std::memcpy(pool_.back().get(), data, size);
    return pool_.back().get();
  }
  if (size > pool_left_) {
    pool_.push_back(std::make_unique_for_overwrite<char[]>(kPoolBlock));
    pool_bytes_ += kPoolBlock;
    pool_cur_ = pool_.back().get();
    pool_left_ = kPoolBlock;
  }
  char* dest = pool_cur_;
  if (size > 0) std::memcpy(dest, data, size);
  pool_cur_ += size;
  pool_left_ -= size;
  return dest;
}

Value Document::AddString(Kind kind, const char* data, uint64_t size) {
  strings_.push_back(StrRef{CopyBytes(data, size), size});
  return Value::Make(kind, strings_.size() - 1);
}

Value Document::NewContainer(Kind kind) {
  if (chunks_.size() == 0) chunks_.push_back(Chunk{nullptr, 0, 0});  // the sentinel
  containers_.push_back(Container{});
  return Value::Make(kind, containers_.size() - 1);
}

uint32_t Document::ShapeOf(const uint64_t* pairs, uint64_t n) {
  constexpr uint64_t kMaxShapeKeys = 16;
  constexpr size_t kMaxShapes = 4096;
  if (n == 0 || n % 2 != 0 || n / 2 > kMaxShapeKeys) return 0;
  uint64_t keys[kMaxShapeKeys];
  for (uint64_t i = 0; i < n / 2; ++i) {
    keys[i] = pairs[2 * i];
    if (Value::FromBits(keys[i]).kind() != Kind::kStr) return 0;
  }
  const size_t key_count = n / 2;
  const std::vector<uint64_t>& recent = shapes_[recent_shape_];
  if (recent.size() == key_count && std::equal(recent.begin(), recent.end(), keys)) {
    return recent_shape_;
  }
  std::string signature(reinterpret_cast<const char*>(keys), key_count * sizeof(uint64_t));
  if (auto it = shape_index_.find(signature); it != shape_index_.end()) {
    recent_shape_ = it->second;
    return it->second;
  }
  if (shapes_.size() >= kMaxShapes) return 0;
  shapes_.emplace_back(keys, keys + key_count);
  recent_shape_ = static_cast<uint32_t>(shapes_.size() - 1);
  shape_index_.emplace(std::move(signature), recent_shape_);
  return recent_shape_;
}

// A shaped dict that receives more pairs goes back to key, value words (in
// a fresh piece; the old values stay unused in the arena).
void Document::Unshape(Container& c) {
  const uint64_t* keys = shapes_[c.tag].data();
  const uint64_t n = uint64_t{c.first_count} * 2;
  uint64_t* dest = words_.Reserve(n);
  for (uint32_t i = 0; i < c.first_count; ++i) {
    dest[2 * i] = keys[i];
    dest[2 * i + 1] = c.first[i];
  }
  words_.Commit(n);
  c.first = dest;
  c.first_count = static_cast<uint32_t>(n);
  c.tag = 0;
}

bool Document::ConsecutiveEntries(const uint64_t* words, uint64_t n, uint64_t next) {
  uint64_t want = Value::Make(Kind::kEntry, next).bits();
  for (uint64_t i = 0; i < n; ++i, want += 16) {  // payload + 1 = bits + 16
    if (words[i] != want) return false;
  }
  return true;
}

void Document::Unrange(Container& c) {
  const uint64_t n = c.first_count;
  const uint64_t begin = c.range_begin;
  uint64_t* dest = words_.Reserve(n);
  for (uint64_t i = 0; i < n; ++i) dest[i] = Value::Make(Kind::kEntry, begin + i).bits();
  words_.Commit(n);
  c.first = dest;
  c.tag = 0;
}

void Document::Append(Value container, const uint64_t* words, uint64_t n) {
  if (n == 0) return;
  Container& c = containers_[container.payload()];
  const auto count = static_cast<uint32_t>(n);
  if (c.tag == kRangeTag) {
    if (ConsecutiveEntries(words, n, c.range_begin + c.first_count)) {
      c.first_count += count;
      return;
    }
    Unrange(c);
  }
  if (c.tag != 0 && !(c.tag & kMorePieces)) Unshape(c);
  if (c.first_count == 0 && c.tag == 0) {
    // Empty: the first piece. Consecutive entries make a range; a dict of
    // string keys may take a shape.
    if (container.kind() != Kind::kDict && Value::FromBits(words[0]).kind() == Kind::kEntry &&
        ConsecutiveEntries(words, n, Value::FromBits(words[0]).payload())) {
      c.range_begin = Value::FromBits(words[0]).payload();
      c.first_count = count;
      c.tag = kRangeTag;
      return;
    }
    if (container.kind() == Kind::kDict) {
      if (const uint32_t shape = ShapeOf(words, n); shape != 0) {
        uint64_t* dest = words_.Reserve(n / 2);
        for (uint64_t i = 0; i < n / 2; ++i) dest[i] = words[2 * i + 1];
        words_.Commit(n / 2);
        c.first = dest;
        c.first_count = count / 2;
        c.tag = shape;
        return;
      }
    }
    uint64_t* dest = words_.Reserve(n);
    std::memcpy(dest, words, n * sizeof(uint64_t));
    words_.Commit(n);
    c.first = dest;
    c.first_count = count;
    return;
  }
  // Grow the last piece in place when it ends the arena.
  Extra* extra = (c.tag & kMorePieces) ? &extras_[c.tag & ~kMorePieces] : nullptr;
  const uint64_t* last_end = extra == nullptr
                                 ? c.first + c.first_count
                                 : chunks_[extra->last].data + chunks_[extra->last].count;
  if (last_end == words_.end() && words_.room() >= n) {
    std::memcpy(words_.Reserve(n), words, n * sizeof(uint64_t));
    words_.Commit(n);
    if (extra == nullptr) {
      c.first_count += count;
    } else {
      chunks_[extra->last].count += count;
      extra->total += n;
    }
    return;
  }
  uint64_t* dest = words_.Reserve(n);
  std::memcpy(dest, words, n * sizeof(uint64_t));
  words_.Commit(n);
  chunks_.push_back(Chunk{dest, count, 0});
  const auto index = static_cast<uint32_t>(chunks_.size() - 1);
  if (extra == nullptr) {
    extras_.push_back(Extra{index, index, uint64_t{c.first_count} + n});
    c.tag = kMorePieces | static_cast<uint32_t>(extras_.size() - 1);
  } else {
    chunks_[extra->last].next = index;
    extra->last = index;
    extra->total += n;
  }
}

}  // namespace vramscope::snapshot
