// The measured allocation stream as an event stream, for the allocator model.
#include <fmt/format.h>

#include <algorithm>
#include <unordered_map>

#include "reconstruct.h"
#include "vramscope/snapshot.h"

namespace vramscope {

AllocatorConfig SnapshotAllocatorConfig(const Snapshot& snapshot) {
  if (snapshot.settings) return snapshot.settings->config;
  // Before allocator_settings was recorded (torch < 2.5): PyTorch's defaults,
  // with expandable segments if the segments say so.
  AllocatorConfig config;
  for (const SnapshotSegment& s : snapshot.segments) {
    if (s.expandable) config.expandable_segments = true;
  }
  for (const auto& trace : snapshot.device_traces) {
    for (const TraceEntry e : trace) {
      if (e.action == TraceAction::kSegmentMap) {
        config.expandable_segments = true;
        break;
      }
    }
  }
  if (config.expandable_segments) config.text = "expandable_segments:True";
  return config;
}

Result<EventStream> SnapshotToEventStream(const Snapshot& snapshot, int device) {
  auto chosen = snapshot::ChooseDevice(snapshot, device);
  if (!chosen.ok()) return chosen.error();
  auto reconstruction = snapshot::Reconstruct(snapshot, *chosen);
  if (!reconstruction.ok()) return reconstruction.error();
  const snapshot::Reconstruction& r = *reconstruction;
  const std::vector<snapshot::AllocRecord>& records = r.records;
  const Trace& entries = *r.entries;

  EventStream stream;
  stream.metadata()["source"] = "pytorch memory snapshot";
  stream.metadata()["device"] = std::to_string(*chosen);
  stream.Reserve(entries.size() + records.size());
  std::unordered_map<uint32_t, std::pair<uint32_t, uint32_t>> strings;  // stack -> op, module
  auto alloc = [&](uint64_t id, const snapshot::AllocRecord& rec) {
    const uint32_t stack = r.Stack(rec);
    auto it = strings.find(stack);
    if (it == strings.end()) {
      const snapshot::StackInfo& info = r.stacks[stack];
      it = strings.emplace(stack, std::make_pair(stream.Intern(info.op), stream.Intern(info.site)))
               .first;
    }
    stream.AllocInterned(id, std::min(r.Requested(rec), kMaxSizeBytes), rec.category,
                         it->second.first, it->second.second, r.Stream(rec));
  };

  // Blocks alive before the trace, in address order (their real layout is
  // unknown; address order packs them as the allocator first handed them out).
  stream.BeginPhase(0, Phase::kSetup);
  std::vector<uint32_t> initial;
  for (uint32_t i = 0; i < records.size(); ++i) {
    if (records[i].initial()) initial.push_back(i);
  }
  std::sort(initial.begin(), initial.end(),
            [&](uint32_t a, uint32_t b) { return r.Address(records[a]) < r.Address(records[b]); });
  for (uint32_t i : initial) alloc(i, records[i]);

  // The model reuses a block once PyTorch can (free_completed), not when the
  // tensor died (free_requested).
  size_t mark = 1, next_forced = 0;
  bool in_release_run = false;
  for (uint64_t i = 0; i < entries.size(); ++i) {
    while (mark < r.marks.size() && r.marks[mark].entry <= i) {
      stream.BeginPhase(r.marks[mark].step, r.marks[mark].phase);
      ++mark;
    }
    while (next_forced < r.forced_frees.size() && r.forced_frees[next_forced].first == i) {
      stream.Free(r.forced_frees[next_forced++].second);
    }
    const TraceEntry e = entries[i];
    const uint32_t id = r.entry_record[i];
    const bool release =
        e.action == TraceAction::kSegmentFree || e.action == TraceAction::kSegmentUnmap;
    // A run of segment frees is empty_cache() or the release before an OOM
    // retry (release_cached_blocks): both return every fully free segment.
    if (release && !in_release_run) stream.EmptyCache();
    in_release_run = release;
    if (id == snapshot::kNoRecord) continue;
    if (e.action == TraceAction::kAlloc) {
      alloc(id, records[id]);
    } else if (e.action == TraceAction::kFreeCompleted && records[id].release_entry == i) {
      stream.Free(id);
    }
  }
  return stream;
}

}  // namespace vramscope
