#include "rank_classes.h"

#include <algorithm>

#include <fmt/format.h>

#include "int_math.h"
#include "param_roles.h"

namespace vramscope::lower {
namespace {

// Megatron's ColumnParallelLinear: the output dimension is split over tensor ranks.
bool ColumnParallel(ParamRole role) {
  switch (role) {
    case ParamRole::kQ:
    case ParamRole::kK:
    case ParamRole::kV:
    case ParamRole::kQkv:
    case ParamRole::kGate:
    case ParamRole::kUp:
    case ParamRole::kGateUp:
    case ParamRole::kExpertGate:
    case ParamRole::kExpertUp:
    case ParamRole::kSharedGate:
    case ParamRole::kSharedUp: return true;
    default: return false;
  }
}

// RowParallelLinear: the input dimension is split (its bias is whole on every rank).
bool RowParallel(ParamRole role) {
  return role == ParamRole::kO || role == ParamRole::kDown || role == ParamRole::kExpertDown ||
         role == ParamRole::kSharedDown;
}

// "model.layers.3.mlp.experts.17.w1" -> 17; -1 when not an expert.
int64_t ExpertIndex(const std::string& module) {
  const size_t at = module.find(".experts.");
  if (at == std::string::npos) return -1;
  int64_t e = 0;
  size_t i = at + 9;
  if (i >= module.size() || module[i] < '0' || module[i] > '9') return -1;
  for (; i < module.size() && module[i] >= '0' && module[i] <= '9'; ++i)
    e = e * 10 + (module[i] - '0');
  return e;
}

}  // namespace

Result<ModelSpec> ShardModel(const ModelSpec& model, const TrainingSetup& setup) {
  const ParallelLayout& l = setup.parallel;
  if (!ShardsModel(setup)) return model;
  auto bad = [](std::string msg) { return MakeError(std::move(msg)); };
  if (model.is_encoder)
    return bad(fmt::format(
        "--tp/--ep: {} is an encoder; Megatron-style parallelism is modelled for decoders",
        model.name));
  const uint64_t t = l.tp;
  const uint64_t kv = model.num_kv_heads ? model.num_kv_heads : model.num_heads;
  if (model.num_heads % t != 0)
    return bad(fmt::format("--tp: {} does not divide the {} attention heads of {}", t,
                           model.num_heads, model.name));
  if (kv % t != 0 && t % kv != 0)
    return bad(fmt::format("--tp: {} and the {} key/value heads of {} do not divide one another", t,
                           kv, model.name));
  if (model.intermediate_size % t != 0)
    return bad(fmt::format("--tp: {} does not divide the MLP size {} of {}", t,
                           model.intermediate_size, model.name));
  if (model.moe_intermediate_size % t != 0)
    return bad(fmt::format("--tp: {} does not divide the expert MLP size {} of {}", t,
                           model.moe_intermediate_size, model.name));
  if (l.ep > 1 && model.num_experts == 0)
    return bad(
        fmt::format("--ep: {} has no experts (expert parallelism needs a mixture-of-experts model)",
                    model.name));
  if (l.ep > 1 && model.num_experts % l.ep != 0)
    return bad(fmt::format("--ep: {} does not divide the {} experts of {}", l.ep, model.num_experts,
                           model.name));

  ModelSpec local = model;
  const uint64_t d = model.head_dim ? model.head_dim : model.hidden_size / model.num_heads;
  local.head_dim = d;
  local.num_heads = model.num_heads / t;
  const uint64_t local_kv = std::max<uint64_t>(1, kv / t);  // kv < tp: heads replicated
  local.num_kv_heads = local_kv;
  local.intermediate_size = model.intermediate_size / t;
  local.moe_intermediate_size = model.moe_intermediate_size / t;
  local.shared_expert_intermediate_size = model.shared_expert_intermediate_size / t;
  // Megatron pads the vocabulary to a multiple of make_vocab_size_divisible_by
  // (128) x tp before splitting it (megatron/training/tokenizer vocab padding).
  const uint64_t padded_vocab = CeilDiv(model.vocab_size, 128 * t) * 128 * t;
  local.vocab_size = padded_vocab / t;
  const uint64_t local_experts = model.num_experts / l.ep;
  local.num_experts = model.num_experts ? local_experts : 0;

  local.params.clear();
  const std::vector<ParamRole> roles = WeightRoles(model.params);  // biases follow their weight
  for (size_t i = 0; i < model.params.size(); ++i) {
    ParamTensor pt = model.params[i];
    const int64_t expert = ExpertIndex(pt.module);
    if (expert >= 0 && static_cast<uint64_t>(expert) >= local_experts) continue;
    const ParamRole role = roles[i];
    const bool is_bias = pt.role == ParamRole::kBias;
    if (role == ParamRole::kEmbed || role == ParamRole::kLmHead) {
      const uint64_t row =
          pt.shape.size() == 2 ? pt.shape[1] : pt.numel / std::max<uint64_t>(1, model.vocab_size);
      pt.numel = local.vocab_size * (is_bias ? 1 : row);
      if (!pt.shape.empty()) pt.shape[0] = local.vocab_size;
    } else if ((role == ParamRole::kK || role == ParamRole::kV) && kv < t) {
      pt.numel = pt.numel / kv * local_kv;
      if (!pt.shape.empty()) pt.shape[0] = pt.shape[0] / kv * local_kv;
    } else if (ColumnParallel(role)) {
      pt.numel /= t;
      if (!pt.shape.empty()) pt.shape[0] /= t;
    } else if (RowParallel(role) && !is_bias) {
      pt.numel /= t;
      if (pt.shape.size() == 2) pt.shape[1] /= t;
    }
    local.params.push_back(std::move(pt));
  }
  local.notes.push_back(
      fmt::format("tensor parallel {}: {} of {} heads, MLP {} of {}, vocabulary {} of {} (padded "
                  "to {}) per rank; "
                  "expert parallel {}: {} of {} experts (Megatron-LM core 0.5-0.13 layouts)",
                  t, local.num_heads, model.num_heads, local.intermediate_size,
                  model.intermediate_size, local.vocab_size, model.vocab_size, padded_vocab, l.ep,
                  local.num_experts, model.num_experts));
  return local;
}

namespace {

// The pipeline layout the model must allow (stages, interleaving, encoders).
Status CheckPipeline(const ModelSpec& model, const ParallelLayout& l) {
  const uint32_t pp = l.pp;
  if (pp > model.num_layers) {
    return MakeError(fmt::format("--pp: {} pipeline stages for the {} layers of {}", pp,
                                 model.num_layers, model.name));
  }
  const uint32_t v = l.virtual_stages;
  if (v > 1 && model.num_layers % (uint64_t{pp} * v) != 0) {
    return MakeError(
        fmt::format("--virtual-stages: {} layers of {} do not split into pp x virtual stages = {} "
                    "equal chunks (Megatron requires it)",
                    model.num_layers, model.name, pp * v));
  }
  if (v > 1 && l.microbatches > 0 && l.microbatches % pp != 0) {
    return MakeError(
        fmt::format("--microbatches: {} is not a multiple of --pp {} (the interleaved schedule "
                    "needs it)",
                    l.microbatches, pp));
  }
  if (pp > 1 && model.is_encoder) {
    return MakeError(fmt::format(
        "--pp: {} is an encoder; pipeline stages are modelled for decoders", model.name));
  }
  return Ok{};
}

}  // namespace

uint64_t SimulatedMicroBatches(const TrainingSetup& setup, const RankClassPlan& plan) {
  const ParallelLayout& layout = setup.parallel;
  const uint64_t requested =
      layout.pp > 1 && layout.microbatches > 0 ? layout.microbatches : setup.grad_accum;
  return layout.pp > 1 && plan.chunks.size() == 1 ? std::min<uint64_t>(requested, plan.warmup + 2)
                                                  : requested;
}

namespace {

// DeepSpeed ZeRO-1/2 over pure data parallelism (Megatron's distributed
// optimizer takes --zero 1 under model parallelism).
bool ZeroPartitionsDiffer(const ParallelLayout& l) {
  return (l.dp_mode == DataParallel::kZero1 || l.dp_mode == DataParallel::kZero2) &&
         !l.model_parallel() && l.dp() > 1;
}

// One class per data-parallel rank (each holds a different slice of the flat
// parameters, so a different set of whole parameters' gradients and norms:
// stage_1_and_2.py get_partition_info). Past 8 ranks: ranks 0, 1 and the
// last; the ranks between hold decoder layers as rank 1 does and are listed
// in its class.
std::vector<RankClassPlan> ZeroRankClasses(const RankClassPlan& all, uint32_t dp) {
  std::vector<uint32_t> simulated;
  if (dp <= 8) {
    for (uint32_t r = 0; r < dp; ++r) simulated.push_back(r);
  } else {
    simulated = {0, 1, dp - 1};
  }
  std::vector<RankClassPlan> out;
  for (size_t i = 0; i < simulated.size(); ++i) {
    RankClassPlan p = all;
    p.dp_rank = simulated[i];
    p.ranks.clear();
    const uint32_t last = i + 1 < simulated.size() ? simulated[i + 1] : dp;
    for (uint32_t r = simulated[i]; r < last && (r == simulated[i] || dp > 8); ++r)
      p.ranks.push_back(static_cast<int>(r));
    p.name = p.ranks.size() == 1 ? fmt::format("dp rank {}", simulated[i])
                                 : fmt::format("dp ranks {}-{}", p.ranks.front(), p.ranks.back());
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace

Result<std::vector<RankClassPlan>> PlanRankClasses(const ModelSpec& model,
                                                   const TrainingSetup& setup) {
  const ParallelLayout& l = setup.parallel;
  if (Status st = CheckPipeline(model, l); !st.ok()) return st.error();
  const uint32_t pp = l.pp;
  const uint32_t v = l.virtual_stages;
  const uint64_t m = l.microbatches ? l.microbatches : setup.grad_accum;
  // Layers per stage: L / pp, the remainder given to the middle stages first
  // (the first and last stages also hold the embeddings and the head, as
  // Megatron's account_for_embedding_in_pipeline_split balances), then to the
  // first stage.
  std::vector<uint64_t> layers(pp, model.num_layers / pp);
  uint64_t rem = model.num_layers % pp;
  for (uint32_t s = 1; s + 1 < pp && rem > 0; ++s, --rem) ++layers[s];
  for (uint32_t s = 0; rem > 0; s = (s + 1) % pp, --rem) ++layers[s];
  std::vector<uint64_t> first(pp, 0);
  for (uint32_t s = 1; s < pp; ++s) first[s] = first[s - 1] + layers[s - 1];

  const uint64_t per_stage = uint64_t{l.tp} * l.cp * l.dp();
  auto ranks_of = [&](uint32_t lo, uint32_t hi) {  // stages [lo, hi]
    std::vector<int> r;
    for (uint64_t s = lo; s <= hi; ++s) {
      for (uint64_t i = 0; i < per_stage; ++i) r.push_back(static_cast<int>(s * per_stage + i));
    }
    return r;
  };
  auto plan_for = [&](std::string name, uint32_t stage, uint32_t lo, uint32_t hi) {
    RankClassPlan p;
    p.name = std::move(name);
    p.ranks = ranks_of(lo, hi);
    p.stage = stage;
    if (v == 1) {
      p.chunks[0].first_layer = first[stage];
      p.chunks[0].end_layer = first[stage] + layers[stage];
      p.chunks[0].embed = stage == 0;
      p.chunks[0].head = stage == pp - 1;
      p.warmup = static_cast<uint32_t>(std::min<uint64_t>(pp - stage - 1, m));
      return p;
    }
    const uint64_t per_chunk = model.num_layers / (uint64_t{pp} * v);
    p.chunks.assign(v, StageSpan{});
    for (uint32_t c = 0; c < v; ++c) {
      const uint64_t virtual_stage = uint64_t{c} * pp + stage;
      p.chunks[c].first_layer = virtual_stage * per_chunk;
      p.chunks[c].end_layer = (virtual_stage + 1) * per_chunk;
      p.chunks[c].embed = virtual_stage == 0;
      p.chunks[c].head = virtual_stage == uint64_t{pp} * v - 1;
    }
    p.warmup = static_cast<uint32_t>(
        std::min<uint64_t>((pp - stage - 1) * 2 + uint64_t{v - 1} * pp, m * v));
    return p;
  };
  std::vector<RankClassPlan> out;
  if (pp == 1) {
    if (ZeroPartitionsDiffer(l)) return ZeroRankClasses(plan_for("all ranks", 0, 0, 0), l.dp());
    out.push_back(plan_for("all ranks", 0, 0, 0));
    return out;
  }
  out.push_back(plan_for("first stage", 0, 0, 0));
  // Stage 1 has the most micro-batches in flight of the middle stages and at
  // least as many layers: it is the middle class's maximum.
  if (pp > 2) out.push_back(plan_for("middle stages", 1, 1, pp - 2));
  out.push_back(plan_for("last stage", pp - 1, pp - 1, pp - 1));
  return out;
}

uint64_t NcclBytes(const ParallelLayout& l) {
  // NCCL (2.18-2.21) allocates per communicator and channel receive buffers
  // for its three protocols (NCCL_BUFFSIZE 4 MiB Simple, about 4.6 MiB LL128,
  // 256 KiB LL) for ring and tree peers; with the 16 channels typical of
  // NVLink systems that is about 300 MiB per communicator, outside PyTorch's
  // allocator. A lead to measure: NCCL issue #864 reports ~1.6 GB for one
  // communicator with NVLS on H100 systems.
  constexpr uint64_t kPerCommunicator = 300ull << 20;
  uint64_t communicators = 0;
  if (l.dp() > 1) ++communicators;
  if (l.tp > 1) ++communicators;
  if (l.pp > 1) ++communicators;
  if (l.cp > 1) ++communicators;
  if (l.ep > 1) ++communicators;
  return communicators * kPerCommunicator;
}

}  // namespace vramscope::lower
