// The two readers of snapshot files, both building a Document
// (document.h), and the graph check they share.
//
// Neither reader executes anything: the pickle reader implements only the
// opcodes Python's pickler (protocols 2-5) and torch::jit::Pickler emit for
// dicts, lists, tuples, str, bytes, int, float, bool and None, and refuses
// every opcode that would import or call a Python object (GLOBAL,
// STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ, NEWOBJ_EX, PERSID,
// BINPERSID, EXT*), naming it and its byte offset.
#pragma once

#include <string>
#include <string_view>

#include "document.h"
#include "vramscope/result.h"
#include "vramscope/snapshot.h"

namespace vramscope::snapshot {

// Where a reader has got to in its input, so that a memory-mapped file can
// drop the pages behind it (a Document copies what it keeps).
class InputWindow {
 public:
  virtual ~InputWindow() = default;
  // Nothing before `offset` will be read again.
  virtual void Consumed(uint64_t offset) = 0;
};

// Parses one pickle. Bytes after its STOP are an error (pickle.load would
// ignore them; a snapshot file is one pickle, and garbage appended to a
// valid one must not pass unnoticed). Errors: "NAME: offset N: problem". `protocol` receives
// the PROTO number. Dicts that decode as trace entries become entries
// (unless limits.compact_trace_entries is false). `window`, if given, is
// told as the input is consumed.
Result<Document> ParsePickle(std::string_view bytes, std::string_view name,
                             const SnapshotReadLimits& limits, int* protocol,
                             InputWindow* window = nullptr);

// True for a byte that is a pickle opcode of any protocol (format sniffing).
bool IsPickleOpcode(unsigned char byte);

// Parses JSON text (the same structure, as MemoryViz.js accepts it).
// Errors: "NAME: JSON: problem at byte N". The Document owns its strings.
Result<Document> ParseJson(std::string_view text, std::string_view name,
                           const SnapshotReadLimits& limits);

// Checks the structure PyTorch writes and converts it (docs/snapshot.md),
// taking over the document's trace entries and streams.
// Errors: "NAME: segments[3].blocks[0].size: problem".
// `shared_containers`: true for pickles (memo references share containers).
Result<Snapshot> ExtractSnapshot(Document& doc, std::string_view name, std::string format,
                                 bool shared_containers);

// Rejects segments that no allocator state can have (docs/hardening.md,
// "Consistency"): two segments of one device that overlap, or whose sizes sum
// past 2^64 on one device. A segment's own blocks are checked as it is read.
// Errors: "NAME: segments[3]: problem".
Status CheckSegmentLayout(const std::vector<SnapshotSegment>& segments, std::string_view name);

// Rejects a Document whose containers nest deeper than `max_depth` or contain
// themselves (a pickle memo can build cycles), from the root and from the
// trace entries' frames. O(containers + words), no recursion.
// Errors: "NAME: problem".
Status CheckGraph(const Document& doc, std::string_view name, uint32_t max_depth);

// The memory the readers may use for `input_bytes` of input under `limits`.
uint64_t MemoryBudgetBytes(const SnapshotReadLimits& limits, uint64_t input_bytes);

}  // namespace vramscope::snapshot
