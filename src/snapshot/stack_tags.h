// What a recorded stack says about an allocation: which part of a training
// step it came from (tags), and a short site name for reports.
//
// The rules match function and file names of the libraries that allocate in
// a training step (docs/snapshot.md, "Attribution", lists them with the
// versions they were read from). Frames are innermost first, as
// CapturedTraceback symbolizes them; with stacks="all" C++ frames ("??" as
// filename when unsymbolized) are mixed in.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "vramscope/snapshot.h"

namespace vramscope::snapshot {

enum StackTag : uint32_t {
  kTagForward = 1u << 0,         // nn.Module __call__ / forward
  kTagBackward = 1u << 1,        // Tensor.backward, the autograd engine thread
  kTagOptimizer = 1u << 2,       // torch/optim (not zero_grad), GradScaler
  kTagZeroGrad = 1u << 3,        // Optimizer.zero_grad
  kTagLoad = 1u << 4,            // from_pretrained, Module.to/_apply, load_state_dict, init
  kTagLoss = 1u << 5,            // cross_entropy, nll_loss, log_softmax, loss modules
  kTagComm = 1u << 6,            // torch.distributed, NCCL, DDP reducer
  kTagWorkspace = 1u << 7,       // cuBLAS / cuDNN workspaces
  kTagAccumulateGrad = 1u << 8,  // AccumulateGrad: a .grad is created
  kTagCheckpoint = 1u << 9,      // torch.utils.checkpoint (recomputation)
};

struct StackInfo {
  uint32_t tags = 0;
  std::string site;  // "tiny_lm.py:12 linear" (innermost non-torch Python frame)
  std::string op;    // innermost frame's function, shortened
};

// One StackInfo per Snapshot::stacks entry (computed once; stacks are few).
std::vector<StackInfo> ClassifyStacks(const Snapshot& snapshot);

// Tags of a single frame (exposed for tests).
uint32_t FrameTags(std::string_view name, std::string_view filename);

}  // namespace vramscope::snapshot
