// RenderHtml: one self-contained page (inline CSS, SVG and script) that works
// offline. A Content-Security-Policy forbids every fetch, so even a mistake in
// this file cannot make the page load anything. Every text from inputs goes
// through EscapeMarkup.
#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "html_assets.h"
#include "report_format.h"
#include "svg_chart.h"
#include "vramscope/report.h"

namespace vramscope::report_internal {
namespace {

// Timeline values for the hover script. Only numbers and fixed vocabulary go
// in; '<' is still escaped so that no text can close the script element.
std::string TimelineData(const SimResult& sim) {
  nlohmann::json x = nlohmann::json::array(), s = x, p = x, a = x, r = x, c = x;
  for (const TimelinePoint& point : sim.timeline) {
    x.push_back(point.event_index);
    s.push_back(point.step);
    p.push_back(static_cast<int>(point.phase));
    a.push_back(point.allocated_bytes);
    r.push_back(point.reserved_bytes);
    c.push_back(point.by_category);
  }
  nlohmann::json names = nlohmann::json::array(), colours = names, phases = names;
  for (Category cat : kAllCategories) {
    names.push_back(CategoryLabel(cat));
    colours.push_back(CategoryColour(cat));
  }
  for (int i = 0; i < kNumPhases; ++i) phases.push_back(PhaseName(static_cast<Phase>(i)));
  const nlohmann::json data = {{"x", x},          {"s", s}, {"p", p},         {"a", a},
                               {"r", r},          {"c", c}, {"names", names}, {"colours", colours},
                               {"phases", phases}};
  std::string text = data.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::string out;
  for (char ch : text) out += ch == '<' ? std::string("\\u003c") : std::string(1, ch);
  return out;
}

class PageWriter {
 public:
  explicit PageWriter(const Report& report) : report_(report) {}

  std::string Render() {
    Head();
    Headline();
    if (report_.ranks.size() > 1) RankTable();
    for (size_t i = 0; i < report_.ranks.size(); ++i) RankSection(i);
    List("Why", report_.explanation);
    Knobs();
    Assumed();
    List("Notes", report_.notes);
    out_ += fmt::format("<script>{}</script>\n</body>\n</html>\n", kHtmlScript);
    return std::move(out_);
  }

 private:
  void Head() {
    const std::string title = EscapeMarkup(report_.source.empty() ? "report" : report_.source);
    out_ += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
    out_ +=
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
        "style-src 'unsafe-inline'; script-src 'unsafe-inline'\">\n";
    out_ += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
    out_ += fmt::format("<title>vramscope: {}</title>\n<style>{}</style>\n</head>\n<body>\n", title,
                        kHtmlStyle);
    out_ += fmt::format("<h1>vramscope {}: {}</h1>\n",
                        EscapeMarkup(report_.command.empty() ? "report" : report_.command), title);
    if (report_.model) {
      const ModelSummary& m = *report_.model;
      out_ += fmt::format("<p class=\"meta\">Model: <b>{}</b>{}, {} parameters, {} trainable</p>\n",
                          EscapeMarkup(m.name),
                          m.architecture.empty() ? "" : " (" + EscapeMarkup(m.architecture) + ")",
                          GroupThousands(m.parameters), GroupThousands(m.trainable_parameters));
    }
    if (!report_.has_device_limit) {
      out_ += "<p class=\"meta\">GPU: not recorded in the snapshot</p>\n";
      return;
    }
    out_ +=
        fmt::format("<p class=\"meta\">GPU: <b>{}</b>, {} usable{}</p>\n",
                    EscapeMarkup(GpuLabel(report_.gpu)), FormatBytes(report_.gpu.usable_bytes),
                    report_.gpu.total_bytes ? " of " + FormatBytes(report_.gpu.total_bytes) : "");
  }

  void Number(std::string_view label, uint64_t bytes, std::string_view what) {
    out_ += fmt::format(
        "<div class=\"number\"><div>{}</div><div class=\"value\">{}</div>"
        "<div class=\"what\">{}</div></div>\n",
        label, FormatBytes(bytes), what);
  }

  void ThreeNumbers(const RankReport& rank) {
    const DeviceExtras& x = rank.extras;
    out_ += "<div class=\"numbers\">\n";
    Number("peak allocated", rank.sim.peak_allocated_bytes,
           "<code>torch.cuda.max_memory_allocated()</code>: memory held by live tensors");
    Number("peak reserved", rank.sim.peak_reserved_bytes,
           "<code>torch.cuda.max_memory_reserved()</code>: allocated plus what PyTorch's caching "
           "allocator keeps");
    Number("device total", DeviceTotalBytes(rank),
           fmt::format("what <code>nvidia-smi</code> shows: reserved + CUDA context {} + NCCL {} + "
                       "other {}",
                       FormatBytes(x.cuda_context_bytes), FormatBytes(x.nccl_bytes),
                       FormatBytes(x.other_bytes)));
    if (rank.host_peak_bytes != 0) {
      Number("host memory", rank.host_peak_bytes, "CPU RAM for offloaded state and pinned buffers");
    }
    out_ += "</div>\n";
    const SimResult& sim = rank.sim;
    out_ += fmt::format(
        "<p>Allocated memory peaks in <b>{}</b> (event {}). Reserved then: {}, of which {} is "
        "cached by the allocator but unused.</p>\n",
        StepPhaseLabel(sim.peak_step, sim.peak_phase), GroupThousands(sim.peak_event_index),
        FormatBytes(sim.reserved_at_peak_bytes), FormatBytes(FragmentationAtPeakBytes(sim)));
  }

  void Headline() {
    const char* verdict = !report_.has_device_limit ? "measured"
                          : report_.fits()          ? "fits"
                                                    : "nofit";
    out_ += fmt::format("<p class=\"verdict {}\">{}</p>\n", verdict,
                        EscapeMarkup(VerdictLine(report_)));
  }

  void RankTable() {
    out_ +=
        "<h2>Rank classes</h2>\n<table>\n<tr><th>class</th><th>ranks</th>"
        "<th class=\"num\">peak allocated</th><th class=\"num\">peak reserved</th>"
        "<th class=\"num\">device total</th><th>fits</th></tr>\n";
    for (const RankReport& rank : report_.ranks) {
      out_ += "<tr>" + TableCell(EscapeMarkup(rank.rank_class)) +
              TableCell(FormatRanks(rank.ranks)) +
              TableCell(FormatBytes(rank.sim.peak_allocated_bytes), "num") +
              TableCell(FormatBytes(rank.sim.peak_reserved_bytes), "num") +
              TableCell(FormatBytes(DeviceTotalBytes(rank)), "num") +
              TableCell(!report_.has_device_limit ? "-"
                        : RankFits(report_, rank) ? "yes"
                                                  : "no") +
              "</tr>\n";
    }
    out_ += "</table>\n";
  }

  void RankSection(size_t index) {
    const RankReport& rank = report_.ranks[index];
    out_ += "<section>\n";
    if (report_.ranks.size() > 1) {
      out_ += fmt::format("<h2>Rank class &quot;{}&quot; (ranks {})</h2>\n",
                          EscapeMarkup(rank.rank_class), FormatRanks(rank.ranks));
    } else {
      out_ += "<h2>The three numbers</h2>\n";
    }
    ThreeNumbers(rank);
    Timeline(rank, index);
    Breakdown(rank.sim);
    Top(rank.sim);
    Phases(rank.sim);
    Saved(rank);
    Oom(rank.sim);
    out_ += "</section>\n";
  }

  void Timeline(const RankReport& rank, size_t index) {
    out_ += "<h3>Memory over time</h3>\n<figure class=\"vs-timeline\">\n";
    out_ += RenderRankSvg(report_, rank, fmt::format("vs{}", index));
    out_ += fmt::format("<script type=\"application/json\" class=\"vs-data\">{}</script>\n",
                        TimelineData(rank.sim));
    out_ +=
        "<div class=\"vs-tip\" hidden></div>\n"
        "<figcaption>Hover for the values at any moment. Drag across the chart or use the "
        "mouse wheel to zoom; double-click or <button type=\"button\" class=\"vs-reset\">reset "
        "zoom</button>.</figcaption>\n</figure>\n";
  }

  void Breakdown(const SimResult& sim) {
    out_ +=
        "<h3>Breakdown at the peak</h3>\n<table>\n<tr><th>category</th>"
        "<th class=\"num\">allocated</th><th class=\"num\">share</th><th></th></tr>\n";
    const uint64_t whole = sim.peak_allocated_bytes;
    for (Category c : kAllCategories) {
      const uint64_t bytes = sim.breakdown_at_peak[static_cast<size_t>(c)];
      const double share =
          whole ? std::min(1.0, static_cast<double>(bytes) / static_cast<double>(whole)) : 0;
      out_ += fmt::format(
          "<tr><td><span class=\"swatch\" style=\"background:{0}\"></span>{1}</td>{2}{3}"
          "<td><span class=\"bar\" style=\"width:{4:.1f}em;background:{0}\"></span></td></tr>\n",
          CategoryColour(c), CategoryLabel(c), TableCell(FormatBytes(bytes), "num"),
          TableCell(FormatPercent(bytes, whole), "num"), share * 20);
    }
    out_ += "</table>\n";
  }

  void Top(const SimResult& sim) {
    if (sim.top_at_peak.empty()) return;
    out_ += fmt::format(
        "<h3>Largest allocations alive at the peak ({} of {} live)</h3>\n<table>\n"
        "<tr><th class=\"num\">size</th><th>category</th><th>allocated in</th><th>op</th>"
        "<th>module</th></tr>\n",
        GroupThousands(sim.top_at_peak.size()),
        GroupThousands(std::max<uint64_t>(sim.live_at_peak_count, sim.top_at_peak.size())));
    for (const LiveAllocation& a : sim.top_at_peak) {
      out_ += "<tr>" + TableCell(FormatBytes(a.block_bytes), "num") +
              TableCell(CategoryLabel(a.category)) + TableCell(StepPhaseLabel(a.step, a.phase)) +
              TableCell(EscapeMarkup(a.op), "name") + TableCell(EscapeMarkup(a.module), "name") +
              "</tr>\n";
    }
    out_ += "</table>\n";
  }

  // What the forward keeps for backward: by block and by layer, largest first.
  void Saved(const RankReport& rank) {
    if (!rank.saved) return;
    const SavedActivations& s = *rank.saved;
    out_ += fmt::format("<h3>Saved for backward at the end of step {}'s forward: {}</h3>\n", s.step,
                        FormatBytes(s.total_bytes));
    GroupTable("block", s.by_block, s.total_bytes);
    GroupTable("layer", s.by_layer, s.total_bytes);
  }

  void GroupTable(std::string_view what, const std::vector<std::pair<std::string, uint64_t>>& rows,
                  uint64_t total) {
    out_ += fmt::format(
        "<table>\n<tr><th>{}</th><th class=\"num\">saved</th><th class=\"num\">share</th>"
        "<th></th></tr>\n",
        what);
    constexpr size_t kRows = 12;  // the rest in one row
    uint64_t rest = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      if (i >= kRows) {
        rest += rows[i].second;
        continue;
      }
      const double share =
          total ? static_cast<double>(rows[i].second) / static_cast<double>(total) : 0;
      out_ += "<tr>" + TableCell(EscapeMarkup(rows[i].first), "name") +
              TableCell(FormatBytes(rows[i].second), "num") +
              TableCell(FormatPercent(rows[i].second, total), "num") +
              fmt::format("<td><span class=\"bar\" style=\"width:{:.1f}em\"></span></td></tr>\n",
                          share * 20);
    }
    if (rest > 0) {
      out_ += "<tr>" + TableCell(fmt::format("{} more", rows.size() - kRows), "name") +
              TableCell(FormatBytes(rest), "num") + TableCell(FormatPercent(rest, total), "num") +
              "<td></td></tr>\n";
    }
    out_ += "</table>\n";
  }

  void Phases(const SimResult& sim) {
    if (sim.phases.empty()) return;
    out_ +=
        "<h3>Peak per step and phase</h3>\n<table>\n<tr><th class=\"num\">step</th>"
        "<th>phase</th><th class=\"num\">peak allocated</th><th class=\"num\">peak reserved</th>"
        "<th class=\"num\">allocated at end</th></tr>\n";
    for (const PhaseRowGroup& group : GroupPhaseRows(sim.phases)) {
      for (const PhasePeak* p : group.rows) {
        const bool is_peak = group.Contains(sim.peak_step) && p->phase == sim.peak_phase;
        out_ += (is_peak ? "<tr class=\"peak\">" : "<tr>") + TableCell(StepRange(group), "num") +
                TableCell(PhaseLabel(p->phase)) +
                TableCell(FormatBytes(p->peak_allocated_bytes), "num") +
                TableCell(FormatBytes(p->peak_reserved_bytes), "num") +
                TableCell(FormatBytes(p->allocated_at_end_bytes), "num") + "</tr>\n";
      }
    }
    out_ += "</table>\n";
  }

  void Oom(const SimResult& sim) {
    if (!sim.oom) return;
    const OomInfo& oom = *sim.oom;
    out_ += fmt::format(
        "<h3>Out of memory</h3>\n<div class=\"oom\"><p>In <b>{}</b> (event {}) the allocator could "
        "not get {} from the device ({} requested by the op). At that moment: {} allocated, {} "
        "reserved, {} free of a {} limit. The numbers above stop here: the simulated run ended "
        "there.</p>\n",
        StepPhaseLabel(sim.oom_step, sim.oom_phase), GroupThousands(sim.oom_event_index),
        FormatBytes(oom.alloc_size_bytes), FormatBytes(oom.requested_bytes),
        FormatBytes(oom.allocated_bytes), FormatBytes(oom.reserved_bytes),
        FormatBytes(oom.free_device_bytes), FormatBytes(oom.device_limit_bytes));
    if (!oom.message.empty()) {
      // Keep the message's own line breaks: escape each line separately.
      std::string message;
      size_t start = 0;
      while (start <= oom.message.size()) {
        const size_t end = std::min(oom.message.find('\n', start), oom.message.size());
        if (!message.empty()) message += '\n';
        message += EscapeMarkup(std::string_view(oom.message).substr(start, end - start));
        start = end + 1;
      }
      out_ += fmt::format("<p>PyTorch would raise:</p><pre>{}</pre>\n", message);
    }
    out_ += "</div>\n";
  }

  void List(std::string_view title, const std::vector<std::string>& lines) {
    if (lines.empty()) return;
    out_ += fmt::format("<h2>{}</h2>\n<ul>\n", title);
    for (const std::string& line : lines) out_ += fmt::format("<li>{}</li>\n", EscapeMarkup(line));
    out_ += "</ul>\n";
  }

  void Assumed() {
    if (report_.assumptions.empty()) return;
    out_ += "<h2>Assumed</h2>\n<table>\n";
    for (const Assumption& a : report_.assumptions) {
      out_ += "<tr>" + TableCell(EscapeMarkup(a.what)) +
              TableCell(EscapeMarkup(a.assumed), "name") + TableCell(EscapeMarkup(a.flag), "name") +
              "</tr>\n";
    }
    out_ += "</table>\n";
  }

  void Knobs() {
    if (report_.knobs.empty()) return;
    out_ += "<h2>Knobs used</h2>\n<table>\n";
    for (const auto& [key, value] : report_.knobs) {
      out_ += "<tr>" + TableCell(EscapeMarkup(key)) + TableCell(EscapeMarkup(value), "name") +
              "</tr>\n";
    }
    out_ += "</table>\n";
  }

  const Report& report_;
  std::string out_;
};

}  // namespace
}  // namespace vramscope::report_internal

namespace vramscope {

std::string RenderHtml(const Report& report) {
  return report_internal::PageWriter(report).Render();
}

}  // namespace vramscope
