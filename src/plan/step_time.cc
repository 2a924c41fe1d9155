// EstimateStepTime (plan.h): a FLOPs-and-bytes model of one optimizer step.
//
// Not a measurement. It ranks strategies against each other on one GPU, where
// the same assumptions hold for every candidate; its absolute seconds are
// only as good as kAchievableComputeFraction. docs/plan.md states the model.
#include <algorithm>
#include <string_view>

#include "vramscope/plan.h"

namespace vramscope {
namespace {

bool IsHalf(Precision p) { return p == Precision::kFp16 || p == Precision::kBf16; }

// Weights a token passes through as a matmul. Routed experts count at the
// share of experts a token visits; a tied lm_head is not in the parameter
// list but still multiplies every token; a vision tower does not run in text
// training.
struct MatmulWeights {
  double all = 0;        // every matmul weight
  double quantised = 0;  // what QLoRA stores in NF4 (not lm_head, which stays 16-bit)
  double lm_head = 0;    // the output projection (tied or not): outside every decoder layer
};

MatmulWeights CountMatmulWeights(const ModelSpec& m) {
  MatmulWeights w;
  const double expert_share =
      m.num_experts ? static_cast<double>(m.experts_per_token) / static_cast<double>(m.num_experts)
                    : 1.0;
  for (const ParamTensor& p : m.params) {
    if (!p.is_linear_weight || p.role == ParamRole::kVision || p.role == ParamRole::kProjector)
      continue;
    const bool expert = IsRoutedExpert(p.role);
    const double n = static_cast<double>(p.numel) * (expert ? expert_share : 1.0);
    w.all += n;
    (p.role == ParamRole::kLmHead ? w.lm_head : w.quantised) += n;
  }
  if (m.tie_word_embeddings) {
    const double tied = static_cast<double>(m.vocab_size) * static_cast<double>(m.hidden_size);
    w.all += tied;
    w.lm_head += tied;
  }
  return w;
}

// Bytes read and written per trainable parameter by one optimizer step:
// the parameter (read + write), its gradient (read), and each state tensor
// (read + write). `x`: parameter and gradient element size; `state`: state
// element size.
double OptimizerBytesPerParameter(OptimizerKind o, double x, double state) {
  switch (o) {
    case OptimizerKind::kNone: return 0;
    case OptimizerKind::kSgd: return 3 * x;
    case OptimizerKind::kSgdMomentum:
    case OptimizerKind::kLion: return 3 * x + 2 * state;
    case OptimizerKind::kAdamW:
    case OptimizerKind::kAdamWFused:
    case OptimizerKind::kAdamWForLoop:
    case OptimizerKind::kPagedAdamW: return 3 * x + 4 * state;
    case OptimizerKind::kAdamW8bit:
    case OptimizerKind::kPagedAdamW8bit: return 3 * x + 4 * 1;  // bitsandbytes: 1-byte states
    case OptimizerKind::kAdafactor: return 4 * x;  // factored second moment: small next to x
  }
  return 0;
}

// Attention scores and weighted values of one micro-batch's forward: 2
// matmuls of 2·seq²·width FLOPs per sample and layer. Causal SDPA/flash
// kernels skip the masked half; eager attention computes the whole matrix and
// then masks it.
double AttentionFlops(const ModelSpec& model, const TrainingSetup& setup) {
  const double head_dim = model.head_dim
                              ? static_cast<double>(model.head_dim)
                              : static_cast<double>(model.hidden_size) /
                                    static_cast<double>(std::max<uint64_t>(model.num_heads, 1));
  const double width = static_cast<double>(model.num_heads) * head_dim;
  const double causal = setup.attn == Attention::kEager ? 1.0 : 0.5;
  const double seq = static_cast<double>(setup.seq);
  return 4.0 * static_cast<double>(model.num_layers) * static_cast<double>(setup.batch) * seq *
         seq * width * causal;
}

// FLOPs of one micro-batch's passes.
struct PassFlops {
  double forward = 0;
  double backward = 0;
  double recomputed = 0;  // what checkpointing reruns (when it is on)
};

// `adapter_params`: LoRA/QLoRA's trainable parameters (0 for full
// fine-tuning), which run as matmuls beside the frozen weights.
PassFlops MicroBatchFlops(const ModelSpec& model, const TrainingSetup& setup,
                          const MatmulWeights& weights, double adapter_params) {
  const double tokens = static_cast<double>(setup.batch) * static_cast<double>(setup.seq);
  const double attention = AttentionFlops(model, setup);
  PassFlops f;
  f.forward = 2 * weights.all * tokens + 2 * adapter_params * tokens + attention;
  // Backward: gradients with respect to activations (one more forward's worth)
  // and to weights (another), for attention twice its forward. LoRA/QLoRA skip
  // the frozen weights' gradients.
  const bool adapters = setup.finetune != Finetune::kFull;
  const double weight_grads = adapters ? 2 * adapter_params * tokens : 2 * weights.all * tokens;
  f.backward =
      2 * weights.all * tokens + 2 * adapter_params * tokens + weight_grads + 2 * attention;
  // Checkpointing wraps every decoder layer (transformers'
  // gradient_checkpointing_enable, llm-foundry's and torchtune's per-block
  // activation checkpointing): backward reruns the layers' forward, not the
  // lm_head's, which sits outside them. (Adapters are all counted as inside.)
  f.recomputed = f.forward - 2 * weights.lm_head * tokens;
  return f;
}

// The matmul rate reached: the GPU's peak dense bf16 (FP32 cores without
// autocast) at kAchievableComputeFraction, less for small micro-batches.
double AchievedFlopsPerSecond(const TrainingSetup& setup, const GpuSpec& gpu) {
  const double tokens = static_cast<double>(setup.batch) * static_cast<double>(setup.seq);
  const double peak = gpu.bf16_dense_tflops * 1e12 *
                      (setup.precision == Precision::kFp32 ? kFp32ComputeShare : 1.0);
  const double utilisation = tokens / (tokens + kHalfUtilisationTokens);
  return peak * kAchievableComputeFraction * utilisation;
}

// bitsandbytes dequantises each NF4 weight to 16 bits before every matmul
// pass (forward, backward, recompute): read 0.5 bytes, write 2.
double DequantSeconds(const TrainingSetup& setup, const MatmulWeights& weights, double bandwidth) {
  if (setup.finetune != Finetune::kQLora) return 0;
  const bool recompute = setup.grad_ckpt != GradCkpt::kNone;
  const double passes = 2 + (recompute ? 1 : 0);
  return static_cast<double>(setup.grad_accum) * passes * weights.quantised * 2.5 / bandwidth;
}

// Data-parallel replicas of the layout (1 on one GPU).
double Replicas(const ParallelLayout& layout) { return std::max<uint32_t>(1, layout.dp()); }

// The trainable parameters one GPU's optimizer steps: sharded optimizers
// (ZeRO 1-3, FSDP) step their 1/N partition only.
double SteppedParameters(const TrainingSetup& setup, uint64_t trainable_parameters) {
  const ParallelLayout& layout = setup.parallel;
  const bool sharded =
      layout.dp_mode == DataParallel::kZero1 || layout.dp_mode == DataParallel::kZero2 ||
      layout.dp_mode == DataParallel::kZero3 || layout.dp_mode == DataParallel::kFsdp;
  return static_cast<double>(trainable_parameters) / (sharded ? Replicas(layout) : 1.0);
}

// Optimizer and accumulation memory traffic over the achievable bandwidth.
double OptimizerSeconds(const TrainingSetup& setup, double stepped_parameters, double bandwidth) {
  const double x = IsHalf(setup.precision) ? 2 : 4;
  const double state = IsHalf(setup.precision) ? 2 : 4;
  // Accumulation: every micro-batch after the first adds into .grad (read +
  // write).
  const double accumulate = (static_cast<double>(setup.grad_accum) - 1) * 2 * x;
  return stepped_parameters * (OptimizerBytesPerParameter(setup.optimizer, x, state) + accumulate) /
         bandwidth;
}

// Gradient / parameter collectives of one step between the replicas (0 on
// one GPU). Ring collectives move (N-1)/N of the tensor per GPU. DDP and
// ZeRO-1/2: one all-reduce (reduce-scatter + all-gather) of the half
// gradients / parameters per step; ZeRO-3 and FSDP: parameters all-gathered in
// forward and backward and gradients reduce-scattered, per micro-batch.
double CommunicationSeconds(const TrainingSetup& setup, const GpuSpec& gpu,
                            uint64_t trainable_parameters) {
  const ParallelLayout& layout = setup.parallel;
  const double replicas = Replicas(layout);
  if (replicas <= 1) return 0;
  const double micro_batches = static_cast<double>(setup.grad_accum);
  const double grads = static_cast<double>(trainable_parameters) * 2;
  const double ring = (replicas - 1) / replicas;
  const bool gathers =
      layout.dp_mode == DataParallel::kZero3 || layout.dp_mode == DataParallel::kFsdp;
  const double volume = gathers ? 3 * micro_batches * grads * ring : 2 * grads * ring;
  const bool one_node = layout.gpus <= layout.gpus_per_node;
  const double link = (one_node && gpu.interconnect_gbps > 0 ? gpu.interconnect_gbps
                       : one_node                            ? gpu.pcie_gbps
                                                             : kInterNodeGBps) *
                      1e9 * kAchievableLinkFraction;
  return link > 0 ? volume / link : 0;
}

// Optimizer offload: gradients to the host and updated half parameters back
// (2 bytes each way per parameter of the partition), and the CPU optimizer
// reading and writing fp32 master, moments and gradient (32 bytes per
// parameter).
double OffloadSeconds(const GpuSpec& gpu, double stepped_parameters) {
  const double pcie = gpu.pcie_gbps * 1e9 * kAchievableLinkFraction;
  if (pcie <= 0) return 0;
  return stepped_parameters * 4 / pcie + stepped_parameters * 32 / kHostOptimizerBytesPerSecond;
}

}  // namespace

// The step is compute (FLOPs at the achieved rate), overlapped with the
// collectives, then the memory-bound work that does not overlap: NF4
// dequantisation, the optimizer, offload traffic.
StepTime EstimateStepTime(const ModelSpec& model, const TrainingSetup& setup, const GpuSpec& gpu,
                          uint64_t trainable_parameters) {
  StepTime t;
  const MatmulWeights weights = CountMatmulWeights(model);
  const double adapter_params =
      setup.finetune != Finetune::kFull ? static_cast<double>(trainable_parameters) : 0;
  const double micro_batches = static_cast<double>(setup.grad_accum);
  const PassFlops flops = MicroBatchFlops(model, setup, weights, adapter_params);
  t.forward_flops = micro_batches * flops.forward;
  t.backward_flops = micro_batches * flops.backward;
  t.recompute_flops = setup.grad_ckpt != GradCkpt::kNone ? micro_batches * flops.recomputed : 0;

  const double rate = AchievedFlopsPerSecond(setup, gpu);
  const double bandwidth = gpu.memory_bandwidth_gbps * 1e9 * kAchievableBandwidthFraction;
  if (rate <= 0 || bandwidth <= 0) return t;  // a catalog entry without figures: no model
  t.compute_seconds = (t.forward_flops + t.backward_flops + t.recompute_flops) / rate;
  t.dequant_seconds = DequantSeconds(setup, weights, bandwidth);
  const double stepped = SteppedParameters(setup, trainable_parameters);
  t.optimizer_seconds = OptimizerSeconds(setup, stepped, bandwidth);
  t.communication_seconds = CommunicationSeconds(setup, gpu, trainable_parameters);
  if (setup.parallel.offload != Offload::kNone) {
    t.offload_seconds = OffloadSeconds(gpu, stepped);
    t.optimizer_seconds = 0;  // no optimizer traffic on the GPU
  }
  t.step_seconds = std::max(t.compute_seconds, t.communication_seconds) + t.dequant_seconds +
                   t.optimizer_seconds + t.offload_seconds;
  const double tokens = static_cast<double>(setup.batch) * static_cast<double>(setup.seq);
  if (t.step_seconds > 0)
    t.tokens_per_second = Replicas(setup.parallel) * micro_batches * tokens / t.step_seconds;
  return t;
}

}  // namespace vramscope
