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
  // Rule (gpu_catalog.cc): total_bytes - 64 MiB, because total_bytes already
  // excludes the memory the driver reserves for itself.
  uint64_t usable_bytes = 0;
  // CUDA context + lazily loaded kernels of a PyTorch training process.
  uint64_t cuda_context_bytes = 0;
  // cuBLAS workspace per (handle, stream), allocated through PyTorch's allocator.
  uint64_t cublas_workspace_bytes = 0;
  double bf16_dense_tflops = 0;      // peak dense bf16 tensor throughput
  double memory_bandwidth_gbps = 0;  // GB/s
  double interconnect_gbps = 0;      // per-GPU NVLink/xGMI bandwidth, GB/s per direction (0: none)
  double pcie_gbps = 0;              // host link, GB/s per direction
  // Streaming multiprocessors (AMD: compute units), as
  // torch.cuda.get_device_properties().multi_processor_count reports them:
  // Liger-Kernel's RMSNorm backward sizes a buffer by it (0: unknown).
  uint32_t sm_count = 0;
  std::string source;  // where the figures come from
};

// Every entry, in a fixed order (data-center GPUs first). Immutable.
const std::vector<GpuSpec>& GpuCatalog();
// Finds by name, alias or display name (what torch.cuda.get_device_name()
// prints), ignoring case, spaces vs dashes vs underscores, and a leading
// "nvidia"; the Error lists the known names.
Result<GpuSpec> FindGpu(std::string_view name);
// The catalog key ("h100-80g") used when no GPU is given.
inline constexpr std::string_view kDefaultGpuName = "h100-80g";

}  // namespace vramscope
