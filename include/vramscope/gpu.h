// GPU catalog: memory, and the per-architecture defaults of the device view.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "vramscope/result.h"

namespace vramscope {

struct GpuSpec {
  std::string name;                  // catalog key, e.g. "h100-80g"
  std::string display_name;          // "NVIDIA H100 80GB HBM3"
  std::vector<std::string> aliases;  // other accepted names
  std::string vendor;                // "nvidia" / "amd"
  std::string arch;                  // "hopper", "ampere", ...
  int compute_capability = 0;        // 90 for sm_90 (0 for AMD)
  // Total memory as cudaMemGetInfo / torch.cuda.mem_get_info reports it.
  uint64_t total_bytes = 0;
  // What a training process can use: total minus what the driver keeps.
  uint64_t usable_bytes = 0;
  // CUDA context + lazily loaded kernels of a PyTorch training process.
  uint64_t cuda_context_bytes = 0;
  // cuBLAS workspace per (handle, stream), allocated through PyTorch's allocator.
  uint64_t cublas_workspace_bytes = 0;
  double bf16_dense_tflops = 0;      // peak dense bf16 tensor throughput
  double memory_bandwidth_gbps = 0;  // GB/s
  double interconnect_gbps = 0;      // per-GPU NVLink/xGMI bandwidth, GB/s
  double pcie_gbps = 0;              // host link, GB/s per direction
  std::string source;                // where the figures come from
};

const std::vector<GpuSpec>& GpuCatalog();
// Finds by name or alias, case-insensitive; the Error lists known names.
Result<GpuSpec> FindGpu(std::string_view name);

}  // namespace vramscope
