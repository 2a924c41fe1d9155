// What the forward leaves alive for backward, by model block and by producing
// op: the part of the memory that batch size and resolution scale, and where
// it comes from (seed 001: a diffusion UNet's convolution feature maps).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "vramscope/event_stream.h"

namespace vramscope {

struct SavedActivations {
  uint32_t step = 0;         // the step whose forward ended with the most saved
  uint64_t total_bytes = 0;  // requested bytes of kActivations allocations then live
  // Largest first; blocks as BlockOf names them, ops as the stream spells them.
  std::vector<std::pair<std::string, uint64_t>> by_block;
  std::vector<std::pair<std::string, uint64_t>> by_layer;  // LayerTypeOf the module
  std::vector<std::pair<std::string, uint64_t>> by_op;
};

// The block a module path belongs to: the path up to its first numbered
// component ("model.layers.3.mlp" -> "model.layers.3", "down_blocks.1.resnets.0"
// -> "down_blocks.1"), "mid_block" for a UNet's middle block, else the first
// component ("conv_in", "lm_head"); "(no module)" for an empty path.
std::string BlockOf(std::string_view module);

// The kind of layer a module path names, without block indices: its last two
// non-numbered components ("down_blocks.0.resnets.1.conv1" -> "resnets.conv1",
// "model.layers.3.self_attn.q_proj" -> "self_attn.q_proj").
std::string LayerTypeOf(std::string_view module);

// At every switch from a forward phase to a backward phase (the moment the
// forward's saved tensors are all alive), sums the live kActivations bytes;
// returns the largest such moment, grouped. nullopt when the stream has no
// backward or nothing was saved. Bytes are requested sizes (ideal accounting).
std::optional<SavedActivations> SavedAtEndOfForward(const EventStream& stream);

}  // namespace vramscope
