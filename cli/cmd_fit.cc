// vramscope fit MODEL --gpu NAME [knobs] [--margin GiB-or-%]: the largest
// micro-batch (at --seq) and the longest sequence (at --batch) that fit; with
// a parallel mode (--ddp, --zero, --fsdp, --tp, --pp), also the fewest GPUs.
#include <cstdio>
#include <memory>

#include <fmt/format.h>

#include "command.h"
#include "knobs.h"
#include "output.h"
#include "vramscope/gpu.h"
#include "vramscope/model.h"
#include "vramscope/plan.h"

namespace vramscope::cli {
namespace {

struct FitArgs {
  std::string model;
  KnobArgs knobs;
  std::string margin = "0";
  uint64_t max_batch = 0;
  uint64_t max_seq = 0;
  int64_t max_gpus = 4096;
  bool json = false;
};

int RunFit(const FitArgs& args) {
  auto setup = args.knobs.ToSetup();
  if (!setup.ok()) return FailBadInput(setup.error());
  auto gpu = FindGpu(setup->gpu);
  if (!gpu.ok()) return FailBadInput(gpu.error());
  auto margin = ParseMargin(args.margin, gpu->usable_bytes);
  if (!margin.ok()) return FailBadInput(margin.error());
  auto model = ResolveModel(args.model, LocalModelIo());
  if (!model.ok()) return FailBadInput(model.error());
  args.knobs.Warn(*model, *setup);
  FitOptions options;
  options.margin_bytes = *margin;
  options.max_batch = args.max_batch;
  options.max_seq = args.max_seq;
  // A parallel mode on the command line asks for the fewest GPUs too.
  options.search_gpus =
      setup->parallel.dp_mode != DataParallel::kNone || setup->parallel.model_parallel();
  if (args.max_gpus < 1 || args.max_gpus > 65536) {
    return FailBadInput(
        MakeError(fmt::format("--max-gpus: {} is outside 1..65536", args.max_gpus)));
  }
  options.max_gpus = static_cast<uint32_t>(args.max_gpus);
  auto fit = Fit(*model, *setup, options);
  if (!fit.ok()) return FailBadInput(fit.error());
  const std::string text =
      args.json ? RenderFitJson(*fit, args.model) + "\n" : RenderFitText(*fit, args.model);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return kExitOk;
}

RunFn SetupFit(CLI::App* sub) {
  auto args = std::make_shared<FitArgs>();
  sub->add_option("MODEL", args->model,
                  "Catalog alias, Hugging Face id, config.json path or model directory")
      ->required();
  AddKnobFlags(sub, &args->knobs);
  sub->add_option(
      "--margin", args->margin,
      "Memory to keep free: GiB (2, 1.5GiB) or a share of usable memory (5%); default 0");
  sub->add_option("--max-batch", args->max_batch, "Largest micro-batch to search (default 65536)");
  sub->add_option(
      "--max-seq", args->max_seq,
      "Longest sequence to search (default: the model's max_position_embeddings, else 1048576)");
  sub->add_option("--max-gpus", args->max_gpus,
                  "With --ddp/--zero/--fsdp/--tp/--pp: the most GPUs the fewest-GPU search tries "
                  "(default 4096)");
  sub->add_flag("--json", args->json, "Print the result as JSON (integer bytes)");
  return [args] { return RunFit(*args); };
}

}  // namespace

extern const CommandSpec kFitCommand = {
    "fit", "The largest micro-batch and the longest sequence of MODEL that fit the GPU", &SetupFit};

}  // namespace vramscope::cli
