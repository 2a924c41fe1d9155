// Autograd retention what-if (seed 004): the same event stream as if saved
// tensors and intermediate gradients lived until the end of each backward
// pass instead of being freed as soon as autograd is done with them.
//
// PyTorch's engine (torch.autograd, all 1.x/2.x releases) releases a node's
// saved tensors when the node has run (retain_graph=False) and an
// intermediate gradient when its consumer has run; some other engines keep
// the whole graph, and every gradient, alive until backward returns.
#pragma once

#include "vramscope/event_stream.h"

namespace vramscope {

// Every free that happens inside a backward phase is moved to the end of that
// phase (just before the next phase mark, or the end of the stream), except
// frees of parameters and optimizer state, which are not autograd's. Frees in
// other phases are unchanged. Allocation ids are renumbered so that ids stay
// unique while live. The input must pass EventStream::Validate().
EventStream RetainGraphUntilEnd(const EventStream& in);

}  // namespace vramscope
