// The training setup: the knobs of `vramscope estimate` (names in DESIGN.md).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "vramscope/parallel.h"
#include "vramscope/result.h"

namespace vramscope {

struct ModelSpec;

// The work budget's default (--max-events; docs/hardening.md, "Work budget"):
// every catalog model with the default knobs needs under a tenth of it. An
// event costs about 170 bytes and 1.5 us to lower and simulate, and the bound
// over-counts real setups about 1-4 times, so a setup just under it takes
// at most about 2.5 GiB and half a minute.
inline constexpr uint64_t kDefaultMaxEvents = uint64_t{1} << 24;
// A sweep's points, or validate's records, together: this many times the
// budget of one estimate (docs/hardening.md).
inline constexpr uint64_t kBatchBudgetFactor = 4;

enum class Precision : uint8_t {
  kFp32,       // fp32 weights, no autocast
  kFp16Mixed,  // fp32 weights + autocast(fp16) + GradScaler
  kBf16Mixed,  // fp32 weights + autocast(bf16)
  kFp16,       // weights, grads and optimizer state in fp16
  kBf16,       // weights, grads and optimizer state in bf16
};

enum class OptimizerKind : uint8_t {
  kNone,
  kSgd,
  kSgdMomentum,
  kAdamW /* foreach */,
  kAdamWFused,
  kAdamWForLoop,
  kAdamW8bit,
  kPagedAdamW8bit,
  kPagedAdamW,
  kAdafactor,
  kLion,
};

enum class Finetune : uint8_t { kFull, kLora, kQLora };
enum class GradCkpt : uint8_t { kNone, kFull /* non-reentrant */, kReentrant };
enum class Attention : uint8_t { kEager, kSdpa, kFlash };
// kTrlFused: TRL >= 1.15's fused LM head (trl/trainer/utils.py add_fused_lm_head,
// trl/kernels/chunked_logprob.py ChunkedLogProbFunction, 1.16.0), which
// SFTTrainer and DPOTrainer install: per-token log-probabilities over
// 4096-token x 32768-vocabulary tiles, no full logits.
// kTorchtuneChunked: torchtune's CEWithChunkedOutputLoss (0.6.1
// torchtune/modules/loss/ce_chunked_output_loss.py) over the chunked output of
// its TransformerDecoder: every chunk's logits exist together, each chunk is
// upcast and reduced in turn.
// kLitgptChunked: LitGPT's fine-tuning step (0.5.13 litgpt/finetune/full.py,
// lora.py fit()): `model(input_ids, lm_head_chunk_size=128)` returns a list of
// 128-token logit chunks, `logits[-1] = logits[-1][..., :-1, :]`, and
// litgpt/utils.py chunked_cross_entropy takes each chunk's cross-entropy in the
// logits' dtype; the loop's `logits` keeps every chunk until the next step's
// forward rebinds it.
enum class LossKind : uint8_t {
  kHf,
  kChunked,
  kFusedLinear,
  kTrlFused,
  kTorchtuneChunked,
  kLitgptChunked
};
// Which device's kernels the device-dependent rules follow. kCuda is the product;
// kCpu describes PyTorch's CPU kernels and exists only so that the lowering can be
// compared with traces of the real libraries run on CPU (docs/fidelity.md): no cuBLAS
// workspace, optimizer step counters on the device, dropout masks in the input's dtype.
enum class DeviceRules : uint8_t { kCuda, kCpu };

// The LoRA adapters' dtype. kFp32: PEFT's get_peft_model upcasts 16-bit
// adapters (autocast_adapter_dtype=True, peft 0.12-0.21), and each adapted
// layer casts its input to fp32. kModel: the adapters are made in the model's
// dtype, as torchtune's LoRALinear under the recipes' set_default_dtype
// (torchtune 0.6.1 modules/peft/lora.py) and LitGPT's lora.py under Fabric's
// *-true precision do; the input is used as it is.
enum class LoraDtype : uint8_t { kFp32, kModel };

// Whose modules run the architecture. kTransformers: transformers' modeling
// code (LlamaForCausalLM and its family). kTorchtune: torchtune 0.6.1's own
// TransformerDecoder for the same architecture (modules/transformer.py,
// attention.py, rms_norm.py, position_embeddings.py): RMSNorm over x.float(),
// rotary embeddings from a max_seq_len cache in fp32, no KV cache in training.
// kLitgpt: LitGPT 0.5.13's own GPT (litgpt/model.py): one fused qkv Linear,
// RMSNorm over x.float(), RoPE from fp32 cos / sin buffers, k / v
// repeat_interleave'd for grouped queries, no KV cache in training.
enum class ModelImpl : uint8_t { kTransformers, kTorchtune, kLitgpt };

struct TrainingSetup {
  uint64_t batch = 1;
  uint64_t seq = 2048;
  uint64_t grad_accum = 1;
  uint32_t steps = 3;  // optimizer steps simulated
  Precision precision = Precision::kBf16Mixed;
  OptimizerKind optimizer = OptimizerKind::kAdamW;
  Finetune finetune = Finetune::kFull;
  uint64_t lora_rank = 16;
  std::vector<std::string> lora_targets = {"q", "v"};
  double lora_dropout = 0.05;
  LoraDtype lora_dtype = LoraDtype::kFp32;
  ModelImpl impl = ModelImpl::kTransformers;
  GradCkpt grad_ckpt = GradCkpt::kNone;
  Attention attn = Attention::kSdpa;
  LossKind loss = LossKind::kHf;
  // transformers release whose behaviour is modelled, as major*100 + minor
  // (4.57 -> 457). Matters for the loss path (<= 4.45, 4.46-4.48, >= 4.49)
  // and for mixture-of-experts layers (>= 5.0: stacked experts, grouped_mm).
  // Default: 5.23, the newest stable release on PyPI when this was set.
  int transformers_version = 524;
  // torch release, major*100 + minor (2.11 -> 211). Matters for SDPA's
  // enable_gqa (>= 2.5) and cuBLAS workspace sizes.
  int torch_version = 213;
  // Mixture-of-experts routing: 0 = dropless (transformers, Megatron's
  // default); F > 0: every expert processes ceil(F * tokens * k / E) tokens
  // (capacity, padded). Imbalance R >= 1: the busiest expert gets R times its
  // even share of tokens (dropless only).
  double moe_capacity_factor = 0;
  double moe_imbalance = 1;
  bool optimizer_in_backward = false;
  bool activation_offload = false;
  // TRL's DPOTrainer (trl 1.16.0 trainer/dpo_trainer.py; with loss kTrlFused):
  // `batch` counts preference pairs, and each micro-batch runs the chosen and
  // rejected rows together (2 x batch), then a no-grad forward of the
  // reference (a frozen copy of the weights under full fine-tuning, the model
  // with its adapters disabled under PEFT) unless its log-probabilities were
  // precomputed (precompute_ref_log_probs: then no copy either). Dropout is
  // off in both models (DPOConfig.disable_dropout, default true).
  bool dpo = false;
  bool dpo_precompute_ref = false;
  // Padding-free packing: the micro-batch's `batch` sequences of `seq` tokens
  // are concatenated into one row, with position_ids restarting at each and
  // no attention_mask (transformers' DataCollatorWithFlattening, TRL's
  // padding_free / packing_strategy "bfd"). transformers >= 4.54 then finds
  // the sequences in position_ids and, for SDPA and eager attention without a
  // cache, materializes a block-diagonal causal mask over the whole row.
  bool packed = false;
  // Liger-Kernel's kernels as `use_liger_kernel=True` applies them
  // (liger_kernel 0.8.5 transformers/monkey_patch.py, apply_liger_kernel_to_llama /
  // _mistral / _qwen2 with their defaults): LigerRMSNorm, liger_rotary_pos_emb,
  // LigerSwiGLUMLP, and the fused linear cross-entropy (loss kFusedLinear, or
  // TRL's own fused head under kTrlFused). Lowered in lower/transformer.cc and
  // lower/ops.cc (Liger*).
  bool liger = false;
  // The batch carries an attention_mask (tokenizers and transformers' data
  // collators add one); false: model(input_ids=..., labels=...) alone, which
  // transformers 4.54-4.x turns into a materialized causal mask when no cache
  // is in use (lower/transformer.cc).
  bool attention_mask = true;
  // false: the script sets model.config.use_cache = False (as the ground-truth
  // harness and many training scripts do), so no DynamicCache is made in
  // training whatever config.json says (lower/transformer.cc MakesTrainingCache).
  bool use_cache = true;
  // The model is built with from_config under torch.device("cuda") (pretraining
  // from scratch, and the ground-truth harness) rather than loaded with
  // from_pretrained: a tied head's own weight exists from its construction
  // until post_init ties it (lower/placement.cc PlaceParameters).
  bool built_on_gpu = false;
  // Diffusion UNets (ModelSpec::is_unet). The image side in pixels (0: the
  // config's sample_size x vae_scale, the size the model was trained at), the
  // VAE's downsampling factor between pixels and the latents the UNet sees (8
  // for Stable Diffusion's AutoencoderKL: 2 ** (len(vae block_out_channels) -
  // 1); 1 for a pixel-space UNet), and the text encoder's tokens per prompt
  // (CLIP's 77) that cross-attention reads.
  // text_len 0: the model's default (TextLen below). FLUX transformers read the
  // same three knobs (the image defaulting to the dreambooth scripts' 512 px).
  uint64_t image_size = 0;
  uint64_t vae_scale = 8;
  uint64_t text_len = 0;
  // T5 (seq2seq): decoder tokens per sample, the labels' length (0: --seq,
  // which is the encoder's source length).
  uint64_t target_len = 0;
  // --vae: the frozen AutoencoderKL (ModelSpec::is_vae) of a UNet or FLUX step,
  // on the GPU in the scripts' weight_dtype and encoding each micro-batch's
  // pixels (lower/vae.h); null: latents precomputed, no VAE counted.
  // `vae_name` is the flag's value as given (reports).
  std::shared_ptr<const ModelSpec> vae;
  std::string vae_name;
  // diffusers' EMAModel (training_utils.py, 0.42.1) of a UNet's weights, as
  // train_text_to_image.py --use_ema keeps it: an fp32 shadow of every
  // parameter on the GPU, stepped after the optimizer (--foreach_ema: with
  // torch._foreach ops).
  bool ema = false;
  bool ema_foreach = false;
  // --text-encoder NAME|FILE (repeatable): frozen text encoders a diffusion
  // step keeps on the GPU in weight_dtype and runs under no_grad each
  // micro-batch (lower/frozen_encoder.cc). The caller resolves the names (the
  // CLI through its ModelIo) into `text_encoders`, in the same order. Empty:
  // the embeddings were precomputed, as before.
  std::vector<std::string> text_encoder_names;
  std::vector<std::shared_ptr<const ModelSpec>> text_encoders;
  std::string gpu = "h100-80g";
  std::string alloc_conf;
  DeviceRules device_rules = DeviceRules::kCuda;
  // GPUs and how they share the work (one GPU by default).
  ParallelLayout parallel;
  // Not a training knob: the work budget (--max-events), the most events
  // the lowering may be expected to produce for this setup (EstimateLoweringWork
  // in lower.h). Not shown in reports.
  uint64_t max_events = kDefaultMaxEvents;
  // Knobs the user did not type, each with where its value came from: the
  // flag and "FILE: KEY" ({"--batch", "ds.json: train_micro_batch_size_per_gpu"},
  // a --vae config's downsampling for --vae-scale). An error about such a
  // knob names that file and key, not a flag the user never typed
  // (AttributeKnobError). Not shown in reports.
  std::vector<std::pair<std::string, std::string>> knob_sources;
  // Whether `precision` is still to be decided from the model (neither
  // --precision nor a --from file named one): ApplyLibraryDefaults does,
  // and says whose default it took in `precision_default`, which the
  // report's Assumed section quotes. Empty: the precision was given.
  bool precision_auto = false;
  std::string precision_default;
  // The same for the optimizer (neither --optimizer nor a --from file named
  // one): ApplyLibraryDefaults picks the one the user's trainer builds.
  bool optimizer_auto = false;
};

// The precision a run gets when none was given (precision_auto; issue 40):
// what the user's libraries do by default. transformers >= 5 (its
// from_pretrained dtype="auto") loads the checkpoint's dtype (config.json's
// dtype / torch_dtype: bfloat16 -> bf16, float16 -> fp16, float32 or none ->
// fp32 weights under the Trainer's bf16 autocast, bf16-mixed); 4.x loads
// float32 (bf16-mixed). Frameworks with their own default keep it:
// torchtune's recipe configs (dtype: bf16), LitGPT (bf16-mixed), diffusers'
// scripts, DeepSpeed ZeRO, accelerate's FSDP and Megatron-LM (fp32 master
// weights: bf16-mixed). Does nothing unless s->precision_auto.
//
// The optimizer, when none was given (optimizer_auto): the HF Trainer's
// default, torch.optim.AdamW(fused=True) on torch >= 2.8, wherever the
// Trainer builds it (the transformers implementation without DeepSpeed,
// Megatron or a diffusers script); elsewhere torch's foreach AdamW.
void ApplyLibraryDefaults(const ModelSpec& model, TrainingSetup* s);

// `error` as the user should read it: when its message starts with a flag
// ("--batch: 70000 is outside 1..65536") whose value came from a file
// (`sources`, TrainingSetup::knob_sources), the flag is replaced by that file
// and key ("ds.json: train_micro_batch_size_per_gpu: 70000 is outside
// 1..65536"). Any other error is returned as it is.
Error AttributeKnobError(Error error,
                         const std::vector<std::pair<std::string, std::string>>& sources);

// What the lowering accepts (Lower rejects a setup outside these, with the
// flag's name); the planners (fit, plan) search within them.
inline constexpr uint64_t kMaxBatch = 65536;
inline constexpr uint64_t kMaxSeq = uint64_t{1} << 22;
inline constexpr uint64_t kMaxTokensPerMicroBatch = uint64_t{1} << 26;  // batch x seq
inline constexpr uint64_t kMaxGradAccum = 4096;
inline constexpr uint32_t kMaxSteps = 16;

std::string_view PrecisionName(Precision p);
std::string_view OptimizerName(OptimizerKind o);
std::string_view FinetuneName(Finetune f);
std::string_view GradCkptName(GradCkpt g);
std::string_view AttentionName(Attention a);
std::string_view LossName(LossKind l);
std::string_view DeviceRulesName(DeviceRules d);
std::string_view LoraDtypeName(LoraDtype d);
std::string_view ModelImplName(ModelImpl m);

Result<Precision> ParsePrecision(std::string_view text);
Result<OptimizerKind> ParseOptimizer(std::string_view text);
Result<Finetune> ParseFinetune(std::string_view text);
Result<GradCkpt> ParseGradCkpt(std::string_view text);
Result<Attention> ParseAttention(std::string_view text);
Result<LossKind> ParseLoss(std::string_view text);
Result<DeviceRules> ParseDeviceRules(std::string_view text);
Result<LoraDtype> ParseLoraDtype(std::string_view text);
Result<ModelImpl> ParseModelImpl(std::string_view text);
// "4.46" -> 446.
Result<int> ParseVersion(std::string_view text, std::string_view field);
// "q,k,v" or "all-linear".
Result<std::vector<std::string>> ParseLoraTargets(std::string_view text);

// Knob pairs for reports, in DESIGN.md's flag names.
std::vector<std::pair<std::string, std::string>> DescribeSetup(const TrainingSetup& s);

// --text-len, or the model's default when it is 0: CLIP's 77 tokens for a
// diffusion UNet; T5's max_sequence_length for a FLUX transformer, 512 with the
// guidance embedding (FLUX.1-dev: the dreambooth scripts' default) and 256
// without (FLUX.1-schnell: FluxPipeline refuses more).
uint64_t TextLen(const ModelSpec& model, const TrainingSetup& setup);

}  // namespace vramscope
