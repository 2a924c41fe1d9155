// Renderings of a Validation: human table (GiB), JSON, README Markdown.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "vramscope/report.h"
#include "vramscope/validate.h"

namespace vramscope {
namespace {

std::string Pct(double fraction) { return fmt::format("{:+.1f}%", 100 * fraction); }

std::string StatsLine(const char* what, const ErrorStats& s) {
  if (s.count == 0) return fmt::format("  {:<15} no ok measurements\n", what);
  return fmt::format(
      "  {:<15} n={}  median |err| {:.1f}%  p90 {:.1f}%  max {:.1f}%  under by >2%: {}\n", what,
      s.count, 100 * s.median_abs, 100 * s.p90_abs, 100 * s.max_abs, s.under_2pct);
}

nlohmann::json StatsJson(const ErrorStats& s) {
  return {{"count", s.count},
          {"median_abs_error", s.median_abs},
          {"p90_abs_error", s.p90_abs},
          {"max_abs_error", s.max_abs},
          {"under_estimates_over_2pct", s.under_2pct},
          {"worst_under_estimate", s.worst_under}};
}

std::string Short(const std::string& s, size_t n) {
  return s.size() <= n ? s : s.substr(0, n - 3) + "...";
}

using Knobs = std::vector<std::pair<std::string, std::string>>;

// Row labels that tell the rows apart: the knobs whose values differ between
// rows (issue 18: truncated names could not be told apart); `common` gets the
// knobs every row shares.
std::vector<std::string> RowLabels(const Validation& v, std::string* common) {
  std::vector<Knobs> all;
  for (const ValidationRow& r : v.rows) all.push_back(r.knobs);
  std::vector<std::string> labels(all.size());
  std::vector<std::string> shared;
  if (all.empty()) return labels;
  for (size_t i = 0; i < all.front().size(); ++i) {
    const std::string& key = all.front()[i].first;
    bool differs = false;
    for (const Knobs& k : all) differs = differs || i >= k.size() || k[i] != all.front()[i];
    if (!differs) {
      if (!all.front()[i].second.empty()) shared.push_back(key + "=" + all.front()[i].second);
      continue;
    }
    for (size_t r = 0; r < all.size(); ++r) {
      if (i < all[r].size())
        labels[r] += (labels[r].empty() ? "" : " ") + key + "=" + all[r][i].second;
    }
  }
  for (size_t r = 0; r < labels.size(); ++r) {
    if (labels[r].empty())
      labels[r] = v.rows[r].run.name.empty() ? v.rows[r].run.id : v.rows[r].run.name;
  }
  for (const std::string& kv : shared) *common += (common->empty() ? "" : " ") + kv;
  return labels;
}

}  // namespace

std::string RenderValidationText(const Validation& v) {
  if (v.rows.empty()) {
    std::string out =
        "vramscope validate: no ok or out-of-memory measurements in the given files.\n";
    for (const std::string& line : v.not_compared) out += "  not compared: " + line + "\n";
    return out;
  }
  std::string out =
      "vramscope validate: measured vs predicted (GiB = 2^30 bytes; error = (predicted - measured) "
      "/ measured)\n\n";
  std::string common;
  const std::vector<std::string> labels = RowLabels(v, &common);
  if (v.rows.size() > 1 && !common.empty()) out += "Every row: " + common + "\n\n";
  size_t width = 13;
  for (const std::string& l : labels) width = std::max(width, std::min<size_t>(l.size(), 90));
  out += fmt::format("{:<{}} {:>6} {:>21} {:>21} {:>21}\n", "configuration", width, "status",
                     "peak allocated", "peak reserved", "device");
  out += fmt::format("{:<{}} {:>6} {:>21} {:>21} {:>21}\n", "", width, "", "meas  pred  err",
                     "meas  pred  err", "meas  pred  err");
  for (size_t i = 0; i < v.rows.size(); ++i) {
    const ValidationRow& r = v.rows[i];
    const std::string name = fmt::format("{:<{}}", Short(labels[i], 90), width);
    if (!r.estimated) {
      out += fmt::format("{} {:>6} not estimated: {}\n", name, r.run.status, r.problem);
      continue;
    }
    if (r.run.status == "oom") {
      out += fmt::format("{} {:>6} measured OOM; predicted {} on the device: {}\n", name, "oom",
                         FormatBytes(r.predicted_device_bytes),
                         r.predicted_fits ? "fits (missed OOM)" : "does not fit (agrees)");
      continue;
    }
    auto cell = [](uint64_t m, uint64_t p) {
      return fmt::format("{:.2f} {:.2f} {:>6}", static_cast<double>(m) / (1ull << 30),
                         static_cast<double>(p) / (1ull << 30), Pct(RelativeError(p, m)));
    };
    out += fmt::format("{} {:>6} {:>21} {:>21} {:>21}\n", name, "ok",
                       cell(r.run.peak_allocated_bytes, r.predicted_allocated_bytes),
                       cell(r.run.peak_reserved_bytes, r.predicted_reserved_bytes),
                       cell(r.run.device_bytes, r.predicted_device_bytes));
  }
  out += "\nSummary\n";
  out += StatsLine("peak allocated", v.allocated);
  out += StatsLine("peak reserved", v.reserved);
  out += StatsLine("device", v.device);
  out += fmt::format(
      "  out of memory   {} measured, {} predicted not to fit; {} ok runs predicted not to fit\n",
      v.oom_runs, v.oom_predicted, v.fits_mispredicted);
  if (!v.not_compared.empty()) {
    out += fmt::format("\nNot compared ({} skipped or error records)\n", v.not_compared.size());
    for (const std::string& line : v.not_compared) out += "  " + line + "\n";
  }
  return out;
}

std::string RenderValidationJson(const Validation& v, const std::vector<std::string>& failures,
                                 bool checked) {
  nlohmann::json rows = nlohmann::json::array();
  for (const ValidationRow& r : v.rows) {
    nlohmann::json row = {{"where", r.run.where},
                          {"id", r.run.id},
                          {"name", r.run.name},
                          {"status", r.run.status},
                          {"estimated", r.estimated}};
    if (!r.estimated) row["problem"] = r.problem;
    if (r.run.status == "ok") {
      row["measured"] = {{"peak_allocated_bytes", r.run.peak_allocated_bytes},
                         {"peak_reserved_bytes", r.run.peak_reserved_bytes},
                         {"device_bytes", r.run.device_bytes}};
    }
    if (r.estimated) {
      row["predicted"] = {{"peak_allocated_bytes", r.predicted_allocated_bytes},
                          {"peak_reserved_bytes", r.predicted_reserved_bytes},
                          {"device_bytes", r.predicted_device_bytes},
                          {"fits", r.predicted_fits}};
      if (r.run.status == "ok") {
        row["relative_error"] = {
            {"peak_allocated",
             RelativeError(r.predicted_allocated_bytes, r.run.peak_allocated_bytes)},
            {"peak_reserved", RelativeError(r.predicted_reserved_bytes, r.run.peak_reserved_bytes)},
            {"device", RelativeError(r.predicted_device_bytes, r.run.device_bytes)}};
      }
    }
    rows.push_back(std::move(row));
  }
  nlohmann::json j = {
      {"rows", rows},
      {"summary",
       {{"peak_allocated", StatsJson(v.allocated)},
        {"peak_reserved", StatsJson(v.reserved)},
        {"device", StatsJson(v.device)},
        {"oom_runs", v.oom_runs},
        {"oom_predicted", v.oom_predicted},
        {"ok_runs_predicted_not_to_fit", v.fits_mispredicted}}},
      {"not_compared", v.not_compared},
      {"thresholds_checked", checked},
      {"threshold_failures", failures},
  };
  return j.dump(2) + "\n";
}

std::string RenderValidationMarkdown(const Validation& v) {
  if (v.rows.empty()) {
    return "No GPU measurements are committed yet: there is no accuracy figure to show.\n";
  }
  std::string out =
      "| quantity | configurations | median \\|error\\| | p90 \\|error\\| | max \\|error\\| | "
      "under-estimates > 2% |\n";
  out += "|---|---:|---:|---:|---:|---:|\n";
  auto row = [&](const char* what, const ErrorStats& s) {
    out += fmt::format("| {} | {} | {:.1f}% | {:.1f}% | {:.1f}% | {} |\n", what, s.count,
                       100 * s.median_abs, 100 * s.p90_abs, 100 * s.max_abs, s.under_2pct);
  };
  row("peak allocated", v.allocated);
  row("peak reserved", v.reserved);
  row("device (nvidia-smi)", v.device);
  out += fmt::format(
      "\nOut of memory: {} measured, {} predicted not to fit. {} records skipped or failed.\n",
      v.oom_runs, v.oom_predicted, v.not_compared.size());
  return out;
}

}  // namespace vramscope
