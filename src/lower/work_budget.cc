// The work budget: how many events a setup will lower to, bounded before
// lowering (lower.h, EstimateLoweringWork; docs/hardening.md).
//
// The constants are upper bounds measured on every family of the catalog
// (src/lower/work_budget_test.cc checks them against real lowerings): one
// layer's forward + backward in one micro-batch emits at most ~950 events
// (gemma-3 with LoRA on all linears, gradient checkpointing, eager attention,
// the for-loop AdamW, fp16 autocast), 1024 here; a mixture-of-experts layer
// adds about 100 events per expert when transformers < 5 loops over one
// nn.Linear per expert, and 8-24 with the stacked experts of transformers 5.
// The optimizer step emits fewer per layer than one micro-batch, so it is
// counted as one more micro-batch.
#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "rank_classes.h"
#include "vramscope/common/checked.h"
#include "vramscope/lower.h"

namespace vramscope {
namespace lower {

namespace {

constexpr uint64_t kEventsPerLayer = 1024;
constexpr uint64_t kEventsPerExpertLoop = 128;    // transformers < 5
constexpr uint64_t kEventsPerExpertStacked = 32;  // transformers >= 5
constexpr uint64_t kEventsOutsideLayers = 512;    // embeddings, head, loss, scaler

uint64_t SaturatingMul(uint64_t a, uint64_t b) {
  return common::CheckedMul(a, b).value_or(UINT64_MAX);
}

uint64_t LayersOf(const RankClassPlan& plan, uint64_t model_layers) {
  uint64_t layers = 0;
  for (const StageSpan& span : plan.chunks) {
    const uint64_t end = std::min(span.end_layer, model_layers);
    if (end > span.first_layer) layers += end - span.first_layer;
  }
  return layers;
}

}  // namespace

LoweringWork WorkOf(const ModelSpec& local, const TrainingSetup& setup,
                    const std::vector<RankClassPlan>& plans) {
  LoweringWork w;
  const uint64_t per_expert =
      setup.transformers_version < 500 ? kEventsPerExpertLoop : kEventsPerExpertStacked;
  w.events_per_layer =
      common::SaturatingAdd(kEventsPerLayer, SaturatingMul(local.num_experts, per_expert));
  w.steps = setup.steps;
  w.rank_classes = plans.size();
  for (const RankClassPlan& plan : plans) {
    w.layers = std::max(w.layers, LayersOf(plan, local.num_layers));
    w.micro_batches = std::max(w.micro_batches, SimulatedMicroBatches(setup, plan));
  }
  // TRL's DPO step adds the reference's forward to every micro-batch.
  if (setup.dpo && !setup.dpo_precompute_ref) w.micro_batches *= 2;
  // Frozen models a diffusion step runs each micro-batch (text encoders, the
  // VAE's encoder): forward only, bounded by the same count per layer. They
  // were not counted, and a 10 000-layer encoder ran out of memory.
  for (const std::shared_ptr<const ModelSpec>& e : setup.text_encoders) {
    if (e) w.frozen_layers = common::SaturatingAdd(w.frozen_layers, e->num_layers);
  }
  if (setup.vae) w.frozen_layers = common::SaturatingAdd(w.frozen_layers, setup.vae->num_layers);
  const uint64_t per_pass =
      common::SaturatingAdd(common::SaturatingAdd(SaturatingMul(w.layers, w.events_per_layer),
                                                  SaturatingMul(w.frozen_layers, kEventsPerLayer)),
                            kEventsOutsideLayers);
  const uint64_t passes = SaturatingMul(common::SaturatingAdd(w.micro_batches, 1), w.steps);
  w.events = SaturatingMul(SaturatingMul(per_pass, passes), w.rank_classes);
  return w;
}

}  // namespace lower

Result<LoweringWork> EstimateLoweringWork(const ModelSpec& model, const TrainingSetup& setup) {
  std::optional<ModelSpec> sharded;
  if (lower::ShardsModel(setup)) {
    VS_TRY(copy, lower::ShardModel(model, setup));
    sharded = std::move(copy);
  }
  const ModelSpec& local = sharded ? *sharded : model;
  TrainingSetup local_setup = setup;
  local_setup.seq = setup.seq / std::max<uint32_t>(setup.parallel.cp, 1);
  VS_TRY(plans, lower::PlanRankClasses(local, local_setup));
  return lower::WorkOf(local, local_setup, plans);
}

std::string DescribeWork(const LoweringWork& w) {
  const std::string frozen = w.frozen_layers == 0
                                 ? std::string()
                                 : fmt::format(" + {} frozen text-encoder / VAE layers x {}",
                                               w.frozen_layers, lower::kEventsPerLayer);
  return fmt::format(
      "about {} events ({} layers x {} events per layer{} x ({} micro-batches + 1 optimizer "
      "step) x {} steps x {} rank classes)",
      w.events == UINT64_MAX ? std::string("2^64") : std::to_string(w.events), w.layers,
      w.events_per_layer, frozen, w.micro_batches, w.steps, w.rank_classes);
}

Status CheckWorkBudget(const LoweringWork& work, uint64_t max_events) {
  if (work.events <= max_events) return Ok{};
  return MakeError(fmt::format(
      "work budget: this setup lowers to {}, above the limit of {} (--max-events; raise it to run "
      "it anyway: each event costs about 170 bytes and 1.5 us)",
      DescribeWork(work), max_events));
}

}  // namespace vramscope
