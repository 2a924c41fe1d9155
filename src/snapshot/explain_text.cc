// ExplainMeasured: the measured run in plain words.
#include <fmt/format.h>

#include <algorithm>

#include "vramscope/report.h"
#include "vramscope/snapshot.h"

namespace vramscope {
namespace {

std::string When(uint32_t step, Phase phase) {
  if (phase == Phase::kSetup) return "before the first forward";
  return fmt::format("step {} {}", step, PhaseName(phase));
}

// "parameters 1.00 GiB, gradients 0.50 GiB, ..." largest first, non-zero only.
std::string Breakdown(const CategoryBytes& bytes) {
  std::vector<std::pair<uint64_t, Category>> parts;
  for (Category c : kAllCategories) {
    const uint64_t b = bytes[static_cast<int>(c)];
    if (b > 0) parts.emplace_back(b, c);
  }
  std::stable_sort(parts.begin(), parts.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  std::string text;
  for (const auto& [b, c] : parts) {
    if (!text.empty()) text += ", ";
    text += fmt::format("{} {}", CategoryJsonKey(c), FormatBytes(b));
  }
  return text.empty() ? "nothing" : text;
}

void ExplainOom(const SnapshotRun& run, std::vector<std::string>* lines) {
  const SimResult& s = run.sim;
  const OomInfo& oom = *s.oom;
  lines->push_back(fmt::format(
      "Out of memory at trace entry {} ({}): PyTorch asked for {} (rounded) with {} allocated "
      "and {} reserved; the GPU had {} free.",
      s.oom_event_index, When(s.oom_step, s.oom_phase), FormatBytes(oom.requested_bytes),
      FormatBytes(oom.allocated_bytes), FormatBytes(oom.reserved_bytes),
      FormatBytes(oom.free_device_bytes)));
  lines->push_back("Alive at the failure: " + Breakdown(run.breakdown_at_oom) + ".");
  for (const LiveAllocation& a : run.live_at_oom) {
    lines->push_back(fmt::format("  {} {} from {}", FormatBytes(a.block_bytes),
                                 CategoryJsonKey(a.category),
                                 a.module.empty() ? std::string("(no stack)") : a.module));
  }
  const uint64_t cached = oom.reserved_bytes - std::min(oom.reserved_bytes, oom.allocated_bytes);
  if (cached >= oom.requested_bytes) {
    lines->push_back(fmt::format(
        "Why: the cache held {} free in total, more than the request, but no free block of {} "
        "in one piece: fragmentation. expandable_segments:True (or a smaller max_split_size_mb) "
        "lets PyTorch reuse it; `vramscope replay SNAPSHOT --alloc-conf "
        "expandable_segments:True` shows what that setting would have reserved.",
        FormatBytes(cached), FormatBytes(oom.requested_bytes)));
  } else {
    lines->push_back(fmt::format(
        "Why: the live tensors plus the request need {}, more than the {} PyTorch could hold "
        "({} reserved + {} free on the GPU): no allocator setting avoids this; the run needs "
        "less memory (smaller batch or sequence, activation checkpointing, a smaller "
        "optimizer state) or a larger GPU.",
        FormatBytes(oom.allocated_bytes + oom.requested_bytes),
        FormatBytes(oom.reserved_bytes + oom.free_device_bytes), FormatBytes(oom.reserved_bytes),
        FormatBytes(oom.free_device_bytes)));
  }
}

}  // namespace

std::vector<std::string> ExplainMeasured(const SnapshotRun& run) {
  std::vector<std::string> lines;
  const SimResult& s = run.sim;
  const uint64_t cached =
      s.reserved_at_peak_bytes - std::min(s.reserved_at_peak_bytes, s.peak_allocated_bytes);
  // Without a trace the snapshot is one state, not a history with a peak.
  const bool state_only = run.trace_entries == 0;
  if (state_only) {
    lines.push_back(
        fmt::format("When the snapshot was taken {} was allocated and {} reserved, so {} sat in "
                    "PyTorch's cache "
                    "unused; it has no trace, so the peak is not known.",
                    FormatBytes(s.peak_allocated_bytes), FormatBytes(s.reserved_at_peak_bytes),
                    FormatBytes(cached)));
  } else {
    lines.push_back(fmt::format(
        "Measured peak allocated {} at trace entry {} ({}); reserved was {} then, so {} sat in "
        "PyTorch's cache unused.",
        FormatBytes(s.peak_allocated_bytes), s.peak_event_index, When(s.peak_step, s.peak_phase),
        FormatBytes(s.reserved_at_peak_bytes), FormatBytes(cached)));
  }
  const char* when = state_only ? "then" : "at the peak";
  lines.push_back(fmt::format("Alive {}: {}.", when, Breakdown(s.breakdown_at_peak)));
  if (!run.top_sites.empty()) {
    lines.push_back(fmt::format("Largest allocation sites alive {}:", when));
    const size_t n = std::min<size_t>(run.top_sites.size(), 5);
    for (size_t i = 0; i < n; ++i) {
      const SiteBytes& site = run.top_sites[i];
      lines.push_back(fmt::format("  {} in {} block(s), mostly {}: {}", FormatBytes(site.bytes),
                                  site.blocks, CategoryJsonKey(site.category), site.site));
    }
  }
  if (run.max_fragmentation_bytes > 0) {
    lines.push_back(
        fmt::format("Fragmentation (reserved minus allocated) was largest at trace entry {}: {}.",
                    run.max_fragmentation_entry, FormatBytes(run.max_fragmentation_bytes)));
  }
  if (run.initially_live_blocks > 0) {
    lines.push_back(fmt::format(
        "The trace starts mid-run (its ring buffer kept only the last entries, or recording "
        "began late): {} block(s) of {} were already alive; they come from the final segments "
        "and from frees without an alloc.",
        run.initially_live_blocks, FormatBytes(run.initially_live_bytes)));
  }
  if (!run.has_frames) {
    lines.push_back(
        "No stacks were recorded, so blocks cannot be told apart (category \"other\"); record "
        "with torch.cuda.memory._record_memory_history(context=\"all\", stacks=\"python\").");
  }
  if (s.oom) ExplainOom(run, &lines);
  return lines;
}

}  // namespace vramscope
