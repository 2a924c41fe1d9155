#include "parallel_flags.h"

#include <algorithm>
#include <cstdio>

#include <fmt/format.h>

#include "vramscope/common/quote.h"

namespace vramscope::cli {
namespace {

Result<uint32_t> Count(int64_t v, std::string_view flag, int64_t lo, int64_t hi) {
  if (v < lo || v > hi) return MakeError(fmt::format("{}: {} is outside {}..{}", flag, v, lo, hi));
  return static_cast<uint32_t>(v);
}

// A ZeRO size in elements; -1 keeps the default.
template <typename T>
Status Elems(int64_t v, std::string_view flag, T* out) {
  if (v == -1) return Ok{};
  if (v < 0 || v > (int64_t{1} << 40)) {
    return MakeError(fmt::format("{}: {} is outside 0..{} elements", flag, v, int64_t{1} << 40));
  }
  *out = static_cast<uint64_t>(v);
  return Ok{};
}

}  // namespace

void AddParallelFlags(CLI::App* sub, ParallelArgs* a) {
  sub->add_option("--gpus", a->gpus,
                  "GPUs in the run (default 1, or tp x pp x cp; alone: DDP over them)");
  sub->add_option("--gpus-per-node", a->gpus_per_node,
                  "GPUs per node (default 8): FSDP hybrid, NCCL");
  sub->add_flag("--ddp", a->ddp, "torch DistributedDataParallel");
  sub->add_option(
      "--zero", a->zero,
      "DeepSpeed ZeRO stage 1, 2 or 3 (with --tp/--pp: 1 = Megatron distributed optimizer)");
  sub->add_option("--fsdp", a->fsdp, "PyTorch FSDP sharding: full, grad-op, hybrid");
  sub->add_option("--fsdp-version", a->fsdp_version,
                  "FSDP 1 (FullyShardedDataParallel) or 2 (fully_shard; default)");
  sub->add_option("--fsdp-backward-prefetch", a->fsdp_backward_prefetch,
                  "FSDP1 backward_prefetch: none (NO_PREFETCH, the HF Trainer's default), pre "
                  "(BACKWARD_PRE), post (BACKWARD_POST)");
  sub->add_option("--fsdp-wrap", a->fsdp_wrap,
                  "FSDP units: trainer (the HF Trainer's: each decoder layer; with PEFT, PEFT's "
                  "wrap policy; default) or layers (each decoder layer whatever the adapters)");
  sub->add_option("--offload", a->offload, "none, optimizer, params (ZeRO / FSDP CPU offload)");
  sub->add_option("--tp", a->tp, "Tensor-parallel size (Megatron)");
  sub->add_option("--pp", a->pp, "Pipeline-parallel stages (1F1B)");
  sub->add_flag("--sp", a->sp, "Megatron sequence parallelism (with --tp)");
  sub->add_option("--cp", a->cp, "Context-parallel size");
  sub->add_option("--ep", a->ep, "Expert-parallel size (MoE)");
  sub->add_option("--microbatches", a->microbatches,
                  "Pipeline micro-batches per step (default: --grad-accum)");
  sub->add_option("--virtual-stages", a->virtual_stages,
                  "Interleaved 1F1B: model chunks per pipeline stage");
  sub->add_option("--ddp-bucket-cap-mb", a->ddp_bucket_cap_mb, "DDP bucket_cap_mb (default 25)");
  sub->add_flag("--gradient-as-bucket-view", a->gradient_as_bucket_view,
                "DDP gradient_as_bucket_view=True");
  sub->add_option("--zero-buckets", a->zero_buckets,
                  "deepspeed (defaults of deepspeed/runtime/zero/config.py) or hf-auto (HF "
                  "Trainer's \"auto\" values)");
  sub->add_flag(
      "--no-zero-init", a->no_zero_init,
      "ZeRO-3: the model was loaded before DeepSpeed's config existed (no deepspeed.zero.Init)");
  sub->add_option("--zero-overlap-comm", a->zero_overlap_comm,
                  "on or off: ZeRO overlap_comm (default: DeepSpeed's, on for stage 3, off for "
                  "1 and 2; on, stages 1-2 keep two reduce buckets)");
  sub->add_option("--deepspeed-version", a->deepspeed_version,
                  "DeepSpeed release whose ZeRO behaviour to model, 0.MINOR[.PATCH] (default "
                  "0.19.8)");
  sub->add_option("--zero-sub-group-size", a->zero_sub_group_size,
                  "ZeRO sub_group_size (elements)");
  sub->add_option("--zero-reduce-bucket-size", a->zero_reduce_bucket_size,
                  "ZeRO reduce_bucket_size (elements)");
  sub->add_option("--zero-prefetch-bucket-size", a->zero_prefetch_bucket_size,
                  "ZeRO-3 stage3_prefetch_bucket_size");
  sub->add_option("--zero-max-live-parameters", a->zero_max_live_parameters,
                  "ZeRO-3 stage3_max_live_parameters");
  sub->add_option("--zero-max-reuse-distance", a->zero_max_reuse_distance,
                  "ZeRO-3 stage3_max_reuse_distance");
  sub->add_option("--zero-persistence-threshold", a->zero_persistence_threshold,
                  "ZeRO-3 stage3_param_persistence_threshold");
}

namespace {

// "0.19.8" -> 1908, "0.14" -> 1400: DeepSpeed's releases are 0.MINOR.PATCH.
Result<uint32_t> ParseDeepSpeedVersion(const std::string& text) {
  uint32_t minor = 0, patch = 0;
  int used = 0;
  const int n = std::sscanf(text.c_str(), "0.%u%n.%u%n", &minor, &used, &patch, &used);
  if (n < 1 || static_cast<size_t>(used) != text.size() || minor >= 100 || patch >= 100) {
    return MakeError(fmt::format("--deepspeed-version: {} is not a version like 0.19.8",
                                 common::QuoteForMessage(text, common::kQuotedBytes, '\'')));
  }
  return minor * 100 + patch;
}

}  // namespace

// DeepSpeed's ZeRO knobs: zero.Init, the release, the bucket defaults and each size.
Status ParallelArgs::ReadZeroKnobs(ParallelLayout* l) const {
  l->zero.zero_init = !no_zero_init;
  VS_TRY(release, ParseDeepSpeedVersion(deepspeed_version));
  l->zero.deepspeed_version = release;
  if (no_zero_init && l->dp_mode != DataParallel::kZero3)
    return MakeError("--no-zero-init: only meaningful with --zero 3");
  if (!zero_overlap_comm.empty()) {
    if (zero_overlap_comm != "on" && zero_overlap_comm != "off") {
      return MakeError(
          fmt::format("--zero-overlap-comm: {} is not one of on, off",
                      common::QuoteForMessage(zero_overlap_comm, common::kQuotedBytes, '\'')));
    }
    l->zero.overlap_comm = zero_overlap_comm == "on" ? 1 : 0;
  }
  if (zero_buckets == "hf-auto") {
    l->zero.hf_auto = true;
  } else if (zero_buckets != "deepspeed") {
    return MakeError(
        fmt::format("--zero-buckets: {} is not one of deepspeed, hf-auto",
                    common::QuoteForMessage(zero_buckets, common::kQuotedBytes, '\'')));
  }
  if (Status st = Elems(zero_sub_group_size, "--zero-sub-group-size", &l->zero.sub_group_size);
      !st.ok())
    return st;
  if (Status st =
          Elems(zero_reduce_bucket_size, "--zero-reduce-bucket-size", &l->zero.reduce_bucket_elems);
      !st.ok())
    return st;
  if (Status st = Elems(zero_prefetch_bucket_size, "--zero-prefetch-bucket-size",
                        &l->zero.prefetch_bucket_elems);
      !st.ok())
    return st;
  if (Status st = Elems(zero_max_live_parameters, "--zero-max-live-parameters",
                        &l->zero.max_live_parameters);
      !st.ok())
    return st;
  if (Status st =
          Elems(zero_max_reuse_distance, "--zero-max-reuse-distance", &l->zero.max_reuse_distance);
      !st.ok())
    return st;
  if (Status st = Elems(zero_persistence_threshold, "--zero-persistence-threshold",
                        &l->zero.param_persistence_threshold);
      !st.ok())
    return st;
  if (l->zero.sub_group_size == 0)
    return MakeError("--zero-sub-group-size: must be at least 1 element");
  return Ok{};
}

Result<ParallelLayout> ParallelArgs::ToLayout() const {
  ParallelLayout l;
  VS_TRY(g, Count(gpus, "--gpus", 1, 1 << 20));
  l.gpus = g;
  VS_TRY(gpn, Count(gpus_per_node, "--gpus-per-node", 1, 64));
  l.gpus_per_node = gpn;
  VS_TRY(t, Count(tp, "--tp", 1, 1 << 20));
  VS_TRY(p, Count(pp, "--pp", 1, 1 << 20));
  VS_TRY(c, Count(cp, "--cp", 1, 1 << 20));
  VS_TRY(e, Count(ep, "--ep", 1, 1 << 20));
  l.tp = t;
  l.pp = p;
  l.cp = c;
  l.ep = e;
  l.sp = sp;
  // --tp/--pp/--cp without --gpus: the smallest layout, one data-parallel replica.
  if (gpus == 1) l.gpus = static_cast<uint32_t>(std::min<uint64_t>(uint64_t{t} * p * c, 1u << 20));
  VS_TRY(mb, Count(microbatches, "--microbatches", 0, 65536));
  l.microbatches = mb;
  VS_TRY(vs, Count(virtual_stages, "--virtual-stages", 1, 64));
  l.virtual_stages = vs;
  VS_TRY(fv, Count(fsdp_version, "--fsdp-version", 1, 2));
  l.fsdp_version = static_cast<int>(fv);
  VS_TRY(prefetch, ParseFsdpPrefetch(fsdp_backward_prefetch));
  l.fsdp_backward_prefetch = prefetch;
  VS_TRY(wrap, ParseFsdpWrap(fsdp_wrap));
  l.fsdp_wrap = wrap;
  VS_TRY(cap, Count(ddp_bucket_cap_mb, "--ddp-bucket-cap-mb", 1, 1 << 16));
  l.ddp_bucket_cap_mb = cap;
  l.gradient_as_bucket_view = gradient_as_bucket_view;

  int modes = (ddp ? 1 : 0) + (zero.empty() ? 0 : 1) + (fsdp.empty() ? 0 : 1);
  if (modes > 1) return MakeError("--ddp, --zero and --fsdp: choose one data-parallel mode");
  if (ddp) l.dp_mode = DataParallel::kDdp;
  if (!zero.empty()) {
    VS_TRY(z, ParseZeroStage(zero));
    l.dp_mode = z;
  }
  if (!fsdp.empty()) {
    VS_TRY(f, ParseFsdpSharding(fsdp));
    l.dp_mode = DataParallel::kFsdp;
    l.fsdp = f;
  }
  VS_TRY(o, ParseOffload(offload));
  l.offload = o;
  // Several GPUs and no mode named: plain data parallelism with DDP, the
  // torchrun default (Megatron's own DDP under --tp/--pp/--cp/--ep).
  if (l.dp_mode == DataParallel::kNone && l.gpus > 1 && !l.model_parallel())
    l.dp_mode = DataParallel::kDdp;

  if (Status st = ReadZeroKnobs(&l); !st.ok()) return st.error();
  if (Status s = ValidateLayout(l); !s.ok()) return s.error();
  return l;
}

}  // namespace vramscope::cli
