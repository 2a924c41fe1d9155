// vramscope gpus: the GPU catalog.
#include <cstdio>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "command.h"
#include "vramscope/gpu.h"
#include "vramscope/report.h"

namespace vramscope::cli {
namespace {

int RunGpus(bool json) {
  const auto& catalog = GpuCatalog();
  if (json) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const GpuSpec& g : catalog) {
      list.push_back({{"name", g.name},
                      {"display_name", g.display_name},
                      {"aliases", g.aliases},
                      {"total_bytes", g.total_bytes},
                      {"usable_bytes", g.usable_bytes},
                      {"cuda_context_bytes", g.cuda_context_bytes},
                      {"cublas_workspace_bytes", g.cublas_workspace_bytes},
                      {"compute_capability", g.compute_capability},
                      {"bf16_dense_tflops", g.bf16_dense_tflops},
                      {"memory_bandwidth_gbps", g.memory_bandwidth_gbps},
                      {"source", g.source}});
    }
    std::puts(list.dump(2).c_str());
    return kExitOk;
  }
  std::puts(fmt::format("{:<12} {:<28} {:>12} {:>12} {:>12}", "name", "GPU", "usable", "CUDA ctx",
                        "bf16 TFLOPs")
                .c_str());
  for (const GpuSpec& g : catalog) {
    std::puts(fmt::format("{:<12} {:<28} {:>12} {:>12} {:>12.0f}", g.name, g.display_name,
                          FormatBytes(g.usable_bytes), FormatBytes(g.cuda_context_bytes),
                          g.bf16_dense_tflops)
                  .c_str());
  }
  return kExitOk;
}

RunFn SetupGpus(CLI::App* sub) {
  auto json = std::make_shared<bool>(false);
  sub->add_flag("--json", *json, "Print the catalog as JSON");
  return [json] { return RunGpus(*json); };
}

}  // namespace

extern const CommandSpec kGpusCommand = {"gpus", "List the GPU catalog", &SetupGpus};

}  // namespace vramscope::cli
