// The parallel layout of a training run: how many GPUs, how the data-parallel
// replicas share model states (DDP, DeepSpeed ZeRO, PyTorch FSDP), offload,
// and Megatron-style tensor / pipeline / context / expert parallelism. Flag
// names are DESIGN.md's; every mode's library rules live in src/lower/
// (data_parallel*.cc, rank_classes.cc) and docs/parallel.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "vramscope/result.h"

namespace vramscope {

// How data-parallel replicas hold the model states.
enum class DataParallel : uint8_t {
  kNone,   // one GPU, or Megatron's own DDP under --tp/--pp
  kDdp,    // torch.nn.parallel.DistributedDataParallel
  kZero1,  // DeepSpeed ZeRO stage 1 (Megatron: distributed optimizer)
  kZero2,  // DeepSpeed ZeRO stage 2
  kZero3,  // DeepSpeed ZeRO stage 3
  kFsdp,   // PyTorch FSDP (version and sharding below)
};

enum class FsdpSharding : uint8_t { kFull, kGradOp, kHybrid };
enum class Offload : uint8_t { kNone, kOptimizer, kParams };
// FSDP1's backward_prefetch: none (NO_PREFETCH, the HF Trainer's and accelerate's
// FullyShardedDataParallelPlugin default), BACKWARD_PRE or BACKWARD_POST.
enum class FsdpPrefetch : uint8_t { kNone, kPre, kPost };
// Which modules FSDP wraps: kTrainer, what the HF Trainer builds (each decoder
// layer; for a PEFT model PEFT's fsdp_auto_wrap_policy, which accelerate's FSDP2
// does not recognise: the layers stay in the root); kLayers, each decoder layer
// whatever the adapters (fully_shard by hand, accelerate without the Trainer,
// torchtune, LitGPT).
enum class FsdpWrap : uint8_t { kTrainer, kLayers };

// DeepSpeed ZeRO configuration (deepspeed/runtime/zero/config.py, 0.14-0.16;
// values in elements). `hf_auto` applies what Hugging Face Trainer / accelerate
// fill in for "auto" (transformers integrations/deepspeed.py
// trainer_config_finalize): reduce bucket h*h, stage-3 prefetch bucket
// 0.9*h*h, persistence threshold 10*h. Without it, DeepSpeed's own defaults.
struct ZeroConfig {
  bool hf_auto = false;
  // Unset: DeepSpeed's default (5e8, 5e7, 1e5) or, with hf_auto, the "auto"
  // value for the model's hidden size. ReduceBucket() etc. resolve them.
  std::optional<uint64_t> reduce_bucket_elems;
  std::optional<uint64_t> prefetch_bucket_elems;
  std::optional<uint64_t> param_persistence_threshold;
  uint64_t max_live_parameters = 1'000'000'000;
  uint64_t max_reuse_distance = 1'000'000'000;
  uint64_t sub_group_size = 1'000'000'000;
  bool contiguous_gradients = true;
  // ZeRO-3 only: the model was built under deepspeed.zero.Init (HF Trainer
  // does so when TrainingArguments exist before from_pretrained). Without it,
  // DeepSpeed before 0.19.4 never installs its memory-saving linear
  // (LinearFunctionForZeroStage3; PR #8189 added it for existing models), and
  // autograd's saved weight views keep every gathered Linear weight alive
  // from its forward to its backward.
  bool zero_init = true;
  // The DeepSpeed release modelled, 0.MINOR.PATCH as MINOR * 100 + PATCH
  // (0.19.8: 1908). The rules follow 0.19.8; older releases differ where
  // docs/parallel.md says so.
  uint32_t deepspeed_version = 1908;
  // None in the config means true for stage 3 and false for stages 1-2
  // (DeepSpeedZeroConfig.overlap_comm_valid).
  int overlap_comm = -1;  // -1: DeepSpeed's default for the stage

  uint64_t ReduceBucket(uint64_t hidden) const;
  uint64_t PrefetchBucket(uint64_t hidden) const;
  uint64_t PersistenceThreshold(uint64_t hidden) const;
};

struct ParallelLayout {
  uint32_t gpus = 1;
  uint32_t gpus_per_node = 8;
  DataParallel dp_mode = DataParallel::kNone;
  FsdpSharding fsdp = FsdpSharding::kFull;
  int fsdp_version = 2;
  FsdpPrefetch fsdp_backward_prefetch = FsdpPrefetch::kNone;
  FsdpWrap fsdp_wrap = FsdpWrap::kTrainer;
  Offload offload = Offload::kNone;
  uint32_t tp = 1, pp = 1, cp = 1, ep = 1;
  bool sp = false;              // Megatron sequence parallelism (needs tp > 1)
  uint32_t microbatches = 0;    // pipeline micro-batches per step; 0: --grad-accum
  uint32_t virtual_stages = 1;  // interleaved 1F1B: model chunks per stage
  // torch DDP(bucket_cap_mb=25, gradient_as_bucket_view=False) defaults.
  uint64_t ddp_bucket_cap_mb = 25;
  bool gradient_as_bucket_view = false;
  ZeroConfig zero;

  // Data-parallel replicas: gpus / (tp * pp * cp).
  uint32_t dp() const;
  // tp, pp, cp or ep above 1: Megatron-style model parallelism.
  bool model_parallel() const { return tp > 1 || pp > 1 || cp > 1 || ep > 1; }
  bool multi_gpu() const { return gpus > 1; }
};

std::string_view DataParallelName(DataParallel d);
std::string_view FsdpShardingName(FsdpSharding f);
std::string_view OffloadName(Offload o);
Result<FsdpSharding> ParseFsdpSharding(std::string_view text);
Result<Offload> ParseOffload(std::string_view text);
std::string_view FsdpPrefetchName(FsdpPrefetch p);
// "trainer", "layers"
Result<FsdpWrap> ParseFsdpWrap(std::string_view text);
// "none", "pre", "post"
Result<FsdpPrefetch> ParseFsdpPrefetch(std::string_view text);
// "1", "2", "3" -> kZero1..3
Result<DataParallel> ParseZeroStage(std::string_view text);

// Checks the layout on its own (model-independent): counts, divisibility,
// contradictory modes. One line naming the flag on failure.
Status ValidateLayout(const ParallelLayout& layout);

// Knob pairs for reports (only what differs from one GPU).
std::vector<std::pair<std::string, std::string>> DescribeLayout(const ParallelLayout& layout);

}  // namespace vramscope
