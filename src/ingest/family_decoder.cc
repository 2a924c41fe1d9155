// Llama-style decoders: embed_tokens, N x (self_attn, mlp, norms), norm, lm_head.
// Defaults are those of the transformers 4.5x configuration_<type>.py classes.
#include <fmt/format.h>

#include "families.h"

namespace vramscope::ingest {
namespace {

// What a config class assumes when a key is absent.
struct DecoderDefaults {
  const char* architecture;
  uint64_t vocab, hidden, intermediate, layers, heads;
  uint64_t kv_heads;  // 0: num_attention_heads (the class default is None)
  uint64_t head_dim;  // 0: hidden_size / num_attention_heads
  uint64_t max_positions;
  bool tie_word_embeddings;
};

// The keys every llama-style config shares.
void ReadDecoderCore(ConfigReader& r, ModelSpec& s, const DecoderDefaults& d) {
  s.architecture = ReadArchitecture(r, d.architecture);
  // GenericForSequenceClassification (modeling_layers.py, 4.57.6 / 5.24.0): a
  // bias-free `score` in place of lm_head (reward models).
  if (s.architecture.ends_with("ForSequenceClassification")) ReadSequenceClassification(r, s);
  s.vocab_size = ReadSize(r, s, {"vocab_size"}, d.vocab, kMaxVocab);
  s.hidden_size = ReadSize(r, s, {"hidden_size"}, d.hidden, kMaxHidden);
  s.intermediate_size = ReadSize(r, s, {"intermediate_size"}, d.intermediate, kMaxIntermediate);
  s.num_layers = ReadSize(r, s, {"num_hidden_layers"}, d.layers, kMaxLayers);
  s.num_heads = ReadSize(r, s, {"num_attention_heads"}, d.heads, kMaxHeads);
  // An explicit null means "same as num_attention_heads" in every class; an
  // absent key takes the class default, which is a number for some (mistral: 8).
  if (r.Has("num_key_value_heads")) {
    s.num_kv_heads = r.Uint("num_key_value_heads", 1, 1, kMaxHeads);
  } else if (r.IsNull("num_key_value_heads") || d.kv_heads == 0) {
    s.num_kv_heads = s.num_heads;
  } else {
    s.num_kv_heads = d.kv_heads;
  }
  if (r.Has("head_dim")) {
    s.head_dim = r.Uint("head_dim", 1, 1, kMaxHeadDim);
  } else if (d.head_dim != 0) {
    s.head_dim = d.head_dim;
  } else {
    s.head_dim = DerivedHeadDim(r, s, "hidden_size", "num_attention_heads");
  }
  if (r.ok()) CheckKvHeads(r, s, "num_key_value_heads");
  s.max_position_embeddings = r.Uint("max_position_embeddings", d.max_positions, 1, kMaxPositions);
  s.tie_word_embeddings = r.Bool("tie_word_embeddings", d.tie_word_embeddings);
  s.attention_dropout = r.Number("attention_dropout", 0.0, 0.0, 1.0);
  s.torch_dtype = ReadTorchDtype(r);
  s.norm = NormKind::kRmsNorm;
  s.mlp = MlpKind::kGatedSilu;
  s.position = PositionKind::kRope;
}

// A window size where JSON null means "no sliding window" (0).
uint64_t ReadWindow(ConfigReader& r, uint64_t def) {
  if (r.IsNull("sliding_window")) return 0;
  return r.Uint("sliding_window", def, 0, kMaxPositions);
}

// qwen2 / qwen3 family: the window applies only with use_sliding_window.
void ReadQwenWindow(ConfigReader& r, ModelSpec& s) {
  bool use = r.Bool("use_sliding_window", false);
  uint64_t window = ReadWindow(r, 4096);
  s.sliding_window = use ? window : 0;
}

void ReadMoe(ConfigReader& r, ModelSpec& s, const char* experts_key, uint64_t experts,
             uint64_t top_k, uint64_t moe_intermediate) {
  s.num_experts = r.Uint(experts_key, experts, 0, kMaxExperts);
  s.experts_per_token = r.Uint("num_experts_per_tok", top_k, 1, kMaxExperts);
  s.moe_intermediate_size = moe_intermediate == 0 ? s.intermediate_size
                                                  : r.Uint("moe_intermediate_size",
                                                           moe_intermediate, 1, kMaxIntermediate);
  s.decoder_sparse_step = r.Uint("decoder_sparse_step", 1, 1, kMaxLayers);
  s.mlp_only_layers = r.UintList("mlp_only_layers", kMaxLayers);
  for (uint64_t layer : s.mlp_only_layers) {
    if (layer >= s.num_layers) {
      r.Fail("mlp_only_layers",
             fmt::format("layer {} is not below num_hidden_layers {}", layer, s.num_layers));
    }
  }
  if (s.num_experts > 0 && s.experts_per_token > s.num_experts) {
    r.Fail("num_experts_per_tok",
           fmt::format("{} exceeds the {} experts", s.experts_per_token, s.num_experts));
  }
}

// rope_scaling's rope_type (or its older spelling `type`), also under
// transformers 5.x's rope_parameters; "" when absent.
std::string RopeType(ConfigReader& r) {
  for (std::string_view nested : {"rope_parameters", "rope_scaling"}) {
    const nlohmann::json* obj = r.Object(nested);
    if (!obj) continue;
    ConfigReader inner(*obj, fmt::format("{}: {}", r.context(), nested));
    std::string type = inner.String("rope_type", inner.String("type", ""));
    r.Adopt(inner);
    if (!type.empty()) return type;
  }
  return "";
}

void ReadLlama(ConfigReader& r, ModelSpec& s, ArchDetails&) {
  ReadDecoderCore(r, s, {"LlamaForCausalLM", 32000, 4096, 11008, 32, 32, 0, 0, 2048, false});
  bool attention_bias = r.Bool("attention_bias", false);
  s.qkv_bias = s.o_bias = attention_bias;
  s.mlp_bias = r.Bool("mlp_bias", false);
  s.rope_llama3_scaled = RopeType(r) == "llama3";
}

void ReadMistral(ConfigReader& r, ModelSpec& s, ArchDetails&) {
  ReadDecoderCore(r, s, {"MistralForCausalLM", 32000, 4096, 14336, 32, 32, 8, 0, 131072, false});
  s.sliding_window = ReadWindow(r, 4096);
}

void ReadMixtral(ConfigReader& r, ModelSpec& s, ArchDetails&) {
  ReadDecoderCore(r, s, {"MixtralForCausalLM", 32000, 4096, 14336, 32, 32, 8, 0, 131072, false});
  s.sliding_window = ReadWindow(r, 0);
  // Mixtral experts use intermediate_size; the config has no separate key.
  ReadMoe(r, s, "num_local_experts", 8, 2, 0);
  if (s.num_experts == 0) r.Fail("num_local_experts", "0 experts");
  // MixtralSparseMoeBlock (4.x) / MixtralTopKRouter (5.x): routing_weights /=
  // routing_weights.sum(dim=-1, keepdim=True), unconditionally.
  s.norm_topk_prob = true;
}

void ReadQwen2(ConfigReader& r, ModelSpec& s, ArchDetails&) {
  ReadDecoderCore(r, s, {"Qwen2ForCausalLM", 151936, 4096, 22016, 32, 32, 32, 0, 32768, false});
  s.qkv_bias = true;  // Qwen2Attention: q/k/v bias=True, o_proj bias=False
  ReadQwenWindow(r, s);
}

void ReadQwen2Moe(ConfigReader& r, ModelSpec& s, ArchDetails&) {
  ReadDecoderCore(r, s, {"Qwen2MoeForCausalLM", 151936, 2048, 5632, 24, 16, 16, 0, 32768, false});
  s.qkv_bias = r.Bool("qkv_bias", true);
  ReadQwenWindow(r, s);
  ReadMoe(r, s, "num_experts", 60, 4, 1408);
  s.norm_topk_prob = r.Bool("norm_topk_prob", false);
  s.shared_expert_intermediate_size =
      r.Uint("shared_expert_intermediate_size", 5632, 0, kMaxIntermediate);
}

void ReadQwen3(ConfigReader& r, ModelSpec& s, ArchDetails&) {
  ReadDecoderCore(r, s, {"Qwen3ForCausalLM", 151936, 4096, 22016, 32, 32, 32, 128, 32768, false});
  s.qkv_bias = s.o_bias = r.Bool("attention_bias", false);
  s.qk_norm = true;
  ReadQwenWindow(r, s);
}

void ReadQwen3Moe(ConfigReader& r, ModelSpec& s, ArchDetails&) {
  ReadDecoderCore(r, s, {"Qwen3MoeForCausalLM", 151936, 2048, 6144, 24, 32, 4, 0, 32768, false});
  s.qkv_bias = s.o_bias = r.Bool("attention_bias", false);
  s.qk_norm = true;
  ReadQwenWindow(r, s);
  ReadMoe(r, s, "num_experts", 128, 8, 768);
  s.norm_topk_prob = r.Bool("norm_topk_prob", false);
}

void ReadGemmaCommon(ConfigReader& r, ModelSpec& s) {
  s.norm = NormKind::kRmsNormGemma;
  // GemmaMLP uses hidden_activation, falling back to gelu_pytorch_tanh even when
  // an old config says hidden_act "gelu" (transformers >= 4.40).
  s.mlp = MlpKind::kGatedGeluTanh;
  s.qkv_bias = s.o_bias = r.Bool("attention_bias", false);
}

void ReadGemma(ConfigReader& r, ModelSpec& s, ArchDetails&) {
  ReadDecoderCore(r, s, {"GemmaForCausalLM", 256000, 3072, 24576, 28, 16, 16, 256, 8192, true});
  ReadGemmaCommon(r, s);
}

void ReadGemma2(ConfigReader& r, ModelSpec& s, ArchDetails&) {
  ReadDecoderCore(r, s, {"Gemma2ForCausalLM", 256000, 2304, 9216, 26, 8, 4, 256, 8192, true});
  ReadGemmaCommon(r, s);
  s.sandwich_norm = true;
  s.sliding_window = ReadWindow(r, 4096);
  s.final_logit_softcapping = ReadOptionalCap(r, "final_logit_softcapping", 30.0);
  s.attn_logit_softcapping = ReadOptionalCap(r, "attn_logit_softcapping", 50.0);
}

void ReadGemma3Text(ConfigReader& r, ModelSpec& s, ArchDetails&) {
  ReadDecoderCore(r, s, {"Gemma3ForCausalLM", 262208, 2304, 9216, 26, 8, 4, 256, 131072, true});
  ReadGemmaCommon(r, s);
  s.sandwich_norm = true;
  s.qk_norm = true;
  s.sliding_window = ReadWindow(r, 4096);
  s.final_logit_softcapping = ReadOptionalCap(r, "final_logit_softcapping", 0.0);
  s.attn_logit_softcapping = ReadOptionalCap(r, "attn_logit_softcapping", 0.0);
}

// Gemma3ForConditionalGeneration: the text model lives in text_config (absent
// keys take Gemma3TextConfig defaults), plus a SigLIP tower in vision_config.
void ReadGemma3(ConfigReader& r, ModelSpec& s, ArchDetails& a) {
  static const nlohmann::json kEmpty = nlohmann::json::object();
  const nlohmann::json* text = r.Object("text_config");
  ConfigReader text_reader(text ? *text : kEmpty, r.context() + ": text_config");
  ReadGemma3Text(text_reader, s, a);
  r.Adopt(text_reader);
  s.architecture = ReadArchitecture(r, "Gemma3ForConditionalGeneration");
  if (s.torch_dtype.empty()) s.torch_dtype = ReadTorchDtype(r);
  ReadGemma3Vision(r, a);
  // Checkpoint names of transformers 4.50 (what google/gemma-3-*-pt store).
  a.prefix = "language_model.model.";
  a.lm_head = "language_model.lm_head";
  s.notes.push_back(
      "gemma3: parameters include the SigLIP vision tower and projector; the text "
      "decoder's activations are what lowering models");
}

void ReadPhi3(ConfigReader& r, ModelSpec& s, ArchDetails&) {
  ReadDecoderCore(r, s, {"Phi3ForCausalLM", 32064, 3072, 8192, 32, 32, 0, 0, 4096, false});
  s.fused_qkv = true;
  s.mlp = MlpKind::kFusedGateUp;
  s.partial_rotary_factor = ReadPartialRotary(r, "partial_rotary_factor", 1.0);
  // Phi3DecoderLayer.resid_attn_dropout / resid_mlp_dropout (resid_pdrop).
  s.residual_dropout = r.Number("resid_pdrop", 0.0, 0.0, 1.0);
  if (r.Has("sliding_window")) s.sliding_window = ReadWindow(r, 0);
}

void ReadStableLm(ConfigReader& r, ModelSpec& s, ArchDetails&) {
  ReadDecoderCore(r, s, {"StableLmForCausalLM", 50304, 2560, 6912, 32, 32, 32, 0, 4096, false});
  s.norm = NormKind::kLayerNorm;
  s.qkv_bias = r.Bool("use_qkv_bias", false);
  s.qk_norm = r.Bool("qk_layernorm", false);
  s.parallel_attn = r.Bool("use_parallel_residual", false);
  s.hidden_dropout = r.Number("hidden_dropout", 0.0, 0.0, 1.0);
  s.partial_rotary_factor = ReadPartialRotary(r, "partial_rotary_factor", 0.25);
}

// ---- parameter lists ----

bool IsMoeLayer(const ModelSpec& s, uint64_t layer) {
  if (s.num_experts == 0) return false;
  for (uint64_t dense : s.mlp_only_layers) {
    if (dense == layer) return false;
  }
  return (layer + 1) % s.decoder_sparse_step == 0;
}

void BuildAttention(const ModelSpec& s, const std::string& p, int i, ParamListBuilder& b) {
  const uint64_t h = s.hidden_size, q_dim = s.num_heads * s.head_dim,
                 kv_dim = s.num_kv_heads * s.head_dim;
  if (s.model_type == "phi3") {
    // Phi3Attention registers o_proj before the fused qkv_proj.
    b.Linear(p + "o_proj", h, q_dim, false, i, ParamRole::kO);
    b.Linear(p + "qkv_proj", q_dim + 2 * kv_dim, h, false, i, ParamRole::kQkv);
    return;
  }
  b.Linear(p + "q_proj", q_dim, h, s.qkv_bias, i, ParamRole::kQ);
  b.Linear(p + "k_proj", kv_dim, h, s.qkv_bias, i, ParamRole::kK);
  b.Linear(p + "v_proj", kv_dim, h, s.qkv_bias, i, ParamRole::kV);
  b.Linear(p + "o_proj", h, q_dim, s.o_bias, i, ParamRole::kO);
  if (!s.qk_norm) return;
  if (s.model_type == "stablelm") {
    // StableLmLayerNormPerHead: one bias-free LayerNorm(head_dim) per head.
    for (uint64_t head = 0; head < s.num_heads; ++head) {
      std::string m = fmt::format("{}q_layernorm.norms.{}", p, head);
      b.Tensor(m + ".weight", {s.head_dim}, i, m, ParamRole::kNorm, false);
    }
    for (uint64_t head = 0; head < s.num_kv_heads; ++head) {
      std::string m = fmt::format("{}k_layernorm.norms.{}", p, head);
      b.Tensor(m + ".weight", {s.head_dim}, i, m, ParamRole::kNorm, false);
    }
    return;
  }
  b.Norm(p + "q_norm", s.head_dim, false, i);  // qwen3, gemma3: RMSNorm(head_dim)
  b.Norm(p + "k_norm", s.head_dim, false, i);
}

// The three projections of a gated MLP and their roles (dense, routed expert, shared expert).
struct GatedMlpRoles {
  ParamRole gate, up, down;
};
constexpr GatedMlpRoles kDenseMlp{ParamRole::kGate, ParamRole::kUp, ParamRole::kDown};
constexpr GatedMlpRoles kExpertMlp{ParamRole::kExpertGate, ParamRole::kExpertUp,
                                   ParamRole::kExpertDown};
constexpr GatedMlpRoles kSharedMlp{ParamRole::kSharedGate, ParamRole::kSharedUp,
                                   ParamRole::kSharedDown};

void BuildGatedMlp(const std::string& p, uint64_t h, uint64_t inter, bool bias, int i,
                   const GatedMlpRoles& roles, ParamListBuilder& b) {
  b.Linear(p + "gate_proj", inter, h, bias, i, roles.gate);
  b.Linear(p + "up_proj", inter, h, bias, i, roles.up);
  b.Linear(p + "down_proj", h, inter, bias, i, roles.down);
}

void BuildMlp(const ModelSpec& s, const std::string& layer, int i, ParamListBuilder& b) {
  const uint64_t h = s.hidden_size;
  if (s.model_type == "mixtral") {
    // MixtralSparseMoeBlock: gate (router), experts[j].{w1 gate, w2 down, w3 up}.
    std::string p = layer + "block_sparse_moe.";
    b.Linear(p + "gate", s.num_experts, h, false, i, ParamRole::kRouter);
    for (uint64_t e = 0; e < s.num_experts && !b.overflowed(); ++e) {
      std::string ep = fmt::format("{}experts.{}.", p, e);
      b.Linear(ep + "w1", s.moe_intermediate_size, h, false, i, ParamRole::kExpertGate);
      b.Linear(ep + "w2", h, s.moe_intermediate_size, false, i, ParamRole::kExpertDown);
      b.Linear(ep + "w3", s.moe_intermediate_size, h, false, i, ParamRole::kExpertUp);
    }
    return;
  }
  std::string p = layer + "mlp.";
  if (IsMoeLayer(s, static_cast<uint64_t>(i))) {
    // Qwen2Moe/Qwen3Moe SparseMoeBlock: gate (router), experts[j] MLPs, and for
    // qwen2_moe a shared expert plus its sigmoid gate Linear(hidden, 1).
    b.Linear(p + "gate", s.num_experts, h, false, i, ParamRole::kRouter);
    for (uint64_t e = 0; e < s.num_experts && !b.overflowed(); ++e) {
      BuildGatedMlp(fmt::format("{}experts.{}.", p, e), h, s.moe_intermediate_size, false, i,
                    kExpertMlp, b);
    }
    if (s.model_type == "qwen2_moe") {
      BuildGatedMlp(p + "shared_expert.", h, s.shared_expert_intermediate_size, false, i,
                    kSharedMlp, b);
      b.Linear(p + "shared_expert_gate", 1, h, false, i, ParamRole::kSharedExpertGate);
    }
    return;
  }
  if (s.mlp == MlpKind::kFusedGateUp) {
    b.Linear(p + "gate_up_proj", 2 * s.intermediate_size, h, false, i, ParamRole::kGateUp);
    b.Linear(p + "down_proj", h, s.intermediate_size, false, i, ParamRole::kDown);
    return;
  }
  BuildGatedMlp(p, h, s.intermediate_size, s.mlp_bias, i, kDenseMlp, b);
}

void BuildDecoder(const ModelSpec& s, const ArchDetails& a, ParamListBuilder& b) {
  if (a.has_vision) BuildGemma3Vision(s, a, b);
  const bool ln_bias = s.norm == NormKind::kLayerNorm;
  b.Embedding(a.prefix + "embed_tokens", s.vocab_size, s.hidden_size, ParamRole::kEmbed);
  for (uint64_t layer = 0; layer < s.num_layers && !b.overflowed(); ++layer) {
    const int i = static_cast<int>(layer);
    const std::string l = fmt::format("{}layers.{}.", a.prefix, layer);
    BuildAttention(s, l + "self_attn.", i, b);
    BuildMlp(s, l, i, b);
    b.Norm(l + "input_layernorm", s.hidden_size, ln_bias, i);
    // StableLM with use_parallel_residual has a single norm per layer.
    if (!(s.model_type == "stablelm" && s.parallel_attn)) {
      b.Norm(l + "post_attention_layernorm", s.hidden_size, ln_bias, i);
    }
    if (s.sandwich_norm) {
      b.Norm(l + "pre_feedforward_layernorm", s.hidden_size, false, i);
      b.Norm(l + "post_feedforward_layernorm", s.hidden_size, false, i);
    }
  }
  b.Norm(a.prefix + "norm", s.hidden_size, ln_bias, -1);
  if (s.num_labels > 0) {
    b.Linear("score", s.num_labels, s.hidden_size, false, -1, ParamRole::kLmHead);
  } else if (!s.tie_word_embeddings) {
    b.Linear(a.lm_head, s.vocab_size, s.hidden_size, false, -1, ParamRole::kLmHead);
  }
}

}  // namespace

const std::vector<Family>& DecoderFamilies() {
  static const std::vector<Family> kFamilies = {
      {"llama", ReadLlama, BuildDecoder},        {"mistral", ReadMistral, BuildDecoder},
      {"mixtral", ReadMixtral, BuildDecoder},    {"qwen2", ReadQwen2, BuildDecoder},
      {"qwen2_moe", ReadQwen2Moe, BuildDecoder}, {"qwen3", ReadQwen3, BuildDecoder},
      {"qwen3_moe", ReadQwen3Moe, BuildDecoder}, {"gemma", ReadGemma, BuildDecoder},
      {"gemma2", ReadGemma2, BuildDecoder},      {"gemma3_text", ReadGemma3Text, BuildDecoder},
      {"gemma3", ReadGemma3, BuildDecoder},      {"phi3", ReadPhi3, BuildDecoder},
      {"stablelm", ReadStableLm, BuildDecoder},
  };
  return kFamilies;
}

}  // namespace vramscope::ingest
