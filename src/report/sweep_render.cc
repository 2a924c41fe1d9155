// Sweep renderers for terminals and machines: RenderSweepText, RenderSweepJson,
// RenderSweepCsv (vramscope/sweep.h), and the summary line they share with
// the chart and the page.
#include <algorithm>
#include <iterator>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "report_format.h"
#include "sweep_internal.h"
#include "vramscope/sweep.h"

namespace vramscope {

std::string_view SweepVariableKey(SweepVariable v) {
  switch (v) {
    case SweepVariable::kSeq: return "seq";
    case SweepVariable::kBatch: return "batch";
    case SweepVariable::kLoraRank: return "lora_rank";
    case SweepVariable::kGradAccum: return "grad_accum";
    case SweepVariable::kImageSize: return "image_size";
  }
  return "seq";
}

std::string_view SweepVariableFlag(SweepVariable v) {
  switch (v) {
    case SweepVariable::kSeq: return "--seq";
    case SweepVariable::kBatch: return "--batch";
    case SweepVariable::kLoraRank: return "--lora-rank";
    case SweepVariable::kGradAccum: return "--grad-accum";
    case SweepVariable::kImageSize: return "--image-size";
  }
  return "--seq";
}

namespace report_internal {
namespace {

// Most values of a second axis the summary line names one by one.
constexpr size_t kSummaryGroups = 12;

uint64_t FirstValue(const SweepPoint& p) { return p.at.empty() ? 0 : p.at[0]; }

// Largest fitting first-axis value among the points with second-axis index
// `group` (every point when there is one axis); 0 when none fits.
uint64_t LargestFitting(const SweepResult& sweep, size_t group, size_t groups) {
  uint64_t best = 0;
  for (size_t i = group; i < sweep.points.size(); i += groups) {
    if (sweep.points[i].fits) best = std::max(best, FirstValue(sweep.points[i]));
  }
  return best;
}

std::string OneAxisSummary(const SweepResult& sweep) {
  const std::string_view flag = SweepVariableFlag(sweep.axes[0].variable);
  const std::string gpu =
      fmt::format("{} usable on {}", FormatBytes(sweep.gpu.usable_bytes), GpuLabel(sweep.gpu));
  const SweepPoint* first_failing = nullptr;
  const SweepPoint* last_fitting = nullptr;
  for (const SweepPoint& p : sweep.points) {
    if (p.fits) last_fitting = &p;
    if (!p.fits && !first_failing) first_failing = &p;
  }
  // A point's numbers are what the whole run needs (Sweep replays one that
  // runs out of memory without the GPU's limit); a simulated OOM says where
  // PyTorch would stop, which can happen below the limit (a fragmented cache).
  const auto fails = [&](const SweepPoint& p) {
    return fmt::format("needs {}, above the {}{}", FormatBytes(SweepPointBytes(p)), gpu,
                       p.oom ? " (PyTorch would run out of memory on the way)" : "");
  };
  if (!first_failing) {
    uint64_t most = 0;
    for (const SweepPoint& p : sweep.points) most = std::max(most, p.device_total_bytes);
    return fmt::format("Every point fits: the largest device total is {} of the {}.",
                       FormatBytes(most), gpu);
  }
  if (!last_fitting) {
    return fmt::format("No point fits: {} {} {}.", flag, FirstValue(*first_failing),
                       fails(*first_failing));
  }
  const bool gap = FirstValue(*first_failing) < FirstValue(*last_fitting);
  return fmt::format("Fits up to {} {} in this grid; {} {} {}{}.", flag, FirstValue(*last_fitting),
                     flag, FirstValue(*first_failing), fails(*first_failing),
                     gap ? "; fitting and failing points alternate near the limit" : "");
}

std::string TwoAxisSummary(const SweepResult& sweep) {
  const std::string_view flag0 = SweepVariableFlag(sweep.axes[0].variable);
  const std::string_view flag1 = SweepVariableFlag(sweep.axes[1].variable);
  const size_t groups = sweep.axes[1].values.size();
  std::string out = fmt::format("Largest fitting {} on {} ({} usable):", flag0, GpuLabel(sweep.gpu),
                                FormatBytes(sweep.gpu.usable_bytes));
  for (size_t g = 0; g < groups && g < kSummaryGroups; ++g) {
    const uint64_t best = LargestFitting(sweep, g, groups);
    out += fmt::format("{} {} {}: {}", g ? ";" : "", flag1, sweep.axes[1].values[g],
                       best ? std::to_string(best) : std::string("none"));
  }
  if (groups > kSummaryGroups) out += "; ...";
  return out + ".";
}

}  // namespace

uint64_t SweepPointBytes(const SweepPoint& point) {
  return point.oom ? std::max(point.needed_bytes, point.device_total_bytes)
                   : point.device_total_bytes;
}

std::string SweepPointLabel(const SweepResult& sweep, const SweepPoint& point) {
  std::string out;
  for (size_t a = 0; a < sweep.axes.size() && a < point.at.size(); ++a) {
    out += fmt::format("{}{} {}", a ? ", " : "", SweepVariableKey(sweep.axes[a].variable),
                       point.at[a]);
  }
  return out;
}

std::string SweepSummaryLine(const SweepResult& sweep) {
  if (sweep.axes.empty() || sweep.points.empty()) return "No points.";
  return sweep.axes.size() == 1 ? OneAxisSummary(sweep) : TwoAxisSummary(sweep);
}

}  // namespace report_internal

using namespace report_internal;

std::string RenderSweepText(const SweepResult& sweep) {
  std::string out = fmt::format("vramscope sweep: {}\n", SanitizeText(sweep.source));
  if (sweep.model) {
    out += fmt::format("Model:  {}, {} parameters, {} trainable\n", SanitizeText(sweep.model->name),
                       GroupThousands(sweep.model->parameters),
                       GroupThousands(sweep.model->trainable_parameters));
  }
  out += fmt::format("GPU:    {}, {} usable\n", GpuLabel(sweep.gpu),
                     FormatBytes(sweep.gpu.usable_bytes));
  std::string knobs;
  for (const auto& [key, value] : sweep.knobs) {
    knobs +=
        fmt::format("{}{}={}", knobs.empty() ? "" : ", ", SanitizeText(key), SanitizeText(value));
  }
  out += fmt::format("Knobs:  {}\n\n", knobs);
  for (const SweepAxis& axis : sweep.axes)
    out += fmt::format("{:>10} ", SweepVariableKey(axis.variable));
  out += fmt::format("{:>15} {:>15} {:>15}  {}\n", "peak allocated", "peak reserved",
                     "device total", "fits");
  for (const SweepPoint& p : sweep.points) {
    for (uint64_t v : p.at) out += fmt::format("{:>10} ", v);
    out += fmt::format("{:>15} {:>15} {:>15}  ", FormatBytes(p.peak_allocated_bytes),
                       FormatBytes(p.peak_reserved_bytes), FormatBytes(p.device_total_bytes));
    if (p.fits) {
      out += "yes\n";
    } else if (p.oom) {
      out += "no: simulated OOM\n";
    } else {
      out += "no\n";
    }
  }
  out += "\n" + SweepSummaryLine(sweep) + "\n";
  out +=
      "Device total = peak reserved + CUDA context + memory outside PyTorch (what nvidia-smi "
      "shows).\n"
      "A point that does not fit shows what the whole run needs (replayed without the GPU's "
      "limit);\n"
      "\"simulated OOM\" says PyTorch would stop there: `estimate` at that point shows where.\n";
  return out;
}

std::string RenderSweepJson(const SweepResult& sweep, int indent) {
  using Json = nlohmann::ordered_json;
  Json root;
  root["command"] = "sweep";
  root["source"] = sweep.source;
  if (sweep.model) {
    root["model"] = {{"name", sweep.model->name},
                     {"architecture", sweep.model->architecture},
                     {"parameters", sweep.model->parameters},
                     {"trainable_parameters", sweep.model->trainable_parameters}};
  } else {
    root["model"] = nullptr;
  }
  root["gpu"] = {{"name", sweep.gpu.name}, {"usable_bytes", sweep.gpu.usable_bytes}};
  Json knobs = Json::object();
  for (const auto& [key, value] : sweep.knobs) knobs[key] = value;
  root["knobs"] = std::move(knobs);
  Json variables = Json::array();
  for (const SweepAxis& axis : sweep.axes) variables.push_back(SweepVariableKey(axis.variable));
  root["variables"] = std::move(variables);
  Json points = Json::array();
  for (const SweepPoint& p : sweep.points) {
    Json j;
    for (size_t a = 0; a < sweep.axes.size() && a < p.at.size(); ++a) {
      j[std::string(SweepVariableKey(sweep.axes[a].variable))] = p.at[a];
    }
    j["peak_allocated_bytes"] = p.peak_allocated_bytes;
    j["peak_reserved_bytes"] = p.peak_reserved_bytes;
    j["device_total_bytes"] = p.device_total_bytes;
    j["needed_bytes"] = p.needed_bytes;
    j["oom"] = p.oom;
    j["fits"] = p.fits;
    points.push_back(std::move(j));
  }
  root["points"] = std::move(points);
  return root.dump(indent, ' ', false, Json::error_handler_t::replace);
}

std::string RenderSweepCsv(const SweepResult& sweep) {
  std::string out;
  for (const SweepAxis& axis : sweep.axes)
    fmt::format_to(std::back_inserter(out), "{},", SweepVariableKey(axis.variable));
  out += "peak_allocated_bytes,peak_reserved_bytes,device_total_bytes,needed_bytes,oom,fits\n";
  for (const SweepPoint& p : sweep.points) {
    for (uint64_t v : p.at) fmt::format_to(std::back_inserter(out), "{},", v);
    fmt::format_to(std::back_inserter(out), "{},{},{},{},{},{}\n", p.peak_allocated_bytes,
                   p.peak_reserved_bytes, p.device_total_bytes, p.needed_bytes,
                   p.oom ? "true" : "false", p.fits ? "true" : "false");
  }
  return out;
}

}  // namespace vramscope
