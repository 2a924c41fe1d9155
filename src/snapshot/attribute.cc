// Attribute: a category for every block, from its stack and its lifetime.
//
// The stack says where a block came from (an optimizer step, the autograd
// engine, a loss function, a cuBLAS workspace); the lifetime relative to the
// phases says what it was for. The rules, in order (docs/snapshot.md):
//
//  1. communication / workspace / AccumulateGrad / loss, by stack alone;
//  2. allocated in an optimizer step and alive after it: optimizer state
//     (Adam's exp_avg, exp_avg_sq, step); freed within it: temporaries;
//  3. allocated in backward and alive after it: gradients; recomputed by
//     activation checkpointing: activations; freed within it: temporaries;
//  4. allocated in forward and freed in backward, or alive when the trace
//     ends mid-step (an OOM): activations; freed within the forward:
//     temporaries; alive past its step: other (outputs kept, leaks);
//  5. allocated before the first forward and alive after it: parameters when
//     a loading stack (from_pretrained, Module.to / _apply, load_state_dict,
//     module constructors) or nothing else is known; freed before: temporaries;
//  6. blocks alive before the trace: by stack tags, else other.
#include "reconstruct.h"

namespace vramscope::snapshot {
namespace {

Category ByTagsAlone(uint32_t tags) {
  if (tags & kTagComm) return Category::kCommunication;
  if (tags & kTagWorkspace) return Category::kWorkspace;
  if (tags & kTagAccumulateGrad) return Category::kGradients;
  if (tags & kTagLoss) return Category::kLoss;
  return Category::kOther;
}

// Blocks alive before the trace: the stack is the allocation's (from the
// final segments) or the free's (a free without an alloc, context="all").
Category Initial(uint32_t tags) {
  if (tags & kTagZeroGrad) return Category::kGradients;  // freed by zero_grad
  if (tags & kTagOptimizer) return Category::kOptimizerState;
  if (tags & kTagLoad) return Category::kParameters;
  if (tags & kTagBackward) return Category::kGradients;
  if (tags & kTagForward) return Category::kActivations;
  return Category::kOther;
}

}  // namespace

void Attribute(Reconstruction& r) {
  const size_t last_mark = r.marks.size() - 1;
  for (AllocRecord& rec : r.records) {
    const uint32_t stack = r.Stack(rec);
    if (!r.has_frames && stack == 0) {
      // No stacks recorded (context=None): lifetimes alone cannot tell
      // weights from optimizer state; say so rather than guess.
      rec.category = Category::kOther;
      continue;
    }
    const uint32_t tags = r.stacks[stack].tags;
    const Category by_tags = ByTagsAlone(tags);
    if (by_tags != Category::kOther) {
      rec.category = by_tags;
      continue;
    }
    if (rec.initial()) {
      rec.category = Initial(tags);
      continue;
    }
    const size_t a = r.MarkAt(rec.alloc_entry);
    const bool alive_at_end = rec.free_entry == kNever;
    const size_t f = alive_at_end ? last_mark : r.MarkAt(rec.free_entry);
    const PhaseMark& born = r.marks[a];
    const PhaseMark& died = r.marks[f];
    const bool same_phase = !alive_at_end && f == a;
    switch (born.phase) {
      case Phase::kOptimizer:
        if (!(tags & kTagOptimizer) && !r.stacks[stack].site.empty()) {
          // Allocated after optimizer.step() returned (the next batch moved to
          // the GPU, say): the phase lasts until the next forward, the
          // optimizer's frames do not.
          rec.category = same_phase ? Category::kTemporaries : Category::kOther;
        } else {
          rec.category = same_phase ? Category::kTemporaries : Category::kOptimizerState;
        }
        break;
      case Phase::kBackward:
        if (tags & kTagCheckpoint) {
          rec.category = Category::kActivations;
        } else {
          rec.category = same_phase ? Category::kTemporaries : Category::kGradients;
        }
        break;
      case Phase::kForward:
        if (same_phase) {
          rec.category = Category::kTemporaries;
        } else if (died.step == born.step &&
                   (died.phase == Phase::kBackward || died.phase == Phase::kForward)) {
          // Freed in backward, or still alive when the trace stopped inside
          // this step's forward or backward.
          rec.category = Category::kActivations;
        } else {
          rec.category = Category::kOther;
        }
        break;
      case Phase::kSetup:
        if (same_phase || (!alive_at_end && died.phase == Phase::kSetup)) {
          rec.category = Category::kTemporaries;
        } else if ((tags & kTagLoad) || alive_at_end) {
          rec.category = Category::kParameters;
        } else {
          rec.category = Category::kOther;
        }
        break;
    }
  }
}

}  // namespace vramscope::snapshot
