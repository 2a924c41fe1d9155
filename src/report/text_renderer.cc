// RenderText: the human report, in GiB, for someone who has never seen
// PyTorch's memory statistics before. Each section says what its numbers mean.
#include <algorithm>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "report_format.h"
#include "vramscope/report.h"

namespace vramscope {
namespace {

using namespace report_internal;

constexpr size_t kBarWidthChars = 30;
constexpr size_t kOpWidthChars = 28;
constexpr size_t kModuleWidthChars = 48;

void Line(std::string* out, std::string_view text = {}) {
  out->append(text);
  out->push_back('\n');
}

// Bytes (in the unit that fits) right-aligned in a fixed column so the numbers line up.
std::string GiBColumn(uint64_t bytes, size_t width = 11) {
  return fmt::format("{:>{}}", FormatBytes(bytes), width);
}

std::string Bar(uint64_t part, uint64_t whole) {
  if (whole == 0 || part == 0) return "";
  const double share = std::min(1.0, static_cast<double>(part) / static_cast<double>(whole));
  const auto chars = static_cast<size_t>(share * kBarWidthChars + 0.5);
  // A visible sliver for small but present categories: "." rather than nothing.
  return chars == 0 ? std::string(".") : std::string(chars, '#');
}

void RenderHeader(const Report& report, std::string* out) {
  const std::string command = report.command.empty() ? "report" : SanitizeText(report.command);
  Line(out, fmt::format("vramscope {}: {}", command, SanitizeText(report.source)));
  if (report.model) {
    const ModelSummary& m = *report.model;
    std::string line = fmt::format("Model:  {}", SanitizeText(m.name));
    if (!m.architecture.empty()) line += fmt::format(" ({})", SanitizeText(m.architecture));
    line += fmt::format(", {} parameters, {} trainable", GroupThousands(m.parameters),
                        GroupThousands(m.trainable_parameters));
    Line(out, line);
  }
  std::string gpu = fmt::format("GPU:    {}, {} usable", GpuLabel(report.gpu),
                                FormatBytes(report.gpu.usable_bytes));
  if (report.gpu.total_bytes != 0)
    gpu += fmt::format(" of {}", FormatBytes(report.gpu.total_bytes));
  if (!report.has_device_limit) {
    gpu = fmt::format(
        "GPU:    not recorded in the snapshot (the device total counts {}'s CUDA "
        "context)",
        report.gpu.name);
  }
  Line(out, gpu);
  if (!report.knobs.empty()) {
    std::string knobs = "Knobs:  ";
    for (size_t i = 0; i < report.knobs.size(); ++i) {
      if (i > 0) knobs += ", ";
      knobs += SanitizeText(report.knobs[i].first) + "=" + SanitizeText(report.knobs[i].second);
    }
    Line(out, knobs);
  }
  Line(out);
  Line(out, VerdictLine(report));
  if (report.ranks.size() > 1) {
    const RankReport& worst = report.worst();
    Line(out, fmt::format("  worst rank class: \"{}\" (ranks {})", SanitizeText(worst.rank_class),
                          FormatRanks(worst.ranks)));
  }
}

void RenderRankTable(const Report& report, std::string* out) {
  Line(out);
  Line(out, "Rank classes (the worst one sets the numbers of the verdict)");
  Line(out, fmt::format("  {}{}  {:>14}  {:>14}  {:>14}  fits", PadRight("class", 18),
                        PadRight("ranks", 12), "peak allocated", "peak reserved", "device total"));
  for (const RankReport& rank : report.ranks) {
    Line(out, fmt::format(
                  "  {}{}  {:>14}  {:>14}  {:>14}  {}", PadRight(ClipText(rank.rank_class, 16), 18),
                  PadRight(ClipText(FormatRanks(rank.ranks), 10), 12),
                  FormatBytes(rank.sim.peak_allocated_bytes),
                  FormatBytes(rank.sim.peak_reserved_bytes), FormatBytes(DeviceTotalBytes(rank)),
                  !report.has_device_limit ? "-"
                  : RankFits(report, rank) ? "yes"
                                           : "no"));
  }
}

// A setup that ran out of memory: the whole run, replayed without the GPU's
// limit, before the numbers up to the failure.
void RenderFullRequirement(const RankReport& rank, std::string* out) {
  if (!rank.full) return;
  const FullRequirement& full = *rank.full;
  Line(out);
  Line(out, "What the run needs (the whole run replayed without the GPU's limit)");
  Line(out, fmt::format("  peak allocated {}", GiBColumn(full.peak_allocated_bytes)));
  Line(out, fmt::format("  peak reserved  {}", GiBColumn(full.peak_reserved_bytes)));
  Line(out, fmt::format("  device total   {}  peaks in {}",
                        GiBColumn(FullDeviceTotalBytes(full, rank.extras)),
                        StepPhaseLabel(full.peak_step, full.peak_phase)));
}

void RenderThreeNumbers(const RankReport& rank, std::string* out) {
  const SimResult& sim = rank.sim;
  const DeviceExtras& x = rank.extras;
  RenderFullRequirement(rank, out);
  Line(out);
  if (rank.state_only) {
    Line(out, "The three numbers when the snapshot was taken (it has no trace: no peak is known)");
    Line(out, fmt::format(
                  "  allocated      {}  torch.cuda.memory_allocated(): memory held by live tensors",
                  GiBColumn(sim.peak_allocated_bytes)));
    Line(out, fmt::format("  reserved       {}  torch.cuda.memory_reserved(): allocated plus what "
                          "PyTorch's caching allocator keeps",
                          GiBColumn(sim.peak_reserved_bytes)));
  } else {
    Line(out, sim.oom ? "The three numbers on this GPU (up to the out-of-memory point)"
                      : "The three numbers");
    Line(out, fmt::format("  peak allocated {}  torch.cuda.max_memory_allocated(): memory held by "
                          "live tensors",
                          GiBColumn(sim.peak_allocated_bytes)));
    Line(out,
         fmt::format("  peak reserved  {}  torch.cuda.max_memory_reserved(): allocated plus what "
                     "PyTorch's caching allocator keeps",
                     GiBColumn(sim.peak_reserved_bytes)));
  }
  Line(out, fmt::format("  device total   {}  what nvidia-smi shows: reserved + CUDA context {} + "
                        "NCCL {} + other {}",
                        GiBColumn(DeviceTotalBytes(rank)), FormatBytes(x.cuda_context_bytes),
                        FormatBytes(x.nccl_bytes), FormatBytes(x.other_bytes)));
  if (rank.host_peak_bytes != 0) {
    Line(out, fmt::format("  host memory    {}  CPU RAM for offloaded state and pinned buffers",
                          GiBColumn(rank.host_peak_bytes)));
  }
}

// Only when more than one stream allocated: what the side streams' own pools
// and their delayed frees (record_stream) cost.
void RenderStreams(const SimResult& sim, std::string* out) {
  if (sim.reserved_by_stream_at_peak.size() < 2) return;
  Line(out, fmt::format("  At the reserved peak ({}), by CUDA stream (each stream caches its own "
                        "blocks):",
                        FormatBytes(sim.peak_reserved_bytes)));
  for (const StreamBytes& s : sim.reserved_by_stream_at_peak) {
    // Names come from the lowering or a trace's validated metadata (no
    // control characters); long ones are cut.
    const std::string label = s.stream == 0 && s.name.empty() ? "default" : s.name.substr(0, 40);
    Line(out, fmt::format("    {}{}", PadRight(fmt::format("stream {} {}", s.stream, label), 46),
                          FormatBytes(s.reserved_bytes)));
  }
  const uint64_t active = sim.peak_active_bytes.value_or(0);
  if (active > sim.peak_allocated_bytes) {
    Line(out, fmt::format("  Freed tensors another stream still used kept active memory up to {} "
                          "(torch.cuda.memory_stats() active_bytes.all.peak).",
                          FormatBytes(active)));
  }
}

void RenderPeak(const SimResult& sim, std::string* out) {
  Line(out);
  Line(out, "When the peak happens");
  Line(out, fmt::format("  Allocated memory peaks in {} (event {}).",
                        StepPhaseLabel(sim.peak_step, sim.peak_phase),
                        GroupThousands(sim.peak_event_index)));
  Line(out, fmt::format("  Reserved then: {}, of which {} is cached by the allocator but unused.",
                        FormatBytes(sim.reserved_at_peak_bytes),
                        FormatBytes(FragmentationAtPeakBytes(sim))));
  RenderStreams(sim, out);
}

void RenderBreakdown(const SimResult& sim, bool state_only, std::string* out) {
  Line(out);
  Line(out, state_only ? "Breakdown (allocated bytes by category, largest first)"
                       : "Breakdown at the peak (allocated bytes by category, largest first)");
  std::vector<Category> order(kAllCategories.begin(), kAllCategories.end());
  const auto bytes = [&](Category c) { return sim.breakdown_at_peak[static_cast<size_t>(c)]; };
  std::stable_sort(order.begin(), order.end(),
                   [&](Category a, Category b) { return bytes(a) > bytes(b); });
  uint64_t sum = 0;
  for (Category c : order) {
    sum = common::SaturatingAdd(sum, bytes(c));
    if (bytes(c) == 0) continue;
    Line(out, fmt::format("  {}{}  {:>6}  {}", PadRight(CategoryLabel(c), 17), GiBColumn(bytes(c)),
                          FormatPercent(bytes(c), sim.peak_allocated_bytes),
                          Bar(bytes(c), sim.peak_allocated_bytes)));
  }
  if (sum == 0) Line(out, "  (nothing allocated at the peak)");
  Line(out, fmt::format("  {}{}  {:>6}", PadRight("total", 17), GiBColumn(sum),
                        FormatPercent(sum, sim.peak_allocated_bytes)));
  if (sum != sim.peak_allocated_bytes) {
    Line(out, fmt::format("  (the categories sum to {}; peak allocated is {})", FormatBytes(sum),
                          FormatBytes(sim.peak_allocated_bytes)));
  }
}

void RenderPhases(const SimResult& sim, std::string* out) {
  if (sim.phases.empty()) return;
  Line(out);
  Line(out, "Peak per step and phase");
  Line(out, fmt::format("  {:>5}  {}{:>15}  {:>15}  {:>17}", "step", PadRight("phase", 10),
                        "peak allocated", "peak reserved", "allocated at end"));
  for (const PhaseRowGroup& group : GroupPhaseRows(sim.phases)) {
    for (const PhasePeak* p : group.rows) {
      const bool is_peak = group.Contains(sim.peak_step) && p->phase == sim.peak_phase;
      Line(out,
           fmt::format("  {:>5}  {}{:>15}  {:>15}  {:>17}{}", StepRange(group),
                       PadRight(PhaseLabel(p->phase), 10), FormatBytes(p->peak_allocated_bytes),
                       FormatBytes(p->peak_reserved_bytes), FormatBytes(p->allocated_at_end_bytes),
                       is_peak ? "  <- peak" : ""));
    }
  }
}

void RenderTop(const SimResult& sim, bool state_only, std::string* out) {
  if (sim.top_at_peak.empty()) return;
  Line(out);
  Line(out, fmt::format("Largest allocations alive {} ({} of {} live)",
                        state_only ? "then" : "at the peak", GroupThousands(sim.top_at_peak.size()),
                        GroupThousands(
                            std::max<uint64_t>(sim.live_at_peak_count, sim.top_at_peak.size()))));
  Line(out, fmt::format("  {:>11}  {}{}{}module", "size", PadRight("category", 17),
                        PadRight("allocated in", 20), PadRight("op", kOpWidthChars + 2)));
  for (const LiveAllocation& a : sim.top_at_peak) {
    Line(out,
         fmt::format(
             "  {}  {}{}{}{}", GiBColumn(a.block_bytes), PadRight(CategoryLabel(a.category), 17),
             PadRight(StepPhaseLabel(a.step, a.phase), 20),
             PadRight(ClipText(a.op.empty() ? "-" : a.op, kOpWidthChars), kOpWidthChars + 2),
             ClipText(a.module.empty() ? "-" : a.module, kModuleWidthChars)));
  }
}

// Rows of a largest-first grouping: the first `shown`, then the rest in one line.
void RenderGroupRows(const std::vector<std::pair<std::string, uint64_t>>& rows, uint64_t total,
                     size_t shown, std::string_view rest_label, std::string* out) {
  uint64_t rest = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (i >= shown) {
      rest = common::SaturatingAdd(rest, rows[i].second);
      continue;
    }
    Line(out,
         fmt::format("    {}{}  {:>6}  {}", PadRight(ClipText(SanitizeText(rows[i].first), 30), 32),
                     GiBColumn(rows[i].second), FormatPercent(rows[i].second, total),
                     Bar(rows[i].second, total)));
  }
  if (rest > 0) {
    Line(out, fmt::format("    {}{}  {:>6}",
                          PadRight(fmt::format("{} more {}", rows.size() - shown, rest_label), 32),
                          GiBColumn(rest), FormatPercent(rest, total)));
  }
}

// What the forward leaves alive for backward: the memory that batch size and
// resolution or sequence length scale, by block and by the op that made it.
void RenderSaved(const RankReport& rank, std::string* out) {
  if (!rank.saved) return;
  const SavedActivations& saved = *rank.saved;
  Line(out);
  Line(out, fmt::format("Saved for backward at the end of step {}'s forward: {}", saved.step,
                        FormatBytes(saved.total_bytes)));
  Line(out, "  by block");
  RenderGroupRows(saved.by_block, saved.total_bytes, 8, "blocks", out);
  Line(out, "  by the layer that made it");
  RenderGroupRows(saved.by_layer, saved.total_bytes, 6, "layers", out);
}

void RenderOom(const SimResult& sim, std::string* out) {
  if (!sim.oom) return;
  const OomInfo& oom = *sim.oom;
  Line(out);
  Line(out, "Out of memory");
  Line(out,
       fmt::format("  In {} (event {}) the allocator could not get {} from the device "
                   "({} requested by the op).",
                   StepPhaseLabel(sim.oom_step, sim.oom_phase), GroupThousands(sim.oom_event_index),
                   FormatBytes(oom.alloc_size_bytes), FormatBytes(oom.requested_bytes)));
  Line(out, fmt::format("  At that moment: {} allocated, {} reserved, {} free of a {} limit.",
                        FormatBytes(oom.allocated_bytes), FormatBytes(oom.reserved_bytes),
                        FormatBytes(oom.free_device_bytes), FormatBytes(oom.device_limit_bytes)));
  if (!oom.message.empty()) {
    Line(out, "  PyTorch would raise:");
    size_t start = 0;
    while (start <= oom.message.size()) {
      const size_t end = std::min(oom.message.find('\n', start), oom.message.size());
      Line(out, "    " + SanitizeText(std::string_view(oom.message).substr(start, end - start)));
      start = end + 1;
    }
  }
  Line(out, "  The numbers above stop at this point: the simulated run ended there.");
}

void RenderRank(const RankReport& rank, std::string* out) {
  RenderThreeNumbers(rank, out);
  if (!rank.state_only) RenderPeak(rank.sim, out);
  RenderBreakdown(rank.sim, rank.state_only, out);
  if (!rank.state_only) RenderPhases(rank.sim, out);
  RenderSaved(rank, out);
  RenderTop(rank.sim, rank.state_only, out);
  RenderOom(rank.sim, out);
}

void RenderList(std::string_view title, const std::vector<std::string>& lines, std::string* out) {
  if (lines.empty()) return;
  Line(out);
  Line(out, title);
  // A line indented by two spaces is a sub-item of the line before it.
  for (const std::string& line : lines) {
    const bool sub = line.rfind("  ", 0) == 0;
    Line(out, (sub ? "      " + SanitizeText(line.substr(2)) : "  - " + SanitizeText(line)));
  }
}

// "Assumed": what the estimate rests on and the flag that changes each.
void RenderAssumptions(const std::vector<Assumption>& assumptions, std::string* out) {
  if (assumptions.empty()) return;
  Line(out);
  Line(out, "Assumed (change with the flag named)");
  for (const Assumption& a : assumptions) {
    // A name as wide as the column ("text encoders") still gets its space.
    const std::string what = SanitizeText(a.what);
    std::string line = fmt::format("  {}{}{}", PadRight(what, 11), what.size() >= 11 ? " " : "",
                                   SanitizeText(a.assumed));
    if (!a.flag.empty()) line += fmt::format(" [{}]", SanitizeText(a.flag));
    Line(out, line);
  }
}

}  // namespace

std::string RenderText(const Report& report) {
  std::string out;
  RenderHeader(report, &out);
  if (report.ranks.size() == 1) {
    RenderRank(report.ranks.front(), &out);
  } else if (report.ranks.size() > 1) {
    RenderRankTable(report, &out);
    for (const RankReport& rank : report.ranks) {
      Line(&out);
      Line(&out, fmt::format("== Rank class \"{}\" (ranks {}) ==", SanitizeText(rank.rank_class),
                             FormatRanks(rank.ranks)));
      RenderRank(rank, &out);
    }
  }
  if (report.host_peak_per_node_bytes != 0) {
    Line(&out);
    Line(&out, fmt::format("Host memory per node  {}  the host memory of the ranks that share a "
                           "node (--gpus-per-node), at their peaks",
                           FormatBytes(report.host_peak_per_node_bytes)));
  }
  RenderList("Why", report.explanation, &out);
  RenderAssumptions(report.assumptions, &out);
  RenderList("Notes", report.notes, &out);
  return out;
}

}  // namespace vramscope
