// ParseModelConfig: defaults of each transformers config class, and one-line
// errors for bad input.
#include <gtest/gtest.h>

#include "test_util.h"
#include "vramscope/model.h"

namespace vramscope {
namespace {

using ingest::testing::IsOneLine;

ModelSpec Parse(const std::string& json) {
  Result<ModelSpec> spec = ParseModelConfig(json, "config.json");
  EXPECT_TRUE(spec.ok()) << (spec.ok() ? "" : spec.error().message);
  return spec.ok() ? spec.value() : ModelSpec{};
}

// The error for `json`; fails the test when parsing succeeds. Checks the
// message is one line and names the file.
std::string ErrorOf(const std::string& json) {
  Result<ModelSpec> spec = ParseModelConfig(json, "bad/config.json");
  EXPECT_FALSE(spec.ok()) << json;
  if (spec.ok()) return "";
  const std::string& m = spec.error().message;
  EXPECT_TRUE(IsOneLine(m)) << m;
  EXPECT_EQ(m.rfind("bad/config.json", 0), 0u) << m;
  return m;
}

void ExpectMentions(const std::string& message, const std::string& part) {
  EXPECT_NE(message.find(part), std::string::npos)
      << "\"" << message << "\" lacks \"" << part << "\"";
}

TEST(ParseConfigDefaultsTest, LlamaDerivesKvHeadsAndHeadDim) {
  ModelSpec s = Parse(R"({"model_type": "llama", "hidden_size": 2048, "num_attention_heads": 16,
                          "num_hidden_layers": 2, "intermediate_size": 64, "vocab_size": 100})");
  EXPECT_EQ(s.num_kv_heads, 16u);  // LlamaConfig: None -> num_attention_heads
  EXPECT_EQ(s.head_dim, 128u);     // hidden_size // num_attention_heads
  EXPECT_FALSE(s.tie_word_embeddings);
  EXPECT_EQ(s.max_position_embeddings, 2048u);
  EXPECT_EQ(s.architecture, "LlamaForCausalLM");
  EXPECT_EQ(s.norm, NormKind::kRmsNorm);
  EXPECT_EQ(s.mlp, MlpKind::kGatedSilu);
}

TEST(ParseConfigDefaultsTest, AbsentCoreKeysTakeClassDefaultsAndAreNoted) {
  ModelSpec s = Parse(R"({"model_type": "llama"})");  // LlamaConfig() is llama-7b
  EXPECT_EQ(s.hidden_size, 4096u);
  EXPECT_EQ(s.intermediate_size, 11008u);
  EXPECT_EQ(s.vocab_size, 32000u);
  EXPECT_EQ(s.ParameterCount(), 6738415616u);  // = Llama-2-7b
  ASSERT_FALSE(s.notes.empty());
  ExpectMentions(s.notes.front(), "vocab_size absent");
}

TEST(ParseConfigDefaultsTest, MistralAbsentKvHeadsIsEightButNullMeansAllHeads) {
  EXPECT_EQ(Parse(R"({"model_type": "mistral"})").num_kv_heads, 8u);
  EXPECT_EQ(Parse(R"({"model_type": "mistral", "num_key_value_heads": null})").num_kv_heads, 32u);
  EXPECT_EQ(Parse(R"({"model_type": "mistral"})").sliding_window, 4096u);
  EXPECT_EQ(Parse(R"({"model_type": "mistral", "sliding_window": null})").sliding_window, 0u);
}

TEST(ParseConfigDefaultsTest, QwenDefaults) {
  ModelSpec q2 = Parse(R"({"model_type": "qwen2", "sliding_window": 4096})");
  EXPECT_EQ(q2.num_kv_heads, 32u);  // Qwen2Config default, not None
  EXPECT_TRUE(q2.qkv_bias);
  EXPECT_FALSE(q2.o_bias);
  EXPECT_EQ(q2.sliding_window, 0u);  // only with use_sliding_window
  ModelSpec q3 = Parse(R"({"model_type": "qwen3", "hidden_size": 1024, "num_attention_heads": 16,
                           "num_key_value_heads": 8})");
  EXPECT_EQ(q3.head_dim, 128u);  // Qwen3Config default head_dim, not 1024/16
  EXPECT_TRUE(q3.qk_norm);
  ModelSpec moe = Parse(R"({"model_type": "qwen2_moe"})");
  EXPECT_EQ(moe.num_experts, 60u);
  EXPECT_EQ(moe.experts_per_token, 4u);
  EXPECT_EQ(moe.moe_intermediate_size, 1408u);
  EXPECT_EQ(moe.shared_expert_intermediate_size, 5632u);
  ModelSpec q3moe = Parse(R"({"model_type": "qwen3_moe"})");
  EXPECT_EQ(q3moe.num_experts, 128u);
  EXPECT_EQ(q3moe.head_dim, 64u);  // no head_dim key: 2048 / 32
  ModelSpec mixtral = Parse(R"({"model_type": "mixtral"})");
  EXPECT_EQ(mixtral.num_experts, 8u);
  EXPECT_EQ(mixtral.moe_intermediate_size, 14336u);
}

TEST(ParseConfigDefaultsTest, GemmaDefaults) {
  ModelSpec g = Parse(R"({"model_type": "gemma", "hidden_size": 2048, "num_attention_heads": 8,
                          "num_key_value_heads": 1})");
  EXPECT_EQ(g.head_dim, 256u);
  EXPECT_TRUE(g.tie_word_embeddings);
  EXPECT_EQ(g.norm, NormKind::kRmsNormGemma);
  EXPECT_EQ(g.mlp, MlpKind::kGatedGeluTanh);
  ModelSpec g2 = Parse(R"({"model_type": "gemma2"})");
  EXPECT_TRUE(g2.sandwich_norm);
  EXPECT_EQ(g2.final_logit_softcapping, 30.0);
  EXPECT_EQ(g2.attn_logit_softcapping, 50.0);
  EXPECT_EQ(
      Parse(R"({"model_type": "gemma2", "final_logit_softcapping": null})").final_logit_softcapping,
      0.0);
  ModelSpec g3 = Parse(R"({"model_type": "gemma3_text"})");
  EXPECT_EQ(g3.vocab_size, 262208u);
  EXPECT_TRUE(g3.qk_norm);
  EXPECT_EQ(g3.final_logit_softcapping, 0.0);
}

TEST(ParseConfigDefaultsTest, Gemma3ReadsTextConfigAndAddsTheVisionTower) {
  ModelSpec s = Parse(R"({"model_type": "gemma3", "text_config": {"hidden_size": 2560,
      "num_hidden_layers": 2, "intermediate_size": 64},
      "vision_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
      "num_attention_heads": 2, "image_size": 28, "patch_size": 14, "vision_use_head": false}})");
  EXPECT_EQ(s.model_type, "gemma3");
  EXPECT_EQ(s.architecture, "Gemma3ForConditionalGeneration");
  EXPECT_EQ(s.hidden_size, 2560u);
  EXPECT_EQ(s.num_heads, 8u);  // Gemma3TextConfig default
  EXPECT_EQ(s.params.front().name, "vision_tower.vision_model.embeddings.patch_embedding.weight");
  bool has_projector = false, has_text = false;
  for (const ParamTensor& p : s.params) {
    if (p.name == "multi_modal_projector.mm_input_projection_weight") {
      has_projector = true;
      EXPECT_EQ(p.shape, (std::vector<uint64_t>{32, 2560}));
    }
    if (p.name == "language_model.model.layers.1.self_attn.k_norm.weight") has_text = true;
  }
  EXPECT_TRUE(has_projector);
  EXPECT_TRUE(has_text);
}

TEST(ParseConfigDefaultsTest, RotaryFractions) {
  EXPECT_EQ(Parse(R"({"model_type": "phi"})").partial_rotary_factor, 0.5);
  EXPECT_EQ(Parse(R"({"model_type": "gpt_neox"})").partial_rotary_factor, 0.25);
  EXPECT_EQ(Parse(R"({"model_type": "gpt_neox", "rotary_pct": 1.0})").partial_rotary_factor, 1.0);
  EXPECT_EQ(Parse(R"({"model_type": "stablelm"})").partial_rotary_factor, 0.25);
  EXPECT_EQ(Parse(R"({"model_type": "phi3"})").partial_rotary_factor, 1.0);
  EXPECT_EQ(Parse(R"({"model_type": "phi3", "rope_parameters": {"partial_rotary_factor": 0.75}})")
                .partial_rotary_factor,
            0.75);
}

TEST(ParseConfigDefaultsTest, Gpt2InnerIsFourTimesEmbedding) {
  ModelSpec s = Parse(R"({"model_type": "gpt2", "n_embd": 1600, "n_head": 25, "n_layer": 1})");
  EXPECT_EQ(s.intermediate_size, 6400u);
  EXPECT_TRUE(s.tie_word_embeddings);
  EXPECT_EQ(s.position, PositionKind::kLearned);
  EXPECT_EQ(s.hidden_dropout, 0.1);
  EXPECT_EQ(Parse(R"({"model_type": "gpt2", "n_inner": 100})").intermediate_size, 100u);
}

TEST(ParseConfigDefaultsTest, ActivationsPerFamilyKey) {
  // Each family's own key and default (configuration_*.py, transformers 4.57 / 5.x).
  EXPECT_EQ(Parse(R"({"model_type": "gpt2"})").mlp, MlpKind::kGeluNew);
  EXPECT_EQ(Parse(R"({"model_type": "gpt2", "activation_function": "gelu"})").mlp, MlpKind::kGelu);
  EXPECT_EQ(Parse(R"({"model_type": "phi"})").mlp, MlpKind::kGeluNew);
  EXPECT_EQ(Parse(R"({"model_type": "gpt_neox"})").mlp, MlpKind::kGelu);
  EXPECT_EQ(Parse(R"({"model_type": "opt"})").mlp, MlpKind::kRelu);
  EXPECT_EQ(Parse(R"({"model_type": "falcon", "activation": "gelu_fast"})").mlp,
            MlpKind::kGeluFast);
  EXPECT_EQ(Parse(R"({"model_type": "bert", "hidden_act": "quick_gelu"})").mlp,
            MlpKind::kQuickGelu);
}

TEST(ParseConfigErrorsTest, UnknownActivationIsAnError) {
  ExpectMentions(ErrorOf(R"({"model_type": "gpt2", "activation_function": "mish"})"), "mish");
}

TEST(ParseConfigDefaultsTest, FalconVariants) {
  ModelSpec mq = Parse(R"({"model_type": "falcon"})");  // falcon-7b defaults: multi_query
  EXPECT_EQ(mq.num_kv_heads, 1u);
  EXPECT_EQ(mq.kv_sharing, KvSharing::kBroadcast);  // one k/v head straight into SDPA
  EXPECT_EQ(mq.intermediate_size, 4 * 4544u);
  EXPECT_TRUE(mq.tie_word_embeddings);
  ModelSpec mha = Parse(R"({"model_type": "falcon", "multi_query": false})");
  EXPECT_EQ(mha.num_kv_heads, 71u);
  ModelSpec gqa = Parse(R"({"model_type": "falcon", "new_decoder_architecture": true,
      "hidden_size": 256, "num_attention_heads": 8, "num_kv_heads": 2, "num_hidden_layers": 1})");
  EXPECT_EQ(gqa.num_kv_heads, 2u);
  EXPECT_EQ(gqa.kv_sharing, KvSharing::kExpanded);  // broadcast_to + flatten: a copy
  EXPECT_EQ(mha.kv_sharing, KvSharing::kAttentionInterface);
  // new_decoder_architecture: two LayerNorms (ln_attn, ln_mlp), fused (8 + 2*2) heads of 32.
  bool ln_mlp = false;
  for (const ParamTensor& p : gqa.params) {
    if (p.name == "transformer.h.0.ln_mlp.bias") ln_mlp = true;
    if (p.name == "transformer.h.0.self_attention.query_key_value.weight") {
      EXPECT_EQ(p.shape, (std::vector<uint64_t>{12 * 32, 256}));
    }
  }
  EXPECT_TRUE(ln_mlp);
  ModelSpec seq = Parse(R"({"model_type": "falcon", "parallel_attn": false, "alibi": true,
      "num_hidden_layers": 1})");
  EXPECT_EQ(seq.position, PositionKind::kAlibi);
  int norms = 0;
  for (const ParamTensor& p : seq.params) norms += p.layer == 0 && p.role == ParamRole::kNorm;
  EXPECT_EQ(norms, 4);  // post_attention_layernorm + input_layernorm, weight and bias
}

TEST(ParseConfigDefaultsTest, FieldsFromConfig) {
  ModelSpec s =
      Parse(R"({"model_type": "llama", "architectures": ["LlamaForSequenceClassification"],
      "torch_dtype": "bfloat16", "attention_dropout": 0.1, "attention_bias": true, "mlp_bias": true})");
  EXPECT_EQ(s.architecture, "LlamaForSequenceClassification");
  EXPECT_EQ(s.torch_dtype, "bfloat16");
  EXPECT_EQ(s.attention_dropout, 0.1);
  EXPECT_TRUE(s.qkv_bias && s.o_bias && s.mlp_bias);
  EXPECT_EQ(Parse(R"({"model_type": "llama", "dtype": "float16"})").torch_dtype, "float16");
  ModelSpec bert = Parse(R"({"model_type": "bert"})");
  EXPECT_TRUE(bert.is_encoder);
  EXPECT_EQ(bert.hidden_dropout, 0.1);
}

TEST(ParseConfigErrorsTest, MalformedAndTruncatedJson) {
  ExpectMentions(ErrorOf("{\"model_type\": \"llama\",,}"), "not valid JSON");
  ExpectMentions(ErrorOf("{\"model_type\": \"llama\", \"hidden_size\": 40"), "not valid JSON");
  ExpectMentions(ErrorOf(""), "not valid JSON");
  ExpectMentions(ErrorOf("[1, 2]"), "expected a JSON object");
  // Numbers beyond double range (found by fuzz_model_config).
  ExpectMentions(ErrorOf(R"({"model_type": "llama", "rope_theta": 1e999})"), "not valid JSON");
  // A real config cut off mid-key.
  ExpectMentions(ErrorOf(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "interm)"),
                 "not valid JSON");
}

TEST(ParseConfigErrorsTest, MissingOrUnknownModelType) {
  std::string missing = ErrorOf(R"({"hidden_size": 4096})");
  ExpectMentions(missing, "model_type: missing");
  std::string unknown = ErrorOf(R"({"model_type": "mamba"})");
  ExpectMentions(unknown, "\"mamba\" is not supported");
  for (const std::string& t : SupportedModelTypes()) ExpectMentions(unknown, t);
  ExpectMentions(ErrorOf(R"({"model_type": 7})"), "model_type: expected a string, got number 7");
}

TEST(ParseConfigErrorsTest, WrongTypes) {
  ExpectMentions(ErrorOf(R"({"model_type": "llama", "hidden_size": "4096"})"),
                 "hidden_size: expected an integer, got string \"4096\"");
  ExpectMentions(ErrorOf(R"({"model_type": "llama", "hidden_size": 4096.5})"),
                 "hidden_size: expected an integer");
  ExpectMentions(ErrorOf(R"({"model_type": "llama", "tie_word_embeddings": "yes"})"),
                 "tie_word_embeddings: expected true or false");
  ExpectMentions(ErrorOf(R"({"model_type": "llama", "architectures": "LlamaForCausalLM"})"),
                 "architectures: expected an array of strings");
  ExpectMentions(ErrorOf(R"({"model_type": "qwen2_moe", "mlp_only_layers": [1, "x"]})"),
                 "mlp_only_layers");
  ExpectMentions(ErrorOf(R"({"model_type": "gemma3", "text_config": [1]})"),
                 "text_config: expected an object");
  ExpectMentions(ErrorOf(R"({"model_type": "gemma3", "text_config": {"hidden_size": true}})"),
                 "bad/config.json: text_config: hidden_size: expected an integer");
  ExpectMentions(ErrorOf(R"({"model_type": "gpt_neox", "rotary_pct": "a quarter"})"),
                 "rotary_pct: expected a number");
}

TEST(ParseConfigErrorsTest, AbsurdValues) {
  // Qwen3Config's default of 32 kv heads cannot serve 16 attention heads.
  ExpectMentions(ErrorOf(R"({"model_type": "qwen3", "num_attention_heads": 16})"),
                 "num_key_value_heads: 32 does not divide num_attention_heads 16");
  ExpectMentions(ErrorOf(R"({"model_type": "llama", "hidden_size": -4096})"),
                 "hidden_size: -4096 is out of range");
  ExpectMentions(ErrorOf(R"({"model_type": "llama", "hidden_size": 0})"),
                 "hidden_size: 0 is out of range");
  ExpectMentions(ErrorOf(R"({"model_type": "llama", "num_hidden_layers": 10001})"),
                 "num_hidden_layers: 10001 is out of range");
  ExpectMentions(ErrorOf(R"({"model_type": "llama", "vocab_size": 100000001})"),
                 "vocab_size: 100000001 is out of range");
  ExpectMentions(ErrorOf(R"({"model_type": "llama", "hidden_size": 4095})"),
                 "hidden_size: 4095 is not divisible by num_attention_heads 32");
  ExpectMentions(ErrorOf(R"({"model_type": "gpt2", "n_embd": 100, "n_head": 12})"),
                 "n_embd: 100 is not divisible by n_head 12");
  ExpectMentions(ErrorOf(R"({"model_type": "llama", "num_key_value_heads": 5})"),
                 "num_key_value_heads: 5 does not divide num_attention_heads 32");
  ExpectMentions(ErrorOf(R"({"model_type": "mixtral", "num_experts_per_tok": 9})"),
                 "num_experts_per_tok: 9 exceeds the 8 experts");
  ExpectMentions(ErrorOf(R"({"model_type": "qwen3_moe", "mlp_only_layers": [24]})"),
                 "mlp_only_layers: layer 24 is not below num_hidden_layers 24");
  ExpectMentions(ErrorOf(R"({"model_type": "llama", "attention_dropout": 2})"),
                 "attention_dropout: 2 is out of range");
  ExpectMentions(ErrorOf(R"({"model_type": "gpt2", "n_positions": 100000000000})"), "n_positions");
  // Each value within its own limit, the product absurd.
  ExpectMentions(ErrorOf(R"({"model_type": "qwen3_moe", "num_experts": 16384,
      "moe_intermediate_size": 4000000, "hidden_size": 1000000, "num_attention_heads": 1000,
      "num_key_value_heads": 1000, "head_dim": 1000})"),
                 "absurd model");
}

// Hostile input (docs/hardening.md): nesting is refused before anything is
// built, and text quoted from the file cannot break the one-line message.
TEST(ParseConfigErrorsTest, HostileNestingAndText) {
  ExpectMentions(ErrorOf(std::string(100000, '[')), "nested deeper than 64 levels");
  std::string deep_object;
  for (int i = 0; i < 65; ++i) deep_object += R"({"a":)";
  ExpectMentions(ErrorOf(deep_object + "1" + std::string(65, '}')), "nested deeper than 64");
  // Brackets inside strings do not count.
  ExpectMentions(ErrorOf(R"({"model_type": ")" + std::string(1000, '[') + R"("})"),
                 "is not supported");
  const std::string control = ErrorOf(R"({"model_type": "llama\u001b[2J\nx"})");
  ExpectMentions(control, R"("llama\x1b[2J\x0ax" is not supported)");
  for (char c : control) EXPECT_GE(static_cast<unsigned char>(c), 0x20) << control;
  const std::string long_value =
      ErrorOf(R"({"model_type": "llama", "hidden_size": ")" + std::string(5000, 'x') + R"("})");
  EXPECT_LT(long_value.size(), 200u) << long_value;
  ExpectMentions(long_value, R"(got string "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"...)");
}

// nlohmann's lexer took a NUL as the end of its input: a valid config
// followed by NUL and garbage was read as the config alone (issue 24).
TEST(ParseConfigErrorsTest, NulAfterTheDocumentIsAnError) {
  const std::string config = R"({"model_type": "llama"})";
  ExpectMentions(ErrorOf(config + std::string("\0garbage", 8)), "NUL byte at byte 23");
  ExpectMentions(ErrorOf(config + "\n" + std::string(1, '\0')), "NUL byte at byte 24");
}

}  // namespace
}  // namespace vramscope
