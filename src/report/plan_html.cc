// RenderPlanHtml (plan.h): one self-contained offline page with every
// estimated strategy, the explanation and the step-time assumptions. Same
// rules as the other HTML reports (src/report/html_renderer.cc): a
// Content-Security-Policy that forbids every network request, inline CSS,
// every input text escaped. No script at all.
#include <string>

#include <fmt/format.h>

#include "report_format.h"
#include "vramscope/plan.h"
#include "vramscope/report.h"

namespace vramscope {
namespace {

constexpr std::string_view kStyle = R"CSS(
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto;
       max-width: 1100px; padding: 16px 24px 48px; color: #1a1a1a; line-height: 1.4; }
h1 { font-size: 1.5em; margin: 0.2em 0; word-break: break-word; }
h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #dddddd; }
.meta { color: #444444; margin: 0.2em 0; }
.verdict { font-size: 1.2em; font-weight: bold; padding: 10px 14px; border-radius: 6px; }
.verdict.fits { background: #e3f4e6; color: #1d5e2c; }
.verdict.nofit { background: #fbe4e4; color: #8e1f1f; }
table { border-collapse: collapse; margin: 0.5em 0; }
th, td { padding: 3px 10px; border-bottom: 1px solid #eeeeee; text-align: left; vertical-align: top; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.nofit td { color: #8e1f1f; }
)CSS";

using report_internal::GroupThousands;

std::string PlanCell(std::string_view html, bool num = false) {
  return report_internal::TableCell(html, num ? "num" : nullptr);
}

void StrategyTable(const PlanResult& plan, std::string* out) {
  *out +=
      "<table class=\"vs-plan\">\n<tr><th class=\"num\">#</th><th class=\"num\">tokens/s</th>"
      "<th class=\"num\">step (s)</th><th class=\"num\">device total</th>"
      "<th class=\"num\">peak allocated</th><th>fits</th><th>strategy</th></tr>\n";
  for (size_t i = 0; i < plan.strategies.size(); ++i) {
    const Strategy& s = plan.strategies[i];
    std::string fits = "yes";
    if (!s.fits)
      fits = s.oom ? fmt::format("no: simulated OOM, needs &ge; {}", FormatBytes(s.needed_bytes))
                   : "no";
    *out += (s.fits ? "<tr>" : "<tr class=\"nofit\">") + PlanCell(std::to_string(i + 1), true) +
            PlanCell(fmt::format("{:.0f}", s.time.tokens_per_second), true) +
            PlanCell(fmt::format("{:.2f}", s.time.step_seconds), true) +
            PlanCell(FormatBytes(s.device_total_bytes), true) +
            PlanCell(FormatBytes(s.peak_allocated_bytes), true) + PlanCell(fits) +
            PlanCell(EscapeHtml(s.label)) + "</tr>\n";
  }
  *out += "</table>\n";
}

}  // namespace

std::string RenderPlanHtml(const PlanResult& plan, std::string_view source) {
  const std::string title = EscapeHtml(source.empty() ? "plan" : source);
  size_t fitting = 0;
  for (const Strategy& s : plan.strategies) fitting += s.fits ? 1 : 0;
  std::string out = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  out +=
      "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src "
      "'unsafe-inline'\">\n";
  out += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  out += fmt::format("<title>vramscope plan: {}</title>\n<style>{}</style>\n</head>\n<body>\n",
                     title, kStyle);
  out += fmt::format("<h1>vramscope plan: {}</h1>\n", title);
  if (plan.model) {
    out += fmt::format(
        "<p class=\"meta\">Model: <b>{}</b>{}, {} parameters</p>\n", EscapeHtml(plan.model->name),
        plan.model->architecture.empty() ? "" : " (" + EscapeHtml(plan.model->architecture) + ")",
        GroupThousands(plan.model->parameters));
  }
  const std::string gpu = plan.gpu.display_name.empty() ? plan.gpu.name : plan.gpu.display_name;
  out += fmt::format("<p class=\"meta\">GPU: <b>{}</b>, {} usable, one GPU</p>\n", EscapeHtml(gpu),
                     FormatBytes(plan.gpu.usable_bytes));
  out += fmt::format(
      "<p class=\"verdict {}\">Step: {} tokens = {} sequences of {}. {} strategies considered, {} "
      "estimated, {} "
      "fit.</p>\n",
      fitting ? "fits" : "nofit", plan.tokens_per_step,
      plan.seq ? plan.tokens_per_step / plan.seq : 0, plan.seq, plan.considered, plan.estimates,
      fitting);
  if (!plan.explanation.empty()) {
    out += "<h2>Why</h2>\n<ul>\n";
    for (const std::string& line : plan.explanation)
      out += fmt::format("<li>{}</li>\n", EscapeHtml(line));
    out += "</ul>\n";
  }
  out +=
      "<h2>Strategies</h2>\n<p>Those that fit, fastest first; then those that do not, by memory "
      "needed. "
      "Memory is estimated; step time is a model (docs/plan.md), not a measurement.</p>\n";
  StrategyTable(plan, &out);
  out += fmt::format(
      "<h2>Step-time assumptions</h2>\n<table>\n<tr><td>share of peak dense bf16 throughput "
      "reached</td>"
      "<td class=\"num\">{:.0f}%</td></tr>\n<tr><td>share of peak memory bandwidth (optimizer)</td>"
      "<td class=\"num\">{:.0f}%</td></tr>\n<tr><td>tokens per micro-batch at half utilisation</td>"
      "<td class=\"num\">{:.0f}</td></tr>\n<tr><td>GPU peak dense bf16</td><td "
      "class=\"num\">{:.0f} TFLOP/s</td></tr>\n"
      "<tr><td>GPU memory bandwidth</td><td class=\"num\">{:.0f} GB/s</td></tr>\n</table>\n",
      100 * kAchievableComputeFraction, 100 * kAchievableBandwidthFraction, kHalfUtilisationTokens,
      plan.gpu.bf16_dense_tflops, plan.gpu.memory_bandwidth_gbps);
  out += "</body>\n</html>\n";
  return out;
}

}  // namespace vramscope
