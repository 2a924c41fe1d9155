#include "vramscope/saved_activations.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <unordered_map>

#include <fmt/format.h>

namespace vramscope {
namespace {

bool IsNumber(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isdigit(static_cast<unsigned char>(c)) != 0;
  });
}

struct LiveAlloc {
  uint64_t bytes = 0;
  uint32_t op = 0;
  uint32_t module = 0;
  uint64_t event = 0;  // its position in the stream
};

// Sums by key, keys in the order first seen.
class Sums {
 public:
  void Add(std::string key, uint64_t bytes) {
    auto [it, inserted] = index_.try_emplace(std::move(key), rows_.size());
    if (inserted) rows_.emplace_back(it->first, 0);
    rows_[it->second].second += bytes;
  }
  // Largest first; equal sums keep the order first seen (layer 2 before layer 10).
  std::vector<std::pair<std::string, uint64_t>> LargestFirst() && {
    std::stable_sort(rows_.begin(), rows_.end(),
                     [](const auto& a, const auto& b) { return a.second > b.second; });
    return std::move(rows_);
  }

 private:
  std::map<std::string, size_t> index_;
  std::vector<std::pair<std::string, uint64_t>> rows_;
};

SavedActivations Group(const EventStream& stream,
                       const std::unordered_map<uint64_t, LiveAlloc>& live, uint32_t step) {
  std::vector<const LiveAlloc*> in_order;
  in_order.reserve(live.size());
  for (const auto& [id, a] : live) in_order.push_back(&a);
  std::sort(in_order.begin(), in_order.end(),
            [](const LiveAlloc* a, const LiveAlloc* b) { return a->event < b->event; });
  SavedActivations out;
  out.step = step;
  Sums blocks, layers, ops;
  for (const LiveAlloc* a : in_order) {
    out.total_bytes += a->bytes;
    blocks.Add(BlockOf(stream.String(a->module)), a->bytes);
    layers.Add(LayerTypeOf(stream.String(a->module)), a->bytes);
    const std::string_view op = stream.String(a->op);
    ops.Add(op.empty() ? std::string("(no op)") : std::string(op), a->bytes);
  }
  out.by_block = std::move(blocks).LargestFirst();
  out.by_layer = std::move(layers).LargestFirst();
  out.by_op = std::move(ops).LargestFirst();
  return out;
}

}  // namespace

std::string BlockOf(std::string_view module) {
  if (module.empty()) return "(no module)";
  if (module == "mid_block" || module.starts_with("mid_block.")) return "mid_block";
  size_t start = 0;
  std::string_view previous;
  while (start <= module.size()) {
    const size_t dot = std::min(module.find('.', start), module.size());
    const std::string_view part = module.substr(start, dot - start);
    if (IsNumber(part) && !previous.empty()) return std::string(module.substr(0, dot));
    previous = part;
    start = dot + 1;
  }
  return std::string(module.substr(0, module.find('.')));
}

std::string LayerTypeOf(std::string_view module) {
  if (module.empty()) return "(no module)";
  std::vector<std::string_view> named;
  size_t start = 0;
  while (start <= module.size()) {
    const size_t dot = std::min(module.find('.', start), module.size());
    const std::string_view part = module.substr(start, dot - start);
    if (!part.empty() && !IsNumber(part)) named.push_back(part);
    start = dot + 1;
  }
  if (named.empty()) return std::string(module);
  if (named.size() == 1) return std::string(named[0]);
  return fmt::format("{}.{}", named[named.size() - 2], named.back());
}

std::optional<SavedActivations> SavedAtEndOfForward(const EventStream& stream) {
  // Only activation allocations are tracked: the rest never counts.
  std::unordered_map<uint64_t, LiveAlloc> live;
  uint64_t live_bytes = 0;
  Phase phase = Phase::kSetup;
  std::optional<SavedActivations> best;
  const std::vector<Event>& events = stream.events();
  for (uint64_t i = 0; i < events.size(); ++i) {
    const Event& e = events[i];
    switch (e.kind) {
      case EventKind::kPhase:
        if (phase == Phase::kForward && e.phase == Phase::kBackward && live_bytes > 0 &&
            (!best || live_bytes > best->total_bytes)) {
          best = Group(stream, live, e.step);
        }
        phase = e.phase;
        break;
      case EventKind::kAlloc:
        if (e.category == Category::kActivations) {
          live[e.id] = {e.size_bytes, e.op, e.module, i};
          live_bytes += e.size_bytes;
        }
        break;
      case EventKind::kFree:
        if (auto it = live.find(e.id); it != live.end()) {
          live_bytes -= it->second.bytes;
          live.erase(it);
        }
        break;
      default: break;
    }
  }
  return best;
}

}  // namespace vramscope
