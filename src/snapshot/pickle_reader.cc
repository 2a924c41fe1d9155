// A pickle reader for plain data only (protocols 2-5).
//
// The opcodes and their payloads follow CPython's Lib/pickle.py and
// Lib/pickletools.py (the specification of the format); torch::jit::Pickler
// (torch/csrc/jit/serialization/pickler.cpp, used by
// torch::cuda::_memory_snapshot_pickled) emits a subset of the same with
// PROTO 2 and BINPUT memo entries. The machine keeps Python's semantics: a
// value stack, a stack of MARK positions, and a memo of values by index.
//
// Trace entries are decoded as their dicts complete (EntryDecoder): the dict
// becomes a 16-byte record and its container slot is given back when nothing
// else can refer to it yet (the common case: Python's pickler writes
// EMPTY_DICT, MEMOIZE, MARK, the pairs, SETITEMS). Input behind the reader is
// released as it goes (InputWindow), so reading a file costs about the
// records, the memo and the distinct strings, not the file.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "entry_decoder.h"
#include "readers.h"

namespace vramscope::snapshot {
namespace {

// A memo hole (BINPUT may skip indices): no Value has kind 15.
constexpr uint64_t kUnset = 0xf;

std::string_view RefusedName(uint8_t op) {
  switch (op) {
    case 'c': return "GLOBAL";
    case 0x93: return "STACK_GLOBAL";
    case 'R': return "REDUCE";
    case 'b': return "BUILD";
    case 'i': return "INST";
    case 'o': return "OBJ";
    case 0x81: return "NEWOBJ";
    case 0x92: return "NEWOBJ_EX";
    case 'P': return "PERSID";
    case 'Q': return "BINPERSID";
    case 0x82: return "EXT1";
    case 0x83: return "EXT2";
    case 0x84: return "EXT4";
    default: return {};
  }
}

std::string_view UnsupportedName(uint8_t op) {
  switch (op) {
    case 'I': return "INT (protocol 0 text)";
    case 'L': return "LONG (protocol 0 text)";
    case 'F': return "FLOAT (protocol 0 text)";
    case 'S': return "STRING (protocol 0 text)";
    case 'V': return "UNICODE (protocol 0 text)";
    case 'p': return "PUT (protocol 0 text)";
    case 'g': return "GET (protocol 0 text)";
    case 0x8f: return "EMPTY_SET (sets are not part of a snapshot)";
    case 0x90: return "ADDITEMS (sets are not part of a snapshot)";
    case 0x91: return "FROZENSET (sets are not part of a snapshot)";
    case 0x97: return "NEXT_BUFFER (out-of-band buffers)";
    case 0x98: return "READONLY_BUFFER (out-of-band buffers)";
    default: return {};
  }
}

class Machine {
 public:
  Machine(std::string_view bytes, std::string_view name, const SnapshotReadLimits& limits,
          InputWindow* window)
      : begin_(reinterpret_cast<const uint8_t*>(bytes.data())),
        p_(begin_),
        end_(begin_ + bytes.size()),
        name_(name),
        limits_(limits),
        budget_(MemoryBudgetBytes(limits, bytes.size())),
        // Container sizes are 32-bit in the Document.
        max_items_(std::min<uint64_t>(limits.max_container_items, 0xffffffffu)),
        doc_(bytes.size()),
        // Big pages for big inputs (fewer of them), small ones for small
        // inputs (no 512 KiB page for a 1 KiB file).
        memo_(bytes.size() >= (uint64_t{64} << 20) ? 16 : 10),
        shape_(bytes.size() >= (uint64_t{64} << 20) ? 16 : 10),
        window_(window),
        release_at_(end_) {
    if (window_ != nullptr) release_at_ = begin_ + std::min<uint64_t>(kReleaseStep, end_ - begin_);
  }

  Result<Document> Run(int* protocol);

 private:
  // --- errors ---
  // Records the error (the first one wins) and returns false, so every
  // operation below is a plain bool on the hot path.
  bool Fail(const std::string& problem) {
    if (!failed_) error_ = MakeError(fmt::format("{}: offset {}: {}", name_, op_offset_, problem));
    failed_ = true;
    return false;
  }
  bool Truncated(std::string_view what) {
    return Fail(fmt::format("truncated: {} runs past the end of the input ({} bytes)", what,
                            end_ - begin_));
  }

  // --- input ---
  uint64_t Remaining() const { return static_cast<uint64_t>(end_ - p_); }
  bool ReadLE(int n, uint64_t* out) {
    if (Remaining() < static_cast<uint64_t>(n)) return false;
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= uint64_t{p_[i]} << (8 * i);
    p_ += n;
    *out = v;
    return true;
  }

  // --- stack ---
  bool Push(Value v) {
    if (stack_.size() >= limits_.max_stack_items) {
      return Fail(fmt::format("more than {} values on the pickle stack (max_stack_items)",
                              limits_.max_stack_items));
    }
    stack_.push_back(v.bits());
    return true;
  }
  uint64_t MarkBase() const { return marks_.empty() ? 0 : marks_.back(); }
  // Items above the innermost MARK; the MARK is popped.
  bool PopMark(std::string_view op, uint64_t* base) {
    if (marks_.empty()) return Fail(fmt::format("{} without a MARK", op));
    *base = marks_.back();
    marks_.pop_back();
    return true;
  }
  bool NeedItems(uint64_t n, std::string_view op) {
    if (stack_.size() < MarkBase() + n) {
      return Fail(fmt::format("{} needs {} value(s) on the stack", op, n));
    }
    return true;
  }

  // The memory budget, checked every 256 container operations and after any
  // large one (the overshoot between checks is bounded by 256 small ones).
  bool CheckMemory(uint64_t words_added = 0) {
    if ((++memory_checks_ & 255) != 0 && words_added < 4096) return true;
    const uint64_t used = doc_.MemoryBytes() + stack_.capacity() * 8 + marks_.capacity() * 8 +
                          memo_.size() * 8 + sparse_memo_.size() * 32 + shape_.size() * 2 +
                          entry_copies_ * kEntryCopyBytes;
    if (used > budget_) {
      const std::string copies =
          entry_copies_ == 0
              ? std::string()
              : fmt::format(", {} of them for {} references to trace entries already in a trace",
                            entry_copies_ * kEntryCopyBytes, entry_copies_);
      return Fail(
          fmt::format("the decoded values would need more than {} bytes for a {}-byte input "
                      "(max_memory_bytes{}); not a plausible snapshot",
                      budget_, end_ - begin_, copies));
    }
    return true;
  }

  // What one more trace entry costs once read: its record, and the events
  // and replay state explain and replay make of it (measured: about 80 bytes
  // an entry for a million-entry snapshot).
  static constexpr uint64_t kEntryCopyBytes = 96;

  // --- input release ---
  static constexpr uint64_t kReleaseStep = uint64_t{32} << 20;
  void Release() {
    window_->Consumed(static_cast<uint64_t>(p_ - begin_));
    release_at_ = p_ + std::min<uint64_t>(kReleaseStep, Remaining());
  }

  // --- operations ---
  Value NewContainer(Kind kind) {
    shape_.push_back(1);
    const Value c = doc_.NewContainer(kind);
    last_bits_ = c.bits();
    last_memo_puts_ = 0;
    last_aliased_ = false;
    return c;
  }
  // A copy of a value was pushed (DUP, BINGET): the newest container, if it
  // was that, is no longer referred to from one stack slot only.
  void NoteCopy(uint64_t bits) {
    if (bits == last_bits_) last_aliased_ = true;
  }
  void NoteMemoPut(uint64_t bits, uint64_t index) {
    if (bits == last_bits_) {
      ++last_memo_puts_;
      last_memo_index_ = index;
    }
  }
  bool TryEntry(Value target, uint64_t container_pos, const uint64_t* pairs, uint64_t n);
  bool DecodeEntry(const uint64_t* pairs, uint64_t n, Value* entry);
  bool NoteChildren(Value target, const uint64_t* words, uint64_t n);
  void NoteEntryStored(Value w);
  bool String(Kind kind, uint64_t length, std::string_view op);
  bool Long(uint64_t n);
  bool BuildContainer(Kind kind, uint64_t base, std::string_view op);
  bool AddTo(Kind want, uint64_t container_pos, uint64_t first, std::string_view op);
  bool MemoPut(uint64_t index);
  bool MemoGet(uint64_t index);
  // One opcode outside Run's fast path: Step is the opcode table, one
  // handler per kind of opcode below it.
  bool Step(uint8_t op, bool* stop);
  bool Proto();
  bool Frame();
  bool Stop(bool* stop);
  bool UnsignedInt(int width, std::string_view op);
  bool BinInt();
  bool LongOpcode(int width, std::string_view op);
  bool BinFloat();
  bool LengthPrefixed(int width, Kind kind, std::string_view op);
  bool BinString();
  bool EmptyContainer(Kind kind);
  bool FromMark(Kind kind, std::string_view op);
  bool TupleOfTop(uint64_t n, std::string_view op);
  bool AddTopItems(Kind want, uint64_t n, std::string_view op);
  bool AddMarkItems(Kind want, std::string_view op);
  bool MemoPutAt(int width, std::string_view op);
  bool MemoGetAt(int width, std::string_view op);
  bool Mark();
  bool Pop();
  bool PopMarkItems();
  bool Dup();
  bool Refuse(uint8_t op);

  const uint8_t* begin_;
  const uint8_t* p_;
  const uint8_t* end_;
  std::string_view name_;
  const SnapshotReadLimits& limits_;
  uint64_t budget_;
  uint64_t max_items_;
  uint64_t op_offset_ = 0;
  int protocol_ = -1;
  Document doc_;
  std::vector<uint64_t> stack_;
  std::vector<uint64_t> marks_;
  PagedVector<uint64_t> memo_;
  std::unordered_map<uint64_t, uint64_t> sparse_memo_;
  // Per container: nesting height in the low 15 bits, and bit 15 once it
  // has been stored into another container. Python's pickler stores a
  // container only after filling it, so as long as no container is filled
  // after being stored, the values form a DAG whose heights are exact; a
  // pickle that does so (a recursive structure, or a crafted one) gets the
  // full graph check at the end instead.
  PagedVector<uint16_t> shape_;
  bool needs_graph_check_ = false;
  // Per trace entry: 1 once it has been stored into a container; the entries
  // stored again (copies, each charged kEntryCopyBytes).
  PagedVector<uint8_t> entry_stored_{16};
  uint64_t entry_copies_ = 0;
  uint64_t memo_count_ = 0;
  uint64_t memory_checks_ = 0;
  bool failed_ = false;
  Error error_;
  // Trace entries.
  EntryDecoder decoder_;
  bool compact_ = limits_.compact_trace_entries;
  // The newest container, tracked until something other than its own stack
  // slot and one memo slot could refer to it (kUnset: none).
  uint64_t last_bits_ = kUnset;
  uint64_t last_memo_index_ = 0;
  uint32_t last_memo_puts_ = 0;
  bool last_aliased_ = false;
  InputWindow* window_;
  const uint8_t* release_at_;
};

// pairs[0, n) as a trace entry record, if they decode as one.
bool Machine::DecodeEntry(const uint64_t* pairs, uint64_t n, Value* entry) {
  EntryFields f;
  if (!decoder_.Scan(doc_, pairs, n, &f) || !f.has_action) return false;
  TraceEntry e;
  if (!decoder_.TryDecode(doc_, f, &e)) return false;
  if (doc_.num_entries() >= 0xffffffffu) return false;  // stays a dict
  const bool frames = f.has_frames && e.action != TraceAction::kOther;
  *entry = doc_.AddEntry(e, frames ? f.frames : Value::None());
  return true;
}

// The first fill of an empty dict (SETITEM(S)): if the pairs are a trace
// entry, the dict becomes a record. Its container slot is given back when
// only its stack slot and at most one memo slot refer to it (both then
// rewritten); otherwise the container forwards to the record.
bool Machine::TryEntry(Value target, uint64_t container_pos, const uint64_t* pairs, uint64_t n) {
  Value entry;
  if (!DecodeEntry(pairs, n, &entry)) return false;
  constexpr uint16_t kStored = 0x8000;
  const bool sole = target.bits() == last_bits_ && !last_aliased_ && last_memo_puts_ <= 1 &&
                    (shape_[target.payload()] & kStored) == 0;
  if (sole) {
    if (last_memo_puts_ == 1) {
      if (last_memo_index_ < memo_.size()) {
        if (memo_[last_memo_index_] == target.bits()) memo_[last_memo_index_] = entry.bits();
      } else if (auto it = sparse_memo_.find(last_memo_index_);
                 it != sparse_memo_.end() && it->second == target.bits()) {
        it->second = entry.bits();
      }
    }
    doc_.PopContainer();
    shape_.pop_back();
    last_bits_ = kUnset;
  } else {
    doc_.ForwardToEntry(target, entry.payload());
  }
  stack_[container_pos] = entry.bits();
  return true;
}

bool Machine::String(Kind kind, uint64_t length, std::string_view op) {
  if (length > Remaining()) {
    return Fail(fmt::format("{} length {} exceeds the {} bytes left in the input", op, length,
                            Remaining()));
  }
  if (length > limits_.max_string_bytes) {
    return Fail(fmt::format("{} of {} bytes is over the {}-byte limit (max_string_bytes)", op,
                            length, limits_.max_string_bytes));
  }
  const Value v = doc_.AddString(kind, reinterpret_cast<const char*>(p_), length);
  p_ += length;
  return Push(v);
}

// LONG1 / LONG4: n bytes, little-endian two's complement.
bool Machine::Long(uint64_t n) {
  if (n > Remaining()) {
    return Fail(fmt::format("LONG of {} bytes exceeds the {} bytes left", n, Remaining()));
  }
  const uint8_t* bytes = p_;
  p_ += n;
  if (n == 0) return Push(Value::Int(0));
  if (n <= 7 && (bytes[n - 1] & 0x80) == 0) {
    // The common case (addresses, timestamps, sizes): a positive value that
    // fits the inline range.
    uint64_t v = 0;
    for (uint64_t i = 0; i < n; ++i) v |= uint64_t{bytes[i]} << (8 * i);
    return Push(Value::Int(static_cast<int64_t>(v)));
  }
  const bool negative = (bytes[n - 1] & 0x80) != 0;
  BigInt big;
  big.negative = negative;
  // Magnitude: the bytes themselves, or their two's-complement negation.
  uint64_t magnitude = 0;
  unsigned carry = 1;
  for (uint64_t i = 0; i < n; ++i) {
    unsigned byte = bytes[i];
    if (negative) {
      byte = (~byte & 0xffu) + carry;
      carry = byte >> 8;
      byte &= 0xffu;
    }
    if (i < 8) {
      magnitude |= uint64_t{byte} << (8 * i);
    } else if (byte != 0) {
      big.overflow = true;
    }
  }
  big.magnitude = magnitude;
  if (!big.overflow && !negative && magnitude < (uint64_t{1} << 59)) {
    return Push(Value::Int(static_cast<int64_t>(magnitude)));
  }
  if (!big.overflow && negative && magnitude <= (uint64_t{1} << 59)) {
    return Push(Value::Int(-static_cast<int64_t>(magnitude)));
  }
  return Push(doc_.AddBigInt(big));
}

// Builds a list/tuple/dict from the stack items above `base` (DICT, LIST,
// TUPLE, TUPLE1-3) and replaces them with it.
bool Machine::BuildContainer(Kind kind, uint64_t base, std::string_view op) {
  const uint64_t n = stack_.size() - base;
  if (kind == Kind::kDict && n % 2 != 0) {
    return Fail(fmt::format("{} with an odd number ({}) of keys and values", op, n));
  }
  if (n > max_items_) {
    return Fail(fmt::format("{} of {} items is over the limit (max_container_items)", op, n));
  }
  if (kind == Kind::kDict && compact_ && n > 0) {
    Value entry;
    if (DecodeEntry(stack_.data() + base, n, &entry)) {
      // Nothing else refers to a dict built by DICT yet; its items may still
      // nest too deep or be cycles only through containers, checked as usual.
      const Value probe = NewContainer(kind);
      const bool ok = NoteChildren(probe, stack_.data() + base, n);
      doc_.PopContainer();
      shape_.pop_back();
      last_bits_ = kUnset;
      if (!ok) return false;
      stack_.resize(base);
      stack_.push_back(entry.bits());
      return CheckMemory(n);
    }
  }
  const Value c = NewContainer(kind);
  if (!NoteChildren(c, stack_.data() + base, n)) return false;
  doc_.Append(c, stack_.data() + base, n);
  stack_.resize(base);
  stack_.push_back(c.bits());
  return CheckMemory(n);
}

// SETITEM(S) / APPEND(S): adds stack items [first, end) to the container at
// stack position `container_pos`.
bool Machine::AddTo(Kind want, uint64_t container_pos, uint64_t first, std::string_view op) {
  const Value target = Value::FromBits(stack_[container_pos]);
  if (target.kind() == Kind::kEntry || (target.kind() == Kind::kDict && doc_.IsForwarded(target))) {
    return Fail(fmt::format(
        "{} adds to a dict already complete and read as a trace entry (PyTorch never writes that)",
        op));
  }
  if (target.kind() != want) {
    return Fail(fmt::format("{} applied to a {}, expected a {}", op, KindName(target.kind()),
                            KindName(want)));
  }
  const uint64_t n = stack_.size() - first;
  if (want == Kind::kDict && n % 2 != 0) {
    return Fail(fmt::format("{} with an odd number ({}) of keys and values", op, n));
  }
  if (doc_.Size(target) + n > max_items_) {
    return Fail(fmt::format("{} grows a {} past {} items (max_container_items)", op, KindName(want),
                            max_items_));
  }
  if (doc_.num_chunks() >= 0xffffffffu) return Fail("too many container pieces");
  if (!NoteChildren(target, stack_.data() + first, n)) return false;
  if (want == Kind::kDict && compact_ && doc_.Size(target) == 0 &&
      TryEntry(target, container_pos, stack_.data() + first, n)) {
    stack_.resize(first);
    return CheckMemory(n);
  }
  doc_.Append(target, stack_.data() + first, n);
  stack_.resize(first);
  return CheckMemory(n);
}

bool Machine::NoteChildren(Value target, const uint64_t* words, uint64_t n) {
  constexpr uint16_t kStored = 0x8000;
  uint16_t& t = shape_[target.payload()];
  if (t & kStored) needs_graph_check_ = true;  // filled after being stored
  uint16_t height = t & 0x7fff;
  for (uint64_t i = 0; i < n; ++i) {
    const Value w = Value::FromBits(words[i]);
    NoteEntryStored(w);
    if (!w.is_container()) continue;
    if (w == target) {
      return Fail(
          "a container contains itself (a memo reference cycle); a snapshot is a tree of "
          "plain values");
    }
    uint16_t& child = shape_[w.payload()];
    child |= kStored;
    const uint32_t h = static_cast<uint32_t>(child & 0x7fff) + 1;
    if (h > limits_.max_depth || h > 0x7ff0) {
      return Fail(fmt::format("values nest deeper than {} levels (max_depth)", limits_.max_depth));
    }
    if (h > height) height = static_cast<uint16_t>(h);
  }
  t = static_cast<uint16_t>((t & kStored) | height);
  return true;
}

// A trace entry (a record, or a dict forwarded to one) stored into a
// container. Stored again (a memo reference, as Python's pickler writes a
// dict that appears twice), it is read as a copy, and a copy costs the
// analyses what an entry costs them while it costs the input 2 bytes: one
// memoized entry referenced 30 million times by a 60 MB file ran past 20 s
// and 2.8 GiB. So each copy is charged to the memory budget.
void Machine::NoteEntryStored(Value w) {
  uint64_t entry = 0;
  if (w.kind() == Kind::kEntry) {
    entry = w.payload();
  } else if (w.kind() != Kind::kDict || !doc_.ForwardedEntry(w, &entry)) {
    return;
  }
  while (entry_stored_.size() <= entry) entry_stored_.push_back(0);
  if (entry_stored_[entry] != 0) ++entry_copies_;
  entry_stored_[entry] = 1;
}

bool Machine::MemoPut(uint64_t index) {
  if (stack_.size() <= MarkBase()) return Fail("memo store with an empty stack");
  const uint64_t top = stack_.back();
  NoteMemoPut(top, index);
  if (index < memo_.size()) {
    if (memo_[index] == kUnset) ++memo_count_;
    memo_[index] = top;
    return true;
  }
  if (memo_count_ >= limits_.max_memo_entries) {
    return Fail(
        fmt::format("more than {} memo entries (max_memo_entries)", limits_.max_memo_entries));
  }
  if (index == memo_.size()) {
    memo_.push_back(top);
    ++memo_count_;
    return true;
  }
  // Sparse indices (pickletools.optimize drops unused PUTs) go to a map so a
  // hostile index of 2^32-1 costs one entry, not 32 GiB.
  if (sparse_memo_.insert_or_assign(index, top).second) ++memo_count_;
  return true;
}

bool Machine::MemoGet(uint64_t index) {
  if (index < memo_.size() && memo_[index] != kUnset) {
    NoteCopy(memo_[index]);
    return Push(Value::FromBits(memo_[index]));
  }
  auto it = sparse_memo_.find(index);
  if (it == sparse_memo_.end()) {
    return Fail(fmt::format("memo index {} was never stored", index));
  }
  NoteCopy(it->second);
  return Push(Value::FromBits(it->second));
}

// Step is the opcode table: each opcode names its handler, with the
// opcode's own constants (payload width, kind, name) as arguments, so one
// switch dispatches and each handler, inlined per opcode, reads only what
// its opcode needs. The handlers follow CPython's Lib/pickle.py
// (_Unpickler.load_*) for plain data. The hottest opcodes (BINGET of a
// memoized key, MEMOIZE, BININT1) never get here (Machine::Run).
bool Machine::Step(uint8_t op, bool* stop) {
  switch (op) {
    // The stream itself.
    case 0x80: return Proto();
    case 0x95: return Frame();
    case '.': return Stop(stop);
    // Constants and numbers.
    case 'N': return Push(Value::None());
    case 0x88: return Push(Value::Bool(true));   // NEWTRUE
    case 0x89: return Push(Value::Bool(false));  // NEWFALSE
    case 'K': return UnsignedInt(1, "BININT1");
    case 'M': return UnsignedInt(2, "BININT2");
    case 'J': return BinInt();
    case 0x8a: return LongOpcode(1, "LONG1");
    case 0x8b: return LongOpcode(4, "LONG4");
    case 'G': return BinFloat();
    // str and bytes: a little-endian length, then the bytes. Python 3 loads
    // Python 2's strings (SHORT_BINSTRING, BINSTRING) as str.
    case 0x8c: return LengthPrefixed(1, Kind::kStr, "SHORT_BINUNICODE");
    case 'X': return LengthPrefixed(4, Kind::kStr, "BINUNICODE");
    case 0x8d: return LengthPrefixed(8, Kind::kStr, "BINUNICODE8");
    case 'U': return LengthPrefixed(1, Kind::kStr, "SHORT_BINSTRING");
    case 'T': return BinString();
    case 'C': return LengthPrefixed(1, Kind::kBytes, "SHORT_BINBYTES");
    case 'B': return LengthPrefixed(4, Kind::kBytes, "BINBYTES");
    case 0x8e: return LengthPrefixed(8, Kind::kBytes, "BINBYTES8");
    case 0x96: return LengthPrefixed(8, Kind::kBytes, "BYTEARRAY8");
    // New containers: empty, from the items above the innermost MARK, or
    // from the top 1-3 items.
    case '}': return EmptyContainer(Kind::kDict);
    case ']': return EmptyContainer(Kind::kList);
    case ')': return EmptyContainer(Kind::kTuple);
    case 'd': return FromMark(Kind::kDict, "DICT");
    case 'l': return FromMark(Kind::kList, "LIST");
    case 't': return FromMark(Kind::kTuple, "TUPLE");
    case 0x85: return TupleOfTop(1, "TUPLE1");
    case 0x86: return TupleOfTop(2, "TUPLE2");
    case 0x87: return TupleOfTop(3, "TUPLE3");
    // Filling a container below the items.
    case 's': return AddTopItems(Kind::kDict, 2, "SETITEM");  // dict key value
    case 'a': return AddTopItems(Kind::kList, 1, "APPEND");   // list item
    case 'u': return AddMarkItems(Kind::kDict, "SETITEMS");   // dict MARK k v ...
    case 'e':
      return AddMarkItems(Kind::kList, "APPENDS");  // list MARK items ...
    // The memo.
    case 0x94: return MemoPut(memo_count_);  // MEMOIZE: memo[len(memo)] = top
    case 'q': return MemoPutAt(1, "BINPUT");
    case 'r': return MemoPutAt(4, "LONG_BINPUT");
    case 'h': return MemoGetAt(1, "BINGET");
    case 'j': return MemoGetAt(4, "LONG_BINGET");
    // The stack.
    case '(': return Mark();
    case '0': return Pop();
    case '1': return PopMarkItems();
    case '2': return Dup();
    default: return Refuse(op);
  }
}

bool Machine::Proto() {
  uint64_t u = 0;
  if (!ReadLE(1, &u)) return Truncated("PROTO");
  if (u < 2 || u > 5) {
    return Fail(fmt::format("pickle protocol {} is not supported (PyTorch writes 2, 4 or 5)", u));
  }
  protocol_ = static_cast<int>(u);
  return true;
}

// FRAME: a length hint for buffered readers; the bytes follow inline.
bool Machine::Frame() {
  uint64_t u = 0;
  if (!ReadLE(8, &u)) return Truncated("FRAME");
  if (u > Remaining()) {
    return Fail(fmt::format("FRAME of {} bytes exceeds the {} bytes left (truncated file?)", u,
                            Remaining()));
  }
  return true;
}

bool Machine::Stop(bool* stop) {
  if (stack_.size() <= MarkBase() || stack_.empty()) return Fail("STOP with an empty stack");
  *stop = true;
  return true;
}

// BININT1 / BININT2: unsigned.
bool Machine::UnsignedInt(int width, std::string_view op) {
  uint64_t u = 0;
  if (!ReadLE(width, &u)) return Truncated(op);
  return Push(Value::Int(static_cast<int64_t>(u)));
}

// BININT: signed 32-bit.
bool Machine::BinInt() {
  uint64_t u = 0;
  if (!ReadLE(4, &u)) return Truncated("BININT");
  return Push(Value::Int(static_cast<int32_t>(static_cast<uint32_t>(u))));
}

// LONG1 / LONG4: a length (LONG4's signed), then Long's bytes.
bool Machine::LongOpcode(int width, std::string_view op) {
  uint64_t u = 0;
  if (!ReadLE(width, &u)) return Truncated(op);
  const int32_t n = static_cast<int32_t>(static_cast<uint32_t>(u));
  if (n < 0) return Fail(fmt::format("{} with negative length {}", op, n));  // LONG4 only
  return Long(static_cast<uint64_t>(n));
}

// BINFLOAT: a big-endian IEEE-754 double (the one big-endian payload).
bool Machine::BinFloat() {
  if (Remaining() < 8) return Truncated("BINFLOAT");
  uint64_t bits = 0;
  for (int i = 0; i < 8; ++i) bits = (bits << 8) | p_[i];
  p_ += 8;
  double d;
  std::memcpy(&d, &bits, sizeof d);
  return Push(doc_.AddFloat(d));
}

bool Machine::LengthPrefixed(int width, Kind kind, std::string_view op) {
  uint64_t length = 0;
  if (!ReadLE(width, &length)) return Truncated(op);
  return String(kind, length, op);
}

// BINSTRING: the one string opcode with a signed (32-bit) length.
bool Machine::BinString() {
  uint64_t u = 0;
  if (!ReadLE(4, &u)) return Truncated("BINSTRING");
  const int32_t n = static_cast<int32_t>(static_cast<uint32_t>(u));
  if (n < 0) return Fail(fmt::format("BINSTRING with negative length {}", n));
  return String(Kind::kStr, static_cast<uint64_t>(n), "BINSTRING");
}

bool Machine::EmptyContainer(Kind kind) { return Push(NewContainer(kind)) && CheckMemory(); }

// DICT / LIST / TUPLE: the items above the innermost MARK.
bool Machine::FromMark(Kind kind, std::string_view op) {
  uint64_t base = 0;
  if (!PopMark(op, &base)) return false;
  return BuildContainer(kind, base, op);
}

bool Machine::TupleOfTop(uint64_t n, std::string_view op) {
  if (!NeedItems(n, op)) return false;
  return BuildContainer(Kind::kTuple, stack_.size() - n, op);
}

// SETITEM / APPEND: the container sits below its `n` top items.
bool Machine::AddTopItems(Kind want, uint64_t n, std::string_view op) {
  if (!NeedItems(n + 1, op)) return false;
  return AddTo(want, stack_.size() - n - 1, stack_.size() - n, op);
}

// SETITEMS / APPENDS: the container sits just below the innermost MARK.
bool Machine::AddMarkItems(Kind want, std::string_view op) {
  uint64_t base = 0;
  if (!PopMark(op, &base)) return false;
  if (base <= MarkBase()) {
    return Fail(fmt::format("{} without a {} below its MARK", op, KindName(want)));
  }
  return AddTo(want, base - 1, base, op);
}

bool Machine::MemoPutAt(int width, std::string_view op) {
  uint64_t index = 0;
  if (!ReadLE(width, &index)) return Truncated(op);
  return MemoPut(index);
}

bool Machine::MemoGetAt(int width, std::string_view op) {
  uint64_t index = 0;
  if (!ReadLE(width, &index)) return Truncated(op);
  return MemoGet(index);
}

bool Machine::Mark() {
  // Each open MARK is a container being built inside the one of the MARK
  // below it, so real pickles never hold more open MARKs than values nest
  // (max_depth). A bomb of millions of MARKs is refused at the first one too
  // many, not after gigabytes of positions.
  if (marks_.size() >= limits_.max_depth) {
    return Fail(
        fmt::format("more than {} MARKs open at once; values nest at most {} levels "
                    "(max_depth)",
                    limits_.max_depth, limits_.max_depth));
  }
  marks_.push_back(stack_.size());
  return true;
}

// POP: the top item, or the innermost MARK when none is above it.
bool Machine::Pop() {
  if (stack_.size() > MarkBase()) {
    stack_.pop_back();
  } else if (!marks_.empty()) {
    marks_.pop_back();
  } else {
    return Fail("POP with an empty stack");
  }
  return true;
}

// POP_MARK: the items above the innermost MARK, and the MARK.
bool Machine::PopMarkItems() {
  uint64_t base = 0;
  if (!PopMark("POP_MARK", &base)) return false;
  stack_.resize(base);
  return true;
}

bool Machine::Dup() {
  if (stack_.size() <= MarkBase()) return Fail("DUP with an empty stack");
  NoteCopy(stack_.back());
  return Push(Value::FromBits(stack_.back()));
}

// Every other byte: what would run code is named as such (the reader's
// safety promise), then what PyTorch never writes, then anything else.
bool Machine::Refuse(uint8_t op) {
  if (std::string_view refused = RefusedName(op); !refused.empty()) {
    return Fail(fmt::format(
        "opcode {} (0x{:02x}) would import or call a Python object; a memory snapshot holds "
        "only plain data, so it is refused (nothing was executed)",
        refused, op));
  }
  if (std::string_view unsupported = UnsupportedName(op); !unsupported.empty()) {
    return Fail(
        fmt::format("opcode {} (0x{:02x}) is not used by PyTorch snapshots", unsupported, op));
  }
  return Fail(fmt::format("unknown pickle opcode 0x{:02x}", op));
}

Result<Document> Machine::Run(int* protocol) {
  if (begin_ == end_) return MakeError(fmt::format("{}: empty file", name_));
  stack_.reserve(1024);
  bool stop = false;
  while (!stop) {
    if (p_ >= release_at_ && window_ != nullptr && p_ < end_) Release();
    if (p_ == end_) {
      op_offset_ = static_cast<uint64_t>(p_ - begin_);
      Fail("truncated: the input ends before the STOP opcode");
      return error_;
    }
    op_offset_ = static_cast<uint64_t>(p_ - begin_);
    const uint8_t op = *p_++;
    // The opcodes of nearly every byte of a snapshot, without the general
    // dispatch: BINGET of a memoized key, MEMOIZE, MARK, small ints.
    if (op == 'h' && p_ < end_) {
      const uint64_t index = *p_;
      if (index < memo_.size() && stack_.size() < limits_.max_stack_items) {
        ++p_;
        NoteCopy(memo_[index]);
        stack_.push_back(memo_[index]);
        continue;
      }
    } else if (op == 0x94 && stack_.size() > MarkBase() && memo_count_ == memo_.size() &&
               memo_count_ < limits_.max_memo_entries) {
      NoteMemoPut(stack_.back(), memo_count_);
      memo_.push_back(stack_.back());
      ++memo_count_;
      continue;
    } else if (op == 'K' && p_ < end_ && stack_.size() < limits_.max_stack_items) {
      stack_.push_back(Value::Int(*p_++).bits());
      continue;
    }
    if (!Step(op, &stop)) return error_;
  }
  if (p_ != end_) {
    // A snapshot is one pickle; more after STOP would be silently ignored
    // (a second pickle, or garbage appended to a valid one).
    op_offset_ = static_cast<uint64_t>(p_ - begin_);
    Fail(fmt::format("{} more bytes after the STOP opcode (a snapshot is one pickle)",
                     static_cast<uint64_t>(end_ - p_)));
    return error_;
  }
  if (protocol_ < 0) {
    // Protocols 0 and 1 have no PROTO opcode; Python 3 and PyTorch never
    // write them for a snapshot.
    op_offset_ = 0;
    Fail("no PROTO opcode: a protocol 0/1 pickle, not one PyTorch writes (2-5)");
    return error_;
  }
  doc_.set_root(Value::FromBits(stack_.back()));
  if (needs_graph_check_) {
    if (Status s = CheckGraph(doc_, name_, limits_.max_depth); !s.ok()) return s.error();
  }
  *protocol = protocol_;
  return std::move(doc_);
}

}  // namespace

bool IsPickleOpcode(unsigned char byte) {
  static constexpr std::string_view kOpcodes = "().0125abcdeghijlopqrstuBCFGIJKLMNPQRSTUVX]}";
  if (byte >= 0x80 && byte <= 0x98) return true;
  return kOpcodes.find(static_cast<char>(byte)) != std::string_view::npos;
}

uint64_t MemoryBudgetBytes(const SnapshotReadLimits& limits, uint64_t input_bytes) {
  if (limits.max_memory_bytes != 0) return limits.max_memory_bytes;
  constexpr uint64_t kFloorBytes = uint64_t{64} << 20;
  if (input_bytes > (~uint64_t{0} - kFloorBytes) / 8) return ~uint64_t{0};
  return 8 * input_bytes + kFloorBytes;
}

Result<Document> ParsePickle(std::string_view bytes, std::string_view name,
                             const SnapshotReadLimits& limits, int* protocol, InputWindow* window) {
  Machine machine(bytes, name, limits, window);
  Result<Document> doc = machine.Run(protocol);
  // The Document copied what it keeps: the input can go.
  if (window != nullptr) window->Consumed(bytes.size());
  return doc;
}

}  // namespace vramscope::snapshot
