// vramscope plan MODEL --gpu NAME [--gpus N] [--tokens-per-step T] [--html FILE] [knobs]:
// single-GPU training strategies ranked by tokens/s among those that fit.
#include <cstdio>
#include <memory>

#include <fmt/format.h>

#include "command.h"
#include "knobs.h"
#include "output.h"
#include "vramscope/model.h"
#include "vramscope/plan.h"

namespace vramscope::cli {
namespace {

struct PlanArgs {
  std::string model;
  KnobArgs knobs;
  uint64_t tokens_per_step = 0;
  size_t top = 10;
  bool json = false;
  std::string html_path;
  const CLI::App* app = nullptr;
};

Result<PlanResult> ComputePlan(const PlanArgs& args, const ModelIo& io) {
  FromConfig from;
  VS_TRY(setup, args.knobs.ToSetup(&from));
  VS_TRY(model, ResolveModel(args.model, io));
  VS_TRY(encoders, args.knobs.ResolveTextEncoders(io, &setup));
  (void)encoders;
  if (Status v = ResolveVae(args.knobs, io, &setup); !v.ok()) return v.error();
  ApplyLibraryDefaults(model, &setup);
  args.knobs.Warn(model, setup);
  PlanOptions options;
  options.tokens_per_step = args.tokens_per_step;
  // A knob given on the command line or by a --from file is a choice already made.
  auto chosen = [&](const char* flag) { return args.app->count(flag) > 0 || FromSets(from, flag); };
  options.keep_finetune = chosen("--finetune");
  options.keep_optimizer = chosen("--optimizer");
  options.keep_precision = chosen("--precision");
  options.keep_parallel = chosen("--zero") || chosen("--fsdp") || chosen("--ddp");
  ProgressLine progress("plan: knob sets");
  options.progress = [&](size_t done, size_t total) { progress.Update(done, total); };
  auto plan = Plan(model, setup, options);
  progress.Done();
  return plan;
}

int RunPlan(const PlanArgs& args) {
  auto plan = ComputePlan(args, LocalModelIo());
  if (!plan.ok()) return FailBadInput(plan.error());
  const std::string text = args.json ? RenderPlanJson(*plan, args.model) + "\n"
                                     : RenderPlanText(*plan, args.model, args.top);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return WriteOutputFiles({{args.html_path, [&] { return RenderPlanHtml(*plan, args.model); }}});
}

std::shared_ptr<PlanArgs> DeclarePlan(CLI::App* sub) {
  auto args = std::make_shared<PlanArgs>();
  args->app = sub;
  sub->add_option("MODEL", args->model,
                  "Catalog alias, Hugging Face id, config.json path or model directory")
      ->required();
  AddKnobFlags(sub, &args->knobs);
  AddFromFlag(sub, &args->knobs);
  sub->add_option("--tokens-per-step", args->tokens_per_step,
                  "Tokens per optimizer step, a multiple of --seq (default 16 x --seq)");
  sub->add_option("--top", args->top, "How many fitting strategies to list (default 10)");
  sub->add_flag("--json", args->json, "Print every strategy as JSON (integer bytes)");
  AddOutputFileOption(sub, "--html", &args->html_path,
                      "Also write a self-contained HTML page (every strategy) to FILE");
  return args;
}

RunFn SetupPlan(CLI::App* sub) {
  auto args = DeclarePlan(sub);
  return [args] { return RunPlan(*args); };
}

ValueFn SetupPlanValue(CLI::App* sub) {
  auto args = DeclarePlan(sub);
  return [args](const ModelIo& io) -> Result<CommandValue> {
    VS_TRY(plan, ComputePlan(*args, io));
    auto shared = std::make_shared<const PlanResult>(std::move(plan));
    CommandValue value;
    value.json = RenderPlanJson(*shared, args->model);
    value.text = [shared, args] { return RenderPlanText(*shared, args->model, args->top); };
    value.html = [shared, args] { return RenderPlanHtml(*shared, args->model); };
    return value;
  };
}

}  // namespace

extern const CommandSpec kPlanCommand = {
    "plan", "Rank single-GPU training strategies for MODEL by tokens/s among those that fit",
    &SetupPlan, &SetupPlanValue};

}  // namespace vramscope::cli
