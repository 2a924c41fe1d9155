#include "vramscope/parallel.h"

#include <fmt/format.h>

#include "vramscope/common/quote.h"

namespace vramscope {

uint32_t ParallelLayout::dp() const {
  const uint64_t model = uint64_t{tp} * pp * cp;
  return model == 0 ? 0 : static_cast<uint32_t>(gpus / model);
}

// transformers integrations/deepspeed.py (HfTrainerDeepSpeedConfig
// trainer_config_finalize, 4.40-4.57) fills "auto" with these; DeepSpeed's own
// defaults are in deepspeed/runtime/zero/config.py (0.14-0.16).
uint64_t ZeroConfig::ReduceBucket(uint64_t h) const {
  if (reduce_bucket_elems) return *reduce_bucket_elems;
  return hf_auto ? h * h : 500'000'000;
}
uint64_t ZeroConfig::PrefetchBucket(uint64_t h) const {
  if (prefetch_bucket_elems) return *prefetch_bucket_elems;
  return hf_auto ? static_cast<uint64_t>(0.9 * static_cast<double>(h * h)) : 50'000'000;
}
uint64_t ZeroConfig::PersistenceThreshold(uint64_t h) const {
  if (param_persistence_threshold) return *param_persistence_threshold;
  return hf_auto ? 10 * h : 100'000;
}

std::string_view DataParallelName(DataParallel d) {
  switch (d) {
    case DataParallel::kNone: return "none";
    case DataParallel::kDdp: return "ddp";
    case DataParallel::kZero1: return "zero1";
    case DataParallel::kZero2: return "zero2";
    case DataParallel::kZero3: return "zero3";
    case DataParallel::kFsdp: return "fsdp";
  }
  return "?";
}

std::string_view FsdpShardingName(FsdpSharding f) {
  switch (f) {
    case FsdpSharding::kFull: return "full";
    case FsdpSharding::kGradOp: return "grad-op";
    case FsdpSharding::kHybrid: return "hybrid";
  }
  return "?";
}

std::string_view OffloadName(Offload o) {
  switch (o) {
    case Offload::kNone: return "none";
    case Offload::kOptimizer: return "optimizer";
    case Offload::kParams: return "params";
  }
  return "?";
}

std::string_view FsdpPrefetchName(FsdpPrefetch p) {
  switch (p) {
    case FsdpPrefetch::kNone: return "none";
    case FsdpPrefetch::kPre: return "pre";
    case FsdpPrefetch::kPost: return "post";
  }
  return "?";
}

Result<FsdpPrefetch> ParseFsdpPrefetch(std::string_view t) {
  if (t == "none") return FsdpPrefetch::kNone;
  if (t == "pre") return FsdpPrefetch::kPre;
  if (t == "post") return FsdpPrefetch::kPost;
  return MakeError(fmt::format("--fsdp-backward-prefetch: {} is not one of none, pre, post",
                               common::QuoteForMessage(t, common::kQuotedBytes, '\'')));
}

Result<FsdpWrap> ParseFsdpWrap(std::string_view t) {
  if (t == "trainer") return FsdpWrap::kTrainer;
  if (t == "layers") return FsdpWrap::kLayers;
  return MakeError(fmt::format("--fsdp-wrap: {} is not one of trainer, layers",
                               common::QuoteForMessage(t, common::kQuotedBytes, '\'')));
}

Result<FsdpSharding> ParseFsdpSharding(std::string_view t) {
  if (t == "full") return FsdpSharding::kFull;
  if (t == "grad-op") return FsdpSharding::kGradOp;
  if (t == "hybrid") return FsdpSharding::kHybrid;
  return MakeError(fmt::format("--fsdp: {} is not one of full, grad-op, hybrid",
                               common::QuoteForMessage(t, common::kQuotedBytes, '\'')));
}

Result<Offload> ParseOffload(std::string_view t) {
  if (t == "none") return Offload::kNone;
  if (t == "optimizer") return Offload::kOptimizer;
  if (t == "params") return Offload::kParams;
  return MakeError(fmt::format("--offload: {} is not one of none, optimizer, params",
                               common::QuoteForMessage(t, common::kQuotedBytes, '\'')));
}

Result<DataParallel> ParseZeroStage(std::string_view t) {
  if (t == "1") return DataParallel::kZero1;
  if (t == "2") return DataParallel::kZero2;
  if (t == "3") return DataParallel::kZero3;
  return MakeError(fmt::format("--zero: {} is not one of 1, 2, 3",
                               common::QuoteForMessage(t, common::kQuotedBytes, '\'')));
}

Status ValidateLayout(const ParallelLayout& l) {
  auto bad = [](std::string msg) { return Status(MakeError(std::move(msg))); };
  constexpr uint32_t kMaxGpus = 1u << 20;
  if (l.gpus == 0 || l.gpus > kMaxGpus)
    return bad(fmt::format("--gpus: {} is outside 1..{}", l.gpus, kMaxGpus));
  for (auto [flag, v] : {std::pair<const char*, uint32_t>{"--tp", l.tp},
                         {"--pp", l.pp},
                         {"--cp", l.cp},
                         {"--ep", l.ep}}) {
    if (v == 0 || v > l.gpus)
      return bad(fmt::format("{}: {} is outside 1..{} (--gpus)", flag, v, l.gpus));
  }
  if (l.gpus_per_node == 0 || l.gpus_per_node > 64)
    return bad(fmt::format("--gpus-per-node: {} is outside 1..64", l.gpus_per_node));
  const uint64_t model = uint64_t{l.tp} * l.pp * l.cp;
  if (l.gpus % model != 0) {
    return bad(fmt::format("--gpus: {} GPUs is not a multiple of tp x pp x cp = {} x {} x {} = {}",
                           l.gpus, l.tp, l.pp, l.cp, model));
  }
  const uint32_t dp = l.dp();
  // Megatron places expert parallelism inside the data-parallel (x context)
  // group: ep must divide dp * cp (megatron/core/parallel_state.py).
  if ((uint64_t{dp} * l.cp) % l.ep != 0)
    return bad(fmt::format("--ep: {} does not divide the data-parallel x context-parallel size {}",
                           l.ep, dp * l.cp));
  if (l.sp && l.tp == 1) return bad("--sp: sequence parallelism needs --tp above 1");
  if (l.virtual_stages == 0 || l.virtual_stages > 64)
    return bad(fmt::format("--virtual-stages: {} is outside 1..64", l.virtual_stages));
  if (l.virtual_stages > 1 && l.pp == 1)
    return bad("--virtual-stages: interleaving needs --pp above 1");
  if (l.microbatches > 65536)
    return bad(fmt::format("--microbatches: {} is outside 0..65536", l.microbatches));
  if (l.fsdp_version != 1 && l.fsdp_version != 2)
    return bad(fmt::format("--fsdp-version: {} is not 1 or 2", l.fsdp_version));
  if (l.dp_mode == DataParallel::kFsdp && l.fsdp == FsdpSharding::kHybrid &&
      dp % l.gpus_per_node != 0 && dp > l.gpus_per_node)
    return bad(
        fmt::format("--fsdp hybrid: {} data-parallel ranks do not fill whole nodes of {} GPUs", dp,
                    l.gpus_per_node));
  const bool sharded = l.dp_mode == DataParallel::kZero1 || l.dp_mode == DataParallel::kZero2 ||
                       l.dp_mode == DataParallel::kZero3 || l.dp_mode == DataParallel::kFsdp;
  if (l.offload != Offload::kNone && !sharded)
    return bad(
        "--offload: needs --zero 1|2|3 or --fsdp (DDP and plain runs keep every state on the GPU)");
  if (l.offload == Offload::kParams &&
      (l.dp_mode == DataParallel::kZero1 || l.dp_mode == DataParallel::kZero2))
    return bad("--offload params: DeepSpeed offloads parameters only with --zero 3");
  if (l.model_parallel()) {
    if (l.dp_mode == DataParallel::kZero2 || l.dp_mode == DataParallel::kZero3 ||
        l.dp_mode == DataParallel::kFsdp || l.dp_mode == DataParallel::kDdp) {
      return bad(
          fmt::format("--{}: with --tp/--pp/--cp/--ep the data-parallel side is Megatron's "
                      "(plain, or --zero 1 for its distributed optimizer)",
                      l.dp_mode == DataParallel::kFsdp  ? "fsdp"
                      : l.dp_mode == DataParallel::kDdp ? "ddp"
                                                        : "zero"));
    }
    if (l.offload != Offload::kNone)
      return bad("--offload: not modelled with Megatron-style --tp/--pp/--cp/--ep");
  }
  return Ok{};
}

std::vector<std::pair<std::string, std::string>> DescribeLayout(const ParallelLayout& l) {
  std::vector<std::pair<std::string, std::string>> k;
  if (!l.multi_gpu()) return k;
  k.emplace_back("gpus", std::to_string(l.gpus));
  k.emplace_back("data_parallel", std::string(DataParallelName(l.dp_mode)));
  if (l.dp_mode == DataParallel::kFsdp) {
    k.emplace_back("fsdp", std::string(FsdpShardingName(l.fsdp)));
    k.emplace_back("fsdp_version", std::to_string(l.fsdp_version));
    if (l.fsdp_wrap == FsdpWrap::kLayers) k.emplace_back("fsdp_wrap", "layers");
    if (l.fsdp_version == 1 && l.fsdp_backward_prefetch != FsdpPrefetch::kNone)
      k.emplace_back("fsdp_backward_prefetch",
                     std::string(FsdpPrefetchName(l.fsdp_backward_prefetch)));
  }
  if (l.offload != Offload::kNone) k.emplace_back("offload", std::string(OffloadName(l.offload)));
  if (l.tp > 1) k.emplace_back("tp", std::to_string(l.tp));
  if (l.pp > 1) k.emplace_back("pp", std::to_string(l.pp));
  if (l.cp > 1) k.emplace_back("cp", std::to_string(l.cp));
  if (l.ep > 1) k.emplace_back("ep", std::to_string(l.ep));
  if (l.sp) k.emplace_back("sp", "true");
  if (l.pp > 1 && l.microbatches > 0)
    k.emplace_back("microbatches", std::to_string(l.microbatches));
  if (l.virtual_stages > 1) k.emplace_back("virtual_stages", std::to_string(l.virtual_stages));
  if (l.dp_mode == DataParallel::kZero1 || l.dp_mode == DataParallel::kZero2 ||
      l.dp_mode == DataParallel::kZero3) {
    k.emplace_back("zero_buckets", l.zero.hf_auto ? "hf-auto" : "deepspeed-defaults");
    k.emplace_back("zero_sub_group_size", std::to_string(l.zero.sub_group_size));
    if (l.dp_mode == DataParallel::kZero3 && !l.zero.zero_init)
      k.emplace_back("zero_init", "false");
    // Listed only where it is not the stage's default (on for 3, off for 1-2).
    if (l.zero.overlap_comm >= 0 &&
        (l.zero.overlap_comm == 1) != (l.dp_mode == DataParallel::kZero3))
      k.emplace_back("zero_overlap_comm", l.zero.overlap_comm == 1 ? "on" : "off");
  }
  return k;
}

}  // namespace vramscope
