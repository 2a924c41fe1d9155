// The planner: searches over training setups, built on Estimate() only
// (DESIGN.md: "the planner only calls lower + simulate").
//
// - Fit(): the largest micro-batch and the longest sequence that fit a GPU.
// - Sweep(): one estimate per point of a grid over one or two knobs.
// - Plan(): single-GPU training strategies ranked by a step-time model.
//
// Pure and deterministic: no printing, no clocks, no global state; errors are
// values (one line naming the flag). A setup that does not fit is a result,
// not an error. Thread-compatible: concurrent calls share nothing.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "vramscope/model.h"
#include "vramscope/report.h"
#include "vramscope/result.h"
#include "vramscope/setup.h"
#include "vramscope/sweep.h"

namespace vramscope {

// ---------------------------------------------------------------------------
// Fit
// ---------------------------------------------------------------------------

// Search limits. A search never asks for more than lowering accepts
// (kMaxBatch, kMaxSeq, kMaxTokensPerMicroBatch in setup.h).
inline constexpr uint64_t kFitMaxBatch = kMaxBatch;
// Longest sequence searched when the model states no max_position_embeddings.
inline constexpr uint64_t kFitDefaultMaxSeq = uint64_t{1} << 20;

// fit's margin when --margin is not given (docs/plan.md): 2% of the GPU's
// usable memory, about the median device-total error of the estimate on
// single-GPU runs it had never seen (1.5%, README "Accuracy", round 2), so
// an answer at the edge is not a coin toss. --margin 0 removes it.
inline constexpr std::string_view kDefaultFitMargin = "2%";

struct FitOptions {
  // Memory kept free on the device: a setup fits when it fits the GPU and its
  // device total is at most usable_bytes - margin_bytes. Must be below the
  // GPU's usable bytes (ParseMargin checks).
  uint64_t margin_bytes = 0;
  // The margin is kDefaultFitMargin, not one the user gave (the report says so).
  bool margin_is_default = false;
  // 0: the defaults above (the model's max_position_embeddings when stated).
  uint64_t max_batch = 0;
  uint64_t max_seq = 0;
  // Also search the fewest GPUs for the setup's parallel mode, up to max_gpus.
  bool search_gpus = false;
  uint32_t max_gpus = 4096;
};

// One search: the largest value of one knob that fits, the others held.
struct FitSearch {
  SweepVariable variable = SweepVariable::kBatch;  // kBatch or kSeq
  uint64_t held_value = 0;                         // the other knob (seq for a batch search, ...)
  // Values searched are multiples of `step` (1; a UNet's image side: what one
  // more latent row at the smallest resolution adds in pixels).
  uint64_t step = 1;
  SweepVariable held = SweepVariable::kSeq;  // which knob held_value is
  uint64_t cap = 0;                          // the largest value searched
  std::string cap_reason;                    // why: "the model's max_position_embeddings", ...
  // Largest value whose estimate fits; 0 when even 1 does not.
  uint64_t max_value = 0;
  bool fits() const { return max_value > 0; }
  // max_value == cap: the search limit, not memory, ended the search.
  bool capped = false;
  // The estimate at max_value, or at 1 when nothing fits (what even the
  // smallest setup needs).
  Report at_max;
  // The estimate at max_value + 1, which does not fit; empty when capped or
  // when nothing fits. Its needed_bytes() is a lower bound when it ran out of
  // memory (a fragmented cache can fail below the limit).
  std::optional<Report> at_next;
  uint64_t estimates = 0;  // Estimate() calls this search made
  // A larger value was seen to need fewer bytes than a smaller one that fits:
  // memory was not monotone, so a larger value beyond the first failing one
  // might fit too. Expected never; reported rather than hidden.
  bool non_monotone = false;
};

// The fewest GPUs that fit the setup's batch and seq under its parallel mode
// (--ddp, --zero, --fsdp; with --tp/--pp/--cp the counts are multiples of
// tp x pp x cp). Memory per GPU falls as sharding spreads the model states,
// so the search is exponential then binary over the GPU count.
struct FitGpusSearch {
  uint32_t step = 1;      // GPU counts searched are multiples of this
  uint32_t cap = 0;       // the largest count searched
  uint32_t min_gpus = 0;  // 0: no count up to cap fits
  // What to launch: min_gpus when one node holds it, else rounded up to whole
  // nodes of gpus_per_node (--gpus-per-node) that are also multiples of step.
  // Memory per GPU does not grow with the count, so it fits too. 0: none fits.
  uint32_t gpus_per_node = 8;
  uint32_t launch_gpus = 0;
  Report at_min;                // the estimate at min_gpus (at cap when none fits)
  std::optional<Report> below;  // at min_gpus - step, which does not fit
  uint64_t estimates = 0;
};

// When no micro-batch fits at the setup's sequence: the first one-knob change
// (gradient checkpointing, 16-bit weights, the chunked loss, an 8-bit
// optimizer, LoRA, in that order) under which one does, and the largest
// micro-batch then.
struct FitSuggestion {
  std::string flags;  // "--grad-ckpt full"
  std::string why;    // what the change trades
  FitSearch batch;    // the batch search under the change
};

struct FitResult {
  GpuSpec gpu;
  uint64_t margin_bytes = 0;
  bool margin_is_default = false;           // FitOptions::margin_is_default
  uint64_t limit_bytes = 0;                 // gpu.usable_bytes - margin_bytes
  FitSearch batch;                          // at the setup's seq
  FitSearch seq;                            // at the setup's batch (a UNet: the image side)
  std::optional<FitGpusSearch> gpus;        // with FitOptions::search_gpus
  std::optional<FitSuggestion> suggestion;  // only when !batch.fits()
  bool fits() const { return batch.fits() || seq.fits(); }
  uint64_t estimates = 0;  // distinct Estimate() calls in all
};

// Both searches, each by exponential then binary search (with a linear
// interpolation guess where memory grows linearly). The result's batch
// satisfies: batch fits, batch + 1 does not (or batch == cap); the same for
// seq. Errors: the setup is invalid (a knob, the GPU name) or the margin is
// not below the GPU's usable bytes.
Result<FitResult> Fit(const ModelSpec& model, const TrainingSetup& setup,
                      const FitOptions& options = {});

// The GPU-count search alone (Fit calls it with search_gpus).
Result<FitGpusSearch> FitGpus(const ModelSpec& model, const TrainingSetup& setup,
                              uint64_t limit_bytes, uint32_t max_gpus);

// --margin text: "2" or "2GiB" (GiB, fractions allowed: "1.5") or "5%" (of
// usable_bytes). Errors: not a number, negative, or not below usable_bytes.
Result<uint64_t> ParseMargin(std::string_view text, uint64_t usable_bytes);

// Human report in GiB and JSON ("max_batch", "max_seq", "margin_bytes",
// "limit_bytes", the estimate at each found point; docs/plan.md). Pure
// functions of the result, in the report stage (src/report/fit_render.cc).
std::string RenderFitText(const FitResult& fit, std::string_view source);
std::string RenderFitJson(const FitResult& fit, std::string_view source, int indent = 2);

// ---------------------------------------------------------------------------
// Sweep
// ---------------------------------------------------------------------------

// Most points one grid or one sweep may have.
inline constexpr uint64_t kMaxSweepPoints = 10000;

// A grid of knob values: "START:STOP:COUNT" (COUNT integers evenly spaced
// from START to STOP inclusive, rounded to the nearest integer (halves up), duplicates
// removed) or "A,B,C" (a list), or one integer. Values ascending and
// distinct, each in 1..2^32. `flag` names the flag in errors ("--seq").
Result<std::vector<uint64_t>> ParseGrid(std::string_view text, std::string_view flag);

// One estimate per combination of the axes' values (one or two axes, distinct
// variables, at most kMaxSweepPoints combinations), the other knobs from
// `setup`. Errors: bad axes, or an estimate's error prefixed with its point
// ("--seq 9000: ...").
// `progress`, when given, is called after each point with (points done,
// points in all), from the worker threads, one call at a time.
using Progress = std::function<void(size_t done, size_t total)>;
Result<SweepResult> Sweep(const ModelSpec& model, const TrainingSetup& setup,
                          const std::vector<SweepAxis>& axes, const Progress& progress = {});

// The setup with `variable` set to `value`.
TrainingSetup WithKnob(TrainingSetup setup, SweepVariable variable, uint64_t value);

// ---------------------------------------------------------------------------
// Step time (a documented model, not a measurement; docs/plan.md)
// ---------------------------------------------------------------------------

// Assumptions of the step-time model, each a named constant so that tests and
// docs quote the same numbers.
// Share of the GPU's peak dense bf16 throughput that eager PyTorch training
// reaches on large matmuls (model FLOPs utilisation of 35-50% is typical).
inline constexpr double kAchievableComputeFraction = 0.40;
// Share of peak HBM bandwidth that elementwise optimizer kernels reach.
inline constexpr double kAchievableBandwidthFraction = 0.80;
// Tokens per micro-batch at which matmuls reach half the achievable rate:
// utilisation = tokens / (tokens + this). A heuristic for small batches.
inline constexpr double kHalfUtilisationTokens = 128;
// fp32 without autocast runs matmuls on FP32 cores: PyTorch >= 1.12 keeps
// TF32 off for matmuls (torch.backends.cuda.matmul.allow_tf32 = False); FP32
// throughput is about 1/16 of dense bf16 on A100 and H100.
inline constexpr double kFp32ComputeShare = 1.0 / 16;

// Several GPUs (docs/plan.md): collectives run at this share of the link's
// bandwidth; nodes talk over one 400 Gb/s NIC per GPU (DGX A100/H100 class
// clusters), 50 GB/s; offloaded optimizer state is read and written by the
// CPU optimizer at this many bytes per second per GPU process (the host's
// memory bandwidth shared by eight processes).
inline constexpr double kAchievableLinkFraction = 0.70;
inline constexpr double kInterNodeGBps = 50;
inline constexpr double kHostOptimizerBytesPerSecond = 25e9;

struct StepTime {
  double forward_flops = 0;  // per optimizer step (all micro-batches)
  double backward_flops = 0;
  double recompute_flops = 0;    // activation checkpointing reruns the forward
  double compute_seconds = 0;    // the FLOPs at the achievable rate
  double dequant_seconds = 0;    // QLoRA: NF4 weights dequantised per matmul pass
  double optimizer_seconds = 0;  // optimizer (and accumulation) memory traffic
  // Several GPUs: gradient / parameter collectives per step (overlapped with
  // compute: only what exceeds it adds to the step), and offload traffic
  // (PCIe both ways plus the CPU optimizer).
  double communication_seconds = 0;
  double offload_seconds = 0;
  double step_seconds = 0;
  double tokens_per_second = 0;  // of all data-parallel replicas together
};

// Time of one optimizer step of `setup` on `gpu`: batch x seq x grad_accum
// tokens. Forward 2·N·tokens FLOPs over the model's matmul weights N (experts
// counted at experts_per_token / num_experts), attention 4·layers·seq²·width
// per sample forward (halved by causal SDPA/flash kernels), backward twice the
// forward (LoRA/QLoRA: the frozen weights' gradients are skipped, so about the
// forward again), recompute the decoder layers' forward again (not the
// lm_head's: checkpointing wraps decoder layers); all at
// kAchievableComputeFraction of peak. Optimizer: bytes read and written per
// trainable parameter over kAchievableBandwidthFraction of HBM bandwidth.
// `trainable_parameters` as the estimate counts them (LoRA adapters).
StepTime EstimateStepTime(const ModelSpec& model, const TrainingSetup& setup, const GpuSpec& gpu,
                          uint64_t trainable_parameters);

// ---------------------------------------------------------------------------
// Strategy ranking (single GPU)
// ---------------------------------------------------------------------------

struct PlanOptions {
  // Tokens per optimizer step; 0: 16 sequences of the setup's seq. Must be a
  // multiple of seq.
  uint64_t tokens_per_step = 0;
  // Only the setup's finetune kind (full / LoRA / QLoRA) instead of all three:
  // they train different things, so a user often has chosen already.
  bool keep_finetune = false;
  // Only the setup's optimizer (else AdamW and 8-bit AdamW are both tried).
  bool keep_optimizer = false;
  // Only the setup's precision (else full fine-tunes with fp32 master weights
  // under bf16 autocast also try bf16 weights).
  bool keep_precision = false;
  // Several GPUs: only the setup's data-parallel mode and offload (else DDP,
  // ZeRO 1-3, FSDP and optimizer offload are tried for full fine-tuning).
  bool keep_parallel = false;
  // Called after each knob set's search with (knob sets done, knob sets in all).
  Progress progress;
};

// One strategy: a setup, its memory (an estimate) and its step time (the
// model above).
struct Strategy {
  TrainingSetup setup;
  // The setup in words, for the renderers (src/report), which cannot name
  // knobs themselves: the knob names live with lowering. `label` is
  // "LoRA, micro-batch 8 x 2, AdamW (fused), gradient checkpointing, ...";
  // `knobs` is DescribeSetup(setup). Plan() sets both.
  std::string label;
  std::vector<std::pair<std::string, std::string>> knobs;
  uint64_t peak_allocated_bytes = 0;
  uint64_t peak_reserved_bytes = 0;
  uint64_t device_total_bytes = 0;
  uint64_t needed_bytes = 0;
  bool oom = false;
  bool fits = false;
  StepTime time;
};

struct PlanResult {
  GpuSpec gpu;
  std::optional<ModelSummary> model;  // of the base setup
  uint64_t seq = 0;
  uint64_t tokens_per_step = 0;
  // Combinations considered (knob sets x micro-batch splits) and estimated:
  // for each knob set the micro-batch splits are tried from the largest down
  // and the first that fits ends it (smaller ones would be slower).
  uint64_t considered = 0;
  uint64_t estimates = 0;
  // Fitting strategies by tokens/s (fastest first), then those that do not
  // fit by needed bytes.
  std::vector<Strategy> strategies;
  // Plain-words lines about the top choices.
  std::vector<std::string> explanation;
};

// Enumerates single-GPU strategies around `setup` (finetune, gradient
// checkpointing, 8-bit AdamW, fused linear cross-entropy, expandable segments,
// micro-batch x accumulation at the setup's seq) and ranks them. Errors: the
// setup is invalid, or tokens_per_step is not a positive multiple of seq.
Result<PlanResult> Plan(const ModelSpec& model, const TrainingSetup& setup,
                        const PlanOptions& options = {});

// Human report (GiB, tokens/s) of the top `top` strategies and the
// explanation; JSON of all of them (docs/plan.md). Pure functions of the
// result, in the report stage (src/report/plan_render.cc, plan_html.cc).
std::string RenderPlanText(const PlanResult& plan, std::string_view source, size_t top = 10);
std::string RenderPlanJson(const PlanResult& plan, std::string_view source, int indent = 2);
// One self-contained offline HTML page: every strategy (tokens/s, step time,
// memory), the explanation and the step-time assumptions; a
// Content-Security-Policy forbids every network request and it has no script.
std::string RenderPlanHtml(const PlanResult& plan, std::string_view source);

}  // namespace vramscope
