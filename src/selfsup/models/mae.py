"""The parts of a masked autoencoder (He et al. 2022; facebookresearch/mae ``models_mae.py``) around selfsup's ViT.

The encoder is :class:`~selfsup.models.vit.VisionTransformer` (its ``forward_visible`` runs the kept patches
only); this module adds per-sample random masking, the lighter decoder with its learned mask token, MAE's
fixed sin-cos table and initialisation, and the patch layout of the pixel target.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .vit import Block, VisionTransformer, build_2d_sincos_position_embedding, init_linears_and_norms


def mae_sincos_position_embedding(grid_size: int, embed_dim: int) -> Tensor:
    """(1, 1 + g², D): MAE's ``get_2d_sincos_pos_embed(cls_token=True)`` (util/pos_embed.py:20-67).

    The first half of the channels is [sin | cos] of the column index, the second half of the row index,
    frequencies 1 / 10000^(i / (D/4)); the class position is zeros. It is MoCo v3's table with the two halves
    exchanged (MoCo's first half encodes the row)."""
    table = build_2d_sincos_position_embedding(grid_size, embed_dim)
    half = embed_dim // 2
    return torch.cat([table[..., half:], table[..., :half]], dim=-1)


def num_kept(num_patches: int, mask_ratio: float) -> int:
    """Patches the encoder sees: ``int(L · (1 − mask_ratio))`` (models_mae.py random_masking; 49 of 196 at 0.75)."""
    return int(num_patches * (1 - mask_ratio))


def random_masking(noise: Tensor, len_keep: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per-sample random masking by sorting noise (models_mae.py:123-148).

    ``noise`` (B, L) ~ U(0, 1): each sample keeps its ``len_keep`` patches of smallest noise. Returns
    ``ids_keep`` (B, len_keep), ``mask`` (B, L; 1 = removed, 0 = kept, in the original patch order) and
    ``ids_restore`` (B, L), the inverse of the shuffle: ``shuffled.gather(1, ids_restore)`` is the original order.
    """
    ids_shuffle = noise.argsort(dim=1)  # ascending: small noise is kept
    ids_restore = ids_shuffle.argsort(dim=1)
    mask = (ids_restore >= len_keep).to(noise.dtype)
    return ids_shuffle[:, :len_keep], mask, ids_restore


def patchify(images: Tensor, patch_size: int) -> Tensor:
    """(B, C, H, W) → (B, L, p²·C) in the encoder's token order, each patch laid out (p, q, c), channel last
    (models_mae.py patchify)."""
    b, c, height, width = images.shape
    p = patch_size
    h, w = height // p, width // p
    return images.reshape(b, c, h, p, w, p).permute(0, 2, 4, 3, 5, 1).reshape(b, h * w, p * p * c)


def unpatchify(patches: Tensor, patch_size: int, channels: int) -> Tensor:
    """The inverse of :func:`patchify` for square images: (B, L, p²·C) → (B, C, H, W)."""
    b, n, _ = patches.shape
    p, g = patch_size, round(n ** 0.5)
    return patches.reshape(b, g, g, p, p, channels).permute(0, 5, 1, 3, 2, 4).reshape(b, channels, g * p, g * p)


class MAEDecoder(nn.Module):
    """MAE's decoder (models_mae.py:172-196): Linear to its own width, the learned ``mask_token`` (decoder width)
    in every removed position, unshuffle with ``ids_restore`` (class token first), + the fixed sin-cos table,
    ``depth`` pre-norm blocks, LayerNorm, Linear to p²·C pixels per patch; the class token's output is dropped."""

    def __init__(self, grid_size: int, encoder_dim: int, patch_dim: int, embed_dim: int = 512, depth: int = 8,
                 num_heads: int = 16, mlp_ratio: float = 4.0):
        super().__init__()
        self.embed = nn.Linear(encoder_dim, embed_dim)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(mae_sincos_position_embedding(grid_size, embed_dim), requires_grad=False)
        self.blocks = nn.Sequential(*[Block(embed_dim, num_heads, mlp_ratio, True, 0.0) for _ in range(depth)])
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6)
        self.pred = nn.Linear(embed_dim, patch_dim)

    def forward(self, latent: Tensor, ids_restore: Tensor) -> Tensor:
        """``latent`` (B, 1+K, D_enc) from the encoder, ``ids_restore`` (B, L) → predicted patches (B, L, p²·C)."""
        x = self.embed(latent)
        b, length = ids_restore.shape
        d = x.shape[-1]
        tokens = torch.cat([x[:, 1:], self.mask_token.expand(b, length + 1 - x.shape[1], d)], dim=1)
        tokens = tokens.gather(1, ids_restore.unsqueeze(-1).expand(-1, -1, d))  # unshuffle
        x = torch.cat([x[:, :1], tokens], dim=1) + self.pos_embed
        return self.pred(self.norm(self.blocks(x)))[:, 1:]


@torch.no_grad()
def mae_init_(encoder: VisionTransformer, decoder: MAEDecoder) -> None:
    """MAE's initialisation (models_mae.py:65-93) of both halves, in place: MAE's sin-cos table in the encoder;
    xavier-uniform on every Linear (qkv as one matrix) and on the patch projection seen as a Linear (its bias
    keeps torch's default Conv2d init, as the official code never touches it); zero Linear biases; LayerNorm
    1 / 0; class and mask tokens ~ N(0, 0.02). An encoder without a position table (DINOv3's rotary ViT) keeps its
    rotary positions."""
    grid = encoder.image_size // encoder.patch_size
    if hasattr(encoder, "pos_embed"):
        encoder.pos_embed.copy_(mae_sincos_position_embedding(grid, encoder.embed_dim))
    proj = encoder.patch_embed.proj
    proj.reset_parameters()  # torch's default bias init, as official (only the weight is re-drawn below)
    nn.init.xavier_uniform_(proj.weight.view(proj.weight.shape[0], -1))
    init_linears_and_norms((*encoder.modules(), *decoder.modules()), nn.init.xavier_uniform_)
    nn.init.normal_(encoder.cls_token, std=0.02)
    nn.init.normal_(decoder.mask_token, std=0.02)
