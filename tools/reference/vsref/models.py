"""The model configs the fidelity grid runs: published catalog configs, cut down.

A reference point builds the real transformers model from a config.json and the lowering
reads the very same file, so both sides see identical shapes. The configs are the
catalog's published ones (data/models/) with the layer count cut to 2 and the width
shrunk (hidden 128, 4 heads, vocabulary 512): every flag that selects a code path
(model_type, norms, biases, tied embeddings, GQA ratio, post-norm layout, projections,
MoE routing) is kept, only sizes change. Byte rules are per-shape, so a rule that is
wrong at real width is wrong here too; small shapes only make small tensors (loss
scalars, step counters) weigh more, which makes the check stricter, not looser.
"""

import copy
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
CATALOG_DIR = os.path.normpath(os.path.join(HERE, "..", "..", "..", "data", "models"))

# One catalog model per architecture family of the catalog (docs/models.md).
FAMILIES = {
    "llama": "llama-3.2-1b",
    "mistral": "mistral-7b-v0.3",
    "qwen2": "qwen2.5-0.5b",
    "qwen3": "qwen3-0.6b",
    "gemma": "gemma-2b",
    "gemma2": "gemma-2-2b",
    "gemma3": "gemma-3-1b",
    "phi": "phi-2",
    "phi3": "phi-3-mini-4k",
    "falcon": "falcon-7b",
    "gpt2": "gpt2",
    "gpt_neox": "pythia-160m",
    "opt": "opt-125m",
    "opt_postnorm": "opt-350m",  # do_layer_norm_before: false, word_embed_proj_dim 512
    "bert": "bert-base-uncased",
    # BertForSequenceClassification on the same config: the pooler, a classifier and
    # CrossEntropyLoss over 3 labels (bert_seqcls), or MSELoss over 1 (bert_regression).
    "bert_seqcls": "bert-base-uncased",
    "bert_regression": "bert-base-uncased",
    # BertForTokenClassification: no pooler, a classifier over every token (5 labels).
    "bert_tokcls": "bert-base-uncased",
    # GenericForSequenceClassification (a `score` head on the last non-pad token): Llama
    # with 3 labels, and a Qwen2 reward model (1 label, MSELoss).
    "llama_seqcls": "llama-3.2-1b",
    "qwen2_reward": "qwen2.5-0.5b",
    "stablelm": "stablelm-2-1.6b",
    "qwen2_moe": "qwen1.5-moe-a2.7b",
    "mixtral": "mixtral-8x7b",
    # ViTForImageClassification: a 32 x 32 image in 8 x 8 patches (17 tokens), 10 labels.
    "vit": "vit-base-patch16-224",
    # T5ForConditionalGeneration (seq2seq): the original relu feed-forward with tied
    # embeddings (t5-base), and v1.1 / flan's gated-gelu with tie_word_embeddings false
    # (flan-t5-large; transformers 5.24 ties lm_head anyway, without the output scaling).
    "t5": "t5-base",
    "t5_v11": "flan-t5-large",
    # CLIPModel's contrastive step (return_loss=True): both towers cut down (CLIP_REDUCED).
    "clip": "clip-vit-large-patch14",
}


HIDDEN = 128
HEADS = 4
HEAD_DIM = HIDDEN // HEADS
INTERMEDIATE = 256
VOCAB = 512
LAYERS = 2

# T5's reduced inner attention width (num_heads x d_kv) differs from d_model both ways,
# and flan's decoder is one block deeper than its encoder (num_decoder_layers).
T5_SHAPES = {"t5": {"d_kv": 16}, "t5_v11": {"d_kv": 48, "num_decoder_layers": LAYERS + 1}}


def is_t5(family):
    return family in T5_SHAPES


def catalog_config(alias):
    """The catalog's config.json for `alias`, without vramscope's own `_vramscope` block."""
    with open(os.path.join(CATALOG_DIR, alias + ".json"), encoding="utf-8") as f:
        config = json.load(f)
    config.pop("_vramscope", None)
    return config


def _set_if(config, key, value):
    if key in config:
        config[key] = value


def reduce_config(config):
    """A copy of `config` at reference size (see the module docstring)."""
    c = dict(config)
    heads = int(c.get("num_attention_heads", c.get("n_head", HEADS)))
    kv = int(c.get("num_key_value_heads", heads) or heads)
    kv_reduced = HEADS if kv >= heads else max(1, HEADS * kv // heads)
    if kv < heads and kv_reduced == HEADS:
        kv_reduced = HEADS // 2
    c["num_hidden_layers"] = LAYERS
    _set_if(c, "n_layer", LAYERS)
    for key in ("hidden_size", "n_embd", "d_model"):
        _set_if(c, key, HIDDEN)
    if c.get("model_type") == "opt":
        # OPT: word_embed_proj_dim below hidden_size adds project_in/project_out (opt-350m).
        proj = int(config.get("word_embed_proj_dim", config["hidden_size"]))
        c["word_embed_proj_dim"] = HIDDEN if proj == config["hidden_size"] else HIDDEN // 2
        c["ffn_dim"] = INTERMEDIATE
    for key in ("num_attention_heads", "n_head"):
        _set_if(c, key, HEADS)
    for key in ("num_key_value_heads", "num_kv_heads"):
        _set_if(c, key, kv_reduced)
    if "head_dim" in c:
        c["head_dim"] = HEAD_DIM
    for key in ("intermediate_size", "n_inner", "ffn_dim"):
        if c.get(key) is not None:
            c[key] = INTERMEDIATE
    c["vocab_size"] = VOCAB
    # MoE: 4 experts, 2 per token, small experts (the routing code paths stay).
    for key in ("num_local_experts", "num_experts"):
        _set_if(c, key, 4)
    _set_if(c, "num_experts_per_tok", 2)
    for key in ("moe_intermediate_size", "shared_expert_intermediate_size"):
        _set_if(c, key, INTERMEDIATE // 2)
    # Gemma 2/3 sliding windows and Gemma 3's local/global pattern stay meaningful at seq 64.
    _set_if(c, "sliding_window", 32)
    _set_if(c, "query_pre_attn_scalar", HEAD_DIM)
    # Token ids of the published vocabulary may exceed the reduced one.
    for key in ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id"):
        if key in c and c[key] is not None:
            c[key] = 1 if not isinstance(c[key], list) else [1]
    c.pop("rope_scaling", None)
    return c


# Diffusers UNet2DConditionModel families (run by vsref/unet.py under .venv/tf5 only,
# which alone has diffusers). Unlike the families above these are not catalog files cut
# down: each is written here at reference size (8x8 latents, 32/64 channels, 8 groups) with
# the keys of the published config it imitates, so that the same code paths run.
UNET_FAMILIES = {
    # stable-diffusion-v1-5/unet/config.json: conv proj_in/proj_out (use_linear_projection
    # absent), the legacy `attention_head_dim` that means the head count (8 heads of every
    # width), cross-attention down blocks before a plain DownBlock2D and the mirror-image up
    # path, UNetMidBlock2DCrossAttn (the default), no additional embedding.
    "unet_sd15": {
        "_class_name": "UNet2DConditionModel", "sample_size": 8, "in_channels": 4,
        "out_channels": 4, "layers_per_block": 2, "block_out_channels": [32, 64, 64],
        "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
        "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"],
        "cross_attention_dim": 32, "attention_head_dim": 8, "norm_num_groups": 8,
        "norm_eps": 1e-05, "act_fn": "silu", "flip_sin_to_cos": True, "freq_shift": 0,
        "downsample_padding": 1, "mid_block_scale_factor": 1, "center_input_sample": False,
    },
    # stable-diffusion-xl-base-1.0/unet/config.json: linear proj_in/proj_out, per-block
    # head counts and transformer_layers_per_block lists (2 transformer blocks in the last
    # level, as SDXL's deeper levels have several), a plain first level, and the
    # "text_time" additional embedding (text_embeds of width 80 - 6 * 8 = 32 plus six
    # time ids through a sinusoidal projection).
    "unet_sdxl": {
        "_class_name": "UNet2DConditionModel", "sample_size": 8, "in_channels": 4,
        "out_channels": 4, "layers_per_block": 2, "block_out_channels": [32, 64],
        "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D"],
        "up_block_types": ["CrossAttnUpBlock2D", "UpBlock2D"],
        "attention_head_dim": [2, 4], "transformer_layers_per_block": [1, 2],
        "use_linear_projection": True, "cross_attention_dim": 48,
        "addition_embed_type": "text_time", "addition_time_embed_dim": 8,
        "projection_class_embeddings_input_dim": 80, "norm_num_groups": 8, "norm_eps": 1e-05,
        "act_fn": "silu", "flip_sin_to_cos": True, "freq_shift": 0,
        "mid_block_type": "UNetMidBlock2DCrossAttn",
    },
}

# SD 1.5's UNet with its frozen CLIP text encoder on the device (train_text_to_image.py
# keeps it there and encodes each micro-batch): the unet_sd15 UNet, and a CLIPTextModel
# as sd-1.5-text-encoder cut down to the UNet's cross_attention_dim (32 wide, 4 heads,
# quick_gelu, eos_token_id 2), estimated with --text-encoder.
UNET_FAMILIES["unet_sd15_te"] = UNET_FAMILIES["unet_sd15"]
TEXT_ENCODERS = {
    "unet_sd15_te": {
        "architectures": ["CLIPTextModel"], "model_type": "clip_text_model",
        "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "vocab_size": 512, "max_position_embeddings": 16,
        "hidden_act": "quick_gelu", "bos_token_id": 0, "eos_token_id": 2, "pad_token_id": 1,
        "projection_dim": 32,
    },
}


# SDXL's UNet with both frozen text encoders (train_text_to_image_lora_sdxl.py encodes each
# micro-batch): CLIPTextModel 16 wide and CLIPTextModelWithProjection 32 wide (gelu, as
# sdxl-text-encoder-2), whose penultimate hidden states concatenate to the UNet's
# cross_attention_dim 48 and whose projection (32) is its text_embeds.
UNET_FAMILIES["unet_sdxl_te"] = UNET_FAMILIES["unet_sdxl"]
TEXT_ENCODERS["unet_sdxl_te"] = [
    dict(TEXT_ENCODERS["unet_sd15_te"], hidden_size=16, intermediate_size=32),
    dict(TEXT_ENCODERS["unet_sd15_te"], architectures=["CLIPTextModelWithProjection"],
         hidden_act="gelu", projection_dim=32),
]
TEXT_ENCODERS["unet_sd15_te"] = [TEXT_ENCODERS["unet_sd15_te"]]


def text_encoder_config_paths(family):
    """Files holding TEXT_ENCODERS[family] for `estimate --text-encoder`, in order
    (written on demand under the system's temporary directory)."""
    import tempfile

    paths = []
    for i, config in enumerate(TEXT_ENCODERS[family]):
        path = os.path.join(tempfile.gettempdir(), f"vsref-{family}-text-encoder-{i}.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(config, f)
        paths.append(path)
    return paths


# The ViT family's image, patches and labels at reference size.
VIT_IMAGE, VIT_PATCH, VIT_LABELS = 32, 8, 10

# vramscope's --image-size is in pixels; latent UNets see it through the VAE's 8x
# downsampling (vramscope's default VAE scale), so sample_size latents = 8 x pixels.
VAE_SCALE = 8

# diffusers' FluxTransformer2DModel at reduced width (vsref/flux.py runs it): FLUX.1-dev's
# layout (guidance embedding, double and single blocks) with two blocks of each kind and
# two heads of 16 features rotated by axes 4 + 6 + 6.
FLUX_FAMILIES = {
    "flux_dev": {
        "_class_name": "FluxTransformer2DModel", "patch_size": 1, "in_channels": 16,
        "num_layers": 2, "num_single_layers": 2, "attention_head_dim": 16,
        "num_attention_heads": 2, "joint_attention_dim": 32, "pooled_projection_dim": 24,
        "guidance_embeds": True, "axes_dims_rope": [4, 6, 6],
    },
}
# FLUX.1-dev's transformer with both frozen text encoders on the device, encoding each
# micro-batch (train_dreambooth_(lora_)flux.py with per-image captions): a CLIPTextModel as
# FLUX's text_encoder (CLIP-L's layout) 24 wide, the transformer's pooled_projection_dim,
# whose max_position_embeddings (16) stands for the 77 tokens FluxPipeline pads CLIP to;
# and a T5EncoderModel as text_encoder_2 (google/t5-v1_1-xxl's gated-gelu layout) 32 wide,
# the transformer's joint_attention_dim, reading the point's text length.
FLUX_FAMILIES["flux_dev_te"] = FLUX_FAMILIES["flux_dev"]
TEXT_ENCODERS["flux_dev_te"] = [
    dict(TEXT_ENCODERS["unet_sd15_te"][0], hidden_size=24, intermediate_size=48),
    {
        "architectures": ["T5EncoderModel"], "model_type": "t5", "d_model": 32, "d_kv": 8,
        "num_heads": 4, "d_ff": 48, "num_layers": 2, "feed_forward_proj": "gated-gelu",
        "vocab_size": 256, "dropout_rate": 0.1, "relative_attention_num_buckets": 32,
        "relative_attention_max_distance": 128, "is_encoder_decoder": True,
        "tie_word_embeddings": False, "use_cache": False,
    },
]

# diffusers' AutoencoderKL at reduced width (vsref/vae.py runs it, `estimate --vae` reads
# it): the published VAEs' four levels (so 8 pixels per latent, VAE_SCALE), one resnet per
# level, 32 / 64 channels in 8 groups, the mid block's attention. "vae_sd" imitates
# stable-diffusion-v1-5/vae/config.json (quant_conv, scaling_factor 0.18215); "vae_flux"
# FLUX.1-dev's (no quant_conv / post_quant_conv, shift_factor and scaling_factor) with the
# 4 latent channels the reduced FLUX transformer packs into its 16 features.
_VAE_COMMON = {
    "_class_name": "AutoencoderKL", "act_fn": "silu", "in_channels": 3, "out_channels": 3,
    "block_out_channels": [32, 32, 64, 64], "down_block_types": ["DownEncoderBlock2D"] * 4,
    "up_block_types": ["UpDecoderBlock2D"] * 4, "layers_per_block": 1, "norm_num_groups": 8,
    "latent_channels": 4, "sample_size": 64,
}
VAE_FAMILIES = {
    "vae_sd": {**_VAE_COMMON, "scaling_factor": 0.18215},
    "vae_flux": {**_VAE_COMMON, "force_upcast": True, "scaling_factor": 0.3611,
                 "shift_factor": 0.1159, "use_quant_conv": False, "use_post_quant_conv": False,
                 "mid_block_add_attention": True},
}

# A FLUX point's latent side (the VAE's latents, before the 2 x 2 packing) and text length.
FLUX_LATENT_SIDE = 8
FLUX_TEXT_LEN = 8
# With the frozen text encoders, 64 tokens: T5's position-bias mask (a [1, heads, T, T] copy
# per layer) and its states then weigh in the encoder's forward.
FLUX_TE_TEXT_LEN = 64


def flux_text_len(family):
    return FLUX_TE_TEXT_LEN if family in TEXT_ENCODERS else FLUX_TEXT_LEN


def is_unet(family):
    return family in UNET_FAMILIES


def is_flux(family):
    return family in FLUX_FAMILIES


# Sequence-classification heads on a catalog config: the architecture and the labels
# (id2label, as PretrainedConfig writes num_labels).
SEQUENCE_CLASSIFICATION = {"bert_seqcls": 3, "bert_regression": 1, "llama_seqcls": 3,
                           "qwen2_reward": 1, "bert_tokcls": 5}


# CLIP's towers at reference size: the text tower at the common width, the vision tower
# narrower (so that a rule reading the wrong tower's width shows), a 32 x 32 image in
# 8 x 8 patches (17 tokens), 64 text positions (the points' --text-len), projection 48.
# hidden_act, eos_token_id (2: the argmax pooling path) and the rest stay published.
CLIP_REDUCED = {
    "text_config": {"hidden_size": HIDDEN, "num_attention_heads": HEADS,
                    "intermediate_size": INTERMEDIATE, "num_hidden_layers": LAYERS,
                    "vocab_size": VOCAB, "max_position_embeddings": 64},
    "vision_config": {"hidden_size": 64, "num_attention_heads": HEADS, "intermediate_size": 128,
                      "num_hidden_layers": LAYERS, "image_size": 32, "patch_size": 8},
    "projection_dim": 48,
}


def reduce_clip_config(config):
    """A CLIP config.json (CLIPModel, or one tower) with CLIP_REDUCED's sizes."""
    c = copy.deepcopy(config)
    if c.get("model_type") == "clip":
        for tower in ("text_config", "vision_config"):
            c[tower].update(CLIP_REDUCED[tower])
        c["projection_dim"] = CLIP_REDUCED["projection_dim"]
        return c
    tower = "text_config" if c.get("model_type") == "clip_text_model" else "vision_config"
    c.update(CLIP_REDUCED[tower])
    c["projection_dim"] = CLIP_REDUCED["projection_dim"]
    return c


def reference_config(family):
    """The reduced config of `family`: a catalog model cut down, or a UNet written above."""
    if is_unet(family):
        return copy.deepcopy(UNET_FAMILIES[family])
    if is_flux(family):
        return copy.deepcopy(FLUX_FAMILIES[family])
    if family == "clip":
        return reduce_clip_config(catalog_config(FAMILIES[family]))
    if family == "llama_tt":
        # torchtune's own Llama 3.2 decoder (vsref/torchtune_model.py; not a
        # FAMILIES entry), estimated with --impl torchtune: its rotary cache is
        # max_seq_len long, 256 here rather than the catalog's 131072.
        config = reduce_config(catalog_config(FAMILIES["llama"]))
        # Two kv heads, so that torchtune's per-head k / v copies are copies
        # (one kv head expands as a view). The reference is built with llama3_2's
        # builders (Llama3ScaledRoPE, one module for every layer): the config says
        # so with Llama 3.2's rope_type, which reduce_config drops.
        config.update(max_position_embeddings=256, num_key_value_heads=2,
                      rope_scaling=catalog_config(FAMILIES["llama"])["rope_scaling"])
        return config
    if family == "qwen2_tt":
        # torchtune's own Qwen2 decoder (qwen2 / lora_qwen2 component builders): Qwen2.5's
        # q / k / v biases, tied embeddings (TiedLinear), Qwen2RotaryPositionalEmbeddings.
        config = reduce_config(catalog_config(FAMILIES["qwen2"]))
        config.update(max_position_embeddings=256, num_key_value_heads=2)
        return config
    if family == "llama_tt8":
        # The same with eight layers (the activation-offloading points).
        config = reference_config("llama_tt")
        config.update(num_hidden_layers=8)
        return config
    if family == "llama_lg":
        # LitGPT's own GPT (vsref/litgpt_model.py; not a FAMILIES entry), estimated with
        # --impl litgpt: block_size 512 (max_position_embeddings) above the 256-token rows,
        # so that fit()'s max_seq_length rebuilds the RoPE cache; two query groups, so that
        # k / v are repeat_interleave'd copies.
        config = reduce_config(catalog_config(FAMILIES["llama"]))
        config.update(max_position_embeddings=512, num_key_value_heads=2,
                      tie_word_embeddings=False)
        return config
    if family == "llama_lg_mha":
        # The same with as many query groups as heads: LoRAQKVLinear's single grouped
        # conv1d (litgpt/lora.py 0.5.13), k / v without repeat_interleave copies.
        config = reference_config("llama_lg")
        config.update(num_key_value_heads=config["num_attention_heads"])
        return config
    config = reduce_config(catalog_config(FAMILIES[family]))
    if is_t5(family):
        # T5Config names its sizes num_layers / num_heads / d_ff (num_hidden_layers is an
        # alias that vramscope does not read).
        config.pop("num_hidden_layers", None)
        config.update(num_layers=LAYERS, num_heads=HEADS, d_ff=INTERMEDIATE, **T5_SHAPES[family])
        config.setdefault("num_decoder_layers", LAYERS)
    if config.get("model_type") == "vit":
        config.update(image_size=VIT_IMAGE, patch_size=VIT_PATCH, num_labels=VIT_LABELS)
        config.pop("vocab_size", None)
    if family in SEQUENCE_CLASSIFICATION:
        labels = SEQUENCE_CLASSIFICATION[family]
        architecture = config["architectures"][0]
        task = "ForTokenClassification" if family.endswith("_tokcls") else "ForSequenceClassification"
        for head in ("ForMaskedLM", "ForCausalLM"):
            architecture = architecture.replace(head, task)
        config["architectures"] = [architecture]
        config["id2label"] = {str(i): f"LABEL_{i}" for i in range(labels)}
        if config.get("model_type") != "bert":
            # Batches of more than one row need a pad token (transformers raises without
            # one); the reference's ids are drawn from 2.., so no row is padded.
            config["pad_token_id"] = 0
    return config
