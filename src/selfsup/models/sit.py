"""SiT / DiT with adaLN-zero blocks and the per-token timestep variant (Self-Flow's release model).

Interface (the release's): ``model(x_t, t, y) -> velocity`` where ``t = 1`` is pure noise, ``t`` is
(B,) or per token (B, N), ``y`` holds class indices with ``num_classes`` as the null (unconditional)
class. Internally the network runs on ``1 − t`` and its output is negated, so the model returns the
velocity ``ε − x_0`` of the linear path ``x_t = (1 − t)·x_0 + t·ε``.

Blocks: LayerNorm without affine (eps 1e-6), attention with qkv bias through
``scaled_dot_product_attention``, MLP ratio 4 with the tanh GELU, modulation SiLU → Linear(D, 6D)
(final layer 2D) per token when the conditioning is per token. Per-token levels can also be given
as a few levels per sample and each token's index into them (``token_index``; Self-Flow: two): the
embedding and the modulations are then computed once per level and given to the tokens by a product
with the one-hot of their level: the same values as the release's per-token computation (up to float
rounding) for a fraction of its FLOPs (the modulation Linear alone is half a block's matmul work per
token). Init as the release:
xavier-uniform on every Linear with zero biases, label and time embedders N(0, 0.02), the last
modulation Linear of each block and of the final layer zero, the output Linear zero (so every block
is the identity and the output 0 at step 0).

``FlowEncoder`` is a SiT as a frozen feature extractor (what ``selfsup eval knn|linear|rankme`` sees of
a flow run, and what the run exports as its ``backbone.safetensors``, rebuilt by name as ``flow_encoder``):
images normalised to [−1, 1] (mean = std = 0.5) at the dataset's size are fitted to the model's input
size (resize or pad), noised to level ``t`` with a fixed-seed noise draw (t = 0: clean), passed with the
null class through blocks 1..k, and the tokens averaged.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from selfsup.architectures import FLOW_ENCODER as FLOW_ENCODER

# name -> (hidden size D, depth, heads). S..XL are the SiT/DiT sizes; tiny and micro are CPU sizes.
SIT_SIZES: dict[str, tuple[int, int, int]] = {
    "micro": (64, 4, 2),
    "tiny": (128, 6, 4),
    "S": (384, 12, 6),
    "B": (768, 12, 12),
    "L": (1024, 24, 16),
    "XL": (1152, 28, 16),
}


def sincos_pos_embed(grid: int, dim: int) -> Tensor:
    """(grid², dim) fixed 2-D sin-cos table (DiT/MAE layout: first half the column, second half the row)."""
    if dim % 4:
        raise ValueError(f"hidden size {dim} must divide by 4 for the 2-D sin-cos position embedding")
    omega = 1.0 / 10000 ** (torch.arange(dim // 4, dtype=torch.float64) / (dim // 4))
    rows, cols = torch.meshgrid(torch.arange(grid, dtype=torch.float64), torch.arange(grid, dtype=torch.float64),
                                indexing="ij")

    def one_axis(pos: Tensor) -> Tensor:
        args = pos.reshape(-1, 1) * omega[None]
        return torch.cat([args.sin(), args.cos()], dim=1)

    return torch.cat([one_axis(cols), one_axis(rows)], dim=1).float()


def timestep_sinusoid(t: Tensor, dim: int = 256, max_period: float = 10000.0) -> Tensor:
    """DiT's frequency embedding: ``[cos(t·f), sin(t·f)]`` with ``f_i = max_period^(−i/half)``; any shape →
    (..., dim)."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    args = t.float()[..., None] * freqs
    return torch.cat([args.cos(), args.sin()], dim=-1)


def modulate(x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    return x * (1 + scale) + shift


class TimestepEmbedder(nn.Module):
    """256-dim sinusoid → Linear, SiLU, Linear; works on (B,) or per-token (B, N) timesteps."""

    def __init__(self, dim: int, freq_dim: int = 256):
        super().__init__()
        self.freq_dim = freq_dim
        self.mlp = nn.Sequential(nn.Linear(freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))

    def forward(self, t: Tensor) -> Tensor:
        return self.mlp(timestep_sinusoid(t, self.freq_dim).to(self.mlp[0].weight.dtype))


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        B, N, D = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, N, D))


def modulation(layer: nn.Module, c: Tensor, select: Tensor | None, chunks: int) -> tuple[Tensor, ...]:
    """``layer(c)`` split in ``chunks`` along the channels. With ``select`` (B, N, K), the one-hot of each
    token's level, ``c`` holds one row per level (B, K, D): the layer runs once per level and each token
    takes its level's row by a batched product with the one-hot (exact: products with 1 and 0; on CPU
    its backward is a product too, where a gather's is a slower scatter-add)."""
    m = layer(c)
    if select is not None:
        m = torch.bmm(select.to(m.dtype), m)
    return m.chunk(chunks, dim=-1)


class SiTBlock(nn.Module):
    """adaLN-zero block: ``x + gate·f(modulate(norm(x), shift, scale))`` for attention then MLP."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float = 4.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(approximate="tanh"), nn.Linear(hidden, dim))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))

    def forward(self, x: Tensor, c: Tensor, select: Tensor | None = None) -> Tensor:
        """``c`` is (B, 1, D) (one level per sample), (B, N, D) (one level per token), or (B, K, D) with
        ``select`` (B, N, K) the one-hot of each token's level."""
        shift1, scale1, gate1, shift2, scale2, gate2 = modulation(self.adaLN_modulation, c, select, 6)
        x = x + gate1 * self.attn(modulate(self.norm1(x), shift1, scale1))
        return x + gate2 * self.mlp(modulate(self.norm2(x), shift2, scale2))


class FinalLayer(nn.Module):
    def __init__(self, dim: int, patch_size: int, out_channels: int):
        super().__init__()
        self.norm_final = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(dim, patch_size * patch_size * out_channels)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 2 * dim))

    def forward(self, x: Tensor, c: Tensor, select: Tensor | None = None) -> Tensor:
        shift, scale = modulation(self.adaLN_modulation, c, select, 2)
        return self.linear(modulate(self.norm_final(x), shift, scale))


class SiT(nn.Module):
    """Scalable interpolant transformer with class conditioning and per-token timesteps.

    ``size`` is one of ``SIT_SIZES`` (hidden, depth, heads); ``hidden``/``depth``/``heads`` override it.
    """

    def __init__(self, input_size: int, in_channels: int, patch_size: int = 2, size: str = "tiny",
                 num_classes: int = 10, hidden: int | None = None, depth: int | None = None,
                 heads: int | None = None, mlp_ratio: float = 4.0):
        super().__init__()
        if size not in SIT_SIZES:
            raise ValueError(f"SiT size {size!r} is not known; use one of {', '.join(SIT_SIZES)}")
        D0, L0, H0 = SIT_SIZES[size]
        D, L, H = hidden or D0, depth or L0, heads or H0
        if input_size % patch_size:
            raise ValueError(f"image size {input_size} does not divide by the patch size {patch_size}; set "
                             f"data.image_size to a multiple of {patch_size} (method.fit=resize|pad)")
        if D % H:
            raise ValueError(f"hidden size {D} does not divide by {H} heads")
        self.input_size, self.in_channels, self.patch_size = input_size, in_channels, patch_size
        self.num_classes, self.hidden, self.depth, self.heads = num_classes, D, L, H
        self.grid = input_size // patch_size
        self.num_tokens = self.grid ** 2
        self.x_embedder = nn.Linear(in_channels * patch_size * patch_size, D)  # on patchified tokens
        self.t_embedder = TimestepEmbedder(D)
        self.y_embedder = nn.Embedding(num_classes + 1, D)  # index num_classes = the null class (CFG)
        self.register_buffer("pos_embed", sincos_pos_embed(self.grid, D)[None], persistent=False)
        self.blocks = nn.ModuleList(SiTBlock(D, H, mlp_ratio) for _ in range(L))
        self.final_layer = FinalLayer(D, patch_size, in_channels)
        self.initialize_weights()

    @property
    def kwargs(self) -> dict:
        """The constructor arguments that rebuild this model."""
        return dict(input_size=self.input_size, in_channels=self.in_channels, patch_size=self.patch_size,
                    num_classes=self.num_classes, hidden=self.hidden, depth=self.depth, heads=self.heads)

    def initialize_weights(self) -> None:
        """The release's init (see the module docstring)."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
        nn.init.normal_(self.y_embedder.weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[0].weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[2].weight, std=0.02)
        for block in self.blocks:
            nn.init.zeros_(block.adaLN_modulation[-1].weight)
            nn.init.zeros_(block.adaLN_modulation[-1].bias)
        for layer in (self.final_layer.adaLN_modulation[-1], self.final_layer.linear):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    # ------------------------------------------------------------------ tokens <-> images
    def patchify(self, x: Tensor) -> Tensor:
        """(B, C, H, W) → (B, N, p·p·C), tokens in row-major grid order."""
        B, C, _, _ = x.shape
        p, g = self.patch_size, self.grid
        return x.reshape(B, C, g, p, g, p).permute(0, 2, 4, 3, 5, 1).reshape(B, g * g, p * p * C)

    def unpatchify(self, tokens: Tensor) -> Tensor:
        """(B, N, p·p·C) → (B, C, H, W)."""
        B = tokens.shape[0]
        p, g, C = self.patch_size, self.grid, self.in_channels
        return tokens.reshape(B, g, g, p, p, C).permute(0, 5, 1, 3, 2, 4).reshape(B, C, g * p, g * p)

    def check_input(self, x: Tensor) -> None:
        if (x.ndim != 4 or x.shape[1] != self.in_channels
                or x.shape[-1] != self.input_size or x.shape[-2] != self.input_size):
            raise ValueError(f"SiT expects (B, {self.in_channels}, {self.input_size}, {self.input_size}) inputs, "
                             f"got {tuple(x.shape)}")

    # ------------------------------------------------------------------ forward
    def condition(self, t: Tensor, y: Tensor) -> Tensor:
        """c = t_emb(1 − t) + y_emb: (B, 1, D) for t of shape (B,), (B, N, D) for per-token t
        ((B, K, D) for K levels per sample)."""
        c = self.t_embedder(1.0 - t)
        c = c[:, None] if t.ndim == 1 else c
        return c + self.y_embedder(y)[:, None]

    def forward(self, x: Tensor, t: Tensor, y: Tensor, features: tuple[int, ...] = (),
                stop_after: int | None = None, token_index: Tensor | None = None):
        """The velocity at (x, t) given class ``y``.

        ``t``: a level per sample (B,) (or one scalar), per token (B, N), or with ``token_index`` (B, N)
        K levels per sample (B, K), token n of sample b at level ``t[b, token_index[b, n]]``.
        ``features``: blocks (counted from 1) whose output tokens (B, N, D) to return as well:
        ``(velocity, [tokens...])``. ``stop_after=k`` runs only blocks 1..k and returns their ``features``
        alone (no velocity), e.g. the teacher's block-k tokens.
        """
        self.check_input(x)
        if t.ndim == 0:
            t = t.expand(x.shape[0])
        if token_index is not None and (t.ndim != 2 or token_index.shape != (x.shape[0], self.num_tokens)):
            raise ValueError(f"token_index must be (B, {self.num_tokens}) with t (B, K) levels, "
                             f"got {tuple(token_index.shape)} and {tuple(t.shape)}")
        h = self.x_embedder(self.patchify(x)) + self.pos_embed
        c = self.condition(t, y)
        select = None  # (B, N, K) one-hot of each token's level (a comparison: F.one_hot reads its range back)
        if token_index is not None:
            select = (token_index[..., None] == torch.arange(t.shape[1], device=t.device)).to(c.dtype)
        out = []
        for i, block in enumerate(self.blocks, start=1):
            h = block(h, c, select)
            if i in features:
                out.append(h)
            if stop_after is not None and i >= stop_after:
                return out
        v = -self.unpatchify(self.final_layer(h, c, select))
        return (v, out) if features else v

    def block_tokens(self, x: Tensor, t: Tensor, y: Tensor, block: int) -> Tensor:
        """The (B, N, D) tokens after block ``block`` (counted from 1), computing no later block."""
        return self.forward(x, t, y, features=(block,), stop_after=block)[0]


# --------------------------------------------------------------------------- the feature extractor

FITS = ("resize", "pad")


def fit_images(x: Tensor, size: int, mode: str = "resize", fill: float = -1.0) -> Tensor:
    """(B, C, h, w) → (B, C, size, size): bilinear antialiased resize, or centred padding with ``fill``."""
    h, w = x.shape[-2:]
    if (h, w) == (size, size):
        return x
    if mode == "pad":
        if h > size or w > size:
            raise ValueError(f"cannot pad {h}x{w} images to {size}x{size}; use method.fit=resize")
        top, left = (size - h) // 2, (size - w) // 2
        return F.pad(x, (left, size - w - left, top, size - h - top), value=fill)
    return F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=True)


class FlowEncoder(nn.Module):
    """(B, C, S, S) in [−1, 1] → (B, D): mean of block-``block`` tokens of ``model`` at level ``t``."""

    def __init__(self, model: SiT, block: int, t: float = 0.1, fit: str = "resize", seed: int = 0):
        super().__init__()
        if not 1 <= block <= model.depth:
            raise ValueError(f"feature block {block} is outside the model's depth 1..{model.depth}")
        if not 0 <= t <= 1:
            raise ValueError(f"feature level t={t} must be in [0, 1]")
        self.model, self.block, self.t, self.fit, self.seed = model, block, t, fit, seed
        self.num_features = model.hidden

    @classmethod
    def build(cls, sit: dict, block: int, t: float = 0.1, fit: str = "resize", seed: int = 0) -> "FlowEncoder":
        return cls(SiT(**sit), block, t, fit, seed)

    @property
    def kwargs(self) -> dict:
        return dict(sit=self.model.kwargs, block=self.block, t=self.t, fit=self.fit, seed=self.seed)

    def forward(self, x: Tensor) -> Tensor:
        x = fit_images(x, self.model.input_size, self.fit)
        B = x.shape[0]
        t = torch.full((B,), float(self.t), device=x.device)
        if self.t > 0:  # the same noise for the same batch position, so features are deterministic
            g = torch.Generator(device=x.device).manual_seed(self.seed)
            noise = torch.randn(x.shape, device=x.device, generator=g, dtype=x.dtype)
            x = x + self.t * (noise - x)
        y = torch.full((B,), self.model.num_classes, device=x.device, dtype=torch.long)
        return self.model.block_tokens(x, t, y, self.block).mean(dim=1)
