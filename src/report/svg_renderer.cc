// RenderSvg and RenderRankSvg: memory over time as a stacked step chart.
//
// Memory only changes at events, so every series is drawn as steps: the value
// of timeline point i holds until point i+1. The x axis is the event index
// (allocations and frees in order), the y axis GiB from zero.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "chart_axes.h"
#include "chart_scale.h"
#include "report_format.h"
#include "svg_chart.h"
#include "vramscope/report.h"

namespace vramscope::report_internal {
namespace {

// Smallest y range (GiB): a run of a few KiB still gets readable ticks.
constexpr double kMinRangeGiB = 1.0 / 1024;
// The GPU limit joins the y range only when it is at most this many times the
// data; farther up it would squash the data into a flat line at the bottom.
constexpr double kTimelineLimitOnChartRatio = 2.0;
constexpr double kMinLabelGapPx = 12;  // rotated phase labels closer than this overlap

constexpr const char* kMarkerColour = "#9a9a9a";

// Coordinates in tenths of a unit, kept as integers so that equal positions
// compare equal and print identically everywhere.
int64_t Tenths(double v) { return std::llround(v * 10); }
std::string Coord(int64_t tenths) {
  return fmt::format("{}{}.{}", tenths < 0 ? "-" : "", std::llabs(tenths) / 10,
                     std::llabs(tenths) % 10);
}
std::string Coord(double v) { return Coord(Tenths(v)); }
// Coord(double) for the shared chart parts (chart_axes.h).
std::string CoordOf(double v) { return Coord(v); }

class ChartWriter {
 public:
  ChartWriter(const Report& report, const RankReport& rank, std::string_view id)
      : report_(report), rank_(rank), sim_(rank.sim), id_(id) {}

  std::string Render() {
    Scale();
    Open();
    YAxis();
    Content();
    Levels();
    Pins();
    XAxis();
    Legend();
    out_ += "</svg>\n";
    return std::move(out_);
  }

 private:
  double Px(uint64_t event) const {
    const uint64_t e = std::clamp(event, x_min_, x_max_);
    return ChartLayout::kPlotLeft + static_cast<double>(e - x_min_) /
                                        static_cast<double>(x_max_ - x_min_) *
                                        (ChartLayout::kPlotRight - ChartLayout::kPlotLeft);
  }
  double Py(uint64_t bytes) const {
    const double share = std::min(1.0, static_cast<double>(bytes) / kChartGiB / y_.top);
    return ChartLayout::kPlotBottom - share * (ChartLayout::kPlotBottom - ChartLayout::kPlotTop);
  }
  // Allocated at the OOM plus the block that could not be had.
  uint64_t FailedRequestTopBytes() const {
    return common::SaturatingAdd(sim_.oom->allocated_bytes, sim_.oom->alloc_size_bytes);
  }
  uint64_t CumulativeBytes(const TimelinePoint& p, size_t last_category) const {
    uint64_t sum = 0;
    for (size_t c = 0; c <= last_category; ++c) sum = common::SaturatingAdd(sum, p.by_category[c]);
    return sum;
  }

  void Scale() {
    const auto& points = sim_.timeline;
    // x: the last point is a state like any other, so it gets the mean width
    // of a point (one event at least: a single point fills the plot).
    x_min_ = points.empty() ? 0 : points.front().event_index;
    x_max_ = x_min_ + 1;
    if (!points.empty()) {
      const uint64_t last = std::max(points.back().event_index, x_min_);
      const uint64_t mean_width = points.size() > 1 ? (last - x_min_) / (points.size() - 1) : 1;
      // After an OOM the run is over: the space right of the failed event
      // shows the request that did not fit instead.
      const uint64_t end = sim_.oom ? std::max(last, sim_.oom_event_index) : last;
      x_max_ = common::SaturatingAdd(end, std::max<uint64_t>(mean_width, 1));
    }
    if (x_max_ <= x_min_) x_min_ = x_max_ - 1;  // saturated at 2^64: keep a non-empty range
    uint64_t max_bytes =
        std::max({sim_.peak_allocated_bytes, sim_.peak_reserved_bytes, DeviceTotalBytes(rank_)});
    if (sim_.oom) max_bytes = std::max(max_bytes, FailedRequestTopBytes());
    for (const TimelinePoint& p : points) {
      max_bytes = std::max(
          {max_bytes, p.allocated_bytes, p.reserved_bytes, CumulativeBytes(p, kNumCategories - 1)});
    }
    double max_gib = static_cast<double>(max_bytes) / kChartGiB;
    const double usable_gib = static_cast<double>(report_.gpu.usable_bytes) / kChartGiB;
    limit_on_chart_ = report_.has_device_limit && usable_gib > 0 && max_gib > 0 &&
                      usable_gib <= kTimelineLimitOnChartRatio * max_gib;
    if (limit_on_chart_) max_gib = std::max(max_gib, usable_gib);
    // All zero: a 0..1 GiB axis rather than a degenerate one.
    y_ = ValueTicks(max_gib > 0 ? std::max(max_gib, kMinRangeGiB) : 1.0, 5);
  }

  void Open() {
    const std::string source = ClipText(report_.source.empty() ? "report" : report_.source, 60);
    std::string title = fmt::format("GPU memory over time: {} on {}", source, DeviceLabel(report_));
    if (report_.ranks.size() > 1) {
      title += fmt::format(" (rank class \"{}\", ranks {})", ClipText(rank_.rank_class, 24),
                           FormatRanks(rank_.ranks));
    }
    out_ += fmt::format(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" "
        "viewBox=\"0 0 {0} {1}\" font-family=\"sans-serif\" font-size=\"12\" class=\"vs-chart\" "
        "id=\"{2}\" data-plot-left=\"{3}\" data-plot-right=\"{4}\" data-plot-top=\"{5}\" "
        "data-plot-bottom=\"{6}\" data-x-min=\"{7}\" data-x-max=\"{8}\">\n",
        ChartLayout::kWidth, ChartLayout::kHeight, id_, ChartLayout::kPlotLeft,
        ChartLayout::kPlotRight, ChartLayout::kPlotTop, ChartLayout::kPlotBottom, x_min_, x_max_);
    out_ += fmt::format("<title>{}</title>\n", EscapeMarkup(title));
    out_ += fmt::format(
        "<desc>Peak allocated {}, peak reserved {}, device total {}, GPU usable {}.</desc>\n",
        FormatBytes(sim_.peak_allocated_bytes), FormatBytes(sim_.peak_reserved_bytes),
        FormatBytes(DeviceTotalBytes(rank_)), FormatBytes(report_.gpu.usable_bytes));
    out_ += fmt::format(
        "<defs><clipPath id=\"{}-clip\"><rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\"/>"
        "</clipPath></defs>\n",
        id_, ChartLayout::kPlotLeft, ChartLayout::kPlotTop - 1,
        ChartLayout::kPlotRight - ChartLayout::kPlotLeft,
        ChartLayout::kPlotBottom - ChartLayout::kPlotTop + 2);
    AppendHeadings(&out_, EscapeMarkup(title), EscapeMarkup(VerdictLine(report_)));
  }

  void YAxis() { AppendYAxis(&out_, y_, CoordOf); }

  // One step path through per-point y values; closed down to the x axis for
  // areas.
  std::string StepPath(const std::vector<int64_t>& ys, bool closed) const {
    const auto& points = sim_.timeline;
    const int64_t base = Tenths(ChartLayout::kPlotBottom);
    std::string d = closed ? fmt::format("M{},{}V{}", Coord(Px(points[0].event_index)), Coord(base),
                                         Coord(ys[0]))
                           : fmt::format("M{},{}", Coord(Px(points[0].event_index)), Coord(ys[0]));
    int64_t last_y = ys[0];
    for (size_t i = 1; i < points.size(); ++i) {
      if (ys[i] == last_y) continue;  // a level stretch needs no vertex
      d += fmt::format("H{}V{}", Coord(Px(points[i].event_index)), Coord(ys[i]));
      last_y = ys[i];
    }
    d += fmt::format("H{}", Coord(sim_.oom ? Px(sim_.oom_event_index) : ChartLayout::kPlotRight));
    if (closed) d += fmt::format("V{}Z", Coord(base));
    return d;
  }

  void Content() {
    out_ += fmt::format("<g clip-path=\"url(#{}-clip)\"><g class=\"vs-content\">\n", id_);
    const auto& points = sim_.timeline;
    if (!points.empty()) {
      // Painter's order: the tallest cumulative band first, each lower one on
      // top, so every band shows exactly its own category.
      for (size_t c = kNumCategories; c-- > 0;) {
        const bool present = std::any_of(points.begin(), points.end(), [&](const TimelinePoint& p) {
          return p.by_category[c] > 0;
        });
        if (!present) continue;
        std::vector<int64_t> ys;
        for (const TimelinePoint& p : points) ys.push_back(Tenths(Py(CumulativeBytes(p, c))));
        out_ += fmt::format("<path d=\"{}\" fill=\"{}\" fill-opacity=\"0.85\"/>\n",
                            StepPath(ys, true), CategoryColour(static_cast<Category>(c)));
      }
      PhaseLines();
      std::vector<int64_t> reserved, allocated;
      for (const TimelinePoint& p : points) {
        reserved.push_back(Tenths(Py(p.reserved_bytes)));
        allocated.push_back(Tenths(Py(p.allocated_bytes)));
      }
      out_ += fmt::format(
          "<path d=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.2\" stroke-dasharray=\"5 "
          "3\" "
          "vector-effect=\"non-scaling-stroke\"/>\n",
          StepPath(reserved, false), kAllocatedColour);
      out_ += fmt::format(
          "<path d=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.6\" "
          "vector-effect=\"non-scaling-stroke\"/>\n",
          StepPath(allocated, false), kAllocatedColour);
    }
    if (sim_.oom) {
      const double px = Px(sim_.oom_event_index);
      const double top = Py(FailedRequestTopBytes());
      out_ += fmt::format(
          "<rect x=\"{0}\" y=\"{1}\" width=\"{2}\" height=\"{3}\" fill=\"{4}\" "
          "fill-opacity=\"0.2\" "
          "stroke=\"{4}\" stroke-dasharray=\"4 2\" vector-effect=\"non-scaling-stroke\"/>\n"
          "<line x1=\"{0}\" y1=\"{5}\" x2=\"{0}\" y2=\"{6}\" stroke=\"{4}\" stroke-width=\"2\" "
          "vector-effect=\"non-scaling-stroke\"/>\n",
          Coord(px), Coord(top), Coord(std::max(0.0, ChartLayout::kPlotRight - px)),
          Coord(std::max(0.0, Py(sim_.oom->allocated_bytes) - top)), kLimitColour,
          Coord(ChartLayout::kPlotTop), Coord(ChartLayout::kPlotBottom));
    }
    out_ += "</g></g>\n";
    if (points.empty()) {
      out_ += fmt::format(
          "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" fill=\"#666666\">No timeline was "
          "recorded "
          "for this run.</text>\n",
          Coord((ChartLayout::kPlotLeft + ChartLayout::kPlotRight) / 2),
          Coord((ChartLayout::kPlotTop + ChartLayout::kPlotBottom) / 2));
    }
  }

  // Phase boundaries as seen in the (downsampled) timeline: a vertical line
  // where the step or phase of a point differs from the previous point's.
  void PhaseLines() {
    const auto& points = sim_.timeline;
    for (size_t i = 0; i < points.size(); ++i) {
      if (i > 0 && points[i].step == points[i - 1].step && points[i].phase == points[i - 1].phase) {
        continue;
      }
      const bool new_step = i == 0 || points[i].step != points[i - 1].step;
      markers_.push_back(
          {Px(points[i].event_index),
           new_step ? fmt::format("step {}: {}", points[i].step, PhaseLabel(points[i].phase))
                    : std::string(PhaseLabel(points[i].phase))});
      out_ += fmt::format(
          "<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"{3}\" stroke-width=\"0.8\" "
          "vector-effect=\"non-scaling-stroke\"/>\n",
          Coord(markers_.back().px), Coord(ChartLayout::kPlotTop), Coord(ChartLayout::kPlotBottom),
          kMarkerColour);
    }
  }

  // Horizontal levels. Their values are in the legend: labels inside the plot
  // would collide with the phase labels along its top edge.
  void Level(uint64_t bytes, const char* colour, const char* dash) {
    out_ += fmt::format(
        "<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"{3}\" stroke-width=\"1.5\" "
        "stroke-dasharray=\"{4}\"/>\n",
        Coord(ChartLayout::kPlotLeft), Coord(Py(bytes)), Coord(ChartLayout::kPlotRight), colour,
        dash);
  }

  void Levels() {
    out_ += "<g class=\"vs-levels\">\n";
    Level(DeviceTotalBytes(rank_), kDeviceTotalColour, "2 3");
    if (limit_on_chart_) Level(report_.gpu.usable_bytes, kLimitColour, "8 4");
    out_ += "</g>\n";
  }

  // Labels tied to an event: phase names, the peak and the OOM point. Each sits
  // in a g.vs-pin with its x in data-px so a zooming script can move it.
  void Pins() {
    // Inherited by every label: a white outline under the glyphs keeps them
    // readable over the bands.
    out_ +=
        "<g class=\"vs-pins\" stroke=\"#ffffff\" stroke-width=\"3\" stroke-linejoin=\"round\" "
        "paint-order=\"stroke\">\n";
    double last_label_px = -1e9;
    for (const Marker& m : markers_) {
      const bool visible = m.px - last_label_px >= kMinLabelGapPx;
      if (visible) last_label_px = m.px;
      out_ += fmt::format(
          "<g class=\"vs-pin vs-phase\" data-px=\"{0}\"{1}><text transform=\"translate({2},{3}) "
          "rotate(-90)\" text-anchor=\"end\" font-size=\"10\" fill=\"#555555\">{4}</text></g>\n",
          Coord(m.px), visible ? "" : " display=\"none\"", Coord(m.px + 11),
          Coord(ChartLayout::kPlotTop + 4), EscapeMarkup(m.label));
    }
    if (!sim_.timeline.empty()) {
      const double px = Px(sim_.peak_event_index);
      const double py = Py(sim_.peak_allocated_bytes);
      const bool left_half = px < (ChartLayout::kPlotLeft + ChartLayout::kPlotRight) / 2;
      out_ += fmt::format(
          "<g class=\"vs-pin\" data-px=\"{0}\"><circle cx=\"{0}\" cy=\"{1}\" r=\"4\" "
          "fill=\"#ffffff\" "
          "stroke=\"{2}\" stroke-width=\"2\"/><text x=\"{3}\" y=\"{4}\" text-anchor=\"{5}\" "
          "font-weight=\"bold\">peak allocated {6}</text></g>\n",
          Coord(px), Coord(py), kAllocatedColour, Coord(left_half ? px + 8 : px - 8),
          Coord(std::max(py - 8, ChartLayout::kPlotTop + 12)), left_half ? "start" : "end",
          FormatBytes(sim_.peak_allocated_bytes));
    }
    if (sim_.oom) {
      const double px = Px(sim_.oom_event_index);
      out_ += fmt::format(
          "<g class=\"vs-pin\" data-px=\"{0}\"><text x=\"{1}\" y=\"{2}\" text-anchor=\"end\" "
          "fill=\"{3}\" font-weight=\"bold\">OOM: {4} more</text></g>\n",
          Coord(px), Coord(px - 4), Coord(ChartLayout::kPlotBottom - 8), kLimitColour,
          FormatBytes(sim_.oom->alloc_size_bytes));
    }
    out_ += "</g>\n";
  }

  void XAxis() {
    AppendXAxis(
        &out_, IndexTicks(x_min_, x_max_, 6), [this](uint64_t tick) { return Px(tick); },
        "events (allocations and frees, in order)", CoordOf);
  }

  // A line sample with its label, and an optional second line in grey.
  void LegendLine(double y, const char* colour, const char* dash, double width,
                  std::string_view label, std::string_view detail = {}) {
    AppendLegendLine(&out_, y, colour, dash, width, label, CoordOf);
    if (!detail.empty()) {
      out_ += fmt::format("<text x=\"{}\" y=\"{}\" fill=\"#555555\">{}</text>\n",
                          Coord(ChartLayout::kLegendLeft + 24), Coord(y + 19), detail);
    }
  }

  void Legend() {
    out_ += "<g class=\"vs-legend\">\n";
    double y = ChartLayout::kPlotTop;
    out_ += fmt::format(
        "<text x=\"{}\" y=\"{}\" font-weight=\"bold\">allocated at the peak, GiB</text>\n",
        Coord(ChartLayout::kLegendLeft), Coord(y + 4));
    for (Category c : kAllCategories) {
      y += 20;
      out_ += fmt::format(
          "<rect x=\"{}\" y=\"{}\" width=\"18\" height=\"12\" fill=\"{}\"/>"
          "<text x=\"{}\" y=\"{}\">{} {}</text>\n",
          Coord(ChartLayout::kLegendLeft), Coord(y - 6), CategoryColour(c),
          Coord(ChartLayout::kLegendLeft + 24), Coord(y + 4), CategoryLabel(c),
          GiBNumber(sim_.breakdown_at_peak[static_cast<size_t>(c)]));
    }
    y += 30;
    LegendLine(y, kAllocatedColour, "", 1.6, "allocated");
    LegendLine(y += 20, kAllocatedColour, "5 3", 1.2, "reserved");
    const uint64_t usable = report_.gpu.usable_bytes;
    LegendLine(y += 20, kDeviceTotalColour, "2 3", 1.5, "device total (nvidia-smi)",
               fmt::format("{} at its peak", FormatBytes(DeviceTotalBytes(rank_))));
    LegendLine(y += 35, kLimitColour, "8 4", 1.5, "GPU usable memory",
               !report_.has_device_limit ? std::string("not recorded in the snapshot")
               : limit_on_chart_         ? FormatBytes(usable)
                                         : fmt::format("{}: far above", FormatBytes(usable)));
    LegendLine(y += 35, kMarkerColour, "", 0.8, "step / phase start");
    if (sim_.oom) {
      LegendLine(y += 20, kLimitColour, "", 2, "out of memory",
                 fmt::format("box: the failed {}", FormatBytes(sim_.oom->alloc_size_bytes)));
    }
    out_ += "</g>\n";
  }

  struct Marker {
    double px;
    std::string label;
  };

  const Report& report_;
  const RankReport& rank_;
  const SimResult& sim_;
  std::string id_;
  std::string out_;
  uint64_t x_min_ = 0;
  uint64_t x_max_ = 1;
  LinearTicks y_;
  bool limit_on_chart_ = false;
  std::vector<Marker> markers_;
};

}  // namespace

std::string RenderRankSvg(const Report& report, const RankReport& rank,
                          std::string_view id_prefix) {
  return ChartWriter(report, rank, id_prefix).Render();
}

}  // namespace vramscope::report_internal

namespace vramscope {

std::string RenderSvg(const Report& report) {
  return report_internal::RenderRankSvg(report, report.worst(), "vs");
}

}  // namespace vramscope
