// vramscope._core: the engine as a Python extension module (pybind11).
//
// A thin shell like the CLI, and built from the CLI's own pieces: a command
// runs with the flags the CLI declares for it (cli/cmd_*.cc, CommandSpec::
// setup_value), so a knob is checked, and refused with the same message, as
// on the command line; what comes back is the library's result (its JSON
// renderer's text, the Report itself), never the CLI's printed output. The
// Python package (python/vramscope/) turns Python keyword arguments into
// those flags and the result into typed objects. The GIL is released while a
// command runs: estimates from several Python threads run in parallel.
#include <malloc.h>

#include <cstdio>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "command.h"
#include "engine_call.h"
#include "output.h"
#include "vramscope/category.h"
#include "vramscope/gpu.h"
#include "vramscope/model.h"

namespace py = pybind11;

namespace vramscope::python {
namespace {

// A command's result for Python: its JSON text, and where it has one, its
// text, HTML page and report timeline.
class Value {
 public:
  Value(cli::CommandValue value, std::vector<std::string> warnings)
      : value_(std::move(value)), warnings_(std::move(warnings)) {}

  const std::string& json() const { return value_.json; }
  const std::vector<std::string>& warnings() const { return warnings_; }
  std::optional<std::string> text() const { return Render(value_.text); }
  std::optional<std::string> html() const { return Render(value_.html); }
  std::optional<std::string> svg() const { return RenderReport(&RenderSvg); }
  std::optional<std::string> csv() const { return RenderReport(&RenderTimelineCsv); }
  py::object timeline() const;

 private:
  // Renders without the GIL; nullopt when there is nothing to render.
  static std::optional<std::string> Render(const std::function<std::string()>& render) {
    if (!render) return std::nullopt;
    py::gil_scoped_release release;
    return render();
  }
  std::optional<std::string> RenderReport(std::string (*render)(const Report&)) const {
    if (!value_.report) return std::nullopt;
    py::gil_scoped_release release;
    return render(*value_.report);
  }

  cli::CommandValue value_;
  std::vector<std::string> warnings_;
};

// The worst rank class's timeline as columns: event_index, step, phase,
// allocated_bytes, reserved_bytes, and one column per category
// ("parameters", ...) of allocated bytes. None for a value without a report.
py::object Value::timeline() const {
  if (!value_.report) return py::none();
  const std::vector<TimelinePoint>& points = value_.report->worst().sim.timeline;
  std::vector<uint64_t> event_index, allocated, reserved;
  std::vector<uint32_t> step;
  std::vector<std::string> phase;
  std::map<std::string, std::vector<uint64_t>> by_category;
  for (const TimelinePoint& p : points) {
    event_index.push_back(p.event_index);
    step.push_back(p.step);
    phase.emplace_back(PhaseName(p.phase));
    allocated.push_back(p.allocated_bytes);
    reserved.push_back(p.reserved_bytes);
    for (Category c : kAllCategories) {
      by_category[std::string(CategoryJsonKey(c))].push_back(p.by_category[static_cast<size_t>(c)]);
    }
  }
  py::dict out;
  out["event_index"] = event_index;
  out["step"] = step;
  out["phase"] = phase;
  out["allocated_bytes"] = allocated;
  out["reserved_bytes"] = reserved;
  for (Category c : kAllCategories) {
    const std::string key(CategoryJsonKey(c));
    out[py::str(key)] = by_category[key];
  }
  return out;
}

// An exception the engine should never throw (the CLI's "internal error", exit
// 1), raised in Python as _core.InternalError: never as pybind11's mapping of
// std::out_of_range to IndexError, which looked like the caller's mistake.
struct InternalError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Runs command `name` with `args` (engine_call.h) without the GIL; `files`
// are shown to model resolution on top of the disk. Raises ValueError with
// the CLI's message on bad input, _core.InternalError on a defect.
Value RunCommand(const std::string& name, const std::vector<std::string>& args,
                 const MemoryFiles& files) {
  EngineCall call;
  {
    py::gil_scoped_release release;
    call = CallEngine(name, args, files);
  }
  if (call.input_error) throw py::value_error(*call.input_error);
  if (call.internal_error) throw InternalError(*call.internal_error);
  return Value(std::move(*call.value), std::move(call.warnings));
}

// The `vramscope` console script: the CLI's whole command line, in-process.
// `argv` holds bytes (the console script passes os.fsencode of each
// argument), so a file name that is not UTF-8 arrives as the shell gave it.
int CliMain(const std::vector<std::string>& argv) {
  std::vector<const char*> pointers;
  for (const std::string& a : argv) pointers.push_back(a.c_str());
  py::gil_scoped_release release;
  const int code = cli::RunCli(static_cast<int>(pointers.size()), pointers.data());
  std::fflush(stdout);
  std::fflush(stderr);
  return code;
}

// What cli/malloc_tuning.cc does for the executable (the console script calls
// it; an importing Python process keeps its malloc settings).
void TuneMalloc() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
}

py::list Models() {
  py::list out;
  for (const CatalogEntry& e : ModelCatalog()) {
    py::dict d;
    d["alias"] = e.alias;
    d["hub_id"] = e.hub_id;
    d["family"] = e.family;
    d["reference_parameters"] = e.reference_parameters;
    out.append(d);
  }
  return out;
}

py::list Gpus() {
  py::list out;
  for (const GpuSpec& g : GpuCatalog()) {
    py::dict d;
    d["name"] = g.name;
    d["display_name"] = g.display_name;
    d["total_bytes"] = g.total_bytes;
    d["usable_bytes"] = g.usable_bytes;
    out.append(d);
  }
  return out;
}

}  // namespace
}  // namespace vramscope::python

PYBIND11_MODULE(_core, m) {
  using namespace vramscope::python;
  m.doc() = "vramscope's engine (C++); use the vramscope package's functions instead";
  m.attr("__version__") = VS_VERSION;
  py::register_exception<InternalError>(m, "InternalError", PyExc_RuntimeError);
  py::class_<Value>(m, "Value")
      .def_property_readonly("json", &Value::json)
      .def_property_readonly("warnings", &Value::warnings)
      .def("text", &Value::text)
      .def("html", &Value::html)
      .def("svg", &Value::svg)
      .def("csv", &Value::csv)
      .def("timeline", &Value::timeline);
  m.def("run_command", &RunCommand, py::arg("name"), py::arg("args"),
        py::arg("files") = MemoryFiles{},
        "Runs a command (estimate, fit, sweep, plan, simulate, explain, compare) with "
        "command-line flags; raises ValueError with the CLI's message on bad input");
  m.def("cli_main", &CliMain, py::arg("argv"), "The vramscope command line; returns the exit code");
  m.def("tune_malloc", &TuneMalloc);
  m.def("models", &Models);
  m.def("gpus", &Gpus);
}
