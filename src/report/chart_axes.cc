// The parts both SVG charts share (chart_axes.h).
#include "chart_axes.h"

#include <fmt/format.h>

#include "report_format.h"
#include "svg_chart.h"

namespace vramscope::report_internal {

void AppendHeadings(std::string* out, std::string_view title_markup,
                    std::string_view subtitle_markup) {
  *out += fmt::format("<rect width=\"{}\" height=\"{}\" fill=\"#ffffff\"/>\n", ChartLayout::kWidth,
                      ChartLayout::kHeight);
  *out += fmt::format(
      "<text x=\"{}\" y=\"20\" text-anchor=\"middle\" font-size=\"15\" "
      "font-weight=\"bold\">{}</text>\n",
      ChartLayout::kWidth / 2, title_markup);
  *out += fmt::format("<text x=\"{}\" y=\"38\" text-anchor=\"middle\" fill=\"#444444\">{}</text>\n",
                      ChartLayout::kWidth / 2, subtitle_markup);
}

void AppendYAxis(std::string* out, const LinearTicks& y, CoordText coord) {
  *out += "<g class=\"vs-yaxis\">\n";
  for (double gib : y.values) {
    const double py =
        ChartLayout::kPlotBottom - gib / y.top * (ChartLayout::kPlotBottom - ChartLayout::kPlotTop);
    *out += fmt::format(
        "<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"#e4e4e4\"/>"
        "<text x=\"{3}\" y=\"{4}\" text-anchor=\"end\">{5:.{6}f}</text>\n",
        coord(ChartLayout::kPlotLeft), coord(py), coord(ChartLayout::kPlotRight),
        coord(ChartLayout::kPlotLeft - 6), coord(py + 4), gib, y.decimals);
  }
  *out += fmt::format(
      "<text transform=\"translate(18,{}) rotate(-90)\" text-anchor=\"middle\">memory "
      "(GiB)</text>\n",
      coord((ChartLayout::kPlotTop + ChartLayout::kPlotBottom) / 2));
  *out += "</g>\n";
}

void AppendXAxis(std::string* out, const std::vector<uint64_t>& ticks,
                 const std::function<double(uint64_t)>& px, std::string_view label_markup,
                 CoordText coord) {
  *out += fmt::format(
      "<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"#333333\"/>"
      "<line x1=\"{0}\" y1=\"{3}\" x2=\"{0}\" y2=\"{1}\" stroke=\"#333333\"/>\n",
      coord(ChartLayout::kPlotLeft), coord(ChartLayout::kPlotBottom),
      coord(ChartLayout::kPlotRight), coord(ChartLayout::kPlotTop));
  *out += "<g class=\"vs-xticks\">\n";
  for (uint64_t tick : ticks) {
    *out += fmt::format(
        "<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#333333\"/>"
        "<text x=\"{0}\" y=\"{3}\" text-anchor=\"middle\">{4}</text>\n",
        coord(px(tick)), coord(ChartLayout::kPlotBottom), coord(ChartLayout::kPlotBottom + 5),
        coord(ChartLayout::kPlotBottom + 18), GroupThousands(tick));
  }
  *out += "</g>\n";
  *out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
                      coord((ChartLayout::kPlotLeft + ChartLayout::kPlotRight) / 2),
                      coord(ChartLayout::kPlotBottom + 40), label_markup);
}

void AppendLegendLine(std::string* out, double y, const char* colour, const char* dash,
                      double width, std::string_view label_markup, CoordText coord) {
  *out += fmt::format(
      "<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"{3}\" stroke-width=\"{4}\"{5}/>"
      "<text x=\"{6}\" y=\"{7}\">{8}</text>\n",
      coord(ChartLayout::kLegendLeft), coord(y), coord(ChartLayout::kLegendLeft + 18), colour,
      width, *dash ? fmt::format(" stroke-dasharray=\"{}\"", dash) : std::string(),
      coord(ChartLayout::kLegendLeft + 24), coord(y + 4), label_markup);
}

}  // namespace vramscope::report_internal
