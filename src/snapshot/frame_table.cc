#include "frame_table.h"

#include <fmt/format.h>

namespace vramscope::snapshot {

FrameTable::FrameTable(const Document& doc, std::vector<SnapshotFrame>* frames,
                       std::vector<std::vector<uint32_t>>* stacks, bool shared_containers)
    : doc_(doc), by_identity_(shared_containers), frames_(frames), stacks_(stacks) {
  if (stacks_->empty()) stacks_->emplace_back();
  stack_by_content_.emplace(std::vector<uint32_t>{}, 0);
}

size_t FrameTable::VectorHash::operator()(const std::vector<uint32_t>& v) const {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the indices
  for (uint32_t x : v) {
    h ^= x;
    h *= 1099511628211ull;
  }
  return static_cast<size_t>(h);
}

Result<uint32_t> FrameTable::InternFrame(Value dict, uint64_t position) {
  if (dict.kind() == Kind::kEntry || (dict.kind() == Kind::kDict && doc_.IsForwarded(dict))) {
    return MakeError(fmt::format(
        "[{}]: a trace entry (a dict with \"action\") where a frame is expected", position));
  }
  if (dict.kind() != Kind::kDict) {
    return MakeError(
        fmt::format("[{}]: expected a frame dict, got {}", position, KindName(dict.kind())));
  }
  if (auto it = frame_by_dict_.find(dict.bits()); it != frame_by_dict_.end()) return it->second;
  SnapshotFrame frame;
  Value v;
  if (doc_.Find(dict, "name", &v)) {
    if (v.kind() != Kind::kStr) {
      return MakeError(
          fmt::format("[{}].name: expected a str, got {}", position, KindName(v.kind())));
    }
    frame.name = std::string(doc_.AsString(v));
  }
  if (doc_.Find(dict, "filename", &v)) {
    if (v.kind() != Kind::kStr) {
      return MakeError(
          fmt::format("[{}].filename: expected a str, got {}", position, KindName(v.kind())));
    }
    frame.filename = std::string(doc_.AsString(v));
  }
  if (doc_.Find(dict, "line", &v) && !doc_.ToInt64(v, &frame.line)) {
    return MakeError(
        fmt::format("[{}].line: expected an int, got {}", position, KindName(v.kind())));
  }
  std::string key = frame.name;
  key.push_back('\0');
  key += frame.filename;
  key.push_back('\0');
  key += std::to_string(frame.line);
  uint32_t index;
  if (auto it = frame_by_content_.find(key); it != frame_by_content_.end()) {
    index = it->second;
  } else {
    index = static_cast<uint32_t>(frames_->size());
    frames_->push_back(std::move(frame));
    frame_by_content_.emplace(std::move(key), index);
  }
  if (by_identity_) frame_by_dict_.emplace(dict.bits(), index);
  return index;
}

Result<uint32_t> FrameTable::Intern(Value list) {
  CacheSlot& slot = recent_[(list.bits() >> 4) & (recent_.size() - 1)];
  if (slot.bits == list.bits() && by_identity_) return slot.stack;
  if (auto it = stack_by_list_.find(list.bits()); it != stack_by_list_.end()) {
    slot = CacheSlot{list.bits(), it->second};
    return it->second;
  }
  scratch_.clear();
  uint64_t position = 0;
  Error error;
  bool failed = false;
  doc_.ForEachWord(list, [&](Value frame) {
    if (failed) return;
    Result<uint32_t> index = InternFrame(frame, position++);
    if (!index.ok()) {
      error = index.error();
      failed = true;
      return;
    }
    scratch_.push_back(*index);
  });
  if (failed) return error;
  uint32_t stack;
  if (auto it = stack_by_content_.find(scratch_); it != stack_by_content_.end()) {
    stack = it->second;
  } else {
    if (stacks_->size() >= 0xffffffffu) return MakeError("too many distinct stacks");
    stack = static_cast<uint32_t>(stacks_->size());
    stacks_->push_back(scratch_);
    stack_by_content_.emplace(scratch_, stack);
  }
  if (by_identity_) {
    stack_by_list_.emplace(list.bits(), stack);
    slot = CacheSlot{list.bits(), stack};
  }
  return stack;
}

}  // namespace vramscope::snapshot
