// Helpers shared by Plan() and its renderers. Private to src/plan.
#pragma once

#include <string>
#include <vector>

#include "vramscope/plan.h"

namespace vramscope::plan_internal {

// "LoRA, micro-batch 8 x 2, AdamW (fused), gradient checkpointing, fused
// linear cross-entropy, expandable segments": the knobs a strategy sets.
std::string StrategyLabel(const TrainingSetup& setup);

// Plain-words lines about the ranked strategies: the top choices and why they
// win, what does not fit, and what the step times rest on.
std::vector<std::string> ExplainPlan(const PlanResult& plan);

}  // namespace vramscope::plan_internal
