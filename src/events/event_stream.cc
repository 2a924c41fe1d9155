// EventStream builders, string interning, phases and Validate().
#include "vramscope/event_stream.h"

#include <algorithm>
#include <array>

#include <fmt/format.h>

#include "live_id_set.h"

namespace vramscope {
namespace {

constexpr std::array<std::string_view, kNumPhases> kPhaseNames = {"setup", "forward", "backward",
                                                                  "optimizer"};

std::string DescribeEvent(size_t index, const Event& e) {
  switch (e.kind) {
    case EventKind::kAlloc: return fmt::format("event {} (alloc id {})", index, e.id);
    case EventKind::kFree: return fmt::format("event {} (free id {})", index, e.id);
    case EventKind::kPhase: return fmt::format("event {} (phase)", index);
    case EventKind::kEmptyCache: return fmt::format("event {} (empty cache)", index);
    case EventKind::kRecordStream:
      return fmt::format("event {} (record stream id {})", index, e.id);
    case EventKind::kUsesDone: return fmt::format("event {} (uses done id {})", index, e.id);
  }
  return fmt::format("event {}", index);
}

}  // namespace

std::string_view PhaseName(Phase p) {
  const auto index = static_cast<size_t>(p);
  return index < kPhaseNames.size() ? kPhaseNames[index] : std::string_view("setup");
}

bool ParsePhase(std::string_view text, Phase* out) {
  for (size_t i = 0; i < kPhaseNames.size(); ++i) {
    if (text == kPhaseNames[i]) {
      *out = static_cast<Phase>(i);
      return true;
    }
  }
  return false;
}

EventStream::EventStream() { strings_.emplace_back(); }

void EventStream::Alloc(uint64_t id, uint64_t size_bytes, Category category, std::string_view op,
                        std::string_view module, uint32_t stream) {
  const uint32_t op_index = Intern(op);
  const uint32_t module_index = Intern(module);
  AllocInterned(id, size_bytes, category, op_index, module_index, stream);
}

void EventStream::AllocInterned(uint64_t id, uint64_t size_bytes, Category category, uint32_t op,
                                uint32_t module, uint32_t stream) {
  Event e;
  e.kind = EventKind::kAlloc;
  e.category = category;
  e.stream = stream;
  e.op = op;
  e.module = module;
  e.id = id;
  e.size_bytes = size_bytes;
  events_.push_back(e);
}

void EventStream::Free(uint64_t id) {
  Event e;
  e.kind = EventKind::kFree;
  e.id = id;
  events_.push_back(e);
}

void EventStream::BeginPhase(uint32_t step, Phase phase) {
  Event e;
  e.kind = EventKind::kPhase;
  e.phase = phase;
  e.step = step;
  events_.push_back(e);
}

void EventStream::EmptyCache() {
  Event e;
  e.kind = EventKind::kEmptyCache;
  events_.push_back(e);
}

void EventStream::RecordStream(uint64_t id, uint32_t stream) {
  Event e;
  e.kind = EventKind::kRecordStream;
  e.id = id;
  e.stream = stream;
  events_.push_back(e);
}

void EventStream::UsesDone(uint64_t id) {
  Event e;
  e.kind = EventKind::kUsesDone;
  e.id = id;
  events_.push_back(e);
}

bool UsesStreamRecords(const std::vector<Event>& events) {
  return std::any_of(events.begin(), events.end(), [](const Event& e) {
    return e.kind == EventKind::kRecordStream || e.kind == EventKind::kUsesDone;
  });
}

uint32_t EventStream::Intern(std::string_view text) {
  if (text.empty()) return 0;
  // Fibonacci hashing of the pointer picks one of the 64 recent slots.
  const uint64_t pointer = reinterpret_cast<uintptr_t>(text.data());
  RecentString& recent = recent_[(pointer * 0x9e3779b97f4a7c15ULL) >> 58];
  if (recent.data == text.data() && recent.size == text.size() &&
      std::string_view(strings_[recent.index]) == text) {
    return recent.index;
  }
  const auto it = string_index_.find(text);
  const uint32_t index = it != string_index_.end() ? it->second : AppendString(text);
  recent = {text.data(), text.size(), index};
  return index;
}

uint32_t EventStream::AppendString(std::string_view text) {
  const auto index = static_cast<uint32_t>(strings_.size());
  strings_.emplace_back(text);
  string_index_.emplace(strings_.back(), index);  // keeps the first index of equal text
  return index;
}

namespace {

Status ValidateAlloc(size_t i, const Event& e, size_t num_strings) {
  if (e.size_bytes > kMaxSizeBytes) {
    return MakeError(fmt::format("{}: size {} bytes is above the limit of 2^62 bytes",
                                 DescribeEvent(i, e), e.size_bytes));
  }
  if (e.op >= num_strings || e.module >= num_strings) {
    return MakeError(fmt::format("{}: string index {} is not defined ({} strings)",
                                 DescribeEvent(i, e), e.op >= num_strings ? e.op : e.module,
                                 num_strings));
  }
  if (static_cast<size_t>(e.category) >= kNumCategories) {
    return MakeError(fmt::format("{}: category {} is out of range", DescribeEvent(i, e),
                                 static_cast<int>(e.category)));
  }
  return Ok{};
}

}  // namespace

Status EventStream::Validate() const {
  events_internal::LiveIdSet live;
  events_internal::StreamUseTracker uses;
  for (size_t i = 0; i < events_.size(); ++i) {
    const Event& e = events_[i];
    switch (e.kind) {
      case EventKind::kAlloc:
        if (Status ok = ValidateAlloc(i, e, strings_.size()); !ok.ok()) return ok;
        if (!live.Insert(e.id)) {
          return MakeError(fmt::format("{}: id {} is already live", DescribeEvent(i, e), e.id));
        }
        break;
      case EventKind::kFree:
      case EventKind::kRecordStream:
        if (!live.Contains(e.id)) {
          return MakeError(fmt::format("{}: id {} is not live", DescribeEvent(i, e), e.id));
        }
        if (e.kind == EventKind::kRecordStream) {
          uses.Use(e.id);
        } else {
          live.Erase(e.id);
          uses.Free(e.id);
        }
        break;
      case EventKind::kUsesDone:
        if (!uses.Done(e.id)) {
          return MakeError(
              fmt::format("{}: id {} was not freed after a stream use", DescribeEvent(i, e), e.id));
        }
        break;
      case EventKind::kPhase:
        if (static_cast<size_t>(e.phase) >= kNumPhases) {
          return MakeError(fmt::format("{}: phase {} is out of range", DescribeEvent(i, e),
                                       static_cast<int>(e.phase)));
        }
        break;
      case EventKind::kEmptyCache: break;
      default:
        return MakeError(
            fmt::format("event {}: kind {} is out of range", i, static_cast<int>(e.kind)));
    }
  }
  return Ok{};
}

}  // namespace vramscope
