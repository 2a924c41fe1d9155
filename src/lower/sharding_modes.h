// One ShardingStrategy per library family (sharding.h); each file cites the
// library code its rules follow.
#pragma once

#include <memory>

#include "sharding.h"

namespace vramscope::lower {

// Plain replicas and torch DistributedDataParallel (sharding_replicated.cc).
std::unique_ptr<ShardingStrategy> MakeReplicatedStrategy(ShardState state);
// Megatron-LM's DDP and distributed optimizer (sharding_replicated.cc).
std::unique_ptr<ShardingStrategy> MakeMegatronStrategy(ShardState state);
// DeepSpeed ZeRO stages 1-2 and stage 3 (sharding_zero.cc).
std::unique_ptr<ShardingStrategy> MakeZeroStrategy(ShardState state);
std::unique_ptr<ShardingStrategy> MakeZero3Strategy(ShardState state);
// PyTorch FSDP1 / FSDP2 (sharding_fsdp.cc).
std::unique_ptr<ShardingStrategy> MakeFsdpStrategy(ShardState state);

}  // namespace vramscope::lower
