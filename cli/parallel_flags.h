// The parallel-layout flags of DESIGN.md (--gpus, --ddp, --zero, --fsdp, ...),
// shared by every command that takes training knobs.
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "vramscope/parallel.h"
#include "vramscope/result.h"

namespace vramscope::cli {

// Flag values as typed (signed, so that a negative count is an error, not a
// wrapped-around huge one); ToLayout() validates them.
struct ParallelArgs {
  int64_t gpus = 1, gpus_per_node = 8;
  bool ddp = false;
  std::string zero, fsdp, offload = "none";
  int64_t fsdp_version = 2;
  std::string fsdp_backward_prefetch = "none";
  std::string fsdp_wrap = "trainer";
  int64_t tp = 1, pp = 1, cp = 1, ep = 1;
  bool sp = false;
  int64_t microbatches = 0, virtual_stages = 1;
  int64_t ddp_bucket_cap_mb = 25;
  bool gradient_as_bucket_view = false;
  std::string zero_buckets = "deepspeed";
  bool no_zero_init = false;
  std::string zero_overlap_comm;  // "", on, off: "" is DeepSpeed's default for the stage
  std::string deepspeed_version = "0.19.8";
  int64_t zero_sub_group_size = -1, zero_reduce_bucket_size = -1, zero_prefetch_bucket_size = -1;
  int64_t zero_max_live_parameters = -1, zero_max_reuse_distance = -1,
          zero_persistence_threshold = -1;
  Result<ParallelLayout> ToLayout() const;

 private:
  Status ReadZeroKnobs(ParallelLayout* l) const;
};

void AddParallelFlags(CLI::App* sub, ParallelArgs* args);

}  // namespace vramscope::cli
