// FitGpus(): the fewest GPUs for a parallel mode (plan.h). Memory per GPU
// does not grow with the GPU count (sharding only spreads model states;
// NCCL's buffers are the same from two GPUs on), so "fits" is monotone and an
// exponential then binary search over multiples of tp x pp x cp finds the
// boundary.
#include <algorithm>
#include <map>
#include <numeric>

#include <fmt/format.h>

#include "vramscope/estimate.h"
#include "vramscope/plan.h"

namespace vramscope {
namespace {

// `gpus` as launched: as is within one node (a job may take part of one),
// else whole nodes of `per_node` that are also multiples of `step` (tp x pp x
// cp). A count past 2^32 - 1 stays as found.
uint32_t WholeNodes(uint32_t gpus, uint32_t step, uint32_t per_node) {
  if (per_node == 0 || gpus <= per_node) return gpus;
  const uint64_t unit = std::lcm<uint64_t>(std::max<uint32_t>(step, 1), per_node);
  const uint64_t rounded = (uint64_t{gpus} + unit - 1) / unit * unit;
  return rounded > UINT32_MAX ? gpus : static_cast<uint32_t>(rounded);
}

}  // namespace

Result<FitGpusSearch> FitGpus(const ModelSpec& model, const TrainingSetup& setup,
                              uint64_t limit_bytes, uint32_t max_gpus) {
  const ParallelLayout& l = setup.parallel;
  FitGpusSearch out;
  out.step = l.tp * l.pp * l.cp;
  out.cap = std::max<uint32_t>(out.step, max_gpus / out.step * out.step);
  std::map<uint32_t, Report> reports;
  auto at = [&](uint32_t gpus) -> Result<const Report*> {
    if (auto it = reports.find(gpus); it != reports.end()) return &it->second;
    TrainingSetup s = setup;
    s.parallel.gpus = gpus;
    // One GPU of a data-parallel mode is that mode at world size 1 (DeepSpeed
    // and FSDP keep their buffers); the default DDP only applies from two.
    EstimateOptions options;
    options.timeline = false;
    options.top_allocations = 0;
    auto est = Estimate(model, s, options);
    if (!est.ok()) return MakeError(fmt::format("--gpus {}: {}", gpus, est.error().message));
    est->report.command = "fit";
    ++out.estimates;
    return &reports.emplace(gpus, std::move(est->report)).first->second;
  };
  auto fits = [&](uint32_t gpus) -> Result<bool> {
    VS_TRY(r, at(gpus));
    return r->fits() && r->needed_bytes() <= limit_bytes;
  };
  // Exponential: step, 2 step, 4 step, ... up to the cap.
  uint32_t lo = 0;  // largest count known not to fit (0: none tried)
  uint32_t hi = 0;  // smallest count known to fit
  for (uint64_t n = out.step; n <= out.cap; n *= 2) {
    VS_TRY(ok, fits(static_cast<uint32_t>(n)));
    if (ok) {
      hi = static_cast<uint32_t>(n);
      break;
    }
    lo = static_cast<uint32_t>(n);
  }
  if (hi == 0 && lo != out.cap) {
    VS_TRY(ok, fits(out.cap));
    if (ok)
      hi = out.cap;
    else
      lo = out.cap;
  }
  if (hi == 0) {
    VS_TRY(r, at(out.cap));
    out.at_min = *r;
    return out;
  }
  // Binary over multiples of step in (lo, hi].
  while (hi - lo > out.step) {
    const uint32_t mid = lo + (hi - lo) / out.step / 2 * out.step;
    if (mid <= lo || mid >= hi) break;
    VS_TRY(ok, fits(mid));
    (ok ? hi : lo) = mid;
  }
  out.min_gpus = hi;
  out.gpus_per_node = setup.parallel.gpus_per_node;
  out.launch_gpus = WholeNodes(hi, out.step, out.gpus_per_node);
  VS_TRY(r, at(hi));
  out.at_min = *r;
  if (lo > 0) {
    VS_TRY(b, at(lo));
    if (lo + out.step == hi) out.below = *b;
  }
  return out;
}

}  // namespace vramscope
