// Fit(): the largest micro-batch and the longest sequence that fit (plan.h).
//
// Each search holds the other knob at the setup's value and asks
// FindLargestFitting (search.h) for the boundary. Both searches go through
// one cache of estimates, so the setup's own point, which both probe, is
// estimated once.
#include <algorithm>
#include <map>
#include <utility>

#include <fmt/format.h>

#include "search.h"
#include "vramscope/common/checked.h"
#include "vramscope/estimate.h"
#include "vramscope/lower.h"
#include "vramscope/plan.h"

namespace vramscope {
namespace {

using plan_internal::FindLargestFitting;
using plan_internal::ProbeResult;
using plan_internal::SearchOutcome;

// A fit within the margin. The estimate simulates the whole GPU; a run that
// stays below usable - margin there never came near the allocator's limit, so
// it behaves the same on a GPU smaller by the margin. A run above it might
// still squeeze in on the smaller GPU by releasing cached blocks (the
// allocator's OOM retry): "does not fit" errs on the safe side.
bool FitsWithin(const Report& report, uint64_t limit_bytes) {
  return report.fits() && report.needed_bytes() <= limit_bytes;
}

// The knob searched beside the batch: the sequence, or a diffusion UNet's
// image side (in pixels, multiples of `step`).
struct SecondAxis {
  SweepVariable variable = SweepVariable::kSeq;
  uint64_t value = 0;  // the setup's
  uint64_t step = 1;
};

SecondAxis SecondAxisOf(const ModelSpec& model, const TrainingSetup& setup) {
  // A FLUX transformer's latents are packed 2 x 2: 2 x vae_scale pixels per
  // step, from the dreambooth scripts' 512 px.
  if (model.is_flux) {
    return {SweepVariable::kImageSize, setup.image_size ? setup.image_size : 512,
            2 * std::max<uint64_t>(setup.vae_scale, 1)};
  }
  if (!model.is_unet) return {SweepVariable::kSeq, setup.seq, 1};
  // One more latent at the smallest resolution: vae_scale x 2^(levels - 1) pixels.
  const uint64_t step = std::max<uint64_t>(setup.vae_scale, 1)
                        << (model.unet.block_out_channels.size() - 1);
  const uint64_t image =
      setup.image_size ? setup.image_size : model.unet.sample_size * setup.vae_scale;
  return {SweepVariable::kImageSize, image, step};
}

class EstimateCache {
 public:
  EstimateCache(const ModelSpec& model, const TrainingSetup& setup, SweepVariable second)
      : model_(model), setup_(setup), second_(second) {}

  Result<const Report*> At(uint64_t batch, uint64_t second) {
    const auto key = std::make_pair(batch, second);
    if (auto it = reports_.find(key); it != reports_.end()) return &it->second;
    TrainingSetup s = setup_;
    s.batch = batch;
    if (second_ == SweepVariable::kImageSize) {
      s.image_size = second;
    } else {
      s.seq = second;
    }
    if (Status st = SpendWork(s); !st.ok()) return st.error();
    EstimateOptions options;
    options.timeline = false;  // searches need the peaks only
    options.top_allocations = 0;
    auto est = Estimate(model_, s, options);
    if (!est.ok()) {
      return MakeError(fmt::format("--batch {} {} {}: {}", batch, SweepVariableFlag(second_),
                                   second, est.error().message));
    }
    est->report.command = "fit";
    return &reports_.emplace(key, std::move(est->report)).first->second;
  }

  uint64_t size() const { return reports_.size(); }

 private:
  // The work budget of the whole search (docs/hardening.md): the bounds of
  // its estimates together within kBatchBudgetFactor x --max-events. Each
  // estimate checks its own bound; a search of ~40 estimates just under it
  // would take many minutes.
  Status SpendWork(const TrainingSetup& s) {
    auto work = EstimateLoweringWork(model_, s);
    if (!work.ok()) return Ok{};  // Estimate reports it
    spent_events_ = common::SaturatingAdd(spent_events_, work->events);
    const uint64_t limit =
        common::CheckedMul(s.max_events, kBatchBudgetFactor).value_or(UINT64_MAX);
    if (spent_events_ <= limit) return Ok{};
    return MakeError(fmt::format(
        "{}: work budget: the {} estimates of this search lower to about {} events in all, "
        "above the limit of {} ({} x --max-events; raise --max-events to search anyway)",
        model_.name, reports_.size() + 1, spent_events_, limit, kBatchBudgetFactor));
  }

  uint64_t spent_events_ = 0;
  const ModelSpec& model_;
  const TrainingSetup& setup_;
  SweepVariable second_;
  // std::map: pointers to its values stay valid as it grows.
  std::map<std::pair<uint64_t, uint64_t>, Report> reports_;
};

struct Cap {
  uint64_t value = 1;
  std::string reason;
};

// The smaller of a knob's own limit and what keeps batch x seq within
// lowering's token limit.
Cap Limit(uint64_t own, std::string own_reason, uint64_t other) {
  const uint64_t by_tokens = kMaxTokensPerMicroBatch / std::max<uint64_t>(other, 1);
  if (by_tokens < own) {
    return {std::max<uint64_t>(by_tokens, 1),
            fmt::format("{} tokens per micro-batch, the most vramscope lowers",
                        kMaxTokensPerMicroBatch)};
  }
  return {own, std::move(own_reason)};
}

Cap SeqCap(const ModelSpec& model, const TrainingSetup& setup, const FitOptions& options) {
  if (options.max_seq) return Limit(options.max_seq, "the requested search limit", setup.batch);
  if (model.max_position_embeddings) {
    return Limit(model.max_position_embeddings, "the model's max_position_embeddings", setup.batch);
  }
  return Limit(kFitDefaultMaxSeq, "the search limit for a model without max_position_embeddings",
               setup.batch);
}

Cap BatchCap(const TrainingSetup& setup, const FitOptions& options) {
  if (options.max_batch) return Limit(options.max_batch, "the requested search limit", setup.seq);
  return Limit(kFitMaxBatch, "the largest micro-batch vramscope lowers", setup.seq);
}

// A UNet's image sides, in steps (fit's default search limit).
constexpr uint64_t kFitMaxImagePixels = 16384;

Cap ImageCap(const SecondAxis& axis) {
  return {std::max<uint64_t>(kFitMaxImagePixels / axis.step, 1),
          fmt::format("the search limit for image sides, {} px", kFitMaxImagePixels)};
}

// `cap` is in units of the searched knob's step (the batch: 1).
Result<FitSearch> Search(EstimateCache& cache, const TrainingSetup& setup, SweepVariable variable,
                         const SecondAxis& second, const Cap& cap, uint64_t limit_bytes) {
  const bool batch = variable == SweepVariable::kBatch;
  const uint64_t step = batch ? 1 : second.step;
  auto point = [&](uint64_t units) {
    return batch ? cache.At(units, second.value) : cache.At(setup.batch, units * step);
  };
  const plan_internal::Probe probe = [&](uint64_t value) -> Result<ProbeResult> {
    VS_TRY(report, point(value));
    return ProbeResult{FitsWithin(*report, limit_bytes), report->needed_bytes()};
  };
  const uint64_t before = cache.size();
  VS_TRY(found, FindLargestFitting(batch ? setup.batch : std::max<uint64_t>(second.value / step, 1),
                                   cap.value, limit_bytes, probe));

  FitSearch out;
  out.variable = variable;
  out.held_value = batch ? second.value : setup.batch;
  out.held = batch ? second.variable : SweepVariable::kBatch;
  out.step = step;
  out.cap = cap.value * step;
  out.cap_reason = cap.reason;
  out.max_value = found.max_value * step;
  out.capped = found.capped;
  out.non_monotone = found.non_monotone;
  out.estimates = cache.size() - before;
  // Cached: the search probed this point (1 when nothing fits).
  VS_TRY(at, point(std::max<uint64_t>(found.max_value, 1)));
  out.at_max = *at;
  if (found.max_value > 0 && !found.capped) {
    VS_TRY(next, point(found.max_value + 1));
    out.at_next = *next;
  }
  return out;
}

// One knob changed from the setup; `applies` says whether it changes anything.
struct KnobChange {
  const char* flags;
  const char* why;
  bool (*applies)(const TrainingSetup&);
  void (*apply)(TrainingSetup*);
};

constexpr KnobChange kSuggestions[] = {
    {"--grad-ckpt full", "recomputes each layer's forward in backward, about +33% step time",
     [](const TrainingSetup& s) { return s.grad_ckpt == GradCkpt::kNone; },
     [](TrainingSetup* s) { s->grad_ckpt = GradCkpt::kFull; }},
    {"--precision bf16", "bf16 weights, no fp32 master copy",
     [](const TrainingSetup& s) { return s.precision == Precision::kBf16Mixed; },
     [](TrainingSetup* s) { s->precision = Precision::kBf16; }},
    {"--loss chunked", "the fp32 logits one chunk at a time",
     [](const TrainingSetup& s) { return s.loss == LossKind::kHf; },
     [](TrainingSetup* s) { s->loss = LossKind::kChunked; }},
    {"--optimizer adamw-8bit", "bitsandbytes' 8-bit optimizer state",
     [](const TrainingSetup& s) {
       return s.finetune == Finetune::kFull &&
              (s.optimizer == OptimizerKind::kAdamW || s.optimizer == OptimizerKind::kAdamWFused ||
               s.optimizer == OptimizerKind::kAdamWForLoop);
     },
     [](TrainingSetup* s) { s->optimizer = OptimizerKind::kAdamW8bit; }},
    {"--finetune lora", "trains adapters only, not the whole model",
     [](const TrainingSetup& s) { return s.finetune == Finetune::kFull; },
     [](TrainingSetup* s) { s->finetune = Finetune::kLora; }},
};

// The first change of kSuggestions under which a micro-batch fits at the
// setup's sequence; a change the model cannot take (an estimate error) is
// passed over.
std::optional<FitSuggestion> SuggestKnob(const ModelSpec& model, const TrainingSetup& at,
                                         const SecondAxis& second, const FitOptions& options,
                                         uint64_t limit_bytes, uint64_t* estimates) {
  for (const KnobChange& change : kSuggestions) {
    if (!change.applies(at)) continue;
    TrainingSetup s = at;
    change.apply(&s);
    EstimateCache cache(model, s, second.variable);
    auto batch = Search(cache, s, SweepVariable::kBatch, second, BatchCap(s, options), limit_bytes);
    *estimates += cache.size();
    if (batch.ok() && batch->fits()) return FitSuggestion{change.flags, change.why, *batch};
  }
  return std::nullopt;
}

}  // namespace

Result<FitResult> Fit(const ModelSpec& model, const TrainingSetup& setup,
                      const FitOptions& options) {
  VS_TRY(gpu, FindGpu(setup.gpu));
  if (options.margin_bytes >= gpu.usable_bytes) {
    return MakeError(fmt::format("--margin: {} is not below the {} usable on {}",
                                 FormatBytes(options.margin_bytes), FormatBytes(gpu.usable_bytes),
                                 gpu.name));
  }
  FitResult out;
  out.gpu = gpu;
  out.margin_bytes = options.margin_bytes;
  out.margin_is_default = options.margin_is_default;
  out.limit_bytes = gpu.usable_bytes - options.margin_bytes;
  // With a GPU-count search and no --gpus given, the batch and sequence
  // searches run at the fewest GPUs found (what the user would launch).
  TrainingSetup at = setup;
  if (options.search_gpus) {
    VS_TRY(gpus, FitGpus(model, setup, out.limit_bytes, options.max_gpus));
    if (setup.parallel.gpus == 1 && gpus.launch_gpus > 0) at.parallel.gpus = gpus.launch_gpus;
    out.gpus = std::move(gpus);
  }
  // A ViT's tokens are its patch grid and the class token, whatever --seq says.
  if (model.is_vit) at.seq = model.vit.Patches() + 1;
  // CLIP's text length is --text-len; --seq is not read.
  if (model.is_clip) at.seq = model.clip.max_positions;
  const SecondAxis second = SecondAxisOf(model, at);
  EstimateCache cache(model, at, second.variable);
  // The setup's own point first: it validates every knob (an error names the
  // flag before any search starts), and both searches start from it.
  VS_TRY(base, cache.At(at.batch, second.value));
  (void)base;
  VS_TRY(batch,
         Search(cache, at, SweepVariable::kBatch, second, BatchCap(at, options), out.limit_bytes));
  const Cap second_cap =
      model.is_unet || model.is_flux ? ImageCap(second) : SeqCap(model, at, options);
  VS_TRY(seq, Search(cache, at, second.variable, second, second_cap, out.limit_bytes));
  out.batch = std::move(batch);
  out.seq = std::move(seq);
  out.estimates = cache.size() + (out.gpus ? out.gpus->estimates : 0);
  if (!out.batch.fits()) {
    out.suggestion = SuggestKnob(model, at, second, options, out.limit_bytes, &out.estimates);
  }
  return out;
}

}  // namespace vramscope
