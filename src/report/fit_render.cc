// RenderFitText and RenderFitJson (plan.h). The estimate at each found point
// is rendered by the report stage (ReportToJson), so its keys are those of
// every report (docs/json-schema.md).
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "vramscope/event_stream.h"
#include "vramscope/plan.h"

namespace vramscope {
namespace {

bool IsBatch(const FitSearch& s) { return s.variable == SweepVariable::kBatch; }

// Names come from the command line and config files: no control character
// (a terminal escape) reaches the output.
std::string Clean(std::string_view text) {
  std::string out(text);
  for (size_t i = 0; i < out.size(); ++i) {
    const auto c = static_cast<unsigned char>(out[i]);
    if (c < 0x20 || c == 0x7F) out[i] = '?';
    // C1 controls in UTF-8 (U+0080..U+009F), e.g. CSI.
    if (c == 0xC2 && i + 1 < out.size() && static_cast<unsigned char>(out[i + 1]) < 0xA0 &&
        static_cast<unsigned char>(out[i + 1]) >= 0x80) {
      out.replace(i, 2, "?");
    }
  }
  return out;
}

// Why a setup does not fit, in one clause: where the simulated allocator ran
// out of memory, or how far the device total is above the limit.
std::string WhyNot(const Report& report, uint64_t limit_bytes) {
  const RankReport& worst = report.worst();
  if (worst.sim.oom) {
    const OomInfo& oom = *worst.sim.oom;
    return fmt::format(
        "runs out of memory in step {}, {}: {} allocated, {} more requested, {} reserved by the "
        "allocator",
        worst.sim.oom_step, PhaseName(worst.sim.oom_phase), FormatBytes(oom.allocated_bytes),
        FormatBytes(oom.alloc_size_bytes), FormatBytes(oom.reserved_bytes));
  }
  // A verb phrase: it follows "--batch 1 " and "does not fit: it ".
  return fmt::format("needs a device total of {}, above the {} limit",
                     FormatBytes(report.needed_bytes()), FormatBytes(limit_bytes));
}

std::string SearchText(const FitSearch& s, uint64_t limit_bytes) {
  const bool batch = IsBatch(s);
  const bool image = s.variable == SweepVariable::kImageSize;
  std::string out =
      batch ? fmt::format("Largest micro-batch at {} {}: ", SweepVariableFlag(s.held), s.held_value)
      : image ? fmt::format("Largest image side at --batch {}: ", s.held_value)
              : fmt::format("Longest sequence at --batch {}: ", s.held_value);
  const std::string_view flag = SweepVariableFlag(s.variable);
  if (!s.fits()) {
    return out + fmt::format("none fits.\n  {} 1 {}.\n", flag, WhyNot(s.at_max, limit_bytes));
  }
  const RankReport& worst = s.at_max.worst();
  out += fmt::format("{}{}\n", s.max_value, image ? " px" : "");
  out +=
      fmt::format("  device total {} (peak allocated {}, peak reserved {}) of the {} limit\n",
                  FormatBytes(s.at_max.needed_bytes()), FormatBytes(worst.sim.peak_allocated_bytes),
                  FormatBytes(worst.sim.peak_reserved_bytes), FormatBytes(limit_bytes));
  if (s.capped) {
    out += fmt::format("  {} {} is the search limit ({}); memory did not run out below it\n", flag,
                       s.cap, s.cap_reason);
  } else if (s.at_next) {
    out += fmt::format("  {} {} does not fit: it {}\n", flag, s.max_value + s.step,
                       WhyNot(*s.at_next, limit_bytes));
  }
  if (s.non_monotone) {
    out +=
        "  note: the device total fell between two fitting values (the caching allocator's reuse "
        "of\n"
        "  cached blocks depends on tensor sizes), so a value above the one that failed might "
        "still fit\n";
  }
  return out;
}

nlohmann::ordered_json SearchJson(const FitSearch& s) {
  nlohmann::ordered_json j;
  j["max"] = s.max_value;
  j["fits"] = s.fits();
  j[fmt::format("at_{}", SweepVariableKey(s.held))] = s.held_value;
  if (s.variable == SweepVariable::kImageSize) j["step"] = s.step;
  j["cap"] = s.cap;
  j["capped"] = s.capped;
  j["cap_reason"] = s.cap_reason;
  j["next_needed_bytes"] = s.at_next ? s.at_next->needed_bytes() : 0;
  j["next_oom"] = s.at_next && s.at_next->worst().sim.oom.has_value();
  j["non_monotone"] = s.non_monotone;
  j["estimates"] = s.estimates;
  j["estimate"] = ReportToJson(s.at_max);
  return j;
}

// "Fewest GPUs (data_parallel=zero3): 4, device total 61.20 GiB per GPU; 3 do
// not fit (at least 83.10 GiB each)." At the setup's batch and seq.
std::string GpusText(const FitGpusSearch& g) {
  std::string mode;
  for (const auto& [key, value] : g.at_min.knobs) {
    if (key == "data_parallel" || key == "fsdp" || key == "offload" || key == "tp" || key == "pp" ||
        key == "cp") {
      mode += fmt::format("{}{}={}", mode.empty() ? "" : ", ", key, Clean(value));
    }
  }
  if (g.min_gpus == 0) {
    return fmt::format("Fewest GPUs ({}): none up to {} fits; at {} each needs {}.\n\n", mode,
                       g.cap, g.cap, FormatBytes(g.at_min.needed_bytes()));
  }
  std::string text = fmt::format("Fewest GPUs ({}): {}, device total {} per GPU", mode, g.min_gpus,
                                 FormatBytes(DeviceTotalBytes(g.at_min.worst())));
  if (g.below) {
    text += fmt::format("; {} do not fit (at least {} each)", g.min_gpus - g.step,
                        FormatBytes(g.below->needed_bytes()));
  }
  if (g.launch_gpus != g.min_gpus) {
    text += fmt::format(
        ".\nOn whole nodes of {} GPUs (--gpus-per-node): {} ({} nodes); the searches below use {}",
        g.gpus_per_node, g.launch_gpus, g.launch_gpus / g.gpus_per_node, g.launch_gpus);
  }
  return text + ".\n\n";
}

}  // namespace

std::string RenderFitText(const FitResult& fit, std::string_view source) {
  std::string out = fmt::format("vramscope fit: {} on {}\n", Clean(source),
                                fit.gpu.display_name.empty() ? fit.gpu.name : fit.gpu.display_name);
  out += fmt::format("Limit: {} usable - {} margin = {}\n", FormatBytes(fit.gpu.usable_bytes),
                     FormatBytes(fit.margin_bytes), FormatBytes(fit.limit_bytes));
  if (fit.margin_is_default) {
    out += fmt::format(
        "       (the default margin, {} of usable memory: about the estimate's median error on "
        "GPU runs it had not seen; --margin 0 removes it)\n",
        kDefaultFitMargin);
  }
  std::string knobs;
  for (const auto& [key, value] : fit.batch.at_max.knobs) {
    if (key == "batch" || key == "seq" || key == "image_size" || key == "gpu" || value.empty())
      continue;
    knobs += fmt::format("{}{}={}", knobs.empty() ? "" : ", ", key, Clean(value));
  }
  out += fmt::format("Knobs: {}\n\n", knobs);
  if (fit.gpus) out += GpusText(*fit.gpus);
  out += SearchText(fit.batch, fit.limit_bytes);
  if (fit.suggestion) {
    const FitSuggestion& g = *fit.suggestion;
    out += fmt::format("  With {}: --batch {} fits, device total {} ({}).\n", g.flags,
                       g.batch.max_value, FormatBytes(g.batch.at_max.needed_bytes()), g.why);
  }
  out += SearchText(fit.seq, fit.limit_bytes);
  out += "\n";
  if (!fit.fits()) {
    out += fit.seq.variable == SweepVariable::kImageSize
               ? fmt::format(
                     "Nothing fits: not even --batch 1 at this --image-size, nor a {} px "
                     "image at this --batch.\n",
                     fit.seq.step)
               : std::string(
                     "Nothing fits: not even --batch 1 at this --seq, nor --seq 1 at this "
                     "--batch.\n");
    out +=
        "`vramscope estimate ... --explain` says what is alive at the peak and which knobs would "
        "save memory (LoRA, gradient checkpointing, an 8-bit optimizer, ...).\n";
  }
  out +=
      fmt::format("Searched with {} estimates (device total within the limit, no simulated OOM).\n",
                  fit.estimates);
  return out;
}

std::string RenderFitJson(const FitResult& fit, std::string_view source, int indent) {
  nlohmann::ordered_json j;
  j["command"] = "fit";
  j["source"] = std::string(source);
  if (const auto& m = fit.batch.at_max.model) {
    j["model"] = {{"name", m->name},
                  {"architecture", m->architecture},
                  {"parameters", m->parameters},
                  {"trainable_parameters", m->trainable_parameters}};
  }
  j["gpu"] = {{"name", fit.gpu.name}, {"usable_bytes", fit.gpu.usable_bytes}};
  j["margin_bytes"] = fit.margin_bytes;
  j["margin_is_default"] = fit.margin_is_default;
  j["limit_bytes"] = fit.limit_bytes;
  j["fits"] = fit.fits();
  j["max_batch"] = fit.batch.max_value;
  // A UNet's second search is its image side: max_image_size and image_size.
  const std::string second(SweepVariableKey(fit.seq.variable));
  j["max_" + second] = fit.seq.max_value;
  j["estimates"] = fit.estimates;
  j["batch"] = SearchJson(fit.batch);
  j[second] = SearchJson(fit.seq);
  // The one-knob change under which a micro-batch fits, when none does.
  j["suggestion"] = nullptr;
  if (fit.suggestion) {
    j["suggestion"] = {{"flags", fit.suggestion->flags},
                       {"why", fit.suggestion->why},
                       {"max_batch", fit.suggestion->batch.max_value},
                       {"needed_bytes", fit.suggestion->batch.at_max.needed_bytes()}};
  }
  if (fit.gpus) {
    j["min_gpus"] = fit.gpus->min_gpus;
    j["gpus"] = {{"step", fit.gpus->step},
                 {"cap", fit.gpus->cap},
                 {"min_gpus", fit.gpus->min_gpus},
                 {"gpus_per_node", fit.gpus->gpus_per_node},
                 {"launch_gpus", fit.gpus->launch_gpus},
                 {"estimates", fit.gpus->estimates},
                 {"estimate", ReportToJson(fit.gpus->at_min)}};
  }
  return j.dump(indent, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace vramscope
