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
      m.num_experts ? static_cast<double>(m.experts_per_token) / static_cast<double>(m.num_experts) : 1.0;
  for (const ParamTensor& p : m.params) {
    if (!p.is_linear_weight || p.role == ParamRole::kVision || p.role == ParamRole::kProjector) continue;
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

}  // namespace

StepTime EstimateStepTime(const ModelSpec& model, const TrainingSetup& setup, const GpuSpec& gpu,
                          uint64_t trainable_parameters) {
  StepTime t;
  const MatmulWeights weights = CountMatmulWeights(model);
  const bool adapters = setup.finetune != Finetune::kFull;
  const double adapter_params = adapters ? static_cast<double>(trainable_parameters) : 0;
  const double tokens = static_cast<double>(setup.batch) * static_cast<double>(setup.seq);
  const double micro_batches = static_cast<double>(setup.grad_accum);

  // Attention scores and weighted values: 2 matmuls of 2·seq²·width FLOPs per
  // sample and layer. Causal SDPA/flash kernels skip the masked half; eager
  // attention computes the whole matrix and then masks it.
  const double head_dim = model.head_dim ? static_cast<double>(model.head_dim)
                                         : static_cast<double>(model.hidden_size) /
                                               static_cast<double>(std::max<uint64_t>(model.num_heads, 1));
  const double width = static_cast<double>(model.num_heads) * head_dim;
  const double causal = setup.attn == Attention::kEager ? 1.0 : 0.5;
  const double seq = static_cast<double>(setup.seq);
  const double attention = 4.0 * static_cast<double>(model.num_layers) * static_cast<double>(setup.batch) *
                           seq * seq * width * causal;

  const double forward = 2 * weights.all * tokens + 2 * adapter_params * tokens + attention;
  // Backward: gradients with respect to activations (one more forward's worth)
  // and to weights (another), for attention twice its forward. LoRA/QLoRA skip
  // the frozen weights' gradients.
  const double weight_grads = adapters ? 2 * adapter_params * tokens : 2 * weights.all * tokens;
  const double backward = 2 * weights.all * tokens + 2 * adapter_params * tokens + weight_grads + 2 * attention;
  const bool recompute = setup.grad_ckpt != GradCkpt::kNone;
  // Checkpointing wraps every decoder layer (transformers'
  // gradient_checkpointing_enable, llm-foundry's and torchtune's per-block
  // activation checkpointing): backward reruns the layers' forward, not the
  // lm_head's, which sits outside them. (Adapters are all counted as inside.)
  const double recomputed = forward - 2 * weights.lm_head * tokens;
  t.forward_flops = micro_batches * forward;
  t.backward_flops = micro_batches * backward;
  t.recompute_flops = recompute ? micro_batches * recomputed : 0;

  const double peak = gpu.bf16_dense_tflops * 1e12 * (setup.precision == Precision::kFp32 ? kFp32ComputeShare : 1.0);
  const double utilisation = tokens / (tokens + kHalfUtilisationTokens);
  const double rate = peak * kAchievableComputeFraction * utilisation;
  const double bandwidth = gpu.memory_bandwidth_gbps * 1e9 * kAchievableBandwidthFraction;
  if (rate <= 0 || bandwidth <= 0) return t;  // a catalog entry without figures: no model
  t.compute_seconds = (t.forward_flops + t.backward_flops + t.recompute_flops) / rate;

  // bitsandbytes dequantises each NF4 weight to 16 bits before every matmul
  // pass (forward, backward, recompute): read 0.5 bytes, write 2.
  if (setup.finetune == Finetune::kQLora) {
    const double passes = 2 + (recompute ? 1 : 0);
    t.dequant_seconds = micro_batches * passes * weights.quantised * 2.5 / bandwidth;
  }

  const double x = IsHalf(setup.precision) ? 2 : 4;
  const double state = IsHalf(setup.precision) ? 2 : 4;
  const ParallelLayout& layout = setup.parallel;
  const double replicas = std::max<uint32_t>(1, layout.dp());
  const bool sharded = layout.dp_mode == DataParallel::kZero1 || layout.dp_mode == DataParallel::kZero2 ||
                       layout.dp_mode == DataParallel::kZero3 || layout.dp_mode == DataParallel::kFsdp;
  // Sharded optimizers step their 1/N partition only.
  const double trainable = static_cast<double>(trainable_parameters) / (sharded ? replicas : 1.0);
  // Accumulation: every micro-batch after the first adds into .grad (read +
  // write).
  const double accumulate = (micro_batches - 1) * 2 * x;
  t.optimizer_seconds = trainable * (OptimizerBytesPerParameter(setup.optimizer, x, state) + accumulate) / bandwidth;

  if (replicas > 1) {
    // Ring collectives move (N-1)/N of the tensor per GPU. DDP and ZeRO-1/2:
    // one all-reduce (reduce-scatter + all-gather) of the half gradients /
    // parameters per step; ZeRO-3 and FSDP: parameters all-gathered in forward
    // and backward and gradients reduce-scattered, per micro-batch.
    const double grads = static_cast<double>(trainable_parameters) * 2;
    const double ring = (replicas - 1) / replicas;
    const bool gathers = layout.dp_mode == DataParallel::kZero3 || layout.dp_mode == DataParallel::kFsdp;
    const double volume = gathers ? 3 * micro_batches * grads * ring : 2 * grads * ring;
    const bool one_node = layout.gpus <= layout.gpus_per_node;
    const double link = (one_node && gpu.interconnect_gbps > 0 ? gpu.interconnect_gbps
                         : one_node ? gpu.pcie_gbps : kInterNodeGBps) * 1e9 * kAchievableLinkFraction;
    if (link > 0) t.communication_seconds = volume / link;
  }
  if (layout.offload != Offload::kNone) {
    // Gradients to the host and updated half parameters back (2 bytes each
    // way per parameter of the partition), and the CPU optimizer reading and
    // writing fp32 master, moments and gradient (32 bytes per parameter).
    const double pcie = gpu.pcie_gbps * 1e9 * kAchievableLinkFraction;
    if (pcie > 0) t.offload_seconds = trainable * 4 / pcie + trainable * 32 / kHostOptimizerBytesPerSecond;
    t.optimizer_seconds = 0;  // no optimizer traffic on the GPU
  }
  t.step_seconds = std::max(t.compute_seconds, t.communication_seconds) + t.dequant_seconds +
                   t.optimizer_seconds + t.offload_seconds;
  if (t.step_seconds > 0) t.tokens_per_second = replicas * micro_batches * tokens / t.step_seconds;
  return t;
}

}  // namespace vramscope
