#include "sharding_zero.h"

namespace vramscope::lower {

void NormTemporary(ShardState& s, uint64_t numel) {
  if (numel == 0) return;
  s.tape->graph.Drop(s.Alloc(numel * 8, Category::kTemporaries, "aten::_to_copy"));
}

}  // namespace vramscope::lower
