// StrategyLabel and ExplainPlan (plan_internal.h): the plan in plain words.
#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "plan_internal.h"

namespace vramscope::plan_internal {
namespace {

// Most fitting strategies explained one by one.
constexpr size_t kExplained = 3;

std::string_view FinetuneLabel(Finetune f) {
  switch (f) {
    case Finetune::kFull: return "full fine-tune";
    case Finetune::kLora: return "LoRA";
    case Finetune::kQLora: return "QLoRA";
  }
  return "";
}

std::string Percent(double part, double whole) {
  return whole > 0 ? fmt::format("{:.0f}%", 100 * part / whole) : std::string("-");
}

// Why this strategy is where it is: one clause per knob that matters.
std::string Reasons(const Strategy& s) {
  const TrainingSetup& k = s.setup;
  const StepTime& t = s.time;
  const double flops = t.forward_flops + t.backward_flops + t.recompute_flops;
  std::vector<std::string> why;
  switch (k.finetune) {
    case Finetune::kFull:
      why.push_back("trains every weight, so backward computes every weight gradient");
      break;
    case Finetune::kLora:
      why.push_back(
          "trains adapters only: backward skips the frozen weights' gradients (about a third "
          "less compute than full fine-tuning) and optimizer state is tiny");
      break;
    case Finetune::kQLora:
      why.push_back(
          fmt::format("4-bit base weights need the least memory, but dequantising them takes {} "
                      "of the step",
                      Percent(t.dequant_seconds, t.step_seconds)));
      break;
  }
  if (k.grad_ckpt != GradCkpt::kNone) {
    why.push_back(
        fmt::format("gradient checkpointing reruns the forward in backward ({} of the FLOPs) to "
                    "drop saved activations",
                    Percent(t.recompute_flops, flops)));
  }
  if (k.optimizer == OptimizerKind::kAdamW8bit || k.optimizer == OptimizerKind::kPagedAdamW8bit) {
    why.push_back("8-bit AdamW keeps 2 bytes of state per trainable parameter instead of 8");
  }
  if (k.loss == LossKind::kFusedLinear)
    why.push_back("fused linear cross-entropy never holds the full logits");
  const uint32_t n = k.parallel.gpus;
  switch (k.parallel.dp_mode) {
    case DataParallel::kDdp:
      why.push_back(
          fmt::format("DDP keeps a whole replica per GPU plus a bucket copy of the gradients; one "
                      "all-reduce per step ({:.2f} s, overlapped with compute)",
                      t.communication_seconds));
      break;
    case DataParallel::kZero1:
    case DataParallel::kZero2:
      why.push_back(
          fmt::format("ZeRO-{} shards the optimizer state{} over {} GPUs; one reduce-scatter and "
                      "all-gather per step ({:.2f} s, overlapped)",
                      k.parallel.dp_mode == DataParallel::kZero1 ? 1 : 2,
                      k.parallel.dp_mode == DataParallel::kZero1 ? "" : " and gradients", n,
                      t.communication_seconds));
      break;
    case DataParallel::kZero3:
    case DataParallel::kFsdp:
      why.push_back(fmt::format(
          "{} shards parameters, gradients and optimizer state over {} GPUs but gathers "
          "the parameters in every forward and backward ({:.2f} s of communication, "
          "overlapped)",
          k.parallel.dp_mode == DataParallel::kFsdp ? "FSDP" : "ZeRO-3", n,
          t.communication_seconds));
      break;
    case DataParallel::kNone: break;
  }
  if (k.parallel.offload != Offload::kNone) {
    why.push_back(fmt::format(
        "optimizer offload moves master weights and Adam state to the host; the CPU step "
        "and PCIe copies take {} of the step",
        Percent(t.offload_seconds, t.step_seconds)));
  }
  if (k.alloc_conf.find("expandable_segments:True") != std::string::npos) {
    why.push_back("expandable segments cut reserved-but-unused memory at no time cost");
  }
  if (k.grad_accum > 1) {
    why.push_back(
        fmt::format("micro-batch {} with {} accumulation steps: the largest split that fits",
                    k.batch, k.grad_accum));
  }
  std::string out;
  for (size_t i = 0; i < why.size(); ++i) out += (i ? "; " : "") + why[i];
  return out;
}

}  // namespace

std::string StrategyLabel(const TrainingSetup& s) {
  std::string out = fmt::format("{}, micro-batch {} x {}, {}", FinetuneLabel(s.finetune), s.batch,
                                s.grad_accum, OptimizerName(s.optimizer));
  if (s.precision == Precision::kBf16) out += ", bf16 weights";
  if (s.grad_ckpt != GradCkpt::kNone) out += ", gradient checkpointing";
  if (s.loss != LossKind::kHf) out += fmt::format(", {} loss", LossName(s.loss));
  if (s.alloc_conf.find("expandable_segments:True") != std::string::npos)
    out += ", expandable segments";
  if (s.parallel.gpus > 1) {
    out += fmt::format(", {} x {}", s.parallel.gpus, DataParallelName(s.parallel.dp_mode));
    if (s.parallel.offload != Offload::kNone)
      out += fmt::format(" + {} offload", OffloadName(s.parallel.offload));
  }
  return out;
}

std::vector<std::string> ExplainPlan(const PlanResult& plan) {
  std::vector<std::string> lines;
  size_t fitting = 0;
  for (const Strategy& s : plan.strategies) fitting += s.fits ? 1 : 0;
  const std::string gpu = plan.gpu.display_name.empty() ? plan.gpu.name : plan.gpu.display_name;
  if (fitting == 0) {
    if (!plan.strategies.empty()) {
      const Strategy& closest = plan.strategies.front();
      lines.push_back(
          fmt::format("No strategy fits on {}: the closest, {}, needs at least {} of {} usable.",
                      gpu, StrategyLabel(closest.setup), FormatBytes(closest.needed_bytes),
                      FormatBytes(plan.gpu.usable_bytes)));
    }
    return lines;
  }
  // The best of each kind (finetune x checkpointing): variants of one kind
  // differ in memory more than in speed, and the table shows them.
  std::vector<std::pair<Finetune, GradCkpt>> kinds;
  for (size_t i = 0; i < fitting && kinds.size() < kExplained; ++i) {
    const Strategy& s = plan.strategies[i];
    const auto kind = std::make_pair(s.setup.finetune, s.setup.grad_ckpt);
    if (std::find(kinds.begin(), kinds.end(), kind) != kinds.end()) continue;
    kinds.push_back(kind);
    lines.push_back(fmt::format("#{}: {}: {:.0f} tokens/s, {} of {} usable. Why: {}.", i + 1,
                                StrategyLabel(s.setup), s.time.tokens_per_second,
                                FormatBytes(s.device_total_bytes),
                                FormatBytes(plan.gpu.usable_bytes), Reasons(s)));
  }
  bool full_fits = false, adapters_fit = false;
  for (const Strategy& s : plan.strategies) {
    if (!s.fits) continue;
    (s.setup.finetune == Finetune::kFull ? full_fits : adapters_fit) = true;
  }
  // Which assumption excludes full fine-tuning: with fp32 master weights
  // (bf16-mixed) none may fit where bf16 weights do.
  const Strategy* mixed_best = nullptr;
  bool bf16_full_fits = false, mixed_full_fits = false;
  for (const Strategy& s : plan.strategies) {
    if (s.setup.finetune != Finetune::kFull) continue;
    if (s.setup.precision == Precision::kBf16) bf16_full_fits = bf16_full_fits || s.fits;
    if (s.setup.precision == Precision::kBf16Mixed) {
      mixed_full_fits = mixed_full_fits || s.fits;
      if (!mixed_best || s.needed_bytes < mixed_best->needed_bytes) mixed_best = &s;
    }
  }
  if (bf16_full_fits && !mixed_full_fits && mixed_best) {
    lines.push_back(fmt::format(
        "A full fine-tune fits only with bf16 weights (the model loaded in bf16, no fp32 master "
        "copy: "
        "--precision bf16); with fp32 master weights under bf16 autocast the smallest needs {}.",
        FormatBytes(mixed_best->needed_bytes)));
  }
  if (adapters_fit) {
    lines.push_back(
        full_fits
            ? "LoRA and QLoRA train adapters, not the whole model: compare within the kind of "
              "fine-tuning you want (--finetune keeps one)."
            : "No full fine-tune fits on this GPU; LoRA and QLoRA do (they train adapters, not "
              "the whole model).");
  }
  lines.push_back(
      fmt::format("{} of {} estimated strategies fit. Memory is estimated; step times come from a "
                  "FLOPs model at {:.0f}% of the "
                  "GPU's peak bf16 throughput and {:.0f}% of its memory bandwidth, not from a "
                  "measurement (docs/plan.md).",
                  fitting, plan.strategies.size(), 100 * kAchievableComputeFraction,
                  100 * kAchievableBandwidthFraction));
  return lines;
}

}  // namespace vramscope::plan_internal
