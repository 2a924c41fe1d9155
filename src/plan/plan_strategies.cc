// Plan(): training strategies (one GPU, or data-parallel modes over --gpus)
// ranked by tokens/s among those that fit
// (plan.h). Memory of every candidate is an estimate; its speed comes from
// EstimateStepTime (step_time.cc).
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <tuple>
#include <utility>

#include <fmt/format.h>

#include "plan_internal.h"
#include "vramscope/common/checked.h"
#include "vramscope/estimate.h"
#include "vramscope/lower.h"
#include "vramscope/plan.h"

namespace vramscope {
namespace {

using plan_internal::StrategyLabel;

constexpr uint64_t kDefaultSequencesPerStep = 16;

constexpr std::string_view kExpandable = "expandable_segments:True";

// A knob set: everything of a strategy but the micro-batch split.
struct KnobSet {
  Precision precision;
  Finetune finetune;
  GradCkpt ckpt;
  OptimizerKind optimizer;
  LossKind loss;
  std::string alloc_conf;
  DataParallel dp = DataParallel::kNone;
  Offload offload = Offload::kNone;
};

struct DataParallelChoice {
  DataParallel dp;
  Offload offload;
};

// Several GPUs: how the replicas hold the model states. Full fine-tuning
// tries DDP, ZeRO 1-3, FSDP and optimizer offload; adapters are small, so
// LoRA and QLoRA replicate them with DDP. A mode given on the command line
// is kept.
std::vector<DataParallelChoice> DataParallelChoices(const TrainingSetup& base, Finetune finetune,
                                                    const PlanOptions& options) {
  if (base.parallel.gpus <= 1) return {{DataParallel::kNone, Offload::kNone}};
  if (options.keep_parallel) return {{base.parallel.dp_mode, base.parallel.offload}};
  if (finetune != Finetune::kFull) return {{DataParallel::kDdp, Offload::kNone}};
  return {{DataParallel::kDdp, Offload::kNone},       {DataParallel::kZero1, Offload::kNone},
          {DataParallel::kZero2, Offload::kNone},     {DataParallel::kZero3, Offload::kNone},
          {DataParallel::kFsdp, Offload::kNone},      {DataParallel::kZero2, Offload::kOptimizer},
          {DataParallel::kZero3, Offload::kOptimizer}};
}

// Full fine-tuning tries both bf16 weights, gradients and optimizer state
// (the default: transformers 5.x loads the checkpoint's dtype) and fp32
// master weights under bf16 autocast (the classic mixed-precision recipe,
// more memory). Adapters keep the setup's precision; --precision on the
// command line keeps it for all.
std::vector<Precision> Precisions(const TrainingSetup& base, Finetune finetune,
                                  const PlanOptions& options) {
  const bool bf16_family =
      base.precision == Precision::kBf16 || base.precision == Precision::kBf16Mixed;
  if (options.keep_precision || finetune != Finetune::kFull || !bf16_family)
    return {base.precision};
  return {Precision::kBf16, Precision::kBf16Mixed};
}

template <typename T>
void AddUnique(std::vector<T>* values, T value) {
  if (std::find(values->begin(), values->end(), value) == values->end())
    values->push_back(std::move(value));
}

std::vector<KnobSet> KnobSets(const TrainingSetup& base, const PlanOptions& options) {
  std::vector<Finetune> finetunes;
  if (options.keep_finetune) {
    finetunes = {base.finetune};
  } else {
    finetunes = {Finetune::kFull, Finetune::kLora};
    // QLoRA in fp32 (bnb_4bit_compute_dtype float32) dequantizes every weight to fp32:
    // the planner offers QLoRA with a 16-bit precision only.
    if (base.precision != Precision::kFp32) finetunes.push_back(Finetune::kQLora);
  }
  std::vector<OptimizerKind> optimizers;
  if (options.keep_optimizer) {
    optimizers = {base.optimizer};
  } else {
    optimizers = {OptimizerKind::kAdamWFused, OptimizerKind::kAdamW8bit};
  }
  std::vector<LossKind> losses = {base.loss};
  AddUnique(&losses, LossKind::kFusedLinear);
  std::vector<std::string> allocs = {base.alloc_conf};
  if (base.alloc_conf.find("expandable_segments") == std::string::npos) {
    AddUnique(&allocs, base.alloc_conf.empty() ? std::string(kExpandable)
                                               : base.alloc_conf + "," + std::string(kExpandable));
  }
  std::vector<KnobSet> out;
  for (Finetune f : finetunes) {
    for (Precision p : Precisions(base, f, options)) {
      for (const DataParallelChoice& d : DataParallelChoices(base, f, options)) {
        const bool sharded = d.dp != DataParallel::kNone && d.dp != DataParallel::kDdp;
        for (GradCkpt c : {GradCkpt::kNone, GradCkpt::kFull}) {
          for (OptimizerKind o : optimizers) {
            // ZeRO and FSDP step fp32 partitions with a fused Adam; bitsandbytes'
            // 8-bit states are not combined with them here.
            if (sharded && !options.keep_optimizer && o != optimizers.front()) continue;
            for (LossKind l : losses) {
              for (const std::string& a : allocs)
                out.push_back({p, f, c, o, l, a, d.dp, d.offload});
            }
          }
        }
      }
    }
  }
  return out;
}

// Micro-batch sizes that split the step's sequences evenly, largest first.
std::vector<uint64_t> MicroBatches(uint64_t sequences, uint64_t seq) {
  std::vector<uint64_t> out;
  for (uint64_t b = sequences; b >= 1; --b) {
    if (sequences % b != 0 || sequences / b > kMaxGradAccum) continue;
    if (b > kFitMaxBatch || b * seq > kMaxTokensPerMicroBatch) continue;
    out.push_back(b);
  }
  return out;
}

Strategy Measure(const TrainingSetup& setup, const Report& report, const ModelSpec& model) {
  Strategy s;
  s.setup = setup;
  s.label = StrategyLabel(setup);
  s.knobs = DescribeSetup(setup);
  const RankReport& worst = report.worst();
  s.peak_allocated_bytes = FullPeakAllocatedBytes(worst);
  s.peak_reserved_bytes = FullPeakReservedBytes(worst);
  s.device_total_bytes = FullDeviceTotalBytes(worst);
  s.needed_bytes = report.needed_bytes();
  s.oom = worst.sim.oom.has_value();
  s.fits = report.fits();
  const uint64_t trainable = report.model ? report.model->trainable_parameters : 0;
  s.time = EstimateStepTime(model, setup, report.gpu, trainable);
  return s;
}

// Speeds within this share of each other count as a tie: the step-time model
// is not that precise, and memory then decides.
constexpr double kSpeedTie = 0.005;

// Speeds in buckets of kSpeedTie (a transitive "about equal", as sorting
// needs).
int64_t SpeedBucket(const Strategy& s) {
  const double speed = s.time.tokens_per_second;
  return speed > 1 ? static_cast<int64_t>(std::floor(std::log(speed) / std::log1p(kSpeedTie))) : 0;
}

bool Faster(const Strategy& a, const Strategy& b) {
  if (a.fits != b.fits) return a.fits;
  if (a.fits) {
    if (SpeedBucket(a) != SpeedBucket(b)) return SpeedBucket(a) > SpeedBucket(b);
    return a.device_total_bytes < b.device_total_bytes;
  }
  return a.needed_bytes < b.needed_bytes;
}

// The step a plan divides: tokens per optimizer step and the sequences each
// data-parallel replica runs of them.
struct StepTokens {
  uint64_t tokens = 0;
  uint64_t sequences = 0;  // per replica
};

// Checks --tokens-per-step against --seq and the GPU count. Errors name the
// flag; none is possible once this returns a Step.
Result<StepTokens> CheckStepTokens(const TrainingSetup& setup, const PlanOptions& options) {
  if (setup.seq == 0) return MakeError("--seq: must be at least 1");
  const uint64_t tokens =
      options.tokens_per_step ? options.tokens_per_step : kDefaultSequencesPerStep * setup.seq;
  if (tokens % setup.seq != 0) {
    return MakeError(
        fmt::format("--tokens-per-step: {} is not a multiple of --seq {}", tokens, setup.seq));
  }
  // Several GPUs: each data-parallel replica takes its share of the step.
  const uint64_t replicas = std::max<uint32_t>(1, setup.parallel.dp());
  if (setup.parallel.model_parallel()) {
    return MakeError(
        "plan: --tp/--pp/--cp/--ep layouts are estimated one at a time (vramscope estimate); plan "
        "ranks data-parallel strategies");
  }
  if ((tokens / setup.seq) % replicas != 0) {
    return MakeError(
        fmt::format("--tokens-per-step: {} sequences of {} tokens do not split over {} GPUs",
                    tokens / setup.seq, setup.seq, replicas));
  }
  const uint64_t sequences = tokens / setup.seq / replicas;
  if (sequences > kMaxGradAccum * kFitMaxBatch) {
    return MakeError(
        fmt::format("--tokens-per-step: {} is more than one GPU step can hold", tokens));
  }
  return StepTokens{tokens, sequences};
}

// Searches estimate without the timeline and the top allocations: only the
// peaks and the verdict rank strategies.
EstimateOptions SearchEstimateOptions() {
  EstimateOptions fast;
  fast.timeline = false;
  fast.top_allocations = 0;
  return fast;
}

// The base setup with knob set `k` and the micro-batch `batch`, accumulated
// to `sequences` per step.
TrainingSetup WithKnobSet(const TrainingSetup& base, const KnobSet& k, uint64_t batch,
                          uint64_t sequences) {
  TrainingSetup s = base;
  s.precision = k.precision;
  s.finetune = k.finetune;
  s.grad_ckpt = k.ckpt;
  s.optimizer = k.optimizer;
  s.loss = k.loss;
  s.alloc_conf = k.alloc_conf;
  s.parallel.dp_mode = k.dp;
  s.parallel.offload = k.offload;
  s.batch = batch;
  s.grad_accum = sequences / batch;
  return s;
}

// Estimates one split: true when it fits, false when not, nullopt when the
// combination cannot be estimated at all.
using ProbeSplit = std::function<std::optional<bool>(size_t index)>;

// The largest split (lowest index; splits run from the largest micro-batch
// down) that fits, searched from `start`: up while splits fit, else down
// until one does. Under the step-time model a smaller micro-batch is never
// faster, so that split is the knob set's answer. Splits above a failing one
// are taken not to fit (memory grows with the micro-batch). nullopt when
// `start` itself cannot be estimated; the last split when none fits.
std::optional<size_t> LargestFittingSplit(size_t start, size_t splits, const ProbeSplit& probe) {
  const std::optional<bool> fits = probe(start);
  if (!fits) return std::nullopt;
  size_t found = start;
  if (*fits) {
    while (found > 0) {
      const std::optional<bool> up = probe(found - 1);
      if (!up || !*up) break;
      --found;
    }
    return found;
  }
  for (size_t i = start + 1; i < splits; ++i) {
    const std::optional<bool> down = probe(i);
    if (!down) break;
    if (*down) return i;
  }
  return splits - 1;
}

// The work budget of a whole plan (docs/hardening.md): the bounds of all its
// estimates (EstimateLoweringWork) within kPlanBudgetFactor x --max-events,
// about 20 s of work on a quiet two-core machine. Measured sums of bounds, in
// units of --max-events: qwen2.5-0.5b 0.7, llama-3-8b 5.0 (one GPU) and 2.1
// (8 GPUs), mistral-7b 4.3, flux.1-dev 7.5; over it llama-3-70b 17.5,
// qwen3-30b-a3b 55 (108 s), a 30B MoE over 720 720 GPUs 14, a FLUX config
// of 2048 blocks 48 before its first estimate.
constexpr uint64_t kPlanBudgetFactor = 8;

class PlanBudget {
 public:
  PlanBudget(const ModelSpec& model, const TrainingSetup& setup)
      : model_(model),
        limit_(common::CheckedMul(setup.max_events, kPlanBudgetFactor).value_or(UINT64_MAX)) {}

  // Adds the bound of estimating `s` (nothing when it cannot be bounded or is
  // over its own budget: Estimate refuses it, and the plan skips it); an Error
  // once the sum passes the limit.
  Status Spend(const TrainingSetup& s, size_t estimates, const char* when) {
    auto work = EstimateLoweringWork(model_, s);
    if (!work.ok() || work->events > s.max_events) return Ok{};
    spent_ = common::SaturatingAdd(spent_, work->events);
    if (spent_ <= limit_) return Ok{};
    return MakeError(fmt::format(
        "{}: work budget: this plan's estimates ({} {}) lower to more than its limit of {} "
        "events in all ({} x --max-events; give --finetune, --optimizer, --precision or "
        "--grad-ckpt to try fewer strategies, or raise --max-events)",
        model_.name, when, estimates, limit_, kPlanBudgetFactor));
  }

 private:
  const ModelSpec& model_;
  uint64_t limit_;
  uint64_t spent_ = 0;
};

// Before any estimate: each knob set is estimated at least once, at its
// cheapest split at best (the largest micro-batch, the fewest accumulated),
// so those bounds alone must be within the plan's budget.
Status CheckPlanWork(const ModelSpec& model, const TrainingSetup& setup, const PlanOptions& options,
                     uint64_t largest_micro_batch, uint64_t sequences) {
  PlanBudget budget(model, setup);
  const std::vector<KnobSet> knob_sets = KnobSets(setup, options);
  for (const KnobSet& k : knob_sets) {
    const TrainingSetup s = WithKnobSet(setup, k, largest_micro_batch, sequences);
    if (Status st = budget.Spend(s, knob_sets.size(), "at least"); !st.ok()) return st;
  }
  return Ok{};
}

// Every knob set's search, in order: its strategies go to out->strategies,
// the estimates it made to out->estimates, and the combinations the model
// cannot take to `skipped` (said in the explanation, not fatal). An Error when
// the search passes the plan's work budget.
Status SearchKnobSets(const ModelSpec& model, const TrainingSetup& setup,
                      const PlanOptions& options, const std::vector<uint64_t>& micro_batches,
                      uint64_t sequences, PlanResult* out, std::vector<std::string>* skipped) {
  const EstimateOptions fast = SearchEstimateOptions();
  PlanBudget budget(model, setup);
  Status over = Ok{};
  // Where the last knob set of the same finetune and checkpointing found its
  // largest fitting split: the optimizer, loss and allocator variants of a
  // group need similar memory, so their search starts there, one step each
  // way usually settles it.
  std::map<std::tuple<Precision, Finetune, GradCkpt>, size_t> group_start;
  const std::vector<KnobSet> knob_sets = KnobSets(setup, options);
  size_t knob_sets_done = 0;
  for (const KnobSet& k : knob_sets) {
    if (options.progress && knob_sets_done > 0) options.progress(knob_sets_done, knob_sets.size());
    ++knob_sets_done;
    out->considered += micro_batches.size();
    const auto group = std::make_tuple(k.precision, k.finetune, k.ckpt);
    const size_t start = group_start.count(group) ? group_start[group] : 0;
    auto probe = [&](size_t index) -> std::optional<bool> {
      const TrainingSetup s = WithKnobSet(setup, k, micro_batches[index], sequences);
      if (over.ok()) over = budget.Spend(s, out->estimates + 1, "after");
      if (!over.ok()) return std::nullopt;  // the search ends: nothing more is estimated
      auto est = Estimate(model, s, fast);
      ++out->estimates;
      if (!est.ok()) {
        // A combination the model cannot take (e.g. no LoRA target matches).
        AddUnique(skipped, fmt::format("{} skipped: {}", StrategyLabel(s), est.error().message));
        return std::nullopt;
      }
      out->strategies.push_back(Measure(s, est->report, model));
      return out->strategies.back().fits;
    };
    if (auto found = LargestFittingSplit(start, micro_batches.size(), probe))
      group_start[group] = *found;
    if (!over.ok()) return over;
  }
  if (options.progress) options.progress(knob_sets.size(), knob_sets.size());
  return Ok{};
}

}  // namespace

Result<PlanResult> Plan(const ModelSpec& model, const TrainingSetup& setup,
                        const PlanOptions& options) {
  VS_TRY(step, CheckStepTokens(setup, options));
  const std::vector<uint64_t> micro_batches = MicroBatches(step.sequences, setup.seq);
  if (micro_batches.empty()) {
    return MakeError(
        fmt::format("--tokens-per-step: {} cannot be split into micro-batches of at most {} tokens",
                    step.tokens, kMaxTokensPerMicroBatch));
  }
  // The plan's work is bounded before the base's estimate, its first work;
  // then the base setup validates every knob before anything is enumerated.
  if (Status st = CheckPlanWork(model, setup, options, micro_batches.front(), step.sequences);
      !st.ok())
    return st.error();
  VS_TRY(base, Estimate(model, setup, SearchEstimateOptions()));

  PlanResult out;
  out.gpu = base.report.gpu;
  out.model = base.report.model;
  out.seq = setup.seq;
  out.tokens_per_step = step.tokens;
  std::vector<std::string> skipped;
  if (Status st =
          SearchKnobSets(model, setup, options, micro_batches, step.sequences, &out, &skipped);
      !st.ok())
    return st.error();
  std::stable_sort(out.strategies.begin(), out.strategies.end(), Faster);
  out.explanation = plan_internal::ExplainPlan(out);
  for (std::string& line : skipped) out.explanation.push_back(std::move(line));
  return out;
}

}  // namespace vramscope
