// CheckGraph: no cycles, bounded nesting, in one pass without recursion.
//
// A pickle memo can make a list that contains itself (Python's pickler does
// so for self-referencing objects); walking such a value naively never ends.
// Depth-first search with three colours finds a container reached again
// while it is still open; each container's height (its deepest nesting) is
// kept, so a DAG with shared frame lists is walked once per container.
#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "readers.h"

namespace vramscope::snapshot {
namespace {

constexpr uint16_t kWhite = 0;
constexpr uint16_t kGray = 0xffff;

struct Frame {
  uint64_t container;     // index
  size_t children_begin;  // this frame's container children are
  size_t children_end;    //   aux[children_begin, children_end)
  size_t next;            // next child to look at
  uint16_t max_child_height;
};

// The containers directly inside container `index`, appended to *out. A
// trace entry is a record, not a container, but its frames are its child: a
// cycle may pass through it (frames holding the entry itself), and a dict
// forwarded to an entry has the entry's frames as its child.
void AppendChildren(const Document& doc, uint64_t index, std::vector<uint64_t>* out) {
  auto frames_of = [&](uint64_t entry) {
    const Value f = doc.EntryFrames(entry);
    if (f.is_container()) out->push_back(f.payload());
  };
  uint64_t entry = 0;
  if (doc.ForwardedEntry(Value::Make(Kind::kDict, index), &entry)) frames_of(entry);
  doc.ForEachWord(Value::Make(Kind::kList, index), [&](Value w) {
    if (w.is_container()) out->push_back(w.payload());
    if (w.kind() == Kind::kEntry) frames_of(w.payload());
  });
}

}  // namespace

Status CheckGraph(const Document& doc, std::string_view name, uint32_t max_depth) {
  // Heights above 0xfffe cannot be stored; the limit is far below that.
  const uint32_t limit = std::min<uint32_t>(max_depth, 0xfff0);
  std::vector<uint16_t> state(doc.num_containers(), kWhite);
  std::vector<uint64_t> aux;  // container children of the open frames
  std::vector<Frame> frames;

  auto open = [&](uint64_t index) -> Status {
    if (frames.size() >= limit) {
      return MakeError(
          fmt::format("{}: values nest deeper than {} levels (max_depth)", name, limit));
    }
    state[index] = kGray;
    Frame f{index, aux.size(), 0, aux.size(), 0};
    AppendChildren(doc, index, &aux);
    f.children_end = aux.size();
    frames.push_back(f);
    return Ok{};
  };

  auto walk = [&](uint64_t start) -> Status {
    if (state[start] != kWhite) return Ok{};
    if (Status s = open(start); !s.ok()) return s;
    while (!frames.empty()) {
      Frame& top = frames.back();
      if (top.next < top.children_end) {
        const uint64_t child = aux[top.next++];
        const uint16_t child_state = state[child];
        if (child_state == kGray) {
          return MakeError(fmt::format(
              "{}: a container contains itself (a memo reference cycle); a snapshot is a tree "
              "of plain values",
              name));
        }
        if (child_state == kWhite) {
          if (Status s = open(child); !s.ok()) return s;
        } else {
          top.max_child_height = std::max(top.max_child_height, child_state);
        }
        continue;
      }
      const auto height = static_cast<uint16_t>(top.max_child_height + 1);
      if (height > limit) {
        return MakeError(
            fmt::format("{}: values nest deeper than {} levels (max_depth)", name, limit));
      }
      state[top.container] = height;
      aux.resize(top.children_begin);  // drop this frame's children
      frames.pop_back();
      if (!frames.empty()) {
        frames.back().max_child_height = std::max(frames.back().max_child_height, height);
      }
    }
    return Ok{};
  };

  const Value root = doc.root();
  if (root.is_container()) {
    if (Status s = walk(root.payload()); !s.ok()) return s;
  }
  // Trace entries are records, not containers; their frames lists are read
  // after parsing, so they are walked too.
  for (uint64_t e = 0; e < doc.num_entries(); ++e) {
    const Value f = doc.EntryFrames(e);
    if (f.is_container()) {
      if (Status s = walk(f.payload()); !s.ok()) return s;
    }
  }
  return Ok{};
}

}  // namespace vramscope::snapshot
