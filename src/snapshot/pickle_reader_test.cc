// The pickle reader: every supported opcode, the memo, protocols 2-5 as
// Python's pickle writes them, refused opcodes, limits, hostile input.
#include <gtest/gtest.h>

#include <cmath>
#include <deque>
#include <string>

#include "readers.h"
#include "test_support.h"

namespace vramscope::snapshot {
namespace {

using snapshot_test::DataPath;
using snapshot_test::ReadBytes;

const std::string kP4("\x80\x04", 2);

// A string literal with its NUL bytes: "h\x00" must stay two bytes.
template <size_t N>
std::string Bytes(const char (&text)[N]) {
  return std::string(text, N - 1);
}

// A Document points into the bytes it was parsed from (readers.h), so the
// bytes of every parse stay alive for the whole test program (found by ASan:
// the tests pass temporaries).
Result<Document> Parse(const std::string& bytes, const SnapshotReadLimits& limits = {}) {
  static std::deque<std::string> kept;
  kept.push_back(bytes);
  int protocol = 0;
  return ParsePickle(kept.back(), "t", limits, &protocol);
}

Value Root(const std::string& bytes) {
  auto doc = Parse(bytes);
  EXPECT_TRUE(doc.ok()) << (doc.ok() ? "" : doc.error().message);
  return doc.ok() ? doc->root() : Value::None();
}

int64_t IntOf(const std::string& bytes) {
  auto doc = Parse(bytes);
  EXPECT_TRUE(doc.ok()) << (doc.ok() ? "" : doc.error().message);
  int64_t v = 0;
  EXPECT_TRUE(doc.ok() && doc->ToInt64(doc->root(), &v));
  return v;
}

std::string ErrorOf(const std::string& bytes, const SnapshotReadLimits& limits = {}) {
  auto doc = Parse(bytes, limits);
  EXPECT_FALSE(doc.ok());
  return doc.ok() ? "" : doc.error().message;
}

std::vector<Value> Words(const Document& doc, Value c) {
  std::vector<Value> out;
  doc.ForEachWord(c, [&](Value w) { out.push_back(w); });
  return out;
}

TEST(PickleOpcodes, Scalars) {
  EXPECT_EQ(Root(kP4 + "N.").kind(), Kind::kNone);
  EXPECT_EQ(Root(kP4 + "\x88.").kind(), Kind::kBool);
  EXPECT_EQ(Root(kP4 + "\x89.").payload(), 0u);
  EXPECT_EQ(IntOf(kP4 + "K\xff."), 255);                                   // BININT1
  EXPECT_EQ(IntOf(kP4 + std::string("M\x01\x02.", 4)), 0x0201);            // BININT2
  EXPECT_EQ(IntOf(kP4 + std::string("J\xff\xff\xff\xff.", 6)), -1);        // BININT signed
  EXPECT_EQ(IntOf(kP4 + std::string("\x8a\x00.", 3)), 0);                  // LONG1 empty
  EXPECT_EQ(IntOf(kP4 + std::string("\x8a\x03\x00\x80\x00.", 6)), 32768);  // LONG1 sign byte
  EXPECT_EQ(IntOf(kP4 + std::string("\x8a\x02\x00\x80.", 5)), -32768);     // LONG1 two's complement
  EXPECT_EQ(IntOf(kP4 + std::string("\x8a\x01\xff.", 4)), -1);             // LONG1 negative
  EXPECT_EQ(IntOf(kP4 + std::string("\x8b\x02\x00\x00\x00\x00\x01.", 8)), 256);   // LONG4
  auto doc = Parse(kP4 + std::string("G\x3f\xf8\x00\x00\x00\x00\x00\x00.", 10));  // BINFLOAT 1.5
  ASSERT_TRUE(doc.ok());
  EXPECT_EQ(doc->root().kind(), Kind::kFloat);
  EXPECT_EQ(doc->AsFloat(doc->root()), 1.5);
}

TEST(PickleOpcodes, Strings) {
  struct Case {
    std::string bytes;
    Kind kind;
    std::string text;
  };
  const Case cases[] = {
      {kP4 + "\x8c\x02hi.", Kind::kStr, "hi"},                                   // SHORT_BINUNICODE
      {kP4 + std::string("X\x02\x00\x00\x00hi.", 8), Kind::kStr, "hi"},          // BINUNICODE
      {kP4 + std::string("\x8d\x02\0\0\0\0\0\0\0hi.", 12), Kind::kStr, "hi"},    // BINUNICODE8
      {kP4 + "U\x02hi.", Kind::kStr, "hi"},                                      // SHORT_BINSTRING
      {kP4 + std::string("T\x02\x00\x00\x00hi.", 8), Kind::kStr, "hi"},          // BINSTRING
      {kP4 + "C\x02hi.", Kind::kBytes, "hi"},                                    // SHORT_BINBYTES
      {kP4 + std::string("B\x02\x00\x00\x00hi.", 8), Kind::kBytes, "hi"},        // BINBYTES
      {kP4 + std::string("\x8e\x02\0\0\0\0\0\0\0hi.", 12), Kind::kBytes, "hi"},  // BINBYTES8
      {kP4 + std::string("\x96\x02\0\0\0\0\0\0\0hi.", 12), Kind::kBytes, "hi"},  // BYTEARRAY8
  };
  for (const Case& c : cases) {
    auto doc = Parse(c.bytes);
    ASSERT_TRUE(doc.ok()) << doc.error().message;
    EXPECT_EQ(doc->root().kind(), c.kind);
    EXPECT_EQ(doc->AsString(doc->root()), c.text);
  }
}

TEST(PickleOpcodes, Containers) {
  // EMPTY_LIST MARK K1 K2 APPENDS, APPEND
  auto doc = Parse(kP4 +
                   "](K\x01K\x02"
                   "eK\x03"
                   "a.");
  ASSERT_TRUE(doc.ok()) << doc.error().message;
  EXPECT_EQ(doc->root().kind(), Kind::kList);
  EXPECT_EQ(doc->Size(doc->root()), 3u);
  // EMPTY_DICT SETITEM, SETITEMS
  doc = Parse(kP4 +
              "}\x8c\x01"
              "aK\x01s(\x8c\x01"
              "bK\x02\x8c\x01"
              "cK\x03u.");
  ASSERT_TRUE(doc.ok()) << doc.error().message;
  Value v;
  ASSERT_TRUE(doc->Find(doc->root(), "c", &v));
  EXPECT_EQ(v.inline_int(), 3);
  // DICT / LIST / TUPLE from a MARK, TUPLE1-3, EMPTY_TUPLE
  doc = Parse(kP4 +
              "(\x8c\x01kK\x07"
              "d.");
  ASSERT_TRUE(doc.ok() && doc->Find(doc->root(), "k", &v) && v.inline_int() == 7);
  doc = Parse(kP4 + "(K\x01K\x02l.");
  ASSERT_TRUE(doc.ok());
  EXPECT_EQ(doc->root().kind(), Kind::kList);
  EXPECT_EQ(doc->Size(doc->root()), 2u);
  for (const auto& [bytes, size] :
       std::vector<std::pair<std::string, uint64_t>>{{kP4 + "(K\x01K\x02K\x03K\x04t.", 4},
                                                     {kP4 + ").", 0},
                                                     {kP4 + "K\x01\x85.", 1},
                                                     {kP4 + "K\x01K\x02\x86.", 2},
                                                     {kP4 + "K\x01K\x02K\x03\x87.", 3}}) {
    doc = Parse(bytes);
    ASSERT_TRUE(doc.ok()) << doc.error().message;
    EXPECT_EQ(doc->root().kind(), Kind::kTuple);
    EXPECT_EQ(doc->Size(doc->root()), size);
  }
}

TEST(PickleOpcodes, StackOperations) {
  // POP, POP_MARK, DUP, and FRAME (a length hint, skipped).
  EXPECT_EQ(IntOf(kP4 + "K\x01K\x02"
                        "0."),
            1);
  EXPECT_EQ(IntOf(kP4 + "K\x05(K\x01K\x02"
                        "1."),
            5);
  auto doc = Parse(kP4 + "]2a.");  // a list appended to itself would be a cycle...
  EXPECT_FALSE(doc.ok());          // ...so DUP works and the cycle is caught
  EXPECT_EQ(IntOf(kP4 + std::string("\x95\x02\0\0\0\0\0\0\0K\x09.", 12)), 9);
  // POP of a MARK with nothing above it.
  EXPECT_EQ(IntOf(kP4 + "K\x04(0."), 4);
}

TEST(PickleOpcodes, MemoSharesValues) {
  // MEMOIZE / BINPUT / LONG_BINPUT and BINGET / LONG_BINGET all refer to the
  // same container: the document stores one list, referenced three times.
  auto doc = Parse(kP4 + Bytes("](]\x94h\x00q\x05j\x05\x00\x00\x00r\x07\x00\x00\x00h\x07"
                               "e."));
  ASSERT_TRUE(doc.ok()) << doc.error().message;
  std::vector<Value> items = Words(*doc, doc->root());
  ASSERT_EQ(items.size(), 4u);
  for (const Value& item : items) EXPECT_EQ(item, items[0]);
}

TEST(PickleOpcodes, RefusesCodeExecution) {
  const std::pair<std::string, std::string> cases[] = {
      {"cos\nsystem\n(S'echo'\ntR.", "GLOBAL"},
      {kP4 + "\x8c\x08"
             "builtins\x8c\x04"
             "eval\x93.",
       "STACK_GLOBAL"},
      {kP4 + "NN\x85R.", "REDUCE"},
      {kP4 + "}}b.", "BUILD"},
      {kP4 + "(ios\nsystem\n.", "INST"},
      {kP4 + "(No.", "OBJ"},
      {kP4 + "N)\x81.", "NEWOBJ"},
      {kP4 + "N)}\x92.", "NEWOBJ_EX"},
      {kP4 + "Pid\n.", "PERSID"},
      {kP4 + "NQ.", "BINPERSID"},
      {kP4 + "\x82\x01.", "EXT1"},
      {kP4 + Bytes("\x83\x01\x00."), "EXT2"},
      {kP4 + std::string("\x84\x01\0\0\0.", 6), "EXT4"},
  };
  for (const auto& [bytes, name] : cases) {
    const std::string error = ErrorOf(bytes);
    EXPECT_NE(error.find(name), std::string::npos) << error;
    EXPECT_NE(error.find("refused"), std::string::npos) << error;
  }
}

TEST(PickleOpcodes, RejectsUnsupportedAndUnknown) {
  EXPECT_NE(ErrorOf(kP4 + "\xff.").find("unknown pickle opcode 0xff"), std::string::npos);
  EXPECT_NE(ErrorOf(kP4 + "\x8f.").find("EMPTY_SET"), std::string::npos);
  EXPECT_NE(ErrorOf(kP4 + "I1\n.").find("protocol 0"), std::string::npos);
  EXPECT_NE(ErrorOf(std::string("\x80\x01N.", 4)).find("protocol 1"), std::string::npos);
  EXPECT_NE(ErrorOf("N.").find("no PROTO"), std::string::npos);
}

TEST(PickleOpcodes, MalformedStructure) {
  EXPECT_NE(ErrorOf(kP4 + "a.").find("APPEND needs"), std::string::npos);
  EXPECT_NE(ErrorOf(kP4 + "}Na.").find("APPEND applied to a dict"), std::string::npos);
  EXPECT_NE(ErrorOf(kP4 + "](Nu.").find("SETITEMS applied to a list"), std::string::npos);
  EXPECT_NE(ErrorOf(kP4 + "}(Nu.").find("odd number"), std::string::npos);
  EXPECT_NE(ErrorOf(kP4 + "e.").find("without a MARK"), std::string::npos);
  EXPECT_NE(ErrorOf(kP4 + ".").find("empty stack"), std::string::npos);
  EXPECT_NE(ErrorOf(kP4 + "h\x03.").find("never stored"), std::string::npos);
  EXPECT_NE(ErrorOf(kP4 + "N").find("before the STOP"), std::string::npos);
  EXPECT_NE(ErrorOf(kP4 + "\x8c\x09"
                          "ab.")
                .find("exceeds"),
            std::string::npos);
}

TEST(PickleOpcodes, MemoCyclesAreRejected) {
  EXPECT_NE(ErrorOf(kP4 + Bytes("]\x94h\x00"
                                "a."))
                .find("contains itself"),
            std::string::npos);
  EXPECT_NE(ErrorOf(kP4 + Bytes("}\x94\x8c\x01"
                                "ah\x00s."))
                .find("contains itself"),
            std::string::npos);
  EXPECT_NE(ErrorOf(kP4 + Bytes("]\x94]\x94h\x00"
                                "aa."))
                .find("contains itself"),
            std::string::npos);
}

// A trace entry dict {action: alloc, addr: 4096, size: 512} whose pairs follow
// a MARK, ready for SETITEMS ('u').
const std::string kEntryPairs = Bytes(
    "\x8c\x06"
    "action\x8c\x05"
    "alloc\x8c\x04"
    "addrM\x00\x10\x8c\x04"
    "sizeM\x00\x02");

TEST(PickleOpcodes, ACycleThroughATraceEntrysFramesIsRejected) {
  // frames = [entry]; entry["frames"] = frames (round 3: accepted with exit 0,
  // the entry being a record the graph walk did not enter).
  const std::string bytes = kP4 +
                            Bytes(
                                "]\x94}\x94"
                                "a0h\x01(") +
                            kEntryPairs +
                            Bytes(
                                "\x8c\x06"
                                "framesh\x00"
                                "u.");
  EXPECT_NE(ErrorOf(bytes).find("contains itself"), std::string::npos);
}

TEST(PickleLimits, CopiesOfATraceEntryAreChargedToTheMemoryBudget) {
  // [entry, entry, ...] through the memo: read as copies (layout_test's
  // SharedEntryDictReadsTwice), each charged what an entry costs once read.
  // 30 million such references made a 60 MB file run past 20 s and 2.8 GiB.
  const std::string twice = kP4 + Bytes("]\x94(}\x94(") + kEntryPairs +
                            Bytes(
                                "uh\x01"
                                "e.");
  EXPECT_TRUE(Parse(twice).ok());
  std::string many = kP4 + Bytes("]\x94(}\x94(") + kEntryPairs + "u";
  for (int i = 0; i < 100000; ++i) many += Bytes("h\x01");
  many += "e.";
  SnapshotReadLimits limits;
  limits.max_memory_bytes = 4 << 20;  // 100 000 copies need about 9.6 MB
  const std::string m = ErrorOf(many, limits);
  EXPECT_NE(m.find("max_memory_bytes"), std::string::npos) << m;
  EXPECT_NE(m.find("100000 references to trace entries already in a trace"), std::string::npos)
      << m;
}

TEST(PickleLimits, AMarkBombStopsAtTheDepthLimit) {
  // Open MARKs are containers being built, so no more than max_depth: 250 MB
  // of MARKs took 16 s and 2 GiB before its refusal.
  EXPECT_NE(ErrorOf(kP4 + std::string(1 << 20, '(') + ".").find("MARKs open at once"),
            std::string::npos);
  SnapshotReadLimits depth;
  depth.max_depth = 3;
  EXPECT_TRUE(Parse(kP4 + "(((NttNt.", depth).ok());
  EXPECT_NE(ErrorOf(kP4 + "((((NtttNt.", depth).find("max_depth"), std::string::npos);
}

TEST(PickleLimits, EachLimitStopsWithItsName) {
  SnapshotReadLimits depth;
  depth.max_depth = 3;
  EXPECT_NE(ErrorOf(kP4 + "]]]]aaa.", depth).find("max_depth"), std::string::npos);
  EXPECT_TRUE(Parse(kP4 + "]]]aa.", depth).ok());

  SnapshotReadLimits items;
  items.max_container_items = 2;
  EXPECT_NE(ErrorOf(kP4 + "](NNNe.", items).find("max_container_items"), std::string::npos);
  SnapshotReadLimits strings;
  strings.max_string_bytes = 1;
  EXPECT_NE(ErrorOf(kP4 + "\x8c\x02hi.", strings).find("max_string_bytes"), std::string::npos);
  SnapshotReadLimits memo;
  memo.max_memo_entries = 1;
  EXPECT_NE(ErrorOf(kP4 + "N\x94N\x94.", memo).find("max_memo_entries"), std::string::npos);
  SnapshotReadLimits stack;
  stack.max_stack_items = 2;
  EXPECT_NE(ErrorOf(kP4 + "NNN.", stack).find("max_stack_items"), std::string::npos);
  SnapshotReadLimits memory;
  memory.max_memory_bytes = 4096;
  EXPECT_NE(ErrorOf(kP4 + std::string(1000, ']') + ".", memory).find("max_memory_bytes"),
            std::string::npos);
}

TEST(PickleLimits, DeepNestingNeedsNoRecursion) {
  // 200000 nested lists: rejected by max_depth, without a deep call stack.
  const int n = 200000;
  const std::string bytes = kP4 + std::string(n, ']') + std::string(n - 1, 'a') + ".";
  EXPECT_NE(ErrorOf(bytes).find("max_depth"), std::string::npos);
}

TEST(PickleLimits, HugeLengthsAndIndicesCostNothing) {
  EXPECT_NE(ErrorOf(kP4 + std::string("\x8d\0\0\0\0\0\0\0\x10.", 10)).find("exceeds"),
            std::string::npos);
  EXPECT_NE(ErrorOf(kP4 + std::string("N\x94r\xfe\xff\xff\xff"
                                      "0j\xfe\xff\xff\xff"
                                      "0h\x07."))
                .find("never stored"),
            std::string::npos);
}

// The committed value pickles (tests/snapshots/make_snapshots.py,
// values_document()) as Python writes them at protocols 2-5.
class ValuesByProtocol : public ::testing::TestWithParam<int> {};

TEST_P(ValuesByProtocol, ReadsEveryValueKind) {
  const int proto = GetParam();
  const std::string bytes = ReadBytes(DataPath("values_p" + std::to_string(proto) + ".pickle"));
  int protocol = 0;
  auto doc = ParsePickle(bytes, "values", {}, &protocol);
  ASSERT_TRUE(doc.ok()) << doc.error().message;
  EXPECT_EQ(protocol, proto);
  const Value root = doc->root();
  Value v;
  ASSERT_TRUE(doc->Find(root, "none", &v));
  EXPECT_EQ(v.kind(), Kind::kNone);
  ASSERT_TRUE(doc->Find(root, "true", &v));
  EXPECT_TRUE(v.kind() == Kind::kBool && doc->AsBool(v));
  ASSERT_TRUE(doc->Find(root, "false", &v));
  EXPECT_TRUE(v.kind() == Kind::kBool && !doc->AsBool(v));
  ASSERT_TRUE(doc->Find(root, "ints", &v));
  std::vector<Value> ints = Words(*doc, v);
  ASSERT_EQ(ints.size(), 22u);
  const int64_t small[] = {0,
                           1,
                           255,
                           256,
                           65535,
                           65536,
                           -1,
                           -(int64_t{1} << 31),
                           (int64_t{1} << 31) - 1,
                           int64_t{1} << 31,
                           -(int64_t{1} << 31) - 1,
                           (int64_t{1} << 59) - 1,
                           int64_t{1} << 59,
                           -(int64_t{1} << 59),
                           -(int64_t{1} << 59) - 1,
                           INT64_MAX,
                           INT64_MIN};
  for (size_t i = 0; i < std::size(small); ++i) {
    int64_t got = 0;
    ASSERT_TRUE(doc->ToInt64(ints[i], &got)) << i;
    EXPECT_EQ(got, small[i]) << i;
  }
  uint64_t u = 0;
  ASSERT_TRUE(doc->ToUint64(ints[17], &u));
  EXPECT_EQ(u, UINT64_MAX);
  EXPECT_TRUE(doc->AsBigInt(ints[18]).overflow);  // 2^64
  EXPECT_TRUE(doc->AsBigInt(ints[19]).overflow);  // -2^64
  EXPECT_TRUE(doc->AsBigInt(ints[20]).overflow);  // 2^200 (LONG1)
  EXPECT_TRUE(doc->AsBigInt(ints[21]).overflow);  // 2^2100 (LONG4)
  ASSERT_TRUE(doc->Find(root, "float", &v));
  EXPECT_EQ(doc->AsFloat(v), 0.1);
  ASSERT_TRUE(doc->Find(root, "neg_float", &v));
  EXPECT_EQ(doc->AsFloat(v), -2.5e300);
  ASSERT_TRUE(doc->Find(root, "long_str", &v));
  EXPECT_EQ(doc->AsString(v), std::string(300, 'x'));
  ASSERT_TRUE(doc->Find(root, "unicode", &v));
  EXPECT_EQ(doc->AsString(v), "\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80");
  for (const char* key : {"empty_list", "empty_dict", "empty_tuple"}) {
    ASSERT_TRUE(doc->Find(root, key, &v)) << key;
    EXPECT_EQ(doc->Size(v), 0u);
  }
  ASSERT_TRUE(doc->Find(root, "tuple4", &v));
  EXPECT_EQ(v.kind(), Kind::kTuple);
  EXPECT_EQ(doc->Size(v), 4u);
  ASSERT_TRUE(doc->Find(root, "big_list", &v));
  std::vector<Value> big = Words(*doc, v);
  ASSERT_EQ(big.size(), 1100u);
  EXPECT_EQ(big[1099].inline_int(), 1099 % 200);
  ASSERT_TRUE(doc->Find(root, "big_dict", &v));
  EXPECT_EQ(doc->Size(v), 2002u);
  Value a, b;
  ASSERT_TRUE(doc->Find(root, "shared_a", &a) && doc->Find(root, "shared_b", &b));
  EXPECT_EQ(a, b);  // one object, two references: one memo entry
  ASSERT_TRUE(doc->Find(root, "nested", &v));
  EXPECT_EQ(v.kind(), Kind::kDict);
  if (proto >= 3) {
    ASSERT_TRUE(doc->Find(root, "bytes", &v));
    EXPECT_EQ(v.kind(), Kind::kBytes);
    EXPECT_EQ(doc->AsString(v), std::string("\x00\x01"
                                            "binary",
                                            8));
    ASSERT_TRUE(doc->Find(root, "long_bytes", &v));
    EXPECT_EQ(doc->AsString(v).size(), 300u);
  }
  if (proto >= 5) {
    ASSERT_TRUE(doc->Find(root, "bytearray", &v));
    EXPECT_EQ(doc->AsString(v), "ba");
  }
}

INSTANTIATE_TEST_SUITE_P(Protocols, ValuesByProtocol, ::testing::Values(2, 3, 4, 5));

TEST(PickleRobustness, EveryPrefixOfASnapshotIsAnErrorNotACrash) {
  const std::string bytes = ReadBytes(DataPath("train_p4.pickle"));
  ASSERT_GT(bytes.size(), 1000u);
  for (size_t n = 0; n < bytes.size(); n += 7) {
    auto doc = Parse(bytes.substr(0, n));
    EXPECT_FALSE(doc.ok()) << n;
  }
  EXPECT_TRUE(Parse(bytes).ok());
}

TEST(PickleRobustness, EverySingleByteFlipIsHandled) {
  const std::string bytes = ReadBytes(DataPath("train_1step_p4.pickle"));
  for (size_t i = 0; i < bytes.size(); i += 3) {
    std::string mutated = bytes;
    mutated[i] = static_cast<char>(mutated[i] ^ 0x5a);
    auto snap = ParseSnapshot(mutated, "flip");  // ok or an Error; never a crash
    if (!snap.ok()) {
      EXPECT_EQ(snap.error().message.find('\n'), std::string::npos);
    }
  }
}

}  // namespace
}  // namespace vramscope::snapshot
