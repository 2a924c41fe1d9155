// T5ForConditionalGeneration and T5EncoderModel (transformers 5.24.0
// models/t5/modeling_t5.py and configuration_t5.py). Defaults are T5Config's;
// the parameter names and order are named_parameters()' in 5.24.0.
#include <fmt/format.h>

#include "families.h"
#include "vramscope/common/quote.h"

namespace vramscope::ingest {
namespace {

// feed_forward_proj "relu" / "gated-gelu" / "gated-ACT" (T5Config.__post_init__
// and validate_architecture, 5.24.0): "gated-gelu" means gelu_new; a config's
// own dense_act_fn (the published v1.1 / flan configs carry one) is applied
// afterwards by PreTrainedConfig's kwargs, so it wins.
void ReadFeedForward(ConfigReader& r, ModelSpec& s) {
  const std::string proj = r.String("feed_forward_proj", "relu");
  const size_t dash = proj.find('-');
  const bool gated = dash != std::string::npos && proj.substr(0, dash) == "gated";
  if ((dash != std::string::npos && !gated) ||
      (gated && proj.find('-', dash + 1) != std::string::npos)) {
    r.Fail("feed_forward_proj",
           fmt::format("{} is not `ACT` or `gated-ACT`", common::QuoteForMessage(proj)));
    return;
  }
  s.t5.gated = gated;
  if (r.Has("is_gated_act") && r.Bool("is_gated_act", gated) != gated) {
    r.Fail("is_gated_act", "disagrees with feed_forward_proj");
    return;
  }
  std::string act = gated ? proj.substr(dash + 1) : proj;
  if (proj == "gated-gelu") act = "gelu_new";
  s.mlp = ReadActivation(r, "dense_act_fn", act);
}

// The architectures transformers builds from a t5 config that are lowered
// here; the others (T5Model, the classification / QA / token heads) select
// code paths that are not modelled and are refused by name.
void ReadT5Architecture(ConfigReader& r, ModelSpec& s) {
  s.architecture = ReadArchitecture(r, "T5ForConditionalGeneration");
  if (s.architecture == "T5EncoderModel") {
    s.t5.encoder_only = true;
  } else if (s.architecture != "T5ForConditionalGeneration") {
    r.Fail("architectures",
           fmt::format("{} is not modelled (T5ForConditionalGeneration and T5EncoderModel are)",
                       common::QuoteForMessage(s.architecture)));
  }
  // A T5 stack used on its own as a decoder (is_decoder) is another model.
  if (r.Bool("is_decoder", false)) r.Fail("is_decoder", "a T5 decoder on its own is not modelled");
}

}  // namespace

void ReadT5(ConfigReader& r, ModelSpec& s, ArchDetails&) {
  ReadT5Architecture(r, s);
  s.is_t5 = true;
  s.vocab_size = ReadSize(r, s, {"vocab_size"}, 32128, kMaxVocab);
  s.hidden_size = ReadSize(r, s, {"d_model"}, 512, kMaxHidden);
  s.head_dim = r.Uint("d_kv", 64, 1, kMaxHeadDim);
  s.intermediate_size = ReadSize(r, s, {"d_ff"}, 2048, kMaxIntermediate);
  s.t5.encoder_layers = ReadSize(r, s, {"num_layers"}, 6, kMaxLayers);
  // num_decoder_layers: null or absent means num_layers ("symmetry").
  s.t5.decoder_layers = r.IsNull("num_decoder_layers")
                            ? s.t5.encoder_layers
                            : r.Uint("num_decoder_layers", s.t5.encoder_layers, 1, kMaxLayers);
  if (s.t5.encoder_only) s.t5.decoder_layers = 0;
  s.num_layers = s.t5.encoder_layers + s.t5.decoder_layers;
  s.num_heads = ReadSize(r, s, {"num_heads"}, 8, kMaxHeads);
  s.num_kv_heads = s.num_heads;
  if (r.ok() && s.num_heads * s.head_dim > kMaxHidden * 4)
    r.Fail("d_kv", fmt::format("num_heads x d_kv = {} is absurd", s.num_heads * s.head_dim));
  s.t5.num_buckets = r.Uint("relative_attention_num_buckets", 32, 2, 1 << 16);
  s.t5.max_distance = r.Uint("relative_attention_max_distance", 128, 2, 1 << 24);
  s.t5.dropout = r.Number("dropout_rate", 0.1, 0.0, 1.0);
  s.attention_dropout = s.hidden_dropout = s.t5.dropout;
  ReadFeedForward(r, s);
  // T5Config.__post_init__ (5.24.0): `scale_decoder_outputs = tie_word_embeddings
  // is not False`, then `tie_word_embeddings = True` whatever the config says,
  // so lm_head is the shared embedding even for v1.1 / flan checkpoints
  // (4.57.6 kept an untied lm_head for them).
  s.t5.scale_decoder_outputs = r.Bool("tie_word_embeddings", true);
  s.tie_word_embeddings = true;
  s.torch_dtype = ReadTorchDtype(r);
  s.norm = NormKind::kRmsNorm;
  s.position = PositionKind::kLearned;  // relative buckets; no position table
  s.qkv_bias = s.o_bias = s.mlp_bias = false;
  s.use_cache = !s.t5.encoder_only && r.Bool("use_cache", true);
  s.max_position_embeddings = 0;  // relative positions: any length runs
}

namespace {

// One stack's blocks; the decoder's layer indices follow the encoder's.
void BuildT5Stack(const ModelSpec& s, ParamListBuilder& b, bool decoder) {
  const uint64_t h = s.hidden_size, inner = s.num_heads * s.head_dim;
  const uint64_t n = decoder ? s.t5.decoder_layers : s.t5.encoder_layers;
  const uint64_t first = decoder ? s.t5.encoder_layers : 0;
  const std::string stack = decoder ? "decoder." : "encoder.";
  for (uint64_t layer = 0; layer < n && !b.overflowed(); ++layer) {
    const int i = static_cast<int>(first + layer);
    const std::string l = fmt::format("{}block.{}.layer.", stack, layer);
    auto attention = [&](const std::string& m) {
      b.Linear(m + ".q", inner, h, false, i, ParamRole::kQ);
      b.Linear(m + ".k", inner, h, false, i, ParamRole::kK);
      b.Linear(m + ".v", inner, h, false, i, ParamRole::kV);
      b.Linear(m + ".o", h, inner, false, i, ParamRole::kO);
    };
    attention(l + "0.SelfAttention");
    if (layer == 0) {
      // Only each stack's first block has_relative_attention_bias.
      b.Tensor(l + "0.SelfAttention.relative_attention_bias.weight",
               {s.t5.num_buckets, s.num_heads}, i, l + "0.SelfAttention.relative_attention_bias",
               ParamRole::kPosEmbed, false);
    }
    b.Norm(l + "0.layer_norm", h, false, i);
    const std::string ff = l + (decoder ? "2" : "1");
    if (decoder) {
      attention(l + "1.EncDecAttention");
      b.Norm(l + "1.layer_norm", h, false, i);
    }
    if (s.t5.gated) {
      b.Linear(ff + ".DenseReluDense.wi_0", s.intermediate_size, h, false, i, ParamRole::kGate);
      b.Linear(ff + ".DenseReluDense.wi_1", s.intermediate_size, h, false, i, ParamRole::kUp);
    } else {
      b.Linear(ff + ".DenseReluDense.wi", s.intermediate_size, h, false, i, ParamRole::kUp);
    }
    b.Linear(ff + ".DenseReluDense.wo", h, s.intermediate_size, false, i, ParamRole::kDown);
    b.Norm(ff + ".layer_norm", h, false, i);
  }
  b.Norm(stack + "final_layer_norm", h, false, -1);
}

}  // namespace

// `shared` is the one embedding (encoder/decoder.embed_tokens and lm_head are
// tied to it in 5.24.0, so named_parameters() lists it once).
void BuildT5(const ModelSpec& s, const ArchDetails&, ParamListBuilder& b) {
  b.Embedding("shared", s.vocab_size, s.hidden_size, ParamRole::kEmbed);
  BuildT5Stack(s, b, false);
  if (!s.t5.encoder_only) BuildT5Stack(s, b, true);
}

}  // namespace vramscope::ingest
