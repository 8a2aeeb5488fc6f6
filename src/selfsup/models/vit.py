"""MoCo v3 / DINO Vision Transformer: fixed 2-D sin-cos, learned or no positions, MoCo v3 or trunc-normal (DINO)
init, optional frozen patch projection, optional final LayerNorm. Square inputs of any size divisible by the patch
size: the fixed sin-cos table is recomputed for the grid, a learned one interpolated bicubically (DINO's local
crops).

Parameter names follow timm's ``VisionTransformer`` so a ``state_dict`` loads there with ``strict=True``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from selfsup.architectures import VIT_SIZES as VIT_SIZES  # the size table, declared without torch (exported here)


def build_2d_sincos_position_embedding(grid_size: int, embed_dim: int, temperature: float = 10000.0,
                                       device=None) -> torch.Tensor:
    """(1, 1 + g*g, D) sin-cos table as in MoCo v3's ``build_2d_sincos_position_embedding``; class position zeros."""
    if embed_dim % 4 != 0:
        raise ValueError(f"embed_dim must be divisible by 4 for the 2-D sin-cos position embedding, got {embed_dim}")
    grid = torch.arange(grid_size, dtype=torch.float32, device=device)
    grid_w, grid_h = torch.meshgrid(grid, grid, indexing="ij")
    pos_dim = embed_dim // 4
    omega = 1.0 / temperature ** (torch.arange(pos_dim, dtype=torch.float32, device=device) / pos_dim)
    out_w = torch.einsum("m,d->md", grid_w.flatten(), omega)
    out_h = torch.einsum("m,d->md", grid_h.flatten(), omega)
    pe = torch.cat([out_w.sin(), out_w.cos(), out_h.sin(), out_h.cos()], dim=1)
    return torch.cat([torch.zeros(1, embed_dim, device=device), pe], dim=0)[None]


def interpolate_pos_embed(pos_embed: torch.Tensor, grid_size: int, prefix: int = 1) -> torch.Tensor:
    """A learned (1, prefix + G*G, D) table resampled to a g × g grid, as DINO's ``interpolate_pos_encoding``
    (vision_transformer.py:174-194): the patch positions bicubically, with scale factor (g + 0.1) / G (the
    +0.1 guards the output size against float error, DINO issue #8), the class position (``prefix`` 1; 0 without
    a class token) as it is."""
    n = pos_embed.shape[1] - prefix
    old = int(round(math.sqrt(n)))
    if grid_size == old:
        return pos_embed
    dim = pos_embed.shape[-1]
    patch = pos_embed[:, prefix:].reshape(1, old, old, dim).permute(0, 3, 1, 2)
    scale = (grid_size + 0.1) / old
    patch = F.interpolate(patch, scale_factor=(scale, scale), mode="bicubic")
    if tuple(patch.shape[-2:]) != (grid_size, grid_size):
        raise ValueError(f"position embedding resampled to {tuple(patch.shape[-2:])}, not {grid_size}x{grid_size}")
    return torch.cat([pos_embed[:, :prefix], patch.permute(0, 2, 3, 1).reshape(1, -1, dim)], dim=1)


def init_linears_and_norms(modules, weight_init, linear_types: tuple = (nn.Linear,)) -> None:
    """The transformers' weight init (timm's and DINO's ``_init_weights``, MAE's, I-JEPA's): each of ``linear_types``
    its weight by ``weight_init`` and a zero bias, each LayerNorm weight 1 and bias 0, in ``modules``' order."""
    for m in modules:
        if isinstance(m, linear_types):
            weight_init(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


class DropPath(nn.Module):
    """Per-sample stochastic depth: zero a sample's residual branch with probability p, rescale by 1/(1-p)."""

    def __init__(self, p: float = 0.0):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.p == 0.0 or not self.training:
            return x
        keep = 1.0 - self.p
        mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
        return x * mask / keep

    def extra_repr(self) -> str:
        return f"p={self.p}"


class PatchEmbed(nn.Module):
    """Non-overlapping p x p patches -> D via a strided conv (timm name: ``patch_embed.proj``)."""

    def __init__(self, patch_size: int, in_chans: int, embed_dim: int):
        super().__init__()
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)


# Attention path: "sdpa" (torch's fused kernel, the default; on GPUs the flash / memory-efficient one) or
# "matmul" (softmax(q kᵀ/√d) v as two batched products); both give the same result within float rounding.
# The switch exists for the attention lever of benchmarks/levers.py (figures: benchmarks/results/NOTES.md).
ATTENTION_MODES = ("sdpa", "matmul")
_attention = "sdpa"


def set_attention(mode: str) -> None:
    """Choose the attention path of every ViT in this process (one of ``ATTENTION_MODES``)."""
    global _attention
    if mode not in ATTENTION_MODES:
        raise ValueError(f"attention must be one of {', '.join(ATTENTION_MODES)}, got {mode!r}")
    _attention = mode


def attention_mode() -> str:
    return _attention


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q kᵀ / √d) v over (B, heads, N, d) tensors, by the path ``set_attention`` chose."""
    if _attention == "sdpa":
        return F.scaled_dot_product_attention(q, k, v)
    return ((q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)).softmax(dim=-1) @ v


class Attention(nn.Module):
    """Multi-head self-attention with a fused qkv Linear, laid out (3, heads, head_dim) as in timm."""

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True):
        super().__init__()
        if dim % num_heads != 0:
            raise ValueError(f"embed_dim {dim} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, D = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, D // self.num_heads).permute(2, 0, 3, 1, 4)
        x = attention(q, k, v)
        return self.proj(x.transpose(1, 2).reshape(B, N, D))


class Mlp(nn.Module):
    """fc1 -> GELU -> fc2."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class SwiGLUFFN(nn.Module):
    """DINOv2's ``swiglufused`` FFN (dinov2/layers/swiglu_ffn.py ``SwiGLUFFNFused``): ``w3(silu(a) · b)`` with
    ``a, b = w12(x).chunk(2)``; the hidden width is ``hidden · 2/3`` rounded up to a multiple of 8 (4096 → 2736 in
    ViT-L/14), so the parameter count stays near the GELU MLP's."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        hidden = (int(hidden * 2 / 3) + 7) // 8 * 8
        self.w12 = nn.Linear(dim, 2 * hidden)
        self.w3 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.w12(x).chunk(2, dim=-1)
        return self.w3(F.silu(a) * b)


class LayerScale(nn.Module):
    """Per-channel scale ``gamma`` of a residual branch, initialised to a small constant (Touvron et al. 2021,
    CaiT); timm name ``ls1.gamma`` / ``ls2.gamma``."""

    def __init__(self, dim: int, init_value: float):
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), float(init_value)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class Block(nn.Module):
    """Pre-norm transformer block: x + dp(ls1(attn(norm1(x)))); x + dp(ls2(mlp(norm2(x)))); ls = identity
    unless ``layer_scale`` > 0; ``ffn``: mlp (GELU) or swiglu (DINOv2's ViT-L/g)."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float, qkv_bias: bool, drop_path: float,
                 layer_scale: float = 0.0, ffn: str = "mlp"):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, num_heads, qkv_bias)
        self.ls1 = LayerScale(dim, layer_scale) if layer_scale > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = (SwiGLUFFN if ffn == "swiglu" else Mlp)(dim, int(dim * mlp_ratio))
        self.ls2 = LayerScale(dim, layer_scale) if layer_scale > 0 else nn.Identity()
        self.drop_path = DropPath(drop_path)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path(self.ls1(self.attn(self.norm1(x))))
        return x + self.drop_path(self.ls2(self.mlp(self.norm2(x))))


class VisionTransformer(nn.Module):
    """MoCo v3 ViT (official ``vits.py``): sin-cos positions fixed, class token, pre-norm blocks.

    ``pool="cls"`` returns the final-LayerNorm class token; ``pool="avg"`` returns the mean of the
    final-LayerNorm patch tokens (timm ``global_pool='avg', fc_norm=False``). ``final_norm=False`` drops the
    final LayerNorm (timm ``final_norm=False``): MoCo v3 §6.2 finds average pooling works only without it
    (76.3 vs 69.7%; its variant also drops the class token, which is kept here, unpooled). ``pool="global"`` is
    MAE's fine-tuning pool (models_vit.py:23-53): the mean of the last block's patch tokens, then a LayerNorm
    ``fc_norm``, with no final ``norm`` (timm ``global_pool='avg', fc_norm=True``).
    ``pos_embed="none"``: no position information (a fixed zero table; MoCo v3 §6.2's ablation, −1.6 points).
    ``class_token=False``: no class token at all (I-JEPA's ViT, ijepa vision_transformer.py:329-425): the tokens
    are the patches only, the position table (1, N, D), and the feature is their mean (``pool`` avg or global).
    """

    def __init__(self, *args, **kwargs):
        """The module, then its layers by ``build`` (its arguments are ``build``'s): a subclass with other layers
        (DINOv3's ViT) gives its own ``build`` and keeps this class's forward passes."""
        super().__init__()
        self.build(*args, **kwargs)

    def build(
        self,
        image_size: int = 224,
        patch_size: int = 16,
        in_chans: int = 3,
        embed_dim: int = 768,
        depth: int = 12,
        num_heads: int = 12,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        drop_path_rate: float = 0.0,
        pool: str = "cls",
        stop_grad_conv1: bool = False,
        layer_scale: float = 0.0,
        pos_embed: str = "sincos",
        init: str = "moco_v3",
        final_norm: bool = True,
        registers: int = 0,
        ffn: str = "mlp",
        drop_path_uniform: bool = False,
        class_token: bool = True,
    ) -> None:
        if not class_token and pool == "cls":
            raise ValueError("a ViT without a class token pools its patch tokens: use pool avg or global")
        if pool not in ("cls", "avg", "global"):
            raise ValueError(f"pool must be 'cls', 'avg' or 'global', got {pool!r}")
        if pos_embed not in ("sincos", "learned", "none") or init not in ("moco_v3", "trunc_normal", "dinov2"):
            raise ValueError(f"pos_embed must be sincos, learned or none and init moco_v3, trunc_normal or dinov2, "
                             f"got {pos_embed!r}, {init!r}")
        if ffn not in ("mlp", "swiglu") or registers < 0:
            raise ValueError(f"ffn must be mlp or swiglu and registers >= 0, got {ffn!r}, {registers}")
        if image_size % patch_size != 0:
            lo = max(patch_size, image_size // patch_size * patch_size)
            raise ValueError(f"image size {image_size} is not divisible by the ViT's patch size {patch_size}; set "
                             f"data.image_size to a multiple of {patch_size} (e.g. {lo} or {lo + patch_size}), or a "
                             "model.patch_size that divides it")
        self.kwargs = dict(image_size=image_size, patch_size=patch_size, in_chans=in_chans, embed_dim=embed_dim,
                           depth=depth, num_heads=num_heads, mlp_ratio=float(mlp_ratio), qkv_bias=qkv_bias,
                           drop_path_rate=float(drop_path_rate), pool=pool, stop_grad_conv1=stop_grad_conv1,
                           layer_scale=float(layer_scale), pos_embed=pos_embed,
                           init=init, final_norm=bool(final_norm), registers=int(registers), ffn=ffn,
                           drop_path_uniform=bool(drop_path_uniform),
                           class_token=bool(class_token))  # every constructor argument (the metadata)
        self.prefix = 1 if class_token else 0  # tokens before the patches (the class token)
        self.image_size, self.patch_size, self.in_chans = image_size, patch_size, in_chans
        self.embed_dim = self.num_features = embed_dim
        self.depth, self.pool = depth, pool
        self.learned_pos = pos_embed == "learned"
        grid = image_size // patch_size

        self.patch_embed = PatchEmbed(patch_size, in_chans, embed_dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if class_token else None
        self.no_pos = pos_embed == "none"
        table = torch.zeros(1, 1 + grid * grid, embed_dim) if self.no_pos else \
            build_2d_sincos_position_embedding(grid, embed_dim)
        self.pos_embed = nn.Parameter(table[:, 1 - self.prefix:].clone(), requires_grad=self.learned_pos)
        # stochastic depth rising linearly over the blocks (timm / DINO), or the same in each (DINOv2's
        # drop_path_uniform, vision_transformer.py:118-121)
        rates = [drop_path_rate if drop_path_uniform else drop_path_rate * i / max(depth - 1, 1) for i in range(depth)]
        self.blocks = nn.Sequential(*[Block(embed_dim, num_heads, mlp_ratio, qkv_bias, r, layer_scale, ffn)
                                      for r in rates])
        # DINOv2's register tokens ("Vision Transformers Need Registers", dinov2 vision_transformer.py:96-98, :225):
        # learned tokens after the class token, without positions, dropped from every output
        self.registers = int(registers)
        if self.registers:
            self.register_tokens = nn.Parameter(torch.zeros(1, self.registers, embed_dim))
        if pool == "global":  # MAE: the final norm moves after the pooling (timm's fc_norm)
            self.norm, self.fc_norm = nn.Identity(), nn.LayerNorm(embed_dim, eps=1e-6)
        else:
            self.norm = nn.LayerNorm(embed_dim, eps=1e-6) if final_norm else nn.Identity()
        self._other_grids: dict = {}  # fixed sin-cos tables of other grid sizes, per (grid, device)
        if init in ("trunc_normal", "dinov2"):
            self._init_trunc_normal(stop_grad_conv1, cls_std=1e-6 if init == "dinov2" else 0.02)
        else:
            self._init_weights(stop_grad_conv1)

    @torch.no_grad()
    def _init_trunc_normal(self, stop_grad_conv1: bool, cls_std: float = 0.02) -> None:
        """DINO / timm init (DINO vision_transformer.py:161-172): truncated normal std .02 for every Linear
        weight, the class token and a learned position table; zero Linear biases; LayerNorm 1 / 0; the patch
        convolution keeps PyTorch's default init. ``cls_std`` 1e-6 (``init=dinov2``): DINOv2's class token,
        normal, not truncated."""
        if self.learned_pos:
            nn.init.trunc_normal_(self.pos_embed, std=0.02)
        if self.cls_token is None:
            pass
        elif cls_std == 0.02:
            nn.init.trunc_normal_(self.cls_token, std=0.02)
        else:  # DINOv2 (dinov2 vision_transformer.py:173-178): normal, std 1e-6
            nn.init.normal_(self.cls_token, std=cls_std)
        if self.registers:
            nn.init.normal_(self.register_tokens, std=1e-6)  # dinov2 vision_transformer.py:190-191
        init_linears_and_norms(self.modules(), lambda w: nn.init.trunc_normal_(w, std=0.02))
        if stop_grad_conv1:
            self.patch_embed.proj.weight.requires_grad_(False)
            self.patch_embed.proj.bias.requires_grad_(False)

    @torch.no_grad()
    def _init_weights(self, stop_grad_conv1: bool) -> None:
        """MoCo v3 init: qkv uniform per Q/K/V, xavier elsewhere, zero biases, cls std 1e-6, patch conv as Linear."""
        for name, m in self.named_modules():
            if isinstance(m, nn.Linear):
                if name.endswith("qkv"):
                    bound = math.sqrt(6.0 / (m.weight.shape[0] // 3 + m.weight.shape[1]))
                    nn.init.uniform_(m.weight, -bound, bound)
                else:
                    nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=1e-6)
        if self.registers:
            nn.init.normal_(self.register_tokens, std=1e-6)
        proj = self.patch_embed.proj
        bound = math.sqrt(6.0 / (self.in_chans * self.patch_size**2 + self.embed_dim))
        nn.init.uniform_(proj.weight, -bound, bound)
        nn.init.zeros_(proj.bias)
        if stop_grad_conv1:
            proj.weight.requires_grad_(False)
            proj.bias.requires_grad_(False)

    def _check_input(self, x: torch.Tensor) -> None:
        C, S, p = self.in_chans, self.image_size, self.patch_size
        if x.ndim != 4 or x.shape[1] != C or x.shape[2] != x.shape[3] or x.shape[2] % p:
            raise ValueError(f"ViT expects square ({C}, S, S) images with S divisible by the patch size {p} "
                             f"(the model size is {S}), got a tensor of shape {tuple(x.shape)}")

    def position_embedding(self, size: int) -> torch.Tensor:
        """The (1, prefix + g*g, D) position table of a ``size``-pixel input (g = size / patch): the model's own at
        the model size; otherwise the fixed sin-cos table of the g × g grid (made once per grid and device)
        or the learned one resampled (``interpolate_pos_embed``, differentiable)."""
        grid = size // self.patch_size
        if size == self.image_size:
            return self.pos_embed
        if self.learned_pos:
            return interpolate_pos_embed(self.pos_embed, grid, self.prefix)
        if self.no_pos:
            return self.pos_embed.new_zeros(1, self.prefix + grid * grid, self.embed_dim)
        if torch.compiler.is_compiling():  # in the graph (a cache write would make the step recompile)
            return build_2d_sincos_position_embedding(grid, self.embed_dim, device=self.pos_embed.device)[
                :, 1 - self.prefix:].to(self.pos_embed.dtype)
        key = (grid, self.pos_embed.device)
        if key not in self._other_grids:
            self._other_grids[key] = build_2d_sincos_position_embedding(grid, self.embed_dim, device=key[1])[
                :, 1 - self.prefix:]
        return self._other_grids[key].to(self.pos_embed.dtype)

    def add_mask_token(self) -> None:
        """Register ``masked_embed`` (1, D), zero-initialised: iBOT's learned mask token, of the student only
        (ibot models/vision_transformer.py:169-172); :meth:`forward_features` puts it at masked patches."""
        self.masked_embed = nn.Parameter(torch.zeros(1, self.embed_dim))

    def forward_features(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """All tokens (B, 1+N, D) after the final LayerNorm (none under pool='global'); token 0 is the class
        token ((B, N, D), the patches only, without one). ``mask`` (B, N) bool (row-major patch order): those
        patch embeddings are replaced by ``masked_embed`` before the class token and the positions are added
        (iBOT's ``prepare_tokens`` / ``mask_model``, :205-222, :267-269)."""
        return self._blocks_and_norm(self._tokens(x, mask))

    def _tokens(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """The blocks' input: patch embeddings (``mask``: see :meth:`forward_features`), the class token, positions."""
        self._check_input(x)
        pos = self.position_embedding(x.shape[-1])
        x = self.patch_embed(x)
        if mask is not None:
            x = torch.where(mask.reshape(x.shape[0], -1, 1), self.masked_embed.to(x.dtype), x)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        return x + pos

    def _with_registers(self, x: torch.Tensor) -> torch.Tensor:
        """Register tokens, if any, inserted after the class token."""
        if not self.registers:
            return x
        p = self.prefix
        return torch.cat([x[:, :p], self.register_tokens.expand(x.shape[0], -1, -1).to(x.dtype), x[:, p:]], dim=1)

    def _without_registers(self, x: torch.Tensor) -> torch.Tensor:
        p = self.prefix
        return torch.cat([x[:, :p], x[:, p + self.registers:]], dim=1) if self.registers else x

    def _blocks_and_norm(self, x: torch.Tensor) -> torch.Tensor:
        """The blocks and the final norm on (B, 1+N, D) tokens; register tokens, if any, are inserted after the
        class token before the blocks and removed after the norm."""
        return self._without_registers(self.norm(self.blocks(self._with_registers(x))))

    def forward_visible(self, x: torch.Tensor, ids_keep: torch.Tensor) -> torch.Tensor:
        """The encoder on a subset of patches (MAE models_mae.py ``forward_encoder``; I-JEPA's ``forward(x, masks)``
        with ``apply_masks``, vision_transformer.py:401-425): positions are added to every patch, the patches
        ``ids_keep`` (m·B, K) are kept (m > 1: the m masks of each image stacked mask-major, the images repeated
        as ``apply_masks`` concatenates), then the class token (+ its position), if any, is prepended; returns
        (m·B, 1+K, D) ((m·B, K, D) without a class token) after the final LayerNorm. With every index in order
        it equals ``forward_features``."""
        self._check_input(x)
        p = self.prefix
        x = self.patch_embed(x) + self.pos_embed[:, p:]
        if ids_keep.shape[0] != x.shape[0]:
            x = x.repeat(ids_keep.shape[0] // x.shape[0], 1, 1)
        x = torch.gather(x, 1, ids_keep.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
        if self.cls_token is None:
            return self._blocks_and_norm(x)
        cls = (self.cls_token + self.pos_embed[:, :1]).expand(x.shape[0], -1, -1)
        return self._blocks_and_norm(torch.cat([cls, x], dim=1))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                return_all_tokens: bool = False) -> torch.Tensor:
        """The (B, D) feature: class token (pool='cls'), mean of patch tokens (pool='avg'), or that mean
        through ``fc_norm`` (pool='global'); with ``return_all_tokens`` every token (B, 1+N, D) (iBOT's student
        and teacher); ``mask``: see :meth:`forward_features`."""
        x = self.forward_features(x, mask)
        return x if return_all_tokens else self.pool_tokens(x)

    def pool_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """The (B, D) feature of (B, 1+N, D) normalised tokens, as :meth:`forward` pools them."""
        if self.pool == "global":
            return self.fc_norm(x[:, self.prefix:].mean(dim=1))
        return x[:, 0] if self.pool == "cls" else x[:, self.prefix:].mean(dim=1)

    def forward_last_blocks(self, x: torch.Tensor, n: int) -> torch.Tensor:
        """The pooled features of the last ``n`` blocks concatenated, (B, n·D): each block's tokens through the
        final norm, then pooled as :meth:`forward` (DINO's ``get_intermediate_layers`` + ``n_last_blocks`` of
        eval_linear.py, with the ViT's own pooling). ``n = 1`` is :meth:`forward`. The evaluation features of
        ``selfsup eval --last-blocks N`` (I-JEPA's paper evaluates the last layer or the concatenation of the last
        ones; DINO's ViT-S linear probe takes 4)."""
        return torch.cat([self.pool_tokens(t) for t in self.last_blocks_tokens(x, n)], dim=-1)

    def last_blocks_tokens(self, x: torch.Tensor, n: int) -> list[torch.Tensor]:
        """The tokens (B, 1+N, D) of each of the last ``n`` blocks, each through the final norm, registers removed
        (DINOv2's ``get_intermediate_layers(x, n, norm=True)``, dinov2 b8931f7 vision_transformer.py:299-323); the
        last is :meth:`forward_features`."""
        if not 1 <= n <= self.depth:
            raise ValueError(f"n={n} last blocks: the ViT has {self.depth}")
        x = self._with_registers(self._tokens(x))
        out = []
        for i, block in enumerate(self.blocks):
            x = block(x)
            if i >= self.depth - n:
                out.append(self._without_registers(self.norm(x)))
        return out

    def feature_maps(self, x: torch.Tensor, n: int = 1) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """(the pooled feature of the last block as :meth:`forward` pools it, the patch tokens of the last ``n``
        blocks as maps (B, D, H/p, W/p), row-major as the patches): what ``models.dense.feature_maps`` reads."""
        tokens = self.last_blocks_tokens(x, n)
        h, w = x.shape[-2] // self.patch_size, x.shape[-1] // self.patch_size
        maps = [t[:, self.prefix:].transpose(1, 2).reshape(t.shape[0], t.shape[-1], h, w) for t in tokens]
        return self.pool_tokens(tokens[-1]), maps

    def layer_id(self, param_name: str) -> int:
        """Depth index for layer-wise lr decay: 0 embeddings, i+1 for blocks.i, depth+1 for the rest."""
        if param_name.startswith(("patch_embed", "cls_token", "pos_embed", "masked_embed", "register_tokens")):
            return 0
        if param_name.startswith("blocks."):
            return int(param_name.split(".")[1]) + 1
        return self.depth + 1


class LastBlocks(nn.Module):
    """A ViT whose feature is :meth:`VisionTransformer.forward_last_blocks` of its last ``n`` blocks (evaluation)."""

    def __init__(self, vit: VisionTransformer, n: int):
        super().__init__()
        self.vit, self.n = vit, n
        self.num_features = n * vit.num_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.vit.forward_last_blocks(x, self.n)
