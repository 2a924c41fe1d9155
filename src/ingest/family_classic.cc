// Pre-llama layouts: gpt2, gpt_neox, opt, falcon, phi, bert. Each has its own
// module names, biases and LayerNorms. Defaults are those of the transformers
// 4.5x configuration_<type>.py classes (PretrainedConfig ties embeddings unless
// the class says otherwise).
#include <fmt/format.h>

#include "families.h"

namespace vramscope::ingest {
namespace {

void ReadGpt2(ConfigReader& r, ModelSpec& s, ArchDetails&) {
  s.architecture = ReadArchitecture(r, "GPT2LMHeadModel");
  // GPT2Config.attribute_map lets the standard names stand in for n_*.
  s.vocab_size = ReadSize(r, s, {"vocab_size"}, 50257, kMaxVocab);
  s.max_position_embeddings =
      ReadSize(r, s, {"n_positions", "max_position_embeddings"}, 1024, kMaxLearnedPositions);
  s.hidden_size = ReadSize(r, s, {"n_embd", "hidden_size"}, 768, kMaxHidden);
  s.num_layers = ReadSize(r, s, {"n_layer", "num_hidden_layers"}, 12, kMaxLayers);
  s.num_heads = ReadSize(r, s, {"n_head", "num_attention_heads"}, 12, kMaxHeads);
  s.num_kv_heads = s.num_heads;
  s.head_dim = DerivedHeadDim(r, s, "n_embd", "n_head");
  // GPT2MLP: inner_dim = n_inner if not None else 4 * n_embd.
  s.intermediate_size = r.Uint("n_inner", 4 * s.hidden_size, 1, kMaxIntermediate);
  s.tie_word_embeddings = r.Bool("tie_word_embeddings", true);
  s.attention_dropout = r.Number("attn_pdrop", 0.1, 0.0, 1.0);
  // GPT2Model.drop (embd_pdrop) on the embeddings; resid_dropout after attention's
  // c_proj and GPT2MLP.dropout after the MLP's c_proj (transformers 4.57 / 5.x).
  s.hidden_dropout = r.Number("embd_pdrop", 0.1, 0.0, 1.0);
  s.residual_dropout = r.Number("resid_pdrop", 0.1, 0.0, 1.0);
  if (r.Bool("add_cross_attention", false)) {
    r.Fail("add_cross_attention", "true (GPT-2 with cross-attention) is not supported");
  }
  s.torch_dtype = ReadTorchDtype(r);
  s.norm = NormKind::kLayerNorm;
  s.mlp = ReadActivation(r, "activation_function", "gelu_new");
  s.position = PositionKind::kLearned;
  s.qkv_bias = s.o_bias = s.mlp_bias = true;
  s.fused_qkv = true;
}

void BuildGpt2(const ModelSpec& s, const ArchDetails&, ParamListBuilder& b) {
  const uint64_t h = s.hidden_size;
  b.Embedding("transformer.wte", s.vocab_size, h, ParamRole::kEmbed);
  b.Embedding("transformer.wpe", s.max_position_embeddings, h, ParamRole::kPosEmbed);
  for (uint64_t layer = 0; layer < s.num_layers && !b.overflowed(); ++layer) {
    const int i = static_cast<int>(layer);
    const std::string l = fmt::format("transformer.h.{}.", layer);
    b.Norm(l + "ln_1", h, true, i);
    b.Conv1D(l + "attn.c_attn", 3 * h, h, i, ParamRole::kQkv);
    b.Conv1D(l + "attn.c_proj", h, h, i, ParamRole::kO);
    b.Norm(l + "ln_2", h, true, i);
    b.Conv1D(l + "mlp.c_fc", s.intermediate_size, h, i, ParamRole::kUp);
    b.Conv1D(l + "mlp.c_proj", h, s.intermediate_size, i, ParamRole::kDown);
  }
  b.Norm("transformer.ln_f", h, true, -1);
  if (!s.tie_word_embeddings) b.Linear("lm_head", s.vocab_size, h, false, -1, ParamRole::kLmHead);
}

void ReadGptNeox(ConfigReader& r, ModelSpec& s, ArchDetails&) {
  s.architecture = ReadArchitecture(r, "GPTNeoXForCausalLM");
  s.vocab_size = ReadSize(r, s, {"vocab_size"}, 50432, kMaxVocab);
  s.hidden_size = ReadSize(r, s, {"hidden_size"}, 6144, kMaxHidden);
  s.num_layers = ReadSize(r, s, {"num_hidden_layers"}, 44, kMaxLayers);
  s.num_heads = ReadSize(r, s, {"num_attention_heads"}, 64, kMaxHeads);
  s.intermediate_size = ReadSize(r, s, {"intermediate_size"}, 24576, kMaxIntermediate);
  s.num_kv_heads = s.num_heads;
  s.head_dim = DerivedHeadDim(r, s, "hidden_size", "num_attention_heads");
  s.max_position_embeddings = r.Uint("max_position_embeddings", 2048, 1, kMaxPositions);
  s.tie_word_embeddings = r.Bool("tie_word_embeddings", false);
  s.partial_rotary_factor = ReadPartialRotary(r, "rotary_pct", 0.25);
  s.parallel_attn = r.Bool("use_parallel_residual", true);
  s.attention_dropout = r.Number("attention_dropout", 0.0, 0.0, 1.0);
  // GPTNeoXModel.emb_dropout, GPTNeoXLayer.post_attention_dropout / post_mlp_dropout.
  s.hidden_dropout = r.Number("hidden_dropout", 0.0, 0.0, 1.0);
  s.residual_dropout = s.hidden_dropout;
  bool attention_bias = r.Bool("attention_bias", true);
  s.qkv_bias = s.o_bias = attention_bias;
  s.mlp_bias = true;
  s.fused_qkv = true;
  s.torch_dtype = ReadTorchDtype(r);
  s.norm = NormKind::kLayerNorm;
  s.mlp = ReadActivation(r, "hidden_act", "gelu");
  s.position = PositionKind::kRope;
}

void BuildGptNeox(const ModelSpec& s, const ArchDetails&, ParamListBuilder& b) {
  const uint64_t h = s.hidden_size;
  b.Embedding("gpt_neox.embed_in", s.vocab_size, h, ParamRole::kEmbed);
  for (uint64_t layer = 0; layer < s.num_layers && !b.overflowed(); ++layer) {
    const int i = static_cast<int>(layer);
    const std::string l = fmt::format("gpt_neox.layers.{}.", layer);
    // GPTNeoXLayer registers both LayerNorms before attention and mlp.
    b.Norm(l + "input_layernorm", h, true, i);
    b.Norm(l + "post_attention_layernorm", h, true, i);
    b.Linear(l + "attention.query_key_value", 3 * h, h, s.qkv_bias, i, ParamRole::kQkv);
    b.Linear(l + "attention.dense", h, h, s.o_bias, i, ParamRole::kO);
    b.Linear(l + "mlp.dense_h_to_4h", s.intermediate_size, h, true, i, ParamRole::kUp);
    b.Linear(l + "mlp.dense_4h_to_h", h, s.intermediate_size, true, i, ParamRole::kDown);
  }
  b.Norm("gpt_neox.final_layer_norm", h, true, -1);
  if (!s.tie_word_embeddings) b.Linear("embed_out", s.vocab_size, h, false, -1, ParamRole::kLmHead);
}

void ReadOpt(ConfigReader& r, ModelSpec& s, ArchDetails& a) {
  s.architecture = ReadArchitecture(r, "OPTForCausalLM");
  s.vocab_size = ReadSize(r, s, {"vocab_size"}, 50272, kMaxVocab);
  s.hidden_size = ReadSize(r, s, {"hidden_size", "d_model"}, 768, kMaxHidden);
  s.num_layers = ReadSize(r, s, {"num_hidden_layers"}, 12, kMaxLayers);
  s.num_heads = ReadSize(r, s, {"num_attention_heads"}, 12, kMaxHeads);
  s.intermediate_size = ReadSize(r, s, {"ffn_dim"}, 3072, kMaxIntermediate);
  s.num_kv_heads = s.num_heads;
  s.head_dim = DerivedHeadDim(r, s, "hidden_size", "num_attention_heads");
  s.max_position_embeddings = r.Uint("max_position_embeddings", 2048, 1, kMaxLearnedPositions);
  s.tie_word_embeddings = r.Bool("tie_word_embeddings", true);
  s.attention_dropout = r.Number("attention_dropout", 0.0, 0.0, 1.0);
  // OPTDecoderLayer: dropout after self_attn and after fc2, none on the embeddings
  // (modeling_opt.py, transformers 4.57 / 5.x).
  s.residual_dropout = r.Number("dropout", 0.1, 0.0, 1.0);
  a.word_embed_proj_dim = r.Uint("word_embed_proj_dim", s.hidden_size, 1, kMaxHidden);
  bool before = r.Bool("do_layer_norm_before", true);
  s.post_norm = !before;
  a.final_layer_norm = before && !r.Bool("_remove_final_layer_norm", false);
  a.layer_norm_affine = r.Bool("layer_norm_elementwise_affine", true);
  bool bias = r.Bool("enable_bias", true);
  s.qkv_bias = s.o_bias = s.mlp_bias = bias;
  s.torch_dtype = ReadTorchDtype(r);
  s.norm = a.layer_norm_affine ? NormKind::kLayerNorm : NormKind::kLayerNormNoBias;
  s.mlp = ReadActivation(r, "activation_function", "relu");
  s.position = PositionKind::kLearned;
}

void BuildOpt(const ModelSpec& s, const ArchDetails& a, ParamListBuilder& b) {
  const uint64_t h = s.hidden_size, proj = a.word_embed_proj_dim;
  const std::string d = "model.decoder.";
  auto layer_norm = [&](const std::string& m, int i) {
    if (a.layer_norm_affine) b.Norm(m, h, true, i);
  };
  b.Embedding(d + "embed_tokens", s.vocab_size, proj, ParamRole::kEmbed);
  // OPTLearnedPositionalEmbedding keeps 2 extra rows (its offset).
  b.Embedding(d + "embed_positions", s.max_position_embeddings + 2, h, ParamRole::kPosEmbed);
  if (proj != h) {
    b.Linear(d + "project_out", proj, h, false, -1, ParamRole::kProjOut);
    b.Linear(d + "project_in", h, proj, false, -1, ParamRole::kProjIn);
  }
  if (a.final_layer_norm) layer_norm(d + "final_layer_norm", -1);
  for (uint64_t layer = 0; layer < s.num_layers && !b.overflowed(); ++layer) {
    const int i = static_cast<int>(layer);
    const std::string l = fmt::format("{}layers.{}.", d, layer);
    b.Linear(l + "self_attn.k_proj", h, h, s.qkv_bias, i, ParamRole::kK);
    b.Linear(l + "self_attn.v_proj", h, h, s.qkv_bias, i, ParamRole::kV);
    b.Linear(l + "self_attn.q_proj", h, h, s.qkv_bias, i, ParamRole::kQ);
    b.Linear(l + "self_attn.out_proj", h, h, s.o_bias, i, ParamRole::kO);
    layer_norm(l + "self_attn_layer_norm", i);
    b.Linear(l + "fc1", s.intermediate_size, h, s.mlp_bias, i, ParamRole::kUp);
    b.Linear(l + "fc2", h, s.intermediate_size, s.mlp_bias, i, ParamRole::kDown);
    layer_norm(l + "final_layer_norm", i);
  }
  if (!s.tie_word_embeddings)
    b.Linear("lm_head", s.vocab_size, proj, false, -1, ParamRole::kLmHead);
}

void ReadFalcon(ConfigReader& r, ModelSpec& s, ArchDetails& a) {
  s.architecture = ReadArchitecture(r, "FalconForCausalLM");
  s.vocab_size = ReadSize(r, s, {"vocab_size"}, 65024, kMaxVocab);
  // n_embed, n_layer, n_head and n_head_kv are the RefinedWeb-era spellings.
  s.hidden_size = ReadSize(r, s, {"hidden_size", "n_embed"}, 4544, kMaxHidden);
  s.num_layers = ReadSize(r, s, {"num_hidden_layers", "n_layer"}, 32, kMaxLayers);
  s.num_heads = ReadSize(r, s, {"num_attention_heads", "n_head"}, 71, kMaxHeads);
  s.head_dim = DerivedHeadDim(r, s, "hidden_size", "num_attention_heads");
  uint64_t kv = r.OptUintAny({"num_kv_heads", "n_head_kv"}, 1, kMaxHeads).value_or(s.num_heads);
  a.new_decoder_architecture = r.Bool("new_decoder_architecture", false);
  a.multi_query = r.Bool("multi_query", true);
  s.parallel_attn = r.Bool("parallel_attn", true);
  bool bias = r.Bool("bias", false);
  s.qkv_bias = s.o_bias = s.mlp_bias = bias;
  bool alibi = r.Bool("alibi", false);
  s.position = alibi ? PositionKind::kAlibi : PositionKind::kRope;
  s.max_position_embeddings = r.Uint("max_position_embeddings", 2048, 1, kMaxPositions);
  s.intermediate_size = r.Uint("ffn_hidden_size", 4 * s.hidden_size, 1, kMaxIntermediate);
  a.num_ln_in_parallel_attn = r.Uint("num_ln_in_parallel_attn", 0, 1, 2);
  // FalconDecoderLayer: num_ln_in_parallel_attn None + new architecture -> 2.
  if (a.num_ln_in_parallel_attn == 0 && a.new_decoder_architecture) a.num_ln_in_parallel_attn = 2;
  // FalconAttention: num_kv_heads with the new architecture; one shared head
  // with multi_query; otherwise a plain 3 * hidden projection (all heads).
  s.num_kv_heads = a.new_decoder_architecture ? kv : (a.multi_query ? 1 : s.num_heads);
  // FalconAttention._split_heads and forward (transformers 4.57.6 / 5.24.0): the
  // new architecture broadcast_to()s k and v over the query heads and flattens
  // them (a copy); multi_query hands SDPA a single k/v head, without
  // enable_gqa or repeat_kv.
  if (s.num_kv_heads != s.num_heads) {
    s.kv_sharing = a.new_decoder_architecture ? KvSharing::kExpanded : KvSharing::kBroadcast;
  }
  if (r.ok() && a.new_decoder_architecture) CheckKvHeads(r, s, "num_kv_heads");
  s.tie_word_embeddings = r.Bool("tie_word_embeddings", true);
  s.attention_dropout = r.Number("attention_dropout", 0.0, 0.0, 1.0);
  s.hidden_dropout = r.Number("hidden_dropout", 0.0, 0.0, 1.0);
  s.fused_qkv = true;
  s.torch_dtype = ReadTorchDtype(r);
  s.norm = NormKind::kLayerNorm;
  s.mlp = ReadActivation(r, "activation", "gelu");  // FalconMLP: get_activation(config.activation)
}

void BuildFalcon(const ModelSpec& s, const ArchDetails& a, ParamListBuilder& b) {
  const uint64_t h = s.hidden_size, hd = s.head_dim;
  uint64_t qkv_out = 3 * h;
  if (a.new_decoder_architecture) {
    qkv_out = (2 * s.num_kv_heads + s.num_heads) * hd;
  } else if (a.multi_query) {
    qkv_out = h + 2 * hd;  // multi_query
  }
  b.Embedding("transformer.word_embeddings", s.vocab_size, h, ParamRole::kEmbed);
  for (uint64_t layer = 0; layer < s.num_layers && !b.overflowed(); ++layer) {
    const int i = static_cast<int>(layer);
    const std::string l = fmt::format("transformer.h.{}.", layer);
    b.Linear(l + "self_attention.query_key_value", qkv_out, h, s.qkv_bias, i, ParamRole::kQkv);
    b.Linear(l + "self_attention.dense", h, h, s.o_bias, i, ParamRole::kO);
    b.Linear(l + "mlp.dense_h_to_4h", s.intermediate_size, h, s.mlp_bias, i, ParamRole::kUp);
    b.Linear(l + "mlp.dense_4h_to_h", h, s.intermediate_size, s.mlp_bias, i, ParamRole::kDown);
    if (!s.parallel_attn) {
      b.Norm(l + "post_attention_layernorm", h, true, i);
      b.Norm(l + "input_layernorm", h, true, i);
    } else if (a.num_ln_in_parallel_attn == 2) {
      b.Norm(l + "ln_attn", h, true, i);
      b.Norm(l + "ln_mlp", h, true, i);
    } else {
      b.Norm(l + "input_layernorm", h, true, i);
    }
  }
  b.Norm("transformer.ln_f", h, true, -1);
  if (!s.tie_word_embeddings) b.Linear("lm_head", s.vocab_size, h, false, -1, ParamRole::kLmHead);
}

void ReadPhi(ConfigReader& r, ModelSpec& s, ArchDetails&) {
  s.architecture = ReadArchitecture(r, "PhiForCausalLM");
  s.vocab_size = ReadSize(r, s, {"vocab_size"}, 51200, kMaxVocab);
  s.hidden_size = ReadSize(r, s, {"hidden_size"}, 2048, kMaxHidden);
  s.intermediate_size = ReadSize(r, s, {"intermediate_size"}, 8192, kMaxIntermediate);
  s.num_layers = ReadSize(r, s, {"num_hidden_layers"}, 24, kMaxLayers);
  s.num_heads = ReadSize(r, s, {"num_attention_heads"}, 32, kMaxHeads);
  s.head_dim = DerivedHeadDim(r, s, "hidden_size", "num_attention_heads");
  s.num_kv_heads = r.Uint("num_key_value_heads", s.num_heads, 1, kMaxHeads);
  if (r.ok()) CheckKvHeads(r, s, "num_key_value_heads");
  s.max_position_embeddings = r.Uint("max_position_embeddings", 2048, 1, kMaxPositions);
  s.tie_word_embeddings = r.Bool("tie_word_embeddings", false);
  s.partial_rotary_factor = ReadPartialRotary(r, "partial_rotary_factor", 0.5);
  s.qk_norm = r.Bool("qk_layernorm", false);
  s.attention_dropout = r.Number("attention_dropout", 0.0, 0.0, 1.0);
  // PhiModel.embed_dropout (embd_pdrop); PhiDecoderLayer.resid_dropout on the
  // attention and the MLP output.
  s.hidden_dropout = r.Number("embd_pdrop", 0.0, 0.0, 1.0);
  s.residual_dropout = r.Number("resid_pdrop", 0.0, 0.0, 1.0);
  s.qkv_bias = s.o_bias = s.mlp_bias = true;
  s.parallel_attn = true;  // PhiDecoderLayer feeds one LayerNorm output to both
  s.torch_dtype = ReadTorchDtype(r);
  s.norm = NormKind::kLayerNorm;
  s.mlp = ReadActivation(r, "hidden_act", "gelu_new");
  s.position = PositionKind::kRope;
}

void BuildPhi(const ModelSpec& s, const ArchDetails&, ParamListBuilder& b) {
  const uint64_t h = s.hidden_size, q_dim = s.num_heads * s.head_dim,
                 kv_dim = s.num_kv_heads * s.head_dim;
  b.Embedding("model.embed_tokens", s.vocab_size, h, ParamRole::kEmbed);
  for (uint64_t layer = 0; layer < s.num_layers && !b.overflowed(); ++layer) {
    const int i = static_cast<int>(layer);
    const std::string l = fmt::format("model.layers.{}.", layer);
    b.Linear(l + "self_attn.q_proj", q_dim, h, true, i, ParamRole::kQ);
    b.Linear(l + "self_attn.k_proj", kv_dim, h, true, i, ParamRole::kK);
    b.Linear(l + "self_attn.v_proj", kv_dim, h, true, i, ParamRole::kV);
    b.Linear(l + "self_attn.dense", h, q_dim, true, i, ParamRole::kO);
    if (s.qk_norm) {
      b.Norm(l + "self_attn.q_layernorm", s.head_dim, true, i);
      b.Norm(l + "self_attn.k_layernorm", s.head_dim, true, i);
    }
    b.Linear(l + "mlp.fc1", s.intermediate_size, h, true, i, ParamRole::kUp);
    b.Linear(l + "mlp.fc2", h, s.intermediate_size, true, i, ParamRole::kDown);
    b.Norm(l + "input_layernorm", h, true, i);
  }
  b.Norm("model.final_layernorm", h, true, -1);
  // PhiForCausalLM: lm_head = nn.Linear(hidden, vocab, bias=True); tying shares
  // only the weight, the bias stays its own parameter.
  if (!s.tie_word_embeddings) {
    b.Linear("lm_head", s.vocab_size, h, true, -1, ParamRole::kLmHead);
  } else {
    b.Tensor("lm_head.bias", {s.vocab_size}, -1, "lm_head", ParamRole::kBias, false);
  }
}

void ReadBert(ConfigReader& r, ModelSpec& s, ArchDetails& a) {
  s.architecture = ReadArchitecture(r, "BertForMaskedLM");
  s.is_encoder = true;
  s.vocab_size = ReadSize(r, s, {"vocab_size"}, 30522, kMaxVocab);
  s.hidden_size = ReadSize(r, s, {"hidden_size"}, 768, kMaxHidden);
  s.num_layers = ReadSize(r, s, {"num_hidden_layers"}, 12, kMaxLayers);
  s.num_heads = ReadSize(r, s, {"num_attention_heads"}, 12, kMaxHeads);
  s.intermediate_size = ReadSize(r, s, {"intermediate_size"}, 3072, kMaxIntermediate);
  s.num_kv_heads = s.num_heads;
  s.head_dim = DerivedHeadDim(r, s, "hidden_size", "num_attention_heads");
  s.max_position_embeddings = r.Uint("max_position_embeddings", 512, 1, kMaxLearnedPositions);
  a.type_vocab_size = r.Uint("type_vocab_size", 2, 0, kMaxVocab);
  std::string position = r.String("position_embedding_type", "absolute");
  if (position == "relative_key" || position == "relative_key_query") {
    a.relative_position = true;
  } else if (position != "absolute") {
    r.Fail("position_embedding_type",
           fmt::format("{} is not one of absolute, relative_key, relative_key_query",
                       common::QuoteForMessage(position)));
  }
  s.tie_word_embeddings = r.Bool("tie_word_embeddings", true);
  s.attention_dropout = r.Number("attention_probs_dropout_prob", 0.1, 0.0, 1.0);
  s.hidden_dropout = r.Number("hidden_dropout_prob", 0.1, 0.0, 1.0);
  s.qkv_bias = s.o_bias = s.mlp_bias = true;
  s.torch_dtype = ReadTorchDtype(r);
  s.norm = NormKind::kLayerNorm;
  s.mlp = ReadActivation(r, "hidden_act", "gelu");
  s.position = PositionKind::kLearned;
  if (s.architecture == "BertForSequenceClassification") {
    ReadSequenceClassification(r, s);
  } else if (s.architecture == "BertForTokenClassification") {
    // The same labels; the loss is always cross-entropy over the tokens.
    ReadSequenceClassification(r, s);
    s.token_classification = true;
    if (r.ok() && s.num_labels == 1)
      r.Fail("id2label", "token classification needs 2 or more labels");
  } else if (s.architecture != "BertForMaskedLM") {
    s.notes.push_back(
        fmt::format("bert: parameters are those of BertForMaskedLM (no pooler), "
                    "not of {}",
                    s.architecture));
  }
}

// BertForMaskedLM: BertModel(add_pooling_layer=False) + cls.predictions.
void BuildBert(const ModelSpec& s, const ArchDetails& a, ParamListBuilder& b) {
  const uint64_t h = s.hidden_size;
  b.Embedding("bert.embeddings.word_embeddings", s.vocab_size, h, ParamRole::kEmbed);
  b.Embedding("bert.embeddings.position_embeddings", s.max_position_embeddings, h,
              ParamRole::kPosEmbed);
  b.Embedding("bert.embeddings.token_type_embeddings", a.type_vocab_size, h, ParamRole::kTypeEmbed);
  b.Norm("bert.embeddings.LayerNorm", h, true, -1);
  for (uint64_t layer = 0; layer < s.num_layers && !b.overflowed(); ++layer) {
    const int i = static_cast<int>(layer);
    const std::string l = fmt::format("bert.encoder.layer.{}.", layer);
    b.Linear(l + "attention.self.query", h, h, true, i, ParamRole::kQ);
    b.Linear(l + "attention.self.key", h, h, true, i, ParamRole::kK);
    b.Linear(l + "attention.self.value", h, h, true, i, ParamRole::kV);
    if (a.relative_position) {
      b.Tensor(l + "attention.self.distance_embedding.weight",
               {2 * s.max_position_embeddings - 1, s.head_dim}, i,
               l + "attention.self.distance_embedding", ParamRole::kPosEmbed, false);
    }
    b.Linear(l + "attention.output.dense", h, h, true, i, ParamRole::kO);
    b.Norm(l + "attention.output.LayerNorm", h, true, i);
    b.Linear(l + "intermediate.dense", s.intermediate_size, h, true, i, ParamRole::kUp);
    b.Linear(l + "output.dense", h, s.intermediate_size, true, i, ParamRole::kDown);
    b.Norm(l + "output.LayerNorm", h, true, i);
  }
  if (s.num_labels > 0) {
    // BertModel(add_pooling_layer=True): the pooler after the encoder; then
    // BertForSequenceClassification's dropout and classifier. Token
    // classification has no pooler (add_pooling_layer=False).
    if (!s.token_classification) {
      b.Linear("bert.pooler.dense", h, h, true, -1, ParamRole::kHeadDense);
    }
    b.Linear("classifier", s.num_labels, h, true, -1, ParamRole::kLmHead);
    return;
  }
  // BertLMPredictionHead: its own `bias` (shared with decoder.bias) is listed
  // before the transform submodule; decoder.weight is the tied word embedding.
  b.Tensor("cls.predictions.bias", {s.vocab_size}, -1, "cls.predictions", ParamRole::kBias, false);
  b.Linear("cls.predictions.transform.dense", h, h, true, -1, ParamRole::kHeadDense);
  b.Norm("cls.predictions.transform.LayerNorm", h, true, -1);
  if (!s.tie_word_embeddings) {
    b.Tensor("cls.predictions.decoder.weight", {s.vocab_size, h}, -1, "cls.predictions.decoder",
             ParamRole::kLmHead, true);
  }
}

}  // namespace

const std::vector<Family>& ClassicFamilies() {
  static const std::vector<Family> kFamilies = {
      {"gpt2", ReadGpt2, BuildGpt2}, {"gpt_neox", ReadGptNeox, BuildGptNeox},
      {"opt", ReadOpt, BuildOpt},    {"falcon", ReadFalcon, BuildFalcon},
      {"phi", ReadPhi, BuildPhi},    {"bert", ReadBert, BuildBert},
      {"vit", ReadVit, BuildVit},    {"t5", ReadT5, BuildT5},
  };
  return kFamilies;
}

}  // namespace vramscope::ingest
