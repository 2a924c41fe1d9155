// FrameTable: stack traces of a snapshot, stored once each.
//
// PyTorch's py_symbolize (torch/csrc/profiler/python/combined_traceback.cpp)
// already shares one frame dict per distinct frame and one list per distinct
// traceback, which a pickle keeps as memo references; a JSON file repeats
// them in full. Interning by container identity first (free for pickles) and
// by content second (for JSON) makes both cost one entry per distinct stack.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "document.h"
#include "vramscope/result.h"
#include "vramscope/snapshot.h"

namespace vramscope::snapshot {

class FrameTable {
 public:
  // Appends to `frames` and `stacks`; stacks[0] is made the empty stack.
  // `shared_containers`: the document may reference one container many
  // times (pickle memo), so caching by identity pays; JSON never does, and
  // the cache would only grow.
  FrameTable(const Document& doc, std::vector<SnapshotFrame>* frames,
             std::vector<std::vector<uint32_t>>* stacks, bool shared_containers);

  // `list`: a list or tuple of frame dicts {name, filename, line}. Returns
  // the stack's index (0 for an empty list). Errors are relative to the
  // list: "[2].name: expected a str, got int".
  Result<uint32_t> Intern(Value list);

 private:
  Result<uint32_t> InternFrame(Value dict, uint64_t position);

  struct VectorHash {
    size_t operator()(const std::vector<uint32_t>& v) const;
  };

  const Document& doc_;
  bool by_identity_;
  std::vector<SnapshotFrame>* frames_;
  std::vector<std::vector<uint32_t>>* stacks_;
  std::unordered_map<uint64_t, uint32_t> stack_by_list_;
  // In front of stack_by_list_: most entries reuse a few hundred lists.
  struct CacheSlot {
    uint64_t bits = 0;
    uint32_t stack = 0;
  };
  std::vector<CacheSlot> recent_ = std::vector<CacheSlot>(1024);
  std::unordered_map<uint64_t, uint32_t> frame_by_dict_;
  std::unordered_map<std::string, uint32_t> frame_by_content_;
  std::unordered_map<std::vector<uint32_t>, uint32_t, VectorHash> stack_by_content_;
  std::vector<uint32_t> scratch_;
};

}  // namespace vramscope::snapshot
