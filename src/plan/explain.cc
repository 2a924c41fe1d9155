// Plain-words explanations of an estimate: what is alive at the peak, and
// what each applicable knob would change (every what-if is a re-estimate,
// never a formula).
#include <algorithm>
#include <cstdlib>
#include <functional>

#include <fmt/format.h>

#include "vramscope/estimate.h"

namespace vramscope {
namespace {

// Signed difference in GiB, "-1.23 GiB" / "+0.50 GiB".
std::string SignedGiB(uint64_t after, uint64_t before) {
  if (after >= before) return "+" + FormatBytes(after - before);
  return "-" + FormatBytes(before - after);
}

struct WhatIf {
  std::string label;  // "gradient checkpointing (--grad-ckpt full)"
  std::string cost;   // what it costs besides memory, "" if nothing notable
  std::function<bool(const TrainingSetup&)> applies;
  std::function<void(TrainingSetup*)> change;
  // Why the peak moves the way it did, for a knob whose direction depends on
  // the setup ("" when the cost says enough). `grows`: the peak allocated rose.
  std::function<std::string(const TrainingSetup&, bool grows)> why;
  // A caching-allocator setting: it moves reserved memory (and so the device
  // total), never what tensors allocate; its line shows peak reserved.
  bool allocator_only = false;
};

bool MixedPrecision(const TrainingSetup& s) {
  return s.precision == Precision::kBf16Mixed || s.precision == Precision::kFp16Mixed;
}

// Chunked cross-entropy (loss.cc ChunkedLoss) runs lm_head once per chunk.
// Autocast caches a weight's 16-bit copy only for leaves that require grad
// (aten/src/ATen/autocast_mode.cpp cached_cast, torch 2.13): a frozen fp32
// lm_head (LoRA, QLoRA) is cast again in every chunk and each copy is saved
// for that chunk's backward, which can outweigh the smaller logits.
std::string ChunkedLossWhy(const TrainingSetup& s, bool grows) {
  if (grows && s.finetune != Finetune::kFull && MixedPrecision(s)) {
    return "under autocast each of the 8 chunks casts the frozen fp32 lm_head weight to 16-bit "
           "again and keeps that copy for backward (autocast caches the cast only for weights "
           "that train), more than the smaller logits save; no extra compute";
  }
  if (grows) {
    return "the whole-vocabulary logits do not set the peak here, so chunking them does not "
           "lower it; no extra compute";
  }
  return "the fp32 logits exist one chunk at a time; no extra compute";
}

// --precision bf16-mixed over bf16 weights: the model is held in fp32. For
// adapters the frozen weights also pay twice: autocast caches a weight's
// 16-bit copy only for leaves that require grad (autocast_mode.cpp
// cached_cast, torch 2.13), so each frozen linear is cast on every use and
// the copy is saved for backward.
std::string FullPrecisionWhy(const TrainingSetup& s, bool /*grows*/) {
  if (s.finetune == Finetune::kFull) {
    return "the classic mixed-precision recipe: weights, gradients and optimizer state in fp32, "
           "matmuls in bf16 under autocast; updates kept exact";
  }
  return "the frozen base weights held in fp32, and under autocast each one's bf16 copy is "
         "made on every use and kept for backward (autocast caches casts only of weights that "
         "train); the adapters are fp32 either way";
}

bool IsAdamFamily(OptimizerKind o) {
  return o == OptimizerKind::kAdamW || o == OptimizerKind::kAdamWFused ||
         o == OptimizerKind::kAdamWForLoop;
}

// The knobs people reach for first when a run does not fit. Step-time costs
// are the standard ones: checkpointing recomputes the forward pass (forward is
// about 1/3 of a step's FLOPs, so about +33%); a halved micro-batch with
// doubled accumulation keeps tokens per step but runs smaller kernels.
std::vector<WhatIf> Candidates() {
  return {
      {"gradient checkpointing (--grad-ckpt full)", "about +33% step time (the forward runs twice)",
       [](const TrainingSetup& s) { return s.grad_ckpt == GradCkpt::kNone; },
       [](TrainingSetup* s) { s->grad_ckpt = GradCkpt::kFull; }},
      {"chunked cross-entropy (--loss chunked)", "",
       [](const TrainingSetup& s) { return s.loss == LossKind::kHf; },
       [](TrainingSetup* s) { s->loss = LossKind::kChunked; }, ChunkedLossWhy},
      {"fused linear cross-entropy (--loss fused-linear)", "needs Liger-Kernel; no extra compute",
       [](const TrainingSetup& s) {
         return s.loss == LossKind::kHf || s.loss == LossKind::kChunked;  // TRL has its own head
       },
       [](TrainingSetup* s) { s->loss = LossKind::kFusedLinear; }},
      {"precomputed reference log-probabilities (--dpo-precompute-ref)",
       "one reference pass over the dataset before training; no reference forward per step",
       [](const TrainingSetup& s) { return s.dpo && !s.dpo_precompute_ref; },
       [](TrainingSetup* s) { s->dpo_precompute_ref = true; }},
      {"bf16 weights, no fp32 master copy (--precision bf16)",
       "weights, gradients and optimizer state in bf16 as transformers 5 loads them; updates "
       "smaller than bf16's resolution round away",
       [](const TrainingSetup& s) {
         return s.precision == Precision::kBf16Mixed || s.precision == Precision::kFp32;
       },
       [](TrainingSetup* s) { s->precision = Precision::kBf16; }},
      {"fp32 master weights under bf16 autocast (--precision bf16-mixed)", "",
       [](const TrainingSetup& s) { return s.precision == Precision::kBf16; },
       [](TrainingSetup* s) { s->precision = Precision::kBf16Mixed; }, FullPrecisionWhy},
      {"fused AdamW (--optimizer adamw-fused)", "same math, fewer temporaries",
       [](const TrainingSetup& s) {
         return s.optimizer == OptimizerKind::kAdamW || s.optimizer == OptimizerKind::kAdamWForLoop;
       },
       [](TrainingSetup* s) { s->optimizer = OptimizerKind::kAdamWFused; }},
      {"8-bit AdamW (--optimizer adamw-8bit)", "needs bitsandbytes; optimizer state quantised",
       [](const TrainingSetup& s) { return IsAdamFamily(s.optimizer); },
       [](TrainingSetup* s) { s->optimizer = OptimizerKind::kAdamW8bit; }},
      {"LoRA (--finetune lora)", "trains adapters only, not the full model",
       [](const TrainingSetup& s) { return s.finetune == Finetune::kFull; },
       [](TrainingSetup* s) { s->finetune = Finetune::kLora; }},
      {"SDPA attention (--attn sdpa)", "usually faster than eager",
       [](const TrainingSetup& s) { return s.attn == Attention::kEager; },
       [](TrainingSetup* s) { s->attn = Attention::kSdpa; }},
      {"half the micro-batch, twice the accumulation", "same tokens per step, smaller kernels",
       [](const TrainingSetup& s) { return s.batch >= 2 && s.batch % 2 == 0; },
       [](TrainingSetup* s) {
         s->batch /= 2;
         s->grad_accum *= 2;
       }},
      {"expandable segments (--alloc-conf expandable_segments:True)",
       "the caching allocator grows one segment in place instead of caching separate ones, so "
       "less reserved memory sits unused; what tensors allocate is the same",
       [](const TrainingSetup& s) {
         return s.alloc_conf.find("expandable_segments") == std::string::npos;
       },
       [](TrainingSetup* s) {
         s->alloc_conf = s->alloc_conf.empty() ? "expandable_segments:True"
                                               : s->alloc_conf + ",expandable_segments:True";
       },
       nullptr, true},
  };
}

}  // namespace

namespace {

// "a (12%), b (9%)" for the first `n` rows of a largest-first grouping.
std::string Largest(const std::vector<std::pair<std::string, uint64_t>>& rows, uint64_t total,
                    size_t n) {
  std::string out;
  for (size_t i = 0; i < rows.size() && i < n; ++i) {
    out += fmt::format(
        "{}{} {} ({:.0f}%)", i ? ", " : "", rows[i].first, FormatBytes(rows[i].second),
        total ? 100.0 * static_cast<double>(rows[i].second) / static_cast<double>(total) : 0.0);
  }
  return out;
}

// The activations' side of the story (seed 001): how much the forward keeps
// for backward, where in the model and which layers made it.
std::string ExplainSaved(const SavedActivations& saved, uint64_t peak_bytes) {
  return fmt::format(
      "The forward keeps {} for backward at the end of step {} ({:.0f}% of the peak's size); by "
      "block: {}; the layers whose outputs or inputs these are: {}. This part grows with the "
      "micro-batch and the sequence length or image area; checkpointing (--grad-ckpt) trades it "
      "for recomputation.",
      FormatBytes(saved.total_bytes), saved.step,
      peak_bytes ? 100.0 * static_cast<double>(saved.total_bytes) / static_cast<double>(peak_bytes)
                 : 0.0,
      Largest(saved.by_block, saved.total_bytes, 3), Largest(saved.by_layer, saved.total_bytes, 3));
}

}  // namespace

std::vector<std::string> ExplainPeak(const Report& report) {
  std::vector<std::string> lines;
  const RankReport& r = report.worst();
  const SimResult& sim = r.sim;
  lines.push_back(fmt::format(
      "The peak of {} allocated happens in step {}, {} phase; PyTorch reserves {} by then "
      "({} cached but unused), and nvidia-smi would show about {}.",
      FormatBytes(sim.peak_allocated_bytes), sim.peak_step, PhaseName(sim.peak_phase),
      FormatBytes(sim.reserved_at_peak_bytes),
      FormatBytes(sim.reserved_at_peak_bytes -
                  std::min(sim.reserved_at_peak_bytes, sim.peak_allocated_bytes)),
      FormatBytes(DeviceTotalBytes(r))));
  std::vector<std::pair<uint64_t, Category>> parts;
  for (Category c : kAllCategories)
    parts.emplace_back(sim.breakdown_at_peak[static_cast<int>(c)], c);
  std::sort(parts.rbegin(), parts.rend());
  std::string alive;
  for (const auto& [bytes, c] : parts) {
    // Shares under 0.5% are noise in a plain-words summary; the table has them.
    if (sim.peak_allocated_bytes == 0 || bytes * 200 < sim.peak_allocated_bytes) continue;
    std::string name(CategoryJsonKey(c));
    std::replace(name.begin(), name.end(), '_', ' ');
    alive += fmt::format(
        "{}{} {} ({:.0f}%)", alive.empty() ? "" : ", ", name, FormatBytes(bytes),
        100.0 * static_cast<double>(bytes) / static_cast<double>(sim.peak_allocated_bytes));
  }
  if (!alive.empty()) lines.push_back("Alive at the peak: " + alive + ".");
  if (!sim.top_at_peak.empty()) {
    const LiveAllocation& top = sim.top_at_peak.front();
    lines.push_back(
        fmt::format("The largest single tensor alive then is {} of {} made by {} in {}.",
                    FormatBytes(top.block_bytes), CategoryJsonKey(top.category), top.op,
                    top.module.empty() ? "(no module)" : top.module));
  }
  if (r.saved) lines.push_back(ExplainSaved(*r.saved, sim.peak_allocated_bytes));
  return lines;
}

std::vector<std::string> ExplainWhatIf(const ModelSpec& model, const TrainingSetup& setup,
                                       const Report& base) {
  std::vector<std::string> lines;
  const uint64_t base_alloc = FullPeakAllocatedBytes(base.worst());
  const uint64_t base_reserved = FullPeakReservedBytes(base.worst());
  const uint64_t base_device = base.needed_bytes();
  EstimateOptions options;
  options.timeline = false;
  options.top_allocations = 0;
  for (const WhatIf& w : Candidates()) {
    if (!w.applies(setup)) continue;
    TrainingSetup changed = setup;
    w.change(&changed);
    auto est = Estimate(model, changed, options);
    if (!est.ok()) continue;  // not applicable to this model (e.g. no LoRA targets)
    const Report& r = est->report;
    const uint64_t alloc = FullPeakAllocatedBytes(r.worst());
    const uint64_t reserved = FullPeakReservedBytes(r.worst());
    const uint64_t device = r.needed_bytes();
    const bool same = w.allocator_only ? reserved == base_reserved && device == base_device
                                       : alloc == base_alloc && device == base_device;
    if (same) continue;
    std::string line =
        w.allocator_only
            ? fmt::format("  {}: {} peak reserved, {} on the device", w.label,
                          SignedGiB(reserved, base_reserved), SignedGiB(device, base_device))
            : fmt::format("  {}: {} peak allocated, {} on the device", w.label,
                          SignedGiB(alloc, base_alloc), SignedGiB(device, base_device));
    if (!base.fits() && r.fits()) line += " (then it fits)";
    const std::string why = w.why ? w.why(setup, alloc > base_alloc) : w.cost;
    if (!why.empty()) line += "; " + why;
    lines.push_back(line + ".");
  }
  if (!lines.empty())
    lines.insert(lines.begin(), "What each knob would change (each one re-estimated alone):");
  return lines;
}

}  // namespace vramscope
