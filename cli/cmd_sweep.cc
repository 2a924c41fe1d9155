// vramscope sweep MODEL --seq 1:2048:10 [--batch 1,2,4] [knobs] (a diffusion UNet:
// --image-size 256:1024:4): one estimate
// per grid point; a table, JSON, CSV, an SVG chart or an HTML page.
#include <cstdio>
#include <memory>

#include "command.h"
#include "knobs.h"
#include "output.h"
#include "vramscope/model.h"
#include "vramscope/plan.h"
#include "vramscope/sweep.h"

namespace vramscope::cli {
namespace {

struct GridFlag {
  SweepVariable variable;
  std::string text;  // empty: not given
  CLI::Option* option = nullptr;
};

struct SweepArgs {
  std::string model;
  KnobArgs knobs;
  std::vector<GridFlag> grids = {{SweepVariable::kSeq, {}},
                                 {SweepVariable::kBatch, {}},
                                 {SweepVariable::kLoraRank, {}},
                                 {SweepVariable::kGradAccum, {}},
                                 {SweepVariable::kImageSize, {}}};
  bool json = false;
  std::string csv_path, svg_path, html_path;
  const CLI::App* app = nullptr;
};

// A grid flag with ':' or ',' is swept; a plain number sets the knob.
bool IsGrid(const std::string& text) { return text.find_first_of(":,") != std::string::npos; }

// The swept axes of the grid flags, in command-line order (the first swept
// flag is the chart's x axis); a grid flag with one value sets its knob in
// `setup` instead. Errors: a grid that does not parse.
Result<std::vector<SweepAxis>> ParseAxes(const SweepArgs& args, TrainingSetup* setup) {
  std::vector<SweepAxis> axes;
  for (const CLI::Option* opt : args.app->parse_order()) {
    for (const GridFlag& g : args.grids) {
      if (g.option != opt || g.text.empty()) continue;
      VS_TRY(values, ParseGrid(g.text, SweepVariableFlag(g.variable)));
      if (IsGrid(g.text)) {
        bool seen = false;
        for (const SweepAxis& a : axes) seen = seen || a.variable == g.variable;
        if (!seen) axes.push_back({g.variable, values});
      } else {
        *setup = WithKnob(std::move(*setup), g.variable, values.front());
      }
    }
  }
  return axes;
}

Result<SweepResult> ComputeSweep(const SweepArgs& args, const ModelIo& io) {
  VS_TRY(setup, args.knobs.ToSetup());
  VS_TRY(axes, ParseAxes(args, &setup));
  VS_TRY(model, ResolveModel(args.model, io));
  VS_TRY(encoders, args.knobs.ResolveTextEncoders(io, &setup));
  (void)encoders;
  if (Status v = ResolveVae(args.knobs, io, &setup); !v.ok()) return v.error();
  ApplyLibraryDefaults(model, &setup);
  args.knobs.Warn(model, setup);
  ProgressLine progress("sweep: points");
  auto sweep =
      Sweep(model, setup, axes, [&](size_t done, size_t total) { progress.Update(done, total); });
  progress.Done();
  if (sweep.ok()) sweep->source = args.model;
  return sweep;
}

int RunSweep(const SweepArgs& args) {
  auto sweep = ComputeSweep(args, LocalModelIo());
  if (!sweep.ok()) return FailBadInput(sweep.error());
  const std::string text = args.json ? RenderSweepJson(*sweep) + "\n" : RenderSweepText(*sweep);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return WriteOutputFiles({{args.csv_path, [&] { return RenderSweepCsv(*sweep); }},
                           {args.svg_path, [&] { return RenderSweepSvg(*sweep); }},
                           {args.html_path, [&] { return RenderSweepHtml(*sweep); }}});
}

std::shared_ptr<SweepArgs> DeclareSweep(CLI::App* sub) {
  auto args = std::make_shared<SweepArgs>();
  args->app = sub;
  sub->add_option("MODEL", args->model,
                  "Catalog alias, Hugging Face id, config.json path or model directory")
      ->required();
  AddKnobFlags(sub, &args->knobs);
  AddFromFlag(sub, &args->knobs);
  // The sweepable knobs take a grid here instead of one number.
  for (GridFlag& g : args->grids) {
    const std::string flag(SweepVariableFlag(g.variable));
    sub->remove_option(sub->get_option(flag));
    g.option =
        sub->add_option(flag, g.text,
                        "One value, or a grid to sweep: START:STOP:COUNT (COUNT evenly spaced "
                        "integers) or A,B,C");
  }
  sub->add_flag("--json", args->json, "Print the points as JSON (integer bytes)");
  AddOutputFileOption(sub, "--csv", &args->csv_path, "Also write the points as CSV to FILE");
  AddOutputFileOption(sub, "--svg", &args->svg_path,
                      "Also write a chart of memory against the swept knob (SVG) to FILE");
  AddOutputFileOption(sub, "--html", &args->html_path,
                      "Also write a self-contained HTML page (chart, table, knobs) to FILE");
  return args;
}

RunFn SetupSweep(CLI::App* sub) {
  auto args = DeclareSweep(sub);
  return [args] { return RunSweep(*args); };
}

ValueFn SetupSweepValue(CLI::App* sub) {
  auto args = DeclareSweep(sub);
  return [args](const ModelIo& io) -> Result<CommandValue> {
    VS_TRY(sweep, ComputeSweep(*args, io));
    auto shared = std::make_shared<const SweepResult>(std::move(sweep));
    CommandValue value;
    value.json = RenderSweepJson(*shared);
    value.text = [shared] { return RenderSweepText(*shared); };
    value.html = [shared] { return RenderSweepHtml(*shared); };
    return value;
  };
}

}  // namespace

extern const CommandSpec kSweepCommand = {
    "sweep", "Estimate MODEL over a grid of one or two knobs (seq, batch, lora-rank, grad-accum)",
    &SetupSweep, &SetupSweepValue};

}  // namespace vramscope::cli
