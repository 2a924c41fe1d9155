// RenderPlanText and RenderPlanJson (plan.h).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "vramscope/plan.h"
#include "vramscope/report.h"

namespace vramscope {

std::string RenderPlanText(const PlanResult& plan, std::string_view source, size_t top) {
  size_t fitting = 0;
  for (const Strategy& s : plan.strategies) fitting += s.fits ? 1 : 0;
  const uint32_t gpus = plan.strategies.empty() ? 1u : plan.strategies.front().setup.parallel.gpus;
  std::string out = fmt::format(
      "vramscope plan: {} on {} ({} usable), {}\n", source,
      plan.gpu.display_name.empty() ? plan.gpu.name : plan.gpu.display_name,
      FormatBytes(plan.gpu.usable_bytes),
      gpus > 1 ? fmt::format("{} GPUs (data parallel, per GPU memory)", gpus) : "one GPU");
  out += fmt::format(
      "Step: {} tokens = {} sequences of {}. {} strategies considered, {} estimated, {} fit.\n\n",
      plan.tokens_per_step, plan.seq ? plan.tokens_per_step / plan.seq : 0, plan.seq,
      plan.considered, plan.estimates, fitting);
  // Strategies that differ only in knobs the step-time model does not see
  // (loss path, allocator, optimizer kind) tie; the table shows the one with
  // the least memory and counts the rest.
  struct Row {
    const Strategy* strategy;
    size_t rank;
    size_t variants;
  };
  std::vector<Row> rows;
  size_t hidden = 0;
  for (size_t i = 0; i < plan.strategies.size() && plan.strategies[i].fits; ++i) {
    const TrainingSetup& k = plan.strategies[i].setup;
    bool tied = false;
    for (Row& row : rows) {
      const TrainingSetup& r = row.strategy->setup;
      if (r.finetune == k.finetune && r.grad_ckpt == k.grad_ckpt && r.batch == k.batch &&
          r.grad_accum == k.grad_accum) {
        ++row.variants;
        tied = true;
        break;
      }
    }
    if (tied) continue;
    if (rows.size() < top) {
      rows.push_back({&plan.strategies[i], i + 1, 0});
    } else {
      ++hidden;
    }
  }
  out += fmt::format("{:>3}  {:>9}  {:>8}  {:>13}  {}\n", "#", "tokens/s", "step (s)",
                     "device total", "strategy");
  for (const Row& row : rows) {
    const Strategy& s = *row.strategy;
    out += fmt::format(
        "{:>3}  {:>9.0f}  {:>8.2f}  {:>13}  {}{}\n", row.rank, s.time.tokens_per_second,
        s.time.step_seconds, FormatBytes(s.device_total_bytes), s.label,
        row.variants ? fmt::format(" (+{} variants, same speed, more memory)", row.variants) : "");
  }
  if (hidden > 0)
    out += fmt::format("     ... {} more kinds that fit (--json lists every strategy)\n", hidden);
  if (fitting == 0) out += "     (none fits)\n";
  out += "\n";
  for (const std::string& line : plan.explanation) out += line + "\n";
  return out;
}

std::string RenderPlanJson(const PlanResult& plan, std::string_view source, int indent) {
  using Json = nlohmann::ordered_json;
  Json root;
  root["command"] = "plan";
  root["source"] = std::string(source);
  if (plan.model) {
    root["model"] = {{"name", plan.model->name},
                     {"architecture", plan.model->architecture},
                     {"parameters", plan.model->parameters}};
  }
  root["gpu"] = {{"name", plan.gpu.name},
                 {"usable_bytes", plan.gpu.usable_bytes},
                 {"bf16_dense_tflops", plan.gpu.bf16_dense_tflops},
                 {"memory_bandwidth_gbps", plan.gpu.memory_bandwidth_gbps}};
  root["gpus"] = plan.strategies.empty() ? 1u : plan.strategies.front().setup.parallel.gpus;
  root["seq"] = plan.seq;
  root["tokens_per_step"] = plan.tokens_per_step;
  root["considered"] = plan.considered;
  root["estimates"] = plan.estimates;
  root["assumptions"] = {{"achievable_compute_fraction", kAchievableComputeFraction},
                         {"achievable_bandwidth_fraction", kAchievableBandwidthFraction},
                         {"half_utilisation_tokens", kHalfUtilisationTokens},
                         {"fp32_compute_share", kFp32ComputeShare}};
  Json list = Json::array();
  for (size_t i = 0; i < plan.strategies.size(); ++i) {
    const Strategy& s = plan.strategies[i];
    Json knobs = Json::object();
    for (const auto& [key, value] : s.knobs) knobs[key] = value;
    list.push_back({{"rank", i + 1},
                    {"fits", s.fits},
                    {"label", s.label},
                    {"knobs", std::move(knobs)},
                    {"peak_allocated_bytes", s.peak_allocated_bytes},
                    {"peak_reserved_bytes", s.peak_reserved_bytes},
                    {"device_total_bytes", s.device_total_bytes},
                    {"needed_bytes", s.needed_bytes},
                    {"oom", s.oom},
                    {"tokens_per_second", s.time.tokens_per_second},
                    {"step_seconds", s.time.step_seconds},
                    {"compute_seconds", s.time.compute_seconds},
                    {"dequant_seconds", s.time.dequant_seconds},
                    {"optimizer_seconds", s.time.optimizer_seconds},
                    {"forward_flops", s.time.forward_flops},
                    {"backward_flops", s.time.backward_flops},
                    {"recompute_flops", s.time.recompute_flops}});
  }
  root["strategies"] = std::move(list);
  root["explanation"] = plan.explanation;
  return root.dump(indent, ' ', false, Json::error_handler_t::replace);
}

}  // namespace vramscope
