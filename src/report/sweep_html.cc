// RenderSweepHtml: one self-contained offline page with the sweep chart, the
// table and the knobs. Same rules as RenderHtml: a Content-Security-Policy
// that forbids every network request, inline CSS, every input text escaped.
// No script at all: the chart's markers carry <title> tooltips.
#include <string>

#include <fmt/format.h>

#include "html_assets.h"
#include "report_format.h"
#include "sweep_internal.h"
#include "vramscope/sweep.h"

namespace vramscope {

using namespace report_internal;

namespace {

void Table(const SweepResult& sweep, std::string* out) {
  *out += "<h2>Points</h2>\n<table>\n<tr>";
  for (const SweepAxis& axis : sweep.axes) {
    *out += fmt::format("<th class=\"num\">{}</th>", SweepVariableKey(axis.variable));
  }
  *out +=
      "<th class=\"num\">peak allocated</th><th class=\"num\">peak reserved</th>"
      "<th class=\"num\">device total</th><th>fits</th></tr>\n";
  for (const SweepPoint& p : sweep.points) {
    *out += p.fits ? "<tr>" : "<tr class=\"peak\">";
    for (uint64_t v : p.at) *out += TableCell(std::to_string(v), "num");
    *out += TableCell(FormatBytes(p.peak_allocated_bytes), "num") +
            TableCell(FormatBytes(p.peak_reserved_bytes), "num") +
            TableCell(FormatBytes(p.device_total_bytes), "num");
    if (p.fits) {
      *out += TableCell("yes");
    } else if (p.oom) {
      *out += TableCell("no: simulated OOM");
    } else {
      *out += TableCell("no");
    }
    *out += "</tr>\n";
  }
  *out += "</table>\n";
}

}  // namespace

std::string RenderSweepHtml(const SweepResult& sweep) {
  const std::string title = EscapeMarkup(sweep.source.empty() ? "sweep" : sweep.source);
  std::string out = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  out +=
      "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
      "style-src 'unsafe-inline'\">\n";
  out += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  out += fmt::format("<title>vramscope sweep: {}</title>\n<style>{}{}</style>\n</head>\n<body>\n",
                     title, kHtmlStyle,
                     "figure.vs-sweep svg { max-width: 100%; height: auto; display: block; }\n");
  out += fmt::format("<h1>vramscope sweep: {}</h1>\n", title);
  if (sweep.model) {
    out += fmt::format(
        "<p class=\"meta\">Model: <b>{}</b>{}, {} parameters, {} trainable</p>\n",
        EscapeMarkup(sweep.model->name),
        sweep.model->architecture.empty() ? ""
                                          : " (" + EscapeMarkup(sweep.model->architecture) + ")",
        GroupThousands(sweep.model->parameters), GroupThousands(sweep.model->trainable_parameters));
  }
  out += fmt::format("<p class=\"meta\">GPU: <b>{}</b>, {} usable</p>\n",
                     EscapeMarkup(GpuLabel(sweep.gpu)), FormatBytes(sweep.gpu.usable_bytes));
  bool all_fit = !sweep.points.empty();
  for (const SweepPoint& p : sweep.points) all_fit = all_fit && p.fits;
  out += fmt::format("<p class=\"verdict {}\">{}</p>\n", all_fit ? "fits" : "nofit",
                     EscapeMarkup(SweepSummaryLine(sweep)));
  out += "<figure class=\"vs-sweep\">\n" + RenderSweepChart(sweep, "vs-sweep") +
         "<figcaption>Hover a point for its numbers. Device total is what <code>nvidia-smi</code> "
         "shows: "
         "peak reserved plus the CUDA context and memory outside PyTorch. A hollow red point does "
         "not fit. "
         "A point that does not fit is drawn at what the whole run needs (replayed without the "
         "GPU's limit), so the curve goes on past the GPU's line; PyTorch would stop at the "
         "out-of-memory point, which <code>estimate</code> at that point shows.</figcaption>\n"
         "</figure>\n";
  Table(sweep, &out);
  if (!sweep.knobs.empty()) {
    out += "<h2>Knobs used</h2>\n<table>\n";
    for (const auto& [key, value] : sweep.knobs) {
      out += "<tr>" + TableCell(EscapeMarkup(key)) + TableCell(EscapeMarkup(value), "name") +
             "</tr>\n";
    }
    out += "</table>\n";
  }
  out += "</body>\n</html>\n";
  return out;
}

}  // namespace vramscope
