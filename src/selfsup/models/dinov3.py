"""DINOv3's backbones (facebookresearch/dinov3 at 6876159; facts with file:line in docs/DINOV3.md): the ViT with
rotary positions (RoPE: no position table, so any image size), storage tokens, LayerScale, a GELU MLP or SwiGLU
FFN, the k bias masked, untied class norms; and the ConvNeXt whose [CLS] is its normalised mean.

Parameter and buffer names are the official ones (``rope_embed.periods``, ``storage_tokens``,
``blocks.<i>.attn.qkv.bias_mask``, ``downsample_layers``, ``stages``...), so a hub ``.pth`` loads as it is; the
mask token is the method's (``masked_embed``, added by iBOT / DINOv2 like the selfsup ViT's), the file's
``mask_token`` read into it or dropped.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from selfsup.architectures import DINOV3_CONVNEXT_SIZES as DINOV3_CONVNEXT_SIZES
from selfsup.architectures import DINOV3_VIT_SIZES as DINOV3_VIT_SIZES
from selfsup.errors import UserError

from .vit import DropPath, LayerScale, Mlp, PatchEmbed, VisionTransformer, attention

NORMS = {"layernorm": 1e-6, "layernormbf16": 1e-5, "rmsnorm": 1e-5}  # vision_transformer.py:27-31, rms_norm.py:11


class RMSNorm(nn.Module):
    """x / √(mean(x²) + eps) · weight, computed in float32 (layers/rms_norm.py:10-24)."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(dim)), eps

    def forward(self, x: Tensor) -> Tensor:
        y = x.float()
        return (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def make_norm(kind: str, dim: int) -> nn.Module:
    if kind not in NORMS:
        raise ValueError(f"norm must be one of {', '.join(NORMS)}, got {kind!r}")
    return RMSNorm(dim, NORMS[kind]) if kind == "rmsnorm" else nn.LayerNorm(dim, eps=NORMS[kind])


def rope_periods(head_dim: int, base: float | None = 100.0, min_period: float | None = None,
                 max_period: float | None = None) -> Tensor:
    """The head_dim/4 periods of each axis (rope_position_encoding.py:108-121): base^(2i / (head_dim/2)), or
    geometric from min_period to max_period where those are given instead of the base."""
    n = head_dim // 4
    if base is not None:
        return base ** (2 * torch.arange(n, dtype=torch.float32) / (head_dim // 2))
    ratio = max_period / min_period
    return ratio ** torch.linspace(0, 1, n, dtype=torch.float32) / ratio * max_period


class RopePositionEmbedding(nn.Module):
    """Axial RoPE without weights (rope_position_encoding.py:16-106): patch centres at (i + 0.5) / n on each axis
    (``normalize`` separate: n each axis's count; min / max: the smaller / larger), mapped to [-1, 1]; in training
    the coordinates are shifted by U(-shift, shift) per axis, multiplied by a log-uniform jitter per axis and a
    log-uniform rescale shared by both (each drawn where set); angle 2π·c / period, [h periods, w periods] tiled twice.
    Returns (sin, cos), each (H·W, head_dim), float32. ``periods`` is a buffer, kept in the state dict as the
    official one is."""

    def __init__(self, head_dim: int, base: float | None = 100.0, min_period: float | None = None,
                 max_period: float | None = None, normalize: str = "separate", shift: float | None = None,
                 jitter: float | None = None, rescale: float | None = None):
        super().__init__()
        if head_dim % 4:
            raise ValueError(f"RoPE needs a head width divisible by 4, got {head_dim}")
        if (base is None) == (min_period is None or max_period is None):
            raise ValueError("RoPE takes either a base or both min_period and max_period")
        if normalize not in ("separate", "min", "max"):
            raise ValueError(f"rope normalize must be separate, min or max, got {normalize!r}")
        self.normalize, self.shift, self.jitter, self.rescale = normalize, shift, jitter, rescale
        self.register_buffer("periods", rope_periods(head_dim, base, min_period, max_period))

    def coords(self, H: int, W: int) -> Tensor:
        """(H·W, 2) patch centres in [-1, 1], row-major, (h, w) per row; augmented in training."""
        dd = {"device": self.periods.device, "dtype": torch.float32}
        n_h, n_w = {"separate": (H, W), "min": (min(H, W),) * 2, "max": (max(H, W),) * 2}[self.normalize]
        ch, cw = torch.arange(0.5, H, **dd) / n_h, torch.arange(0.5, W, **dd) / n_w
        c = 2.0 * torch.stack(torch.meshgrid(ch, cw, indexing="ij"), dim=-1).flatten(0, 1) - 1.0
        if self.training and self.shift is not None:
            c = c + torch.empty(2, **dd).uniform_(-self.shift, self.shift)
        if self.training and self.jitter is not None:
            c = c * torch.empty(2, **dd).uniform_(-math.log(self.jitter), math.log(self.jitter)).exp()
        if self.training and self.rescale is not None:
            c = c * torch.empty(1, **dd).uniform_(-math.log(self.rescale), math.log(self.rescale)).exp()
        return c

    def augments(self) -> bool:
        """Whether a forward draws random coordinates (training with shift, jitter or rescale set)."""
        return self.training and any(v is not None for v in (self.shift, self.jitter, self.rescale))

    def forward(self, H: int, W: int) -> tuple[Tensor, Tensor]:
        angles = 2 * math.pi * self.coords(H, W)[:, :, None] / self.periods.float()[None, None, :]
        angles = angles.flatten(1, 2).tile(2)
        return angles.sin(), angles.cos()


def rope_rotate(x: Tensor, sin: Tensor, cos: Tensor) -> Tensor:
    """x·cos + rotate_half(x)·sin, rotate_half([a, b]) = [-b, a] (layers/attention.py:16-27)."""
    a, b = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-b, a], dim=-1) * sin


class MaskedKBiasLinear(nn.Linear):
    """The qkv Linear whose k third of the bias is multiplied by the buffer ``bias_mask`` (1, 0, 1 by thirds):
    DINOv3's ``mask_k_bias`` (layers/attention.py:30-40; its init, vision_transformer.py:45-48)."""

    def __init__(self, dim_in: int, dim_out: int):
        super().__init__(dim_in, dim_out, bias=True)
        mask = torch.ones(dim_out)
        mask[dim_out // 3: 2 * dim_out // 3] = 0
        self.register_buffer("bias_mask", mask)

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias * self.bias_mask.to(self.bias.dtype))


class RopeAttention(nn.Module):
    """Self-attention whose q and k of the patch tokens (the last H·W) are rotated by RoPE in float32, the class and
    storage tokens not (layers/attention.py:66-118)."""

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True, mask_k_bias: bool = False):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"embed_dim {dim} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.qkv = MaskedKBiasLinear(dim, 3 * dim) if mask_k_bias and qkv_bias else nn.Linear(dim, 3 * dim,
                                                                                              bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor] | None = None) -> Tensor:
        B, N, D = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, D // self.num_heads).permute(2, 0, 3, 1, 4)
        if rope is not None:
            sin, cos = (t.unsqueeze(1) if t.ndim == 3 else t for t in rope)  # (B, K, d): one grid per sample
            p = N - sin.shape[-2]
            q, k = (torch.cat([t[:, :, :p], rope_rotate(t[:, :, p:].float(), sin, cos).to(t.dtype)], dim=2)
                    for t in (q, k))
        return self.proj(attention(q, k, v).transpose(1, 2).reshape(B, N, D))


class SwiGLU(nn.Module):
    """w3(silu(w1 x) · w2 x); hidden width int(hidden · 2/3) rounded up to a multiple of ``align`` (8; the 7B's
    swiglu64: 64) unless given exactly (layers/ffn_layers.py:52-77)."""

    def __init__(self, dim: int, hidden: int, align: int = 8, exact: bool = False):
        super().__init__()
        if not exact:
            d = int(hidden * 2 / 3)
            hidden = d + (-d % align)
        self.w1, self.w2, self.w3 = nn.Linear(dim, hidden), nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.w3(F.silu(self.w1(x)) * self.w2(x))


class Block(nn.Module):
    """x + ls1(attn(norm1(x), rope)); x + ls2(ffn(norm2(x))) (layers/block.py:21-124). Drop path as the official
    code drops it: each branch runs on a random subset of max(⌊b(1 − p)⌋, 1) samples of the batch, added back
    scaled by b / subset (block.py:84-119)."""

    def __init__(self, dim: int, num_heads: int, ffn_hidden: int, ffn: str, ffn_align: int, exact: bool,
                 qkv_bias: bool, mask_k_bias: bool, layer_scale: float, norm: str, drop_path: float):
        super().__init__()
        self.norm1 = make_norm(norm, dim)
        self.attn = RopeAttention(dim, num_heads, qkv_bias, mask_k_bias)
        self.ls1 = LayerScale(dim, layer_scale) if layer_scale else nn.Identity()
        self.norm2 = make_norm(norm, dim)
        self.mlp = SwiGLU(dim, ffn_hidden, ffn_align, exact) if ffn == "swiglu" else Mlp(dim, ffn_hidden)
        self.ls2 = LayerScale(dim, layer_scale) if layer_scale else nn.Identity()
        self.drop_path = drop_path

    def _residual(self, x: Tensor, branch, rope=None) -> Tensor:
        if not (self.training and self.drop_path > 0):
            return x + branch(x, rope)
        b = x.shape[0]
        keep = max(int(b * (1 - self.drop_path)), 1)
        idx = torch.randperm(b, device=x.device)[:keep]
        if rope is not None and rope[0].ndim == 3:  # one grid per sample (forward_visible): the subset's
            rope = (rope[0][idx], rope[1][idx])
        return torch.index_add(x, 0, idx, branch(x[idx], rope).to(x.dtype), alpha=b / keep)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor] | None = None) -> Tensor:
        x = self._residual(x, lambda t, r: self.ls1(self.attn(self.norm1(t), r)), rope)
        return self._residual(x, lambda t, r: self.ls2(self.mlp(self.norm2(t))))


class DINOv3ViT(VisionTransformer):
    """DINOv3's ViT (models/vision_transformer.py:59-329) with the selfsup ViT's interface (``forward`` with a
    patch ``mask`` and ``return_all_tokens``, ``forward_visible``, ``forward_last_blocks``, ``layer_id``, the
    method's ``masked_embed``): tokens [CLS, storage tokens, patches], no position table; the final norm on all of
    them, or ``cls_norm`` on the class and storage tokens (``untie_cls_norm``), or in training on a crop smaller than
    the model size ``local_cls_norm`` (``untie_local_cls_norm``: the official applies it to the local crops, the
    second entry of its list, :238-247). The storage tokens are dropped from ``forward_features`` as registers are;
    ``forward_dict`` returns the official outputs. ``ffn_hidden``: the FFN's exact width (a file's), else by ratio."""

    def build(self, image_size: int = 224, patch_size: int = 16, in_chans: int = 3, embed_dim: int = 384,
                 depth: int = 12, num_heads: int = 6, ffn_ratio: float = 4.0, ffn: str = "mlp", ffn_align: int = 8,
                 ffn_hidden: int | None = None, qkv_bias: bool = True, mask_k_bias: bool = True,
                 layer_scale: float = 1e-5, norm: str = "layernormbf16", storage_tokens: int = 4,
                 untie_cls_norm: bool = False, untie_local_cls_norm: bool = False, rope_base: float | None = 100.0,
                 rope_min_period: float | None = None, rope_max_period: float | None = None,
                 rope_normalize: str = "separate", rope_shift: float | None = None,
                 rope_jitter: float | None = None, rope_rescale: float | None = 2.0, drop_path_rate: float = 0.0,
                 pool: str = "cls") -> None:
        if pool not in ("cls", "avg") or ffn not in ("mlp", "swiglu"):
            raise ValueError(f"pool must be cls or avg and ffn mlp or swiglu, got {pool!r}, {ffn!r}")
        if image_size % patch_size:
            raise ValueError(f"image size {image_size} is not divisible by the ViT's patch size {patch_size}; set "
                             f"data.image_size to a multiple of {patch_size}")
        self.kwargs = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        self.prefix, self.registers, self.class_token_kind = 1, int(storage_tokens), "dinov3"
        self.image_size, self.patch_size, self.in_chans = image_size, patch_size, in_chans
        self.embed_dim = self.num_features = embed_dim
        self.depth, self.pool, self.learned_pos, self.no_pos = depth, pool, False, False
        self.patch_embed = PatchEmbed(patch_size, in_chans, embed_dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        if storage_tokens:
            self.storage_tokens = nn.Parameter(torch.zeros(1, storage_tokens, embed_dim))
        self.rope_embed = RopePositionEmbedding(embed_dim // num_heads, rope_base, rope_min_period, rope_max_period,
                                                rope_normalize, rope_shift, rope_jitter, rope_rescale)
        hidden = ffn_hidden or int(embed_dim * ffn_ratio)
        self.blocks = nn.ModuleList([Block(embed_dim, num_heads, hidden, ffn, ffn_align, ffn_hidden is not None,
                                           qkv_bias, mask_k_bias, layer_scale, norm, drop_path_rate)
                                     for _ in range(depth)])  # the same rate in every block (:140-157)
        self.norm = make_norm(norm, embed_dim)
        self.cls_norm = make_norm(norm, embed_dim) if untie_cls_norm else None
        self.local_cls_norm = make_norm(norm, embed_dim) if untie_local_cls_norm else None
        self._init_dinov3()

    @property
    def register_tokens(self) -> Tensor:
        """The storage tokens, under the name the selfsup ViT's token plumbing reads."""
        return self.storage_tokens

    @torch.no_grad()
    def _init_dinov3(self) -> None:
        """vision_transformer.py:40-57, :182-188: class and storage tokens N(0, 0.02); Linear weights truncated
        normal 0.02, biases 0; norms 1 / 0; LayerScale its init; the patch convolution U(±1/√(C·p²)) (weight and
        bias, patch_embed.py:85-89)."""
        nn.init.normal_(self.cls_token, std=0.02)
        if self.registers:
            nn.init.normal_(self.storage_tokens, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, (nn.LayerNorm, RMSNorm)):
                nn.init.ones_(m.weight)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)
        bound = 1 / math.sqrt(self.in_chans * self.patch_size ** 2)
        nn.init.uniform_(self.patch_embed.proj.weight, -bound, bound)
        nn.init.uniform_(self.patch_embed.proj.bias, -bound, bound)

    def _check_input(self, x: Tensor) -> None:
        p = self.patch_size
        if x.ndim != 4 or x.shape[1] != self.in_chans or x.shape[2] % p or x.shape[3] % p:
            raise ValueError(f"the DINOv3 ViT expects ({self.in_chans}, H, W) images with H and W divisible by its "
                             f"patch size {p}, got a tensor of shape {tuple(x.shape)}")

    def position_embedding(self, size: int) -> Tensor:
        raise TypeError("a DINOv3 ViT has no position table: its positions are rotary (rope_embed)")

    def _tokens(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """[CLS, patches] without positions (vision_transformer.py:190-220); masked patches ``masked_embed``."""
        self._check_input(x)
        x = self.patch_embed(x)
        if mask is not None:
            x = torch.where(mask.reshape(x.shape[0], -1, 1), self.masked_embed.to(x.dtype), x)
        return torch.cat([self.cls_token.expand(x.shape[0], -1, -1).to(x.dtype), x], dim=1)

    def _rope(self, x: Tensor):
        """A function of no argument giving each block's (sin, cos) for the image ``x``: new coordinates for every
        block where training draws them (the official calls rope_embed inside the block loop, :229-234)."""
        H, W = x.shape[-2] // self.patch_size, x.shape[-1] // self.patch_size
        if self.rope_embed.augments():
            return lambda: self.rope_embed(H, W)
        rope = self.rope_embed(H, W)
        return lambda: rope

    def _final_norm(self, x: Tensor, local: bool = False) -> Tensor:
        """The final norms on [CLS, storage, patches] (vision_transformer.py:237-251)."""
        s = 1 + self.registers
        if self.local_cls_norm is not None and self.training and local:
            head = self.local_cls_norm(x[:, :s])
        elif self.cls_norm is not None:
            head = self.cls_norm(x[:, :s])
        else:
            return self.norm(x)
        return torch.cat([head, self.norm(x[:, s:])], dim=1)

    def _encode(self, x: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """(the normalised [CLS, storage, patches], the same before the norm) of images ``x``."""
        rope, local = self._rope(x), x.shape[-1] < self.image_size
        t = self._with_registers(self._tokens(x, mask))
        for block in self.blocks:
            t = block(t, rope())
        return self._final_norm(t, local), t

    def forward_features(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """[CLS, patches] (B, 1 + N, D) after the final norms, the storage tokens dropped; ``mask`` (B, N) bool:
        those patches replaced by ``masked_embed`` (the DINOv2 objective's input, as the selfsup ViT's)."""
        return self._without_registers(self._encode(x, mask)[0])

    def forward_dict(self, x: Tensor, mask: Tensor | None = None) -> dict[str, Tensor]:
        """The official ``forward_features`` outputs (vision_transformer.py:252-260): ``x_norm_clstoken`` (B, D),
        ``x_storage_tokens`` (B, S, D), ``x_norm_patchtokens`` (B, N, D), ``x_prenorm`` (B, 1 + S + N, D)."""
        out, pre = self._encode(x, mask)
        s = 1 + self.registers
        return {"x_norm_clstoken": out[:, 0], "x_storage_tokens": out[:, 1:s], "x_norm_patchtokens": out[:, s:],
                "x_prenorm": pre, "masks": mask}

    def forward_visible(self, x: Tensor, ids_keep: Tensor) -> Tensor:
        """The encoder on the patches ``ids_keep`` (m·B, K) only (MAE's encoder), each keeping its own rotary
        position: (m·B, 1 + K, D) after the final norm, the storage tokens dropped."""
        self._check_input(x)
        H, W = x.shape[-2] // self.patch_size, x.shape[-1] // self.patch_size
        t = self.patch_embed(x)
        if ids_keep.shape[0] != t.shape[0]:
            t = t.repeat(ids_keep.shape[0] // t.shape[0], 1, 1)
        t = torch.gather(t, 1, ids_keep.unsqueeze(-1).expand(-1, -1, t.shape[-1]))
        t = self._with_registers(torch.cat([self.cls_token.expand(t.shape[0], -1, -1).to(t.dtype), t], dim=1))
        for block in self.blocks:
            sin, cos = self.rope_embed(H, W)
            t = block(t, (sin[ids_keep], cos[ids_keep]))
        return self._without_registers(self._final_norm(t))

    def last_blocks_tokens(self, x: Tensor, n: int) -> list[Tensor]:
        """The [CLS, patches] (B, 1 + N, D) of each of the last ``n`` blocks, each through the final norms (``cls_norm``
        on the class token where untied, never ``local_cls_norm``), storage tokens dropped: the official
        ``get_intermediate_layers(n, norm=True)`` (vision_transformer.py:285-308), which LightlyTrain's distillation
        v2 reads of a DINOv3 teacher (lightly-train 8f5a75c4 distillationv2.py:230-233) and v3 through its wrapper
        (``_models/dinov3/dinov3_vit.py:55-87``). The inherited ``feature_maps`` and ``forward_last_blocks`` read it."""
        if not 1 <= n <= self.depth:
            raise ValueError(f"n={n} last blocks: the ViT has {self.depth}")
        rope, t, out = self._rope(x), self._with_registers(self._tokens(x)), []
        for i, block in enumerate(self.blocks):
            t = block(t, rope())
            if i >= self.depth - n:
                out.append(self._without_registers(self._final_norm(t)))
        return out

    def layer_id(self, param_name: str) -> int:
        """0 the embeddings and tokens, i + 1 block i, depth + 1 the final norms (layer-wise lr decay)."""
        if param_name.startswith(("patch_embed", "cls_token", "storage_tokens", "masked_embed")):
            return 0
        return int(param_name.split(".")[1]) + 1 if param_name.startswith("blocks.") else self.depth + 1


# --------------------------------------------------------------------------- ConvNeXt

class ChannelsFirstLayerNorm(nn.Module):
    """LayerNorm over the channels of (B, C, H, W): (x − mean) / √(var + eps) · weight + bias (convnext.py:87-118)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight, self.bias, self.eps = nn.Parameter(torch.ones(dim)), nn.Parameter(torch.zeros(dim)), eps

    def forward(self, x: Tensor) -> Tensor:
        u = x.mean(1, keepdim=True)
        s = (x - u).pow(2).mean(1, keepdim=True)
        return self.weight[:, None, None] * ((x - u) / torch.sqrt(s + self.eps)) + self.bias[:, None, None]


class ConvNeXtBlock(nn.Module):
    """x + drop_path(γ · pwconv2(GELU(pwconv1(norm(dwconv7x7(x)))))), the norm and Linears channels-last
    (convnext.py:42-84)."""

    def __init__(self, dim: int, drop_path: float, layer_scale: float):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, kernel_size=7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1, self.act, self.pwconv2 = nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), float(layer_scale))) if layer_scale > 0 else None
        self.drop_path = DropPath(drop_path)

    def forward(self, x: Tensor) -> Tensor:
        y = self.pwconv2(self.act(self.pwconv1(self.norm(self.dwconv(x).permute(0, 2, 3, 1)))))
        if self.gamma is not None:
            y = self.gamma * y
        return x + self.drop_path(y.permute(0, 3, 1, 2))


class DINOv3ConvNeXt(nn.Module):
    """DINOv3's ConvNeXt (models/convnext.py:121-252): a 4×4 stride-4 stem and 2×2 stride-2 downsamplings with
    channels-first LayerNorms, four stages of blocks, drop path rising linearly; the feature (its [CLS]) is the final
    LayerNorm of the spatial mean, the patch tokens the final LayerNorm of each position (:223-245)."""

    def __init__(self, in_chans: int = 3, depths=(3, 3, 9, 3), dims=(96, 192, 384, 768),
                 drop_path_rate: float = 0.0, layer_scale: float = 1e-6):
        super().__init__()
        depths, dims = tuple(int(d) for d in depths), tuple(int(d) for d in dims)
        self.kwargs = dict(in_chans=in_chans, depths=list(depths), dims=list(dims),
                           drop_path_rate=float(drop_path_rate), layer_scale=float(layer_scale))
        self.in_chans, self.num_features = in_chans, dims[-1]
        self.downsample_layers = nn.ModuleList(
            [nn.Sequential(nn.Conv2d(in_chans, dims[0], kernel_size=4, stride=4), ChannelsFirstLayerNorm(dims[0]))]
            + [nn.Sequential(ChannelsFirstLayerNorm(dims[i]), nn.Conv2d(dims[i], dims[i + 1], kernel_size=2,
                                                                        stride=2)) for i in range(3)])
        n = sum(depths)
        rates = [drop_path_rate * i / max(n - 1, 1) for i in range(n)]  # np.linspace(0, rate, n)
        starts = [sum(depths[:i]) for i in range(4)]
        self.stages = nn.ModuleList([nn.Sequential(*[ConvNeXtBlock(dims[i], rates[starts[i] + j], layer_scale)
                                                     for j in range(depths[i])]) for i in range(4)])
        self.norm = nn.LayerNorm(dims[-1], eps=1e-6)
        self._init_weights()

    @torch.no_grad()
    def _init_weights(self) -> None:
        """convnext.py:199-215: Conv2d and Linear weights truncated normal 0.02, biases 0; norms 1 / 0."""
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)

    def feature_map(self, x: Tensor) -> Tensor:
        if min(x.shape[-2:]) < 32:  # the stem's stride 4, then three of 2: a 1 x 1 map left for the last 2 x 2 conv
            raise UserError(f"a DINOv3 ConvNeXt needs images of at least 32 px a side (its stride), got "
                            f"{tuple(x.shape[-2:])}; set data.image_size=32 or more")
        for down, stage in zip(self.downsample_layers, self.stages):
            x = stage(down(x))
        return x

    def forward_dict(self, x: Tensor) -> dict[str, Tensor]:
        """The official outputs: ``x_norm_clstoken`` (B, C), ``x_norm_patchtokens`` (B, h·w, C), ``x_prenorm``."""
        f = self.feature_map(x)
        tokens = f.flatten(2).transpose(1, 2)
        out = self.norm(torch.cat([f.mean((-2, -1)).unsqueeze(1), tokens], dim=1))
        return {"x_norm_clstoken": out[:, 0], "x_norm_patchtokens": out[:, 1:], "x_prenorm": tokens}

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(self.feature_map(x).mean((-2, -1)))

    def feature_maps(self, x: Tensor, n: int = 1) -> tuple[Tensor, list[Tensor]]:
        """(the mean of the normalised map (B, C), [the last stage's map, the final LayerNorm at each position,
        (B, C, h, w)]): what ``models.dense.feature_maps`` reads, as LightlyTrain's distillation reads a DINOv3
        ConvNeXt (lightly-train 8f5a75c4 ``_models/dinov3/dinov3_convnext.py:63-78``: ``x_norm_patchtokens`` as a
        grid, pooled by an average pool, distillationv3.py:304; v2's ``get_intermediate_layers(n=1, reshape=True)``,
        ``dinov3_src/models/convnext.py:298-325``, the same map). The pool is not :meth:`forward`'s [CLS], the norm of
        the mean. One map only: the stages differ in width, so their maps do not concatenate to n × C."""
        if n != 1:
            raise UserError(f"a DINOv3 ConvNeXt gives its last stage's map, not its last {n} stages' (their widths "
                            "differ); set method.n_teacher_blocks=1")
        fmap = self.norm(self.feature_map(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return fmap.mean((-2, -1)), [fmap]
