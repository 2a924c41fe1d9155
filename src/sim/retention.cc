#include "vramscope/retention.h"

#include <unordered_map>
#include <vector>

namespace vramscope {

EventStream RetainGraphUntilEnd(const EventStream& in) {
  EventStream out;
  // Same string table, same indices: AppendString keeps each index.
  for (size_t i = 1; i < in.strings().size(); ++i) out.AppendString(in.strings()[i]);
  out.metadata() = in.metadata();
  out.Reserve(in.size());

  struct Live {
    uint64_t new_id;
    Category category;
  };
  std::unordered_map<uint64_t, Live> live;  // input id -> renumbered allocation
  std::vector<uint64_t> deferred;           // renumbered ids freed at the phase end
  uint64_t next_id = 1;
  Phase phase = Phase::kSetup;

  auto flush = [&] {
    for (uint64_t id : deferred) out.Free(id);
    deferred.clear();
  };
  for (const Event& e : in.events()) {
    switch (e.kind) {
      case EventKind::kAlloc: {
        const uint64_t id = next_id++;
        live[e.id] = Live{id, e.category};
        out.AllocInterned(id, e.size_bytes, e.category, e.op, e.module, e.stream);
        break;
      }
      case EventKind::kFree: {
        auto it = live.find(e.id);
        if (it == live.end()) break;  // not a valid stream; Validate() would have said so
        const Live l = it->second;
        live.erase(it);
        const bool autograd_owned =
            l.category != Category::kParameters && l.category != Category::kOptimizerState;
        if (phase == Phase::kBackward && autograd_owned) {
          deferred.push_back(l.new_id);
        } else {
          out.Free(l.new_id);
        }
        break;
      }
      case EventKind::kPhase:
        flush();
        phase = e.phase;
        out.BeginPhase(e.step, e.phase);
        break;
      case EventKind::kEmptyCache: out.EmptyCache(); break;
    }
  }
  flush();
  return out;
}

}  // namespace vramscope
