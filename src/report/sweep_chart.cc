// RenderSweepSvg: memory against a swept knob, a line chart.
//
// x: the first swept knob, linear from its smallest to its largest value.
// y: GiB from zero. One axis: peak allocated, peak reserved and device total,
// one marker per point. Two axes: one device-total line per value of the
// second knob. A point that does not fit gets a hollow red marker, drawn at
// what the whole run needs (Sweep replays a point that runs out of memory
// without the GPU's limit), so the curve goes on past the GPU's line. Every marker
// carries a <title>, so viewers show the numbers on hover without a script.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "chart_axes.h"
#include "chart_scale.h"
#include "report_format.h"
#include "svg_chart.h"
#include "sweep_internal.h"

namespace vramscope::report_internal {
namespace {

// The GPU limit joins the y range when it is at most this many times the
// data: a sweep is about what fits, so the line matters more here than on a
// timeline, but far above the data it would flatten every curve.
constexpr double kSweepLimitOnChartRatio = 4.0;
constexpr double kInsetPx = 10;       // markers at the ends stay off the frame
constexpr size_t kLegendGroups = 12;  // second-axis values named in the legend
constexpr size_t kDensePoints = 60;   // points per line above which markers shrink

// Distinct hues for the lines of a second knob, in order.
constexpr const char* kGroupColours[] = {"#3a6ea5", "#e08a1e", "#2e8b57", "#7a2e8e",
                                         "#8c564b", "#d6604d", "#17becf", "#6b6b6b"};

std::string SweepCoord(double v) { return fmt::format("{:.1f}", v); }

class SweepChartWriter {
 public:
  SweepChartWriter(const SweepResult& sweep, std::string_view id) : sweep_(sweep), id_(id) {}

  std::string Render() {
    Scale();
    Open();
    YAxis();
    XAxis();
    if (sweep_.axes.size() == 2) {
      GroupLines();
    } else {
      SingleLines();
    }
    Limit();
    Legend();
    out_ += "</svg>\n";
    return std::move(out_);
  }

 private:
  // At least 1: the stride of the loops over one group's points.
  size_t Groups() const {
    return sweep_.axes.size() == 2 ? std::max<size_t>(1, sweep_.axes[1].values.size()) : 1;
  }
  uint64_t X(const SweepPoint& p) const { return p.at.empty() ? x_lo_ : p.at[0]; }

  double Px(uint64_t x) const {
    x = std::clamp(x, x_lo_, x_hi_);
    const double share = static_cast<double>(x - x_lo_) / static_cast<double>(x_hi_ - x_lo_);
    return ChartLayout::kPlotLeft + kInsetPx +
           share * (ChartLayout::kPlotRight - ChartLayout::kPlotLeft - 2 * kInsetPx);
  }
  double Py(uint64_t bytes) const {
    const double share = std::min(1.0, static_cast<double>(bytes) / kChartGiB / y_.top);
    return ChartLayout::kPlotBottom - share * (ChartLayout::kPlotBottom - ChartLayout::kPlotTop);
  }

  void Scale() {
    const std::vector<uint64_t>& xs = sweep_.axes.empty() ? empty_ : sweep_.axes[0].values;
    x_lo_ = xs.empty() ? 0 : xs.front();
    x_hi_ = xs.empty() ? 1 : xs.back();
    if (x_hi_ <= x_lo_) {  // one value: centre it
      x_lo_ = x_lo_ > 0 ? x_lo_ - 1 : 0;
      x_hi_ = x_lo_ + 2;
    }
    uint64_t max_bytes = 0;
    for (const SweepPoint& p : sweep_.points) {
      max_bytes =
          std::max({max_bytes, SweepPointBytes(p), p.peak_reserved_bytes, p.peak_allocated_bytes});
    }
    double max_gib = static_cast<double>(max_bytes) / kChartGiB;
    const double usable_gib = static_cast<double>(sweep_.gpu.usable_bytes) / kChartGiB;
    limit_on_chart_ =
        usable_gib > 0 && (max_gib == 0 || usable_gib <= kSweepLimitOnChartRatio * max_gib);
    if (limit_on_chart_) max_gib = std::max(max_gib, usable_gib);
    y_ = ValueTicks(max_gib > 0 ? max_gib : 1.0, 5);
  }

  void Open() {
    const std::string knob = sweep_.axes.empty()
                                 ? std::string("knob")
                                 : std::string(SweepVariableKey(sweep_.axes[0].variable));
    const std::string title = fmt::format(
        "GPU memory against {}: {} on {}", knob,
        ClipText(sweep_.source.empty() ? "model" : sweep_.source, 60), GpuLabel(sweep_.gpu));
    out_ += fmt::format(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} "
        "{1}\" "
        "font-family=\"sans-serif\" font-size=\"12\" class=\"vs-sweep-chart\" id=\"{2}\">\n",
        ChartLayout::kWidth, ChartLayout::kHeight, id_);
    out_ += fmt::format("<title>{}</title>\n<desc>{}</desc>\n", EscapeMarkup(title),
                        EscapeMarkup(SweepSummaryLine(sweep_)));
    AppendHeadings(&out_, EscapeMarkup(title),
                   EscapeMarkup(ClipText(SweepSummaryLine(sweep_), 140)));
  }

  void YAxis() { AppendYAxis(&out_, y_, SweepCoord); }

  void XAxis() {
    const std::string label =
        sweep_.axes.empty() ? std::string()
                            : fmt::format("{} ({})", SweepVariableKey(sweep_.axes[0].variable),
                                          SweepVariableFlag(sweep_.axes[0].variable));
    AppendXAxis(
        &out_, IndexTicks(x_lo_, x_hi_, 6), [this](uint64_t x) { return Px(x); }, label,
        SweepCoord);
  }

  // A polyline through the points of one group.
  template <typename Value>
  void Line(size_t group, Value value, const char* colour, const char* dash, double width) {
    std::string d;
    for (size_t i = group; i < sweep_.points.size(); i += Groups()) {
      const SweepPoint& p = sweep_.points[i];
      d += fmt::format("{}{},{}", d.empty() ? "M" : "L", SweepCoord(Px(X(p))),
                       SweepCoord(Py(value(p))));
    }
    if (d.empty()) return;
    out_ += fmt::format("<path d=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"{}\"{}/>\n", d,
                        colour, width,
                        *dash ? fmt::format(" stroke-dasharray=\"{}\"", dash) : std::string());
  }

  void Markers(size_t group, const char* colour) {
    // Dense grids get small markers, or they would hide the lines.
    const bool dense = sweep_.points.size() / Groups() > kDensePoints;
    const char* radius = dense ? "1.6" : "3";
    const char* stroke = dense ? "0.8" : "1.5";
    out_ += "<g class=\"vs-points\">\n";
    for (size_t i = group; i < sweep_.points.size(); i += Groups()) {
      const SweepPoint& p = sweep_.points[i];
      const std::string tip = fmt::format(
          "{}: peak allocated {}, peak reserved {}, device total {}{}", SweepPointLabel(sweep_, p),
          FormatBytes(p.peak_allocated_bytes), FormatBytes(p.peak_reserved_bytes),
          FormatBytes(p.device_total_bytes),
          p.fits ? ", fits"
          : p.oom
              ? ", does not fit: what the whole run needs (PyTorch would run out of memory first)"
              : ", does not fit");
      out_ += fmt::format(
          "<circle cx=\"{}\" cy=\"{}\" r=\"{}\" fill=\"{}\" stroke=\"{}\" stroke-width=\"{}\">"
          "<title>{}</title></circle>\n",
          SweepCoord(Px(X(p))), SweepCoord(Py(SweepPointBytes(p))), radius,
          p.fits ? colour : "#ffffff", p.fits ? colour : kLimitColour, stroke, EscapeMarkup(tip));
    }
    out_ += "</g>\n";
  }

  void SingleLines() {
    Line(
        0, [](const SweepPoint& p) { return p.peak_allocated_bytes; }, kAllocatedColour, "", 1.6);
    Line(
        0, [](const SweepPoint& p) { return p.peak_reserved_bytes; }, kAllocatedColour, "5 3", 1.2);
    Line(
        0, [](const SweepPoint& p) { return SweepPointBytes(p); }, kDeviceTotalColour, "", 2);
    Markers(0, kDeviceTotalColour);
  }

  void GroupLines() {
    for (size_t g = 0; g < Groups(); ++g) {
      const char* colour = kGroupColours[g % std::size(kGroupColours)];
      Line(
          g, [](const SweepPoint& p) { return SweepPointBytes(p); }, colour, "", 1.8);
      Markers(g, colour);
    }
  }

  void Limit() {
    if (!limit_on_chart_) return;
    out_ += fmt::format(
        "<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"{3}\" stroke-width=\"1.5\" "
        "stroke-dasharray=\"8 4\"/>\n",
        SweepCoord(ChartLayout::kPlotLeft), SweepCoord(Py(sweep_.gpu.usable_bytes)),
        SweepCoord(ChartLayout::kPlotRight), kLimitColour);
  }

  void LegendLine(double y, const char* colour, const char* dash, double width,
                  std::string_view label) {
    AppendLegendLine(&out_, y, colour, dash, width, EscapeMarkup(label), SweepCoord);
  }

  void Legend() {
    out_ += "<g class=\"vs-legend\">\n";
    double y = ChartLayout::kPlotTop + 4;
    if (sweep_.axes.size() == 2) {
      out_ +=
          fmt::format("<text x=\"{}\" y=\"{}\" font-weight=\"bold\">device total per {}</text>\n",
                      SweepCoord(ChartLayout::kLegendLeft), SweepCoord(y),
                      SweepVariableKey(sweep_.axes[1].variable));
      for (size_t g = 0; g < sweep_.axes[1].values.size() && g < kLegendGroups; ++g) {
        LegendLine(y += 20, kGroupColours[g % std::size(kGroupColours)], "", 1.8,
                   fmt::format("{} {}", SweepVariableKey(sweep_.axes[1].variable),
                               sweep_.axes[1].values[g]));
      }
      if (sweep_.axes[1].values.size() > kLegendGroups) {
        out_ += fmt::format("<text x=\"{}\" y=\"{}\">... {} more</text>\n",
                            SweepCoord(ChartLayout::kLegendLeft + 24), SweepCoord((y += 20) + 4),
                            Groups() - kLegendGroups);
      }
    } else {
      LegendLine(y, kAllocatedColour, "", 1.6, "peak allocated");
      LegendLine(y += 20, kAllocatedColour, "5 3", 1.2, "peak reserved");
      LegendLine(y += 20, kDeviceTotalColour, "", 2, "device total (nvidia-smi)");
    }
    const bool any_failing = std::any_of(sweep_.points.begin(), sweep_.points.end(),
                                         [](const SweepPoint& p) { return !p.fits; });
    if (any_failing) {
      y += 30;
      out_ += fmt::format(
          "<circle cx=\"{}\" cy=\"{}\" r=\"3\" fill=\"#ffffff\" stroke=\"{}\" "
          "stroke-width=\"1.5\"/>"
          "<text x=\"{}\" y=\"{}\">does not fit</text>\n"
          "<text x=\"{}\" y=\"{}\" fill=\"#555555\">OOM: in use at the failure</text>\n",
          SweepCoord(ChartLayout::kLegendLeft + 9), SweepCoord(y), kLimitColour,
          SweepCoord(ChartLayout::kLegendLeft + 24), SweepCoord(y + 4),
          SweepCoord(ChartLayout::kLegendLeft + 24), SweepCoord(y + 19));
      y += 15;
    }
    y += 30;
    LegendLine(y, kLimitColour, "8 4", 1.5, "GPU usable memory");
    out_ += fmt::format("<text x=\"{}\" y=\"{}\" fill=\"#555555\">{}{}</text>\n",
                        SweepCoord(ChartLayout::kLegendLeft + 24), SweepCoord(y + 19),
                        FormatBytes(sweep_.gpu.usable_bytes), limit_on_chart_ ? "" : ": far above");
    out_ += "</g>\n";
  }

  const SweepResult& sweep_;
  std::string id_;
  std::string out_;
  const std::vector<uint64_t> empty_;
  uint64_t x_lo_ = 0, x_hi_ = 1;
  LinearTicks y_;
  bool limit_on_chart_ = false;
};

}  // namespace

std::string RenderSweepChart(const SweepResult& sweep, std::string_view id_prefix) {
  return SweepChartWriter(sweep, id_prefix).Render();
}

}  // namespace vramscope::report_internal

namespace vramscope {

std::string RenderSweepSvg(const SweepResult& sweep) {
  return report_internal::RenderSweepChart(sweep, "vs");
}

}  // namespace vramscope
