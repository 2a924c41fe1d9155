// The GPU catalog: one row per GPU, with where each figure comes from.
//
// total_bytes: what cudaMemGetInfo / torch.cuda.get_device_properties()
//   .total_memory report on Linux, which is below the marketing figure (the
//   driver keeps part of the memory for itself, and the part it keeps grows
//   with newer drivers: an H100 SXM reports 81079..81106 MiB depending on the
//   driver). Where sources disagree, the lowest figure seen with a current
//   driver is used: overstating capacity turns into an OOM the user was told
//   would not happen. Figures quoted from OOM messages ("GPU 0 has a total
//   capacity of 79.11 GiB") are converted at 1 GiB = 1024 MiB, to the MiB.
// usable_bytes: total_bytes - 64 MiB. total_bytes already excludes what the
//   driver reserves; a process can allocate nearly all of the rest (OOM
//   reports show 5-9 MiB left free when a 20-28 MiB request fails), so the
//   margin only covers allocation granularity (2 MiB pages; 20 MiB
//   large-pool segments) and driver page tables.
// cuda_context_bytes: see ContextBytes() below.
// cublas_workspace_bytes: see the kCublas* constants below.
// bf16_dense_tflops / memory_bandwidth_gbps: vendor datasheets, dense (no
//   sparsity). Turing and Volta have no bf16 tensor cores: their fp16 figure.
// interconnect_gbps: NVLink / Infinity Fabric per GPU, per direction (half the
//   vendor's bidirectional total); 0 where there is none.
// pcie_gbps: per direction, x16: Gen3 16, Gen4 32, Gen5 64.
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "vramscope/gpu.h"

namespace vramscope {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

// Everything the driver and PyTorch keep on the device outside the caching
// allocator, for a training process with CUDA_MODULE_LOADING=LAZY (PyTorch
// sets it since 1.13, pytorch/pytorch#86509):
//  - the local-memory (stack) reservation, context-wide: max resident threads
//    per SM x SMs x bytes per thread (NVIDIA forum, "Local memory management",
//    forums.developer.nvidia.com/t/local-memory-management/289339/9); 1 KiB
//    per thread is the default cudaLimitStackSize;
//  - driver structures plus the kernels a training step loads lazily: 256
//    MiB. Anchors: 274 MiB measured after one tensor op with LAZY
//    (pytorch/pytorch#86509, torch 1.13); "about 300 MB" and "around 400 MB"
//    (ptrblck in pytorch/pytorch#107667 and #109888, torch 2.0/2.1); a bare
//    context of 426 MiB on an RTX 6000 Ada, 142 SMs x 1536 threads
//    (unslothai/unsloth-zoo PR #1053, torch 2.10 + CUDA 13.0), and 426 MiB per
//    process on A100 80GB, 108 SMs x 2048 threads, driver 535 / CUDA 12.2
//    (meta-pytorch/torchrec PR #3580). Both bare figures are ~212 MiB plus
//    the local-memory term above (213 and 216 MiB), so the base here leaves
//    ~44 MiB for the kernels a training step loads on top (GEMM, optimizer,
//    attention, loss). A training step loads more kernels than those probes,
//    so this errs high for a bare context. H100 SXM: 256 + 264 = 520 MiB.
//    The ground-truth harness records the bare context after one
//    torch.zeros(1) (tools/groundtruth/gtlib/worker.py) and the device figure
//    as cudaMemGetInfo's used bytes at the end of each phase.
// Not measured per GPU; ROCm (MI300X) uses the same formula unverified.
constexpr uint64_t kContextBaseBytes = 256 * kMiB;
// H100 80GB HBM3, measured (data/groundtruth/2026-11-26_h100-80g_*.jsonl: torch
// 2.11.0+cu130, driver 580.159.04): cudaMemGetInfo's used bytes minus
// memory_reserved() at the end of each training phase was 767 MiB in 538 of
// 735 phases (687-771 MiB in all; fewer kernels loaded early in a run), and
// nvidia-smi's per-process figure minus peak reserved 742-762 MiB; the bare
// context after one torch.zeros(1) was 619 MiB in all 81 runs. The formula
// above gives 520 MiB: CUDA 13 loads more than the anchors' releases did. The
// measurement replaces the formula for this GPU only; the others keep it.
constexpr uint64_t kH100SxmMeasuredContextBytes = 767 * kMiB;
constexpr uint64_t kLocalMemoryBytesPerThread = 1024;

constexpr uint64_t ContextBytes(uint64_t sm_count, uint64_t max_threads_per_sm) {
  return kContextBaseBytes + sm_count * max_threads_per_sm * kLocalMemoryBytesPerThread;
}

// cuBLAS workspaces, aten/src/ATen/cuda/CublasHandlePool.cpp (read at commit
// 26a39059, a 2025 copy with the 2.9+ float32Precision API, and in two 2026
// copies with torch.backends.cuda workspace-size overrides):
//  - size: getChosenWorkspaceSize() parses CUBLAS_WORKSPACE_CONFIG; the
//    default ":4096:2:16:8" is 4096 KiB x 2 + 16 KiB x 8 = 8.125 MiB, and
//    4096 KiB x 8 = 32 MiB on Hopper (compute capability 9.0 in torch 2.0-2.10,
//    pytorch/pytorch#89027 / #91564; major 9, 10 or 12 in the 2026 copies);
//  - allocated through the caching allocator (getNewWorkspace calls
//    CUDACachingAllocator::get()->allocate), so it counts in
//    memory_allocated / memory_reserved; a static map holds it for the life
//    of the process (empty_cache() cannot release an allocated block);
//  - one per (handle, stream) (setWorkspaceForHandle): handles come from a
//    per-thread pool (DeviceThreadHandlePool), so the main thread (forward,
//    optimizer) and the autograd engine's device thread (backward) hold one
//    each, both on the default stream: 2 x 32 MiB on an H100;
//  - cuBLASLt (used for addmm with a 1-D bias, i.e. nn.Linear with a bias in
//    forward): torch 2.9-2.10 keep a separate 1 MiB workspace per (handle,
//    stream) (getCUDABlasLtWorkspace, CUBLASLT_WORKSPACE_SIZE default 1024
//    KiB, pytorch/pytorch#156495 and #73328). pytorch/pytorch#168175
//    (approved 2026-01-12; 2.11's branch cut was 2026-02-16; the merge date
//    was not found) makes the Lt calls reuse the cuBLAS workspace of the same
//    (handle, stream) by default (TORCH_CUBLASLT_UNIFIED_WORKSPACE, on outside
//    fbcode): then no extra bytes in 2.11, else 1 MiB in the small pool for
//    the forward thread of a model with biased Linear layers. Not in this
//    catalog (the lowering adds none).
// On ROCm the default is 32 MiB, 128 MiB on gfx94x/gfx95x (MI300X);
// hipBLASLt keeps a separate 76 MiB workspace there.
constexpr uint64_t kCublasDefaultBytes = 4096 * 1024 * 2 + 16 * 1024 * 8;  // 8.125 MiB
constexpr uint64_t kCublasSm90Bytes = 32 * kMiB;
constexpr uint64_t kHipblasGfx94Bytes = 128 * kMiB;

constexpr uint64_t kUsableMarginBytes = 64 * kMiB;

struct Row {
  std::string_view name;
  std::string_view display_name;
  std::vector<std::string_view> aliases;
  std::string_view vendor;
  std::string_view arch;
  int compute_capability;
  uint64_t total_bytes;
  uint64_t context_bytes;
  uint64_t cublas_workspace_bytes;
  double bf16_dense_tflops;
  double memory_bandwidth_gbps;
  double interconnect_gbps;
  double pcie_gbps;
  std::string_view source;
};

// A data table, one GPU per entry: kept as written.
// clang-format off
std::vector<Row> Rows() {
  return {
      {"a100-40g", "NVIDIA A100-SXM4-40GB", {"a100-40gb", "a100-sxm4-40gb"}, "nvidia", "ampere",
       80, 42298834944, ContextBytes(108, 2048), kCublasDefaultBytes, 312, 1555, 300, 32,
       "memory: deviceQuery 40339 MiB (42298834944 B), driver for CUDA 12.2, in "
       "bottlerocket-os/bottlerocket PR #3873 (older drivers: 40536 MiB); throughput: NVIDIA "
       "A100 datasheet"},
      {"a100-80g", "NVIDIA A100-SXM4-80GB", {"a100", "a100-80gb", "a100-sxm4-80gb", "a100-sxm"},
       "nvidia", "ampere", 80, 81039 * kMiB, ContextBytes(108, 2048), kCublasDefaultBytes, 312,
       2039, 300, 32,
       "memory: OOM message 'total capacity of 79.14 GiB' (lianqi1008/Control-GIC#6); deviceQuery "
       "81051 MiB (CUDA 12.2 driver) to 81158 MiB (CUDA 12.5 driver, thamada/nvidia-smi "
       "nvsim/A100SXMx4_deviceQuery.py); throughput: NVIDIA A100 datasheet"},
      {"h100-80g", "NVIDIA H100 80GB HBM3",
       {"h100", "h100-sxm", "h100-sxm5", "h100-80gb", "h100-80gb-hbm3"}, "nvidia", "hopper", 90,
       85017755648, kH100SxmMeasuredContextBytes, kCublasSm90Bytes, 989, 3350, 450, 64,
       "memory: deviceQuery 81079 MiB (85017755648 B) with a CUDA 13.0 driver; 81089 MiB in "
       "torch 2.7 get_device_properties; 81106 MiB with a CUDA 12.7 driver (thamada/nvidia-smi "
       "nvsim/H100SXMx8_deviceQuery.py); OOM messages say 79.18-79.19 GiB; throughput: NVIDIA "
       "H100 datasheet (SXM5)"},
      {"h100-pcie", "NVIDIA H100 PCIe", {"h100-pcie-80gb"}, "nvidia", "hopper", 90, 81008 * kMiB,
       ContextBytes(114, 2048), kCublasSm90Bytes, 756, 2000, 300, 64,
       "memory: torch get_device_properties total_memory=81008MB; OOM message 'total capacity "
       "of 79.11 GiB' (vllm-project/vllm#27508); throughput: NVIDIA H100 datasheet (PCIe, NVLink "
       "bridge 600 GB/s)"},
      {"h200", "NVIDIA H200", {"h200-141gb", "h200-sxm"}, "nvidia", "hopper", 90, 143156 * kMiB,
       ContextBytes(132, 2048), kCublasSm90Bytes, 989, 4800, 450, 64,
       "memory: torch get_device_properties total_memory=143156MB (one public report, "
       "unconfirmed); throughput: NVIDIA H200 datasheet (SXM)"},
      {"l4", "NVIDIA L4", {"l4-24gb"}, "nvidia", "ada", 89, 23612293120, ContextBytes(58, 1536),
       kCublasDefaultBytes, 121, 300, 0, 32,
       "memory: deviceQuery 22518 MiB (23612293120 B), driver for CUDA 12.0; throughput: NVIDIA "
       "L4 datasheet (242 TFLOPS bf16 is with sparsity)"},
      {"l40s", "NVIDIA L40S", {"l40s-48gb"}, "nvidia", "ada", 89, 47576711168,
       ContextBytes(142, 1536), kCublasDefaultBytes, 362, 864, 0, 32,
       "memory: deviceQuery 45373 MiB (47576711168 B), driver for CUDA 12.4 (README of the "
       "cuda-device-query crate); throughput: NVIDIA L40S datasheet"},
      {"a10g", "NVIDIA A10G", {"a10g-24gb", "aws-a10g"}, "nvidia", "ampere", 86, 22733 * kMiB,
       ContextBytes(80, 1536), kCublasDefaultBytes, 125, 600, 0, 32,
       "memory: OOM message '22.20 GiB total capacity' on a g5.12xlarge "
       "(XavierXiao/Dreambooth-Stable-Diffusion#18); 22.49 GiB on 2022 drivers "
       "(AUTOMATIC1111/stable-diffusion-webui#1259); throughput: NVIDIA A10 datasheet (A10G "
       "figures are not published separately; uncertain)"},
      {"t4", "Tesla T4", {"t4-16gb"}, "nvidia", "turing", 75,
       14930 * kMiB, ContextBytes(40, 1024), kCublasDefaultBytes, 65, 320, 0, 16,
       "memory: torch 2.2.1 get_device_properties total_memory=14930MB (CUDA 12.2 driver); "
       "commonly 15109 MiB = 'total capacity of 14.75 GiB' (hpcaitech/Open-Sora#697); "
       "throughput: NVIDIA T4 datasheet (no bf16: fp16 tensor figure)"},
      {"v100-16g", "Tesla V100-SXM2-16GB", {"v100", "v100-16gb", "v100-sxm2-16gb"}, "nvidia",
       "volta", 70, 16130 * kMiB, ContextBytes(80, 2048), kCublasDefaultBytes, 125, 900, 150, 16,
       "memory: torch get_device_properties total_memory=16130MB (16160 MiB on older drivers); "
       "throughput: NVIDIA V100 datasheet (no bf16: fp16 tensor figure)"},
      {"v100-32g", "Tesla V100-SXM2-32GB", {"v100-32gb", "v100-sxm2-32gb"}, "nvidia", "volta", 70,
       34072559616, ContextBytes(80, 2048), kCublasDefaultBytes, 125, 900, 150, 16,
       "memory: deviceQuery 32494 MiB (34072559616 B), driver for CUDA 12.9 (32510 MiB on CUDA "
       "11 drivers); throughput: NVIDIA V100 datasheet (no bf16: fp16 tensor figure)"},
      {"rtx-3090", "NVIDIA GeForce RTX 3090", {"3090", "rtx3090", "geforce-rtx-3090"}, "nvidia",
       "ampere", 86, 24259 * kMiB, ContextBytes(82, 1536), kCublasDefaultBytes, 71, 936, 56.25,
       32,
       "memory: torch get_device_properties total_memory=24259MB (24268 MiB on older drivers); "
       "throughput: NVIDIA Ampere GA102 whitepaper (fp16/bf16 tensor with fp32 accumulate)"},
      {"rtx-4090", "NVIDIA GeForce RTX 4090", {"4090", "rtx4090", "geforce-rtx-4090"}, "nvidia",
       "ada", 89, 25250627584, ContextBytes(128, 1536), kCublasDefaultBytes, 165, 1008, 0, 32,
       "memory: deviceQuery 24081 MiB (25250627584 B) with a CUDA 13.0 driver; 24564 MiB with a "
       "CUDA 12.1 driver; OOM message '23.68 GiB total capacity' (zai-org/CogVideo#36); "
       "throughput: NVIDIA Ada whitepaper (bf16 tensor with fp32 accumulate)"},
      {"rtx-a6000", "NVIDIA RTX A6000", {"a6000", "rtxa6000"}, "nvidia", "ampere", 86,
       48676 * kMiB, ContextBytes(84, 1536), kCublasDefaultBytes, 155, 768, 56.25, 32,
       "memory: torch get_device_properties total_memory=48676MB; throughput: NVIDIA RTX A6000 "
       "datasheet"},
      {"mi300x", "AMD Instinct MI300X", {"amd-mi300x", "instinct-mi300x"}, "amd", "cdna3", 0,
       196592 * kMiB, ContextBytes(304, 2048), kHipblasGfx94Bytes, 1307, 5300, 448, 64,
       "memory: ROCm torch 2.3 and 2.6 get_device_properties total_memory=196592MB; throughput: "
       "AMD MI300X datasheet (as in torch/_inductor/analysis/device_info.py); xGMI 7 links x 64 "
       "GB/s per direction; context size unmeasured on ROCm"},
  };
}
// clang-format on

// multi_processor_count per catalog entry: the figures ContextBytes is given
// above (NVIDIA's datasheets / deviceQuery), and the H100 SXM5's 132.
uint32_t SmCount(std::string_view name) {
  constexpr std::pair<std::string_view, uint32_t> kSms[] = {
      {"a100-40g", 108}, {"a100-80g", 108}, {"h100-80g", 132}, {"h100-pcie", 114}, {"h200", 132},
      {"l4", 58},        {"l40s", 142},     {"a10g", 80},      {"t4", 40},         {"v100-16g", 80},
      {"v100-32g", 80},  {"rtx-3090", 82},  {"rtx-4090", 128}, {"rtx-a6000", 84},  {"mi300x", 304}};
  for (const auto& [n, sms] : kSms) {
    if (n == name) return sms;
  }
  return 0;
}

GpuSpec ToSpec(const Row& row) {
  GpuSpec spec;
  spec.name = row.name;
  spec.display_name = row.display_name;
  for (std::string_view alias : row.aliases) spec.aliases.emplace_back(alias);
  spec.vendor = row.vendor;
  spec.arch = row.arch;
  spec.compute_capability = row.compute_capability;
  spec.total_bytes = row.total_bytes;
  spec.usable_bytes = row.total_bytes - kUsableMarginBytes;
  spec.cuda_context_bytes = row.context_bytes;
  spec.cublas_workspace_bytes = row.cublas_workspace_bytes;
  spec.bf16_dense_tflops = row.bf16_dense_tflops;
  spec.memory_bandwidth_gbps = row.memory_bandwidth_gbps;
  spec.interconnect_gbps = row.interconnect_gbps;
  spec.pcie_gbps = row.pcie_gbps;
  spec.sm_count = SmCount(row.name);
  spec.source = row.source;
  return spec;
}

}  // namespace

const std::vector<GpuSpec>& GpuCatalog() {
  // Built once, on first use, and never changed afterwards (thread-safe
  // initialization of a function-local static).
  static const std::vector<GpuSpec> catalog = [] {
    std::vector<GpuSpec> specs;
    for (const Row& row : Rows()) specs.push_back(ToSpec(row));
    return specs;
  }();
  return catalog;
}

}  // namespace vramscope
