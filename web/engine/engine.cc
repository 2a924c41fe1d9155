// The web page's engine: the CLI's commands as two C functions the page calls
// through emscripten (web/app.js). A thin shell like the CLI and the Python
// module (python/core/module.cc), built from the same pieces: a command is
// parsed with the flags the CLI declares for it (cli/cmd_*.cc, CommandSpec::
// setup_value) and run by the library, and what comes back is the library's
// JSON renderer's text, so the page's numbers are `vramscope estimate --json`'s
// by construction. No disk, no environment, no network: a model is a catalog
// alias or a config.json the page hands over in memory.
#include <emscripten/emscripten.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "command.h"
#include "memory_files.h"
#include "output.h"
#include "vramscope/event_stream.h"
#include "vramscope/gpu.h"
#include "vramscope/model.h"

namespace vramscope {
namespace cli {

// The CLI's outside world (cli/model_io.cc in the native build), empty here:
// no file exists, no variable is set, no Hub can be reached.
const ModelIo& LocalModelIo() {
  static const ModelIo io;
  return io;
}

}  // namespace cli

namespace web {
namespace {

using json = nlohmann::json;

// Parses argv (command name first, then its flags, as on the command line)
// with the command's own declarations; a parse error is the CLI's message.
Result<cli::ValueFn> ParseCommand(CLI::App& app, const std::vector<std::string>& argv) {
  if (argv.empty()) return MakeError("no command");
  const cli::CommandSpec* spec = cli::FindCommand(argv[0]);
  if (!spec || !spec->setup_value) return MakeError("no command " + argv[0] + " in the web page");
  CLI::App* sub = app.add_subcommand(spec->name, spec->summary);
  cli::ValueFn run = spec->setup_value(sub);
  cli::CheckNumericFlags(sub);
  std::vector<std::string> reversed(argv.rbegin(), argv.rend());  // CLI11 takes them reversed
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    return MakeError(cli::ParseErrorMessage(app, e));
  }
  return run;
}

// The worst rank class's timeline for the page's chart, at most `buckets`
// points: each bucket keeps the highest allocated and reserved bytes of the
// events it covers, so the peak survives the thinning.
json Timeline(const Report& report, size_t buckets) {
  const std::vector<TimelinePoint>& points = report.worst().sim.timeline;
  json event = json::array(), allocated = json::array(), reserved = json::array(),
       phase = json::array();
  const size_t per_bucket = std::max<size_t>(1, (points.size() + buckets - 1) / buckets);
  for (size_t start = 0; start < points.size(); start += per_bucket) {
    const size_t end = std::min(points.size(), start + per_bucket);
    const auto top = std::max_element(
        points.begin() + start, points.begin() + end,
        [](const auto& a, const auto& b) { return a.allocated_bytes < b.allocated_bytes; });
    uint64_t reserved_max = 0;
    for (size_t i = start; i < end; ++i)
      reserved_max = std::max(reserved_max, points[i].reserved_bytes);
    event.push_back(top->event_index);
    allocated.push_back(top->allocated_bytes);
    reserved.push_back(reserved_max);
    phase.push_back(std::string(PhaseName(top->phase)) + " " + std::to_string(top->step));
  }
  return {{"event_index", event},
          {"allocated_bytes", allocated},
          {"reserved_bytes", reserved},
          {"phase", phase}};
}

// One request of the page: {"argv": [...], "files": {path: text}}. The answer
// is {"ok": true, "json": <the command's JSON>, "warnings": [...],
// "timeline": {...}} or {"ok": false, "error": "..."}; the command's JSON is
// spliced in as the library rendered it, never re-serialised.
std::string Run(const std::string& request_text) {
  const json request = json::parse(request_text, nullptr, false);
  if (request.is_discarded() || !request.is_object()) {
    return json{{"ok", false}, {"error", "the page sent a request that is not JSON"}}.dump();
  }
  const auto argv = request.value("argv", std::vector<std::string>{});
  const auto files = request.value("files", std::map<std::string, std::string>{});
  CLI::App app{"vramscope"};
  app.require_subcommand(1);
  auto run = ParseCommand(app, argv);
  if (!run.ok()) return json{{"ok", false}, {"error", run.error().message}}.dump();
  const MemoryFileSystem memory(files);
  ModelIo io;
  io.files = &memory;
  cli::TakeWarnings();  // none left from an earlier call
  auto value = (*run)(io);
  const std::vector<std::string> warnings = cli::TakeWarnings();
  if (!value.ok())
    return json{{"ok", false}, {"error", cli::OneLine(value.error().message)}}.dump();
  json extra = {{"ok", true}, {"warnings", warnings}};
  if (value->report) extra["timeline"] = Timeline(*value->report, 1200);
  std::string out = extra.dump();
  out.insert(out.size() - 1, ",\"json\":" + value->json);
  return out;
}

// The catalogs for the page's pickers.
std::string Catalog() {
  json models = json::array(), gpus = json::array();
  for (const CatalogEntry& e : ModelCatalog()) {
    models.push_back({{"alias", e.alias},
                      {"hub_id", e.hub_id},
                      {"family", e.family},
                      {"reference_parameters", e.reference_parameters}});
  }
  for (const GpuSpec& g : GpuCatalog()) {
    gpus.push_back({{"name", g.name},
                    {"display_name", g.display_name},
                    {"total_bytes", g.total_bytes},
                    {"usable_bytes", g.usable_bytes}});
  }
  return json{{"models", models}, {"gpus", gpus}}.dump();
}

// The answer the page reads with UTF8ToString; valid until the next call
// (the page calls from one thread, one call at a time).
std::string g_answer;

const char* Answer(std::string text) {
  g_answer = std::move(text);
  return g_answer.c_str();
}

}  // namespace
}  // namespace web
}  // namespace vramscope

extern "C" {

EMSCRIPTEN_KEEPALIVE const char* vs_run(const char* request) {
  try {
    return vramscope::web::Answer(vramscope::web::Run(request));
  } catch (const std::exception& e) {
    return vramscope::web::Answer(nlohmann::json{
        {"ok", false},
        {"error", std::string("internal error: ") +
                      e.what()}}.dump());
  }
}

EMSCRIPTEN_KEEPALIVE const char* vs_catalog() {
  return vramscope::web::Answer(vramscope::web::Catalog());
}

}  // extern "C"
