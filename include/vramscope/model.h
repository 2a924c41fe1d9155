// Model description: what lowering needs to know about a transformer, read
// from a Hugging Face config.json (ingest stage), plus its exact parameter list.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "vramscope/result.h"

namespace vramscope {

enum class DType : uint8_t { kFloat32, kFloat16, kBFloat16, kInt8, kUInt8, kNF4 };
// Bytes per element; kNF4 returns 0 (use packed sizes).
uint64_t DTypeBytes(DType d);
std::string_view DTypeName(DType d);

enum class NormKind : uint8_t {
  kRmsNorm,         // LlamaRMSNorm: fp32 upcast, weight * normed.to(dtype)
  kRmsNormGemma,    // GemmaRMSNorm: (1 + weight) multiplied in fp32
  kLayerNorm,       // nn.LayerNorm with bias
  kLayerNormNoBias  // LayerNorm without bias (e.g. OLMo-style); rare
};

enum class MlpKind : uint8_t {
  kGatedSilu,      // down(silu(gate(x)) * up(x)) — llama, mistral, qwen2
  kGatedGeluTanh,  // down(gelu_tanh(gate(x)) * up(x)) — gemma
  kGelu,           // fc2(gelu(fc1(x))): one aten::gelu (exact or tanh) — gpt_neox, falcon, bert
  kRelu,           // opt
  // transformers' activations.py writes these in Python, one eager op per term,
  // so autograd saves several intermediate-size tensors (ops.h GeluNew):
  kGeluNew,      // "gelu_new" (NewGELUActivation) — gpt2, phi
  kGeluFast,     // "gelu_fast" (FastGELUActivation)
  kQuickGelu,    // "quick_gelu" (QuickGELUActivation)
  kFusedGateUp,  // phi3: gate_up_proj fused, silu
};

enum class PositionKind : uint8_t { kRope, kLearned, kAlibi, kNone };

// How a model with fewer key/value heads than query heads feeds attention.
enum class KvSharing : uint8_t {
  kAttentionInterface,  // transformers' attention functions: repeat_kv, or enable_gqa in SDPA
  kBroadcast,           // k/v with their own head count straight into SDPA / matmul
                        // (falcon multi_query): fused SDPA kernels refuse it, matmul
                        // broadcasts by copying
  kExpanded,            // the model copies k/v to every query head first
                        // (falcon new_decoder_architecture: broadcast_to + flatten)
};

// What a parameter tensor is for: the lowering places, shards, quantizes and
// attaches adapters by role (docs/models.md lists which tensors get which).
enum class ParamRole : uint8_t {
  kUnknown,    // stored in a checkpoint but not created by the config
  kEmbed,      // token embeddings (also a tied lm_head)
  kPosEmbed,   // learned positions (BERT: also relative distances)
  kTypeEmbed,  // BERT token-type embeddings
  kQ,
  kK,
  kV,
  kO,    // attention projections
  kQkv,  // fused q/k/v projection
  kGate,
  kUp,
  kDown,    // dense MLP (up/down also name non-gated fc1/fc2)
  kGateUp,  // fused gate/up projection (phi3)
  kRouter,  // MoE router (`gate` Linear)
  kExpertGate,
  kExpertUp,
  kExpertDown,  // routed experts
  kSharedGate,
  kSharedUp,
  kSharedDown,        // qwen2_moe shared expert
  kSharedExpertGate,  // qwen2_moe shared expert's sigmoid gate
  kNorm,              // every norm weight and norm bias
  kBias,              // a Linear's bias (the lowering reads it with its weight's role)
  kLmHead,            // untied output projection (and its bias, through kBias)
  kHeadDense,         // BERT MLM head transform
  kProjIn,
  kProjOut,    // OPT embedding projections
  kVision,     // Gemma 3 vision tower
  kProjector,  // Gemma 3 multimodal projector
  kConv,       // a diffusers UNet's convolutions (conv_in, resnets, samplers, conv_out)
  kTimeEmbed,  // a diffusers UNet's time / added-condition embedding MLPs and time_emb_proj
  // FLUX's text-stream attention projections (add_q_proj, add_k_proj,
  // add_v_proj, to_add_out): PEFT's to_q / to_k / to_v / to_out.0 targets do
  // not match them.
  kContextProj,
};
// The role's name as docs/models.md and --lora-targets spell it ("q", "gate_up",
// "expert_down", ...).
std::string_view ParamRoleName(ParamRole r);
// A routed expert's gate, up or down projection.
bool IsRoutedExpert(ParamRole r);
// Embeddings and what widens them: they live with the first pipeline stage.
bool IsInputSide(ParamRole r);

// One parameter tensor with its Hugging Face name.
struct ParamTensor {
  std::string name;  // "model.layers.0.self_attn.q_proj.weight"
  std::vector<uint64_t> shape;
  uint64_t numel = 0;
  int layer = -1;                 // decoder layer index, -1 outside layers
  bool is_linear_weight = false;  // nn.Linear weight (candidate for LoRA/quantization)
  // transformers' Conv1D (GPT-2): the weight is stored [in, out], not [out, in].
  bool conv1d = false;
  std::string module;  // "model.layers.0.self_attn.q_proj"
  ParamRole role = ParamRole::kUnknown;
  // Added by ingest: the dtype stored in the checkpoint as safetensors spells it
  // ("BF16", "F32", "U8", ...). Empty when the list was derived from config.json.
  std::string stored_dtype;
};

// A diffusers UNet2DConditionModel (diffusers 0.42 models/unets/unet_2d_condition.py):
// what its config.json says about the blocks, read by ingest (family_unet.cc).
struct UNetSpec {
  uint64_t in_channels = 4, out_channels = 4;
  uint64_t sample_size = 64;  // latent side the model was trained at
  std::vector<uint64_t> block_out_channels;
  uint64_t layers_per_block = 2;
  // Per down block (the up blocks mirror them): cross-attention or not, the
  // BasicTransformerBlocks per Transformer2DModel, attention heads.
  std::vector<bool> down_cross, up_cross;
  std::vector<uint64_t> transformer_layers, heads;
  bool mid_block = true;  // UNetMidBlock2DCrossAttn (else mid_block_type null)
  uint64_t cross_attention_dim = 768;
  uint64_t norm_groups = 32;
  bool linear_projection = false;  // use_linear_projection: Linear proj_in / proj_out
  uint64_t time_embed_dim = 0;     // block_out_channels[0] * 4
  // addition_embed_type "text_time" (SDXL): add_time_proj + add_embedding.
  bool text_time = false;
  uint64_t addition_time_embed_dim = 0;
  uint64_t projection_class_embeddings_input_dim = 0;
};

// ViTForImageClassification (transformers models/vit): the image it was
// trained at and its patch grid.
struct VitSpec {
  uint64_t image_size = 224, patch_size = 16, num_channels = 3;
  uint64_t Patches() const { return (image_size / patch_size) * (image_size / patch_size); }
};

// CLIP (transformers 5.24.0 models/clip/modeling_clip.py, configuration_clip.py):
// a causal text tower and/or a ViT-like vision tower (class token,
// pre_layrnorm), each of CLIPEncoderLayers. Read by family_clip.cc; lowered by
// src/lower/clip.cc (CLIPModel's contrastive step, or a frozen text encoder of
// a diffusion step).
struct ClipTower {
  uint64_t hidden = 0, intermediate = 0, layers = 0, heads = 0;
  MlpKind act = MlpKind::kQuickGelu;  // CLIP*Config.hidden_act, default quick_gelu
  double attention_dropout = 0;
};
struct ClipSpec {
  bool has_text = false, has_vision = false;
  ClipTower text, vision;
  uint64_t vocab_size = 49408, max_positions = 77;  // CLIPTextConfig
  uint64_t eos_token_id = 49407;
  uint64_t image_size = 224, patch_size = 32, num_channels = 3;  // CLIPVisionConfig
  uint64_t projection_dim = 512;
  bool text_projection = false;    // CLIPModel, CLIPTextModelWithProjection
  bool visual_projection = false;  // CLIPModel, CLIPVisionModelWithProjection
  bool logit_scale = false;        // CLIPModel
  uint64_t Patches() const { return (image_size / patch_size) * (image_size / patch_size); }
};

// A diffusers FluxTransformer2DModel (diffusers 0.42.1
// models/transformers/transformer_flux.py): FLUX.1-dev / schnell's MMDiT,
// read by ingest (family_flux.cc); its training step is lowered by
// src/lower/flux.cc.
struct FluxSpec {
  uint64_t patch_size = 1;
  uint64_t in_channels = 64, out_channels = 64;  // out_channels null: in_channels
  uint64_t num_layers = 19;                      // FluxTransformerBlock (double stream)
  uint64_t num_single_layers = 38;               // FluxSingleTransformerBlock
  uint64_t attention_head_dim = 128, num_attention_heads = 24;
  uint64_t joint_attention_dim = 4096;   // T5 states' width (context_embedder's input)
  uint64_t pooled_projection_dim = 768;  // pooled CLIP projection's width
  bool guidance_embeds = false;          // dev: true (a guidance_embedder MLP)
  std::vector<uint64_t> axes_dims_rope = {16, 56, 56};
};

// T5 (transformers 5.24.0 models/t5/modeling_t5.py, configuration_t5.py): an
// encoder stack and a decoder stack sharing one embedding. ModelSpec's
// num_layers counts both stacks (encoder blocks first); head_dim is d_kv,
// whose heads x d_kv inner width may differ from d_model.
struct T5Spec {
  uint64_t encoder_layers = 6, decoder_layers = 6;
  uint64_t num_buckets = 32, max_distance = 128;  // relative_attention_*
  bool gated = false;                 // feed_forward_proj "gated-*" (T5DenseGatedActDense)
  bool scale_decoder_outputs = true;  // `* d_model**-0.5` before lm_head (tied embeddings)
  bool encoder_only = false;          // T5EncoderModel (no decoder, no head)
  double dropout = 0.1;               // dropout_rate
  uint64_t Inner(uint64_t heads, uint64_t d_kv) const { return heads * d_kv; }
};

// A diffusers AutoencoderKL (diffusers 0.42.1 models/autoencoders/
// autoencoder_kl.py), read by ingest (family_vae.cc): not trained itself, but
// the frozen VAE of a UNet or FLUX training step (--vae), whose encoder turns
// each micro-batch's pixels into latents (src/lower/vae.cc).
struct VaeSpec {
  uint64_t in_channels = 3, out_channels = 3;
  std::vector<uint64_t> block_out_channels = {64};
  uint64_t layers_per_block = 1;
  uint64_t latent_channels = 4;
  uint64_t norm_groups = 32;
  uint64_t sample_size = 32;
  double scaling_factor = 0.18215;
  bool has_shift_factor = false;  // shift_factor null: none (SD); FLUX: 0.1159
  double shift_factor = 0;
  bool mid_attention = true;  // mid_block_add_attention
  bool quant_conv = true, post_quant_conv = true;
  bool force_upcast = true;  // read for the record: the training scripts ignore it
  // 2 ** (len(block_out_channels) - 1): pixels per latent.
  uint64_t Downsampling() const { return uint64_t{1} << (block_out_channels.size() - 1); }
};

struct ModelSpec {
  std::string name;          // catalog alias or path as given
  std::string hub_id;        // "meta-llama/Meta-Llama-3-8B" when known
  std::string model_type;    // config.json "model_type": "llama", "qwen2", ...
  std::string architecture;  // "LlamaForCausalLM"
  bool is_encoder = false;   // bert (masked LM, or sequence classification)
  // A sequence-classification head (BertForSequenceClassification): the
  // pooler and a classifier of this many labels in place of the MLM head;
  // 1 label is regression (MSELoss), more are single-label classification
  // (CrossEntropyLoss). 0: no such head.
  uint64_t num_labels = 0;
  double classifier_dropout = 0;
  // BertForTokenClassification: the classifier on every token (no pooler),
  // CrossEntropyLoss over tokens; num_labels as above.
  bool token_classification = false;
  bool is_unet = false;  // a diffusers UNet2DConditionModel: `unet` holds its layout
  UNetSpec unet;
  bool is_vit = false;  // ViTForImageClassification: `vit` holds the image; num_labels the head
  VitSpec vit;
  bool is_flux = false;  // a diffusers FluxTransformer2DModel: `flux` holds its layout
  FluxSpec flux;
  bool is_t5 = false;  // T5ForConditionalGeneration / T5EncoderModel: `t5` holds its layout
  T5Spec t5;
  bool is_clip = false;  // clip / clip_text_model / clip_vision_model: `clip` holds the towers
  ClipSpec clip;
  bool is_vae = false;  // a diffusers AutoencoderKL: `vae` holds its layout (--vae only)
  VaeSpec vae;

  uint64_t hidden_size = 0;
  uint64_t intermediate_size = 0;
  uint64_t num_layers = 0;
  uint64_t num_heads = 0;
  uint64_t num_kv_heads = 0;
  uint64_t head_dim = 0;  // may differ from hidden/heads (gemma)
  uint64_t vocab_size = 0;
  uint64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;

  NormKind norm = NormKind::kRmsNorm;
  MlpKind mlp = MlpKind::kGatedSilu;
  PositionKind position = PositionKind::kRope;
  double partial_rotary_factor = 1.0;
  // rope_scaling / rope_parameters rope_type "llama3" (Llama 3.1 and later):
  // torchtune builds those with Llama3ScaledRoPE and one rotary module shared
  // by every layer, also under LoRA.
  bool rope_llama3_scaled = false;
  bool qkv_bias = false;  // qwen2
  bool o_bias = false;
  bool mlp_bias = false;
  bool fused_qkv = false;  // phi3, falcon, gpt_neox, gpt2 (c_attn)
  KvSharing kv_sharing = KvSharing::kAttentionInterface;
  bool parallel_attn = false;          // falcon-7b, phi-2, gpt_neox(use_parallel_residual)
  bool qk_norm = false;                // qwen3, gemma3
  bool sandwich_norm = false;          // gemma2/3: four norms per layer
  uint64_t sliding_window = 0;         // 0 = none
  double final_logit_softcapping = 0;  // gemma2
  double attn_logit_softcapping = 0;   // gemma2
  double attention_dropout = 0;
  double hidden_dropout =
      0;  // on the embeddings: gpt2/phi embd_pdrop, gpt_neox, bert hidden_dropout_prob
  // On the attention and the MLP output before each residual add (gpt2 resid_pdrop,
  // opt dropout, phi/phi3 resid_pdrop, gpt_neox hidden_dropout).
  double residual_dropout = 0;
  // OPT with do_layer_norm_before: false (opt-350m): LayerNorm after each residual
  // add, no final norm.
  bool post_norm = false;
  // config.json use_cache: a decoder called in training without gradient
  // checkpointing still fills a DynamicCache (lower/transformer.cc).
  bool use_cache = true;

  // Mixture of experts (mixtral, qwen2_moe, qwen3_moe); 0 experts = dense.
  uint64_t num_experts = 0;
  uint64_t experts_per_token = 0;
  uint64_t moe_intermediate_size = 0;
  uint64_t shared_expert_intermediate_size = 0;  // qwen2_moe
  // The router renormalizes its top-k weights in place (`/= sum(-1)`):
  // always for mixtral, config "norm_topk_prob" for qwen2_moe / qwen3_moe.
  bool norm_topk_prob = false;
  uint64_t decoder_sparse_step = 1;
  std::vector<uint64_t> mlp_only_layers;  // dense layers in a MoE model

  std::string torch_dtype;  // as in config.json ("bfloat16"), may be empty

  // Every parameter tensor, in module order (embeddings, layers, final norm,
  // lm_head). A tied lm_head is not listed twice.
  std::vector<ParamTensor> params;

  // Added by ingest. True when `params` (names, shapes, stored_dtype) was read
  // from safetensors headers in a model directory rather than derived from
  // config.json alone.
  bool params_from_safetensors = false;
  // Added by ingest: one-line remarks a user may want to see (defaults that
  // were assumed for missing keys, checkpoint tensors that were skipped as
  // buffers, parts of a multimodal checkpoint). Never errors.
  std::vector<std::string> notes;

  uint64_t ParameterCount() const;
};

// Architectures (config.json "model_type") vramscope lowers.
const std::vector<std::string>& SupportedModelTypes();

// Parses config.json text. `name` is used in error messages.
Result<ModelSpec> ParseModelConfig(std::string_view json_text, std::string_view name);

// Resolving a model name (a path, the catalog, the Hugging Face Hub) takes the
// outside world as an argument: ResolveModel(name, ModelIo) in vramscope/model_io.h.

struct CatalogEntry {
  std::string alias;                  // "llama-3-8b"
  std::string hub_id;                 // "meta-llama/Meta-Llama-3-8B"
  std::string family;                 // "Llama 3"
  uint64_t reference_parameters = 0;  // published count (see source)
  std::string reference_source;
};
const std::vector<CatalogEntry>& ModelCatalog();
// Finds a catalog entry by alias or hub id (case-insensitive) and parses it.
Result<ModelSpec> LoadCatalogModel(std::string_view alias_or_id);

}  // namespace vramscope
