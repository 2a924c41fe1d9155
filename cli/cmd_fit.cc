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
  std::string margin;  // empty: kDefaultFitMargin
  uint64_t max_batch = 0;
  uint64_t max_seq = 0;
  int64_t max_gpus = 4096;
  bool json = false;
};

Result<FitResult> ComputeFit(const FitArgs& args, const ModelIo& io) {
  VS_TRY(setup, args.knobs.ToSetup());
  VS_TRY(gpu, FindGpu(setup.gpu));
  const bool default_margin = args.margin.empty();
  VS_TRY(margin, ParseMargin(default_margin ? kDefaultFitMargin : std::string_view(args.margin),
                             gpu.usable_bytes));
  VS_TRY(model, ResolveModel(args.model, io));
  VS_TRY(encoders, args.knobs.ResolveTextEncoders(io, &setup));
  (void)encoders;
  if (Status v = ResolveVae(args.knobs, io, &setup); !v.ok()) return v.error();
  ApplyLibraryDefaults(model, &setup);
  args.knobs.Warn(model, setup);
  FitOptions options;
  options.margin_bytes = margin;
  options.margin_is_default = default_margin;
  options.max_batch = args.max_batch;
  options.max_seq = args.max_seq;
  // A parallel mode on the command line asks for the fewest GPUs too.
  options.search_gpus =
      setup.parallel.dp_mode != DataParallel::kNone || setup.parallel.model_parallel();
  if (args.max_gpus < 1 || args.max_gpus > 65536) {
    return MakeError(fmt::format("--max-gpus: {} is outside 1..65536", args.max_gpus));
  }
  options.max_gpus = static_cast<uint32_t>(args.max_gpus);
  return Fit(model, setup, options);
}

int RunFit(const FitArgs& args) {
  auto fit = ComputeFit(args, LocalModelIo());
  if (!fit.ok()) return FailBadInput(fit.error());
  const std::string text =
      args.json ? RenderFitJson(*fit, args.model) + "\n" : RenderFitText(*fit, args.model);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return kExitOk;
}

std::shared_ptr<FitArgs> DeclareFit(CLI::App* sub) {
  auto args = std::make_shared<FitArgs>();
  sub->add_option("MODEL", args->model,
                  "Catalog alias, Hugging Face id, config.json path or model directory")
      ->required();
  AddKnobFlags(sub, &args->knobs);
  AddFromFlag(sub, &args->knobs);
  sub->add_option(
      "--margin", args->margin,
      "Memory to keep free: GiB (2, 1.5GiB) or a share of usable memory (5%); default 2% "
      "(about the estimate's median error on GPU runs; 0 removes it)");
  sub->add_option("--max-batch", args->max_batch, "Largest micro-batch to search (default 65536)");
  sub->add_option(
      "--max-seq", args->max_seq,
      "Longest sequence to search (default: the model's max_position_embeddings, else 1048576)");
  sub->add_option("--max-gpus", args->max_gpus,
                  "With --ddp/--zero/--fsdp/--tp/--pp: the most GPUs the fewest-GPU search tries "
                  "(default 4096)");
  sub->add_flag("--json", args->json, "Print the result as JSON (integer bytes)");
  return args;
}

RunFn SetupFit(CLI::App* sub) {
  auto args = DeclareFit(sub);
  return [args] { return RunFit(*args); };
}

ValueFn SetupFitValue(CLI::App* sub) {
  auto args = DeclareFit(sub);
  return [args](const ModelIo& io) -> Result<CommandValue> {
    VS_TRY(fit, ComputeFit(*args, io));
    auto shared = std::make_shared<const FitResult>(std::move(fit));
    CommandValue value;
    value.json = RenderFitJson(*shared, args->model);
    value.text = [shared, args] { return RenderFitText(*shared, args->model); };
    return value;
  };
}

}  // namespace

extern const CommandSpec kFitCommand = {
    "fit", "The largest micro-batch and the longest sequence of MODEL that fit the GPU", &SetupFit,
    &SetupFitValue};

}  // namespace vramscope::cli
