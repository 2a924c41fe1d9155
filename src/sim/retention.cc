#include "vramscope/retention.h"

#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace vramscope {
namespace {

// Rewrites a stream so that autograd-owned tensors freed in backward stay
// until the phase ends. Ids are renumbered, as a deferred free may outlive
// the input id's reuse.
class Retainer {
 public:
  explicit Retainer(const EventStream& in) {
    // Same string table, same indices: AppendString keeps each index.
    for (size_t i = 1; i < in.strings().size(); ++i) out_.AppendString(in.strings()[i]);
    out_.metadata() = in.metadata();
    out_.Reserve(in.size());
  }

  void Apply(const Event& e) {
    switch (e.kind) {
      case EventKind::kAlloc: {
        const uint64_t id = next_id_++;
        live_[e.id] = Live{id, e.category};
        out_.AllocInterned(id, e.size_bytes, e.category, e.op, e.module, e.stream);
        break;
      }
      case EventKind::kFree: Free(e.id); break;
      case EventKind::kPhase:
        Flush();
        phase_ = e.phase;
        out_.BeginPhase(e.step, e.phase);
        break;
      case EventKind::kEmptyCache: out_.EmptyCache(); break;
      case EventKind::kRecordStream:
        if (auto it = live_.find(e.id); it != live_.end()) {
          used_.insert(e.id);
          out_.RecordStream(it->second.new_id, e.stream);
        }
        break;
      case EventKind::kUsesDone: UsesDone(e.id); break;
    }
  }

  EventStream Finish() {
    Flush();
    return std::move(out_);
  }

 private:
  struct Live {
    uint64_t new_id;
    Category category;
  };

  void Free(uint64_t id) {
    auto it = live_.find(id);
    if (it == live_.end()) return;  // not a valid stream; Validate() would have said so
    const Live l = it->second;
    live_.erase(it);
    const bool autograd_owned =
        l.category != Category::kParameters && l.category != Category::kOptimizerState;
    const bool defer = phase_ == Phase::kBackward && autograd_owned;
    if (defer) {
      deferred_.push_back(l.new_id);
    } else {
      out_.Free(l.new_id);
    }
    if (used_.erase(id) != 0) {
      freed_[id] = l.new_id;
      if (defer) deferred_used_.insert(l.new_id);
    }
  }

  // A `x` of a deferred free waits until that free is written.
  void UsesDone(uint64_t id) {
    auto it = freed_.find(id);
    if (it == freed_.end()) return;
    if (deferred_used_.count(it->second) != 0) {
      deferred_done_.push_back(it->second);
    } else {
      out_.UsesDone(it->second);
    }
    freed_.erase(it);
  }

  void Flush() {
    for (uint64_t id : deferred_) out_.Free(id);
    for (uint64_t id : deferred_done_) out_.UsesDone(id);
    deferred_.clear();
    deferred_done_.clear();
    deferred_used_.clear();
  }

  EventStream out_;
  std::unordered_map<uint64_t, Live> live_;  // input id -> renumbered allocation
  std::vector<uint64_t> deferred_;           // renumbered ids freed at the phase end
  // Input ids used on another stream while live; then input id -> renumbered
  // id of its free, for `x` records. Only used ids are kept.
  std::unordered_set<uint64_t> used_;
  std::unordered_map<uint64_t, uint64_t> freed_;
  std::unordered_set<uint64_t> deferred_used_;  // renumbered, deferred and used
  std::vector<uint64_t> deferred_done_;
  uint64_t next_id_ = 1;
  Phase phase_ = Phase::kSetup;
};

}  // namespace

EventStream RetainGraphUntilEnd(const EventStream& in) {
  Retainer retainer(in);
  for (const Event& e : in.events()) retainer.Apply(e);
  return retainer.Finish();
}

}  // namespace vramscope
