"""Small reference models for the ground-truth checks and the recording-cost benchmark.

Plain PyTorch (plus torchvision for ResNet-50), written for this project:
- UNet: the shape of seed 001's diffusion UNet (conv blocks with GroupNorm and SiLU, a
  time embedding, strided-conv down-sampling, nearest up-sampling, skip connections),
  at reduced width;
- TinyNeRF: seed 004's tiny NeRF (positional encoding, an 8x256 MLP with a skip
  connection, volume rendering over many rays);
- GPT: a decoder-only transformer with hand-written causal attention;
- Llama: a Llama-like decoder (RMSNorm, rotary embeddings, SwiGLU); `llama_7b_config`
  has Llama-2-7B's sizes.

`build(name, device)` returns (model, batch, loss_fn, optimizer) ready for record_step.
"""

import math

import torch
from torch import nn
from torch.nn import functional as F

# ----------------------------------------------------------------------------- UNet


def _groups(channels):
    return 8 if channels % 8 == 0 else 1


class ResBlock(nn.Module):
    def __init__(self, in_ch, out_ch, time_dim):
        super().__init__()
        self.norm1 = nn.GroupNorm(_groups(in_ch), in_ch)
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, padding=1)
        self.time = nn.Linear(time_dim, out_ch)
        self.norm2 = nn.GroupNorm(_groups(out_ch), out_ch)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, padding=1)
        self.skip = nn.Conv2d(in_ch, out_ch, 1) if in_ch != out_ch else nn.Identity()

    def forward(self, x, t_emb):
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.time(t_emb)[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return h + self.skip(x)


class UNet(nn.Module):
    """Diffusion UNet: base channels `ch`, one ResBlock per level, multipliers `mults`."""

    def __init__(self, in_ch=3, ch=32, mults=(1, 2, 4), time_dim=128):
        super().__init__()
        self.time_dim = time_dim
        self.time_mlp = nn.Sequential(nn.Linear(time_dim, time_dim), nn.SiLU(),
                                      nn.Linear(time_dim, time_dim))
        self.stem = nn.Conv2d(in_ch, ch, 3, padding=1)
        self.down_blocks = nn.ModuleList()
        self.downsamples = nn.ModuleList()
        chans = [ch]
        cur = ch
        for i, mult in enumerate(mults):
            out = ch * mult
            self.down_blocks.append(ResBlock(cur, out, time_dim))
            cur = out
            chans.append(cur)
            if i < len(mults) - 1:
                self.downsamples.append(nn.Conv2d(cur, cur, 3, stride=2, padding=1))
        self.mid = ResBlock(cur, cur, time_dim)
        self.up_blocks = nn.ModuleList()
        self.upsamples = nn.ModuleList()
        for i, mult in reversed(list(enumerate(mults))):
            out = ch * mult
            self.up_blocks.append(ResBlock(cur + chans.pop(), out, time_dim))
            cur = out
            if i > 0:
                self.upsamples.append(nn.Conv2d(cur, cur, 3, padding=1))
        self.out_norm = nn.GroupNorm(_groups(cur), cur)
        self.out = nn.Conv2d(cur, in_ch, 3, padding=1)

    def timestep_embedding(self, t):
        half = self.time_dim // 2
        freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device) / half)
        args = t[:, None].float() * freqs[None]
        return torch.cat([torch.sin(args), torch.cos(args)], dim=-1)

    def forward(self, x, t):
        t_emb = self.time_mlp(self.timestep_embedding(t))
        h = self.stem(x)
        skips = []
        for i, block in enumerate(self.down_blocks):
            h = block(h, t_emb)
            skips.append(h)
            if i < len(self.downsamples):
                h = self.downsamples[i](h)
        h = self.mid(h, t_emb)
        for i, block in enumerate(self.up_blocks):
            h = block(torch.cat([h, skips.pop()], dim=1), t_emb)
            if i < len(self.upsamples):
                h = self.upsamples[i](F.interpolate(h, scale_factor=2.0, mode="nearest"))
        return self.out(F.silu(self.out_norm(h)))


# ----------------------------------------------------------------------------- NeRF


def positional_encoding(x, num_freqs):
    parts = [x]
    for i in range(num_freqs):
        parts.append(torch.sin((2.0 ** i) * x))
        parts.append(torch.cos((2.0 ** i) * x))
    return torch.cat(parts, dim=-1)


class TinyNeRF(nn.Module):
    """The tiny NeRF: PE(L) of 3-D points, 8 x `width` ReLU MLP, skip at layer 4, rendering."""

    def __init__(self, width=256, depth=8, num_freqs=6, skip=4):
        super().__init__()
        self.num_freqs = num_freqs
        self.skip = skip
        in_dim = 3 + 3 * 2 * num_freqs
        layers = []
        for i in range(depth):
            fan_in = in_dim if i == 0 else width + (in_dim if i == skip else 0)
            layers.append(nn.Linear(fan_in, width))
        self.layers = nn.ModuleList(layers)
        self.head = nn.Linear(width, 4)

    def forward(self, points, deltas):
        # points: (rays, samples, 3); deltas: (rays, samples) distances between samples.
        encoded = positional_encoding(points, self.num_freqs)
        h = encoded
        for i, layer in enumerate(self.layers):
            if i == self.skip:
                h = torch.cat([h, encoded], dim=-1)
            h = F.relu(layer(h))
        raw = self.head(h)
        sigma = F.relu(raw[..., 3])
        rgb = torch.sigmoid(raw[..., :3])
        alpha = 1.0 - torch.exp(-sigma * deltas)
        trans = torch.cumprod(1.0 - alpha + 1e-10, dim=-1)
        trans = torch.cat([torch.ones_like(trans[..., :1]), trans[..., :-1]], dim=-1)
        weights = alpha * trans
        return (weights[..., None] * rgb).sum(dim=-2)


# ----------------------------------------------------------------------------- GPT


class CausalSelfAttention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q = q.view(b, s, self.heads, d // self.heads).transpose(1, 2)
        k = k.view(b, s, self.heads, d // self.heads).transpose(1, 2)
        v = v.view(b, s, self.heads, d // self.heads).transpose(1, 2)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // self.heads))
        mask = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
        y = F.softmax(scores, dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, s, d))


class GPTBlock(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab=512, dim=128, heads=4, layers=2, max_seq=128):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(max_seq, dim)
        self.blocks = nn.ModuleList(GPTBlock(dim, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx):
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(positions)[None]
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def lm_loss(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


# ----------------------------------------------------------------------------- Llama


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6, device=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, device=device))

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class LlamaAttention(nn.Module):
    def __init__(self, dim, heads, device=None):
        super().__init__()
        self.heads = heads
        self.q_proj = nn.Linear(dim, dim, bias=False, device=device)
        self.k_proj = nn.Linear(dim, dim, bias=False, device=device)
        self.v_proj = nn.Linear(dim, dim, bias=False, device=device)
        self.o_proj = nn.Linear(dim, dim, bias=False, device=device)

    def forward(self, x, cos, sin, mask):
        b, s, d = x.shape
        hd = d // self.heads
        q = self.q_proj(x).view(b, s, self.heads, hd).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.heads, hd).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.heads, hd).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd)) + mask
        y = F.softmax(scores.float(), dim=-1).to(q.dtype) @ v
        return self.o_proj(y.transpose(1, 2).reshape(b, s, d))


class LlamaMLP(nn.Module):
    def __init__(self, dim, hidden, device=None):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False, device=device)
        self.up_proj = nn.Linear(dim, hidden, bias=False, device=device)
        self.down_proj = nn.Linear(hidden, dim, bias=False, device=device)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaLayer(nn.Module):
    def __init__(self, dim, heads, hidden, device=None):
        super().__init__()
        self.input_layernorm = RMSNorm(dim, device=device)
        self.self_attn = LlamaAttention(dim, heads, device=device)
        self.post_attention_layernorm = RMSNorm(dim, device=device)
        self.mlp = LlamaMLP(dim, hidden, device=device)

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    def __init__(self, vocab=32000, dim=4096, layers=32, heads=32, hidden=11008, device=None):
        super().__init__()
        self.heads = heads
        self.embed_tokens = nn.Embedding(vocab, dim, device=device)
        self.layers = nn.ModuleList(LlamaLayer(dim, heads, hidden, device=device)
                                    for _ in range(layers))
        self.norm = RMSNorm(dim, device=device)
        self.lm_head = nn.Linear(dim, vocab, bias=False, device=device)

    def forward(self, idx):
        b, s = idx.shape
        hd = self.embed_tokens.embedding_dim // self.heads
        inv_freq = 1.0 / (10000.0 ** (torch.arange(0, hd, 2, device=idx.device).float() / hd))
        angles = torch.arange(s, device=idx.device).float()[:, None] * inv_freq[None]
        angles = torch.cat([angles, angles], dim=-1)
        cos, sin = angles.cos(), angles.sin()
        mask = torch.full((s, s), float("-inf"), device=idx.device).triu(1)
        x = self.embed_tokens(idx)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.lm_head(self.norm(x))


def llama_7b_config():
    """Llama-2-7B's sizes: 6.74e9 parameters."""
    return dict(vocab=32000, dim=4096, layers=32, heads=32, hidden=11008)


# ----------------------------------------------------------------------------- builders


def _mse(output, target):
    return F.mse_loss(output, target)


def build(name, device="cpu"):
    """Returns (model, batch, loss_fn, optimizer) of a reference training setup.

    Sizes are chosen so two CPU training steps of all four take seconds on 2 cores.
    """
    generator = torch.Generator().manual_seed(0)
    torch.manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=generator).to(device)

    if name == "resnet50":
        import torchvision

        model = torchvision.models.resnet50().to(device)
        batch = (randn(2, 3, 64, 64),
                 torch.randint(0, 1000, (2,), generator=generator).to(device))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        return model, batch, F.cross_entropy, optimizer
    if name == "unet":
        model = UNet().to(device)
        timesteps = torch.randint(0, 1000, (4,), generator=generator).to(device)
        batch = ((randn(4, 3, 32, 32), timesteps), randn(4, 3, 32, 32))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        return model, batch, _mse, optimizer
    if name == "nerf":
        model = TinyNeRF().to(device)
        rays, samples = 256, 64
        points = randn(rays, samples, 3)
        deltas = torch.full((rays, samples), 4.0 / samples).to(device)
        batch = ((points, deltas), torch.rand(rays, 3, generator=generator).to(device))
        optimizer = torch.optim.Adam(model.parameters(), lr=5e-4)
        return model, batch, _mse, optimizer
    if name == "gpt":
        model = GPT().to(device)
        tokens = torch.randint(0, 512, (8, 65), generator=generator).to(device)
        batch = (tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
        return model, batch, lm_loss, optimizer
    if name == "llama-tiny":
        model = Llama(vocab=256, dim=64, layers=2, heads=4, hidden=172, device=device)
        tokens = torch.randint(0, 256, (2, 33), generator=generator).to(device)
        batch = (tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
        return model, batch, lm_loss, optimizer
    raise ValueError(f"unknown reference model {name!r}")


GROUND_TRUTH_MODELS = ("resnet50", "unet", "nerf", "gpt")
