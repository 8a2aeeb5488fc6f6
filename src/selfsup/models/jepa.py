"""I-JEPA's predictor and initialisation (facebookresearch/ijepa ``src/models/vision_transformer.py``,
``src/helper.py``) around selfsup's ViT (its context and target encoders are
:class:`~selfsup.models.vit.VisionTransformer` without a class token).

The predictor (:220-326) maps the context tokens to its own width, adds its fixed sin-cos positions of the context
patches, appends one learned ``mask_token`` (+ the position) per target patch, runs pre-norm blocks and a LayerNorm
and maps the target tokens back to the encoder width. Facts with file:line in docs/JEPA.md.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .mae import mae_sincos_position_embedding
from .vit import Block, VisionTransformer, init_linears_and_norms


def ijepa_sincos_position_embedding(grid_size: int, embed_dim: int) -> Tensor:
    """(1, g², D): I-JEPA's ``get_2d_sincos_pos_embed(cls_token=False)`` (vision_transformer.py:22-82), MAE's
    table without the class row: the first half of the channels [sin | cos] of the column index, the second half
    of the row index."""
    return mae_sincos_position_embedding(grid_size, embed_dim)[:, 1:]


def apply_masks(x: Tensor, masks: Tensor) -> Tensor:
    """``apply_masks`` (src/masks/utils.py:11-20): the tokens of ``x`` (B, N, D) at each mask's indices, the masks
    (m, B, K) concatenated along the batch, mask-major: (m·B, K, D)."""
    m, b, k = masks.shape
    return torch.gather(x.repeat(m, 1, 1), 1, masks.reshape(m * b, k, 1).expand(-1, -1, x.shape[-1]))


def repeat_interleave_batch(x: Tensor, batch: int, repeat: int) -> Tensor:
    """``repeat_interleave_batch`` (src/utils/tensors.py:65-71): each consecutive chunk of ``batch`` rows repeated
    ``repeat`` times in place."""
    n = x.shape[0] // batch
    return x.view(n, 1, batch, *x.shape[1:]).expand(n, repeat, batch, *x.shape[1:]).reshape(n * repeat * batch,
                                                                                            *x.shape[1:])


class JEPAPredictor(nn.Module):
    """``VisionTransformerPredictor`` (vision_transformer.py:220-326; ``vit_predictor`` :444-448: mlp_ratio 4,
    qkv bias, LayerNorm eps 1e-6), parameter names as the official ones."""

    def __init__(self, grid_size: int, embed_dim: int, predictor_embed_dim: int = 384, depth: int = 6,
                 num_heads: int = 12, mlp_ratio: float = 4.0, drop_path_rate: float = 0.0):
        super().__init__()
        if predictor_embed_dim % 4 or predictor_embed_dim % num_heads:
            raise ValueError(f"the predictor width {predictor_embed_dim} must divide by 4 (sin-cos positions) and by "
                             f"its {num_heads} heads")
        self.predictor_embed = nn.Linear(embed_dim, predictor_embed_dim)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, predictor_embed_dim))
        self.predictor_pos_embed = nn.Parameter(ijepa_sincos_position_embedding(grid_size, predictor_embed_dim),
                                                requires_grad=False)
        rates = [drop_path_rate * i / max(depth - 1, 1) for i in range(depth)]  # torch.linspace(0, rate, depth)
        self.predictor_blocks = nn.ModuleList([Block(predictor_embed_dim, num_heads, mlp_ratio, True, r)
                                               for r in rates])
        self.predictor_norm = nn.LayerNorm(predictor_embed_dim, eps=1e-6)
        self.predictor_proj = nn.Linear(predictor_embed_dim, embed_dim)

    def forward(self, x: Tensor, masks_x: Tensor, masks: Tensor) -> Tensor:
        """``x`` (nenc·B, K_x, D) the context tokens, ``masks_x`` (nenc, B, K_x) their patch indices, ``masks``
        (npred, B, K) the targets' → predictions (npred·nenc·B, K, D) in the order of the official forward
        (:285-326): for each target mask, every context mask's batch."""
        nenc, b = masks_x.shape[:2]
        npred = masks.shape[0]
        x = self.predictor_embed(x)
        pos = self.predictor_pos_embed.expand(b, -1, -1)
        x = x + apply_masks(pos, masks_x)
        n_ctxt = x.shape[1]
        pos_embs = repeat_interleave_batch(apply_masks(pos, masks), b, nenc)
        pred_tokens = self.mask_token.to(pos_embs.dtype) + pos_embs
        x = torch.cat([x.repeat(npred, 1, 1), pred_tokens], dim=1)
        for block in self.predictor_blocks:
            x = block(x)
        return self.predictor_proj(self.predictor_norm(x)[:, n_ctxt:])


@torch.no_grad()
def ijepa_init_(encoder: VisionTransformer, predictor: JEPAPredictor, encoder_init: bool = True) -> None:
    """The initialisation a run of the official code ends with (helper.py:68-104 ``init_model`` after the
    constructors): I-JEPA's sin-cos tables (fixed); every Linear weight truncated normal std 0.02 (helper.py:86-99
    draws them again after the constructors, which undoes their ``fix_init_weight`` depth rescaling,
    vision_transformer.py:264-270 / :380-386), biases 0; LayerNorm 1 / 0; the patch convolution truncated normal
    std 0.02, bias 0 (vision_transformer.py:396-399); the mask token truncated normal std 0.02 (:260). torch's
    ``trunc_normal_`` is the code's (tensors.py:17-50, cut at ±2 absolute). ``encoder_init`` False: the encoder
    keeps its own init (``model.init``) but for the table."""
    if encoder.cls_token is not None:
        raise ValueError("I-JEPA's encoder has no class token (build it with class_token=False)")
    grid = encoder.image_size // encoder.patch_size
    encoder.pos_embed.copy_(ijepa_sincos_position_embedding(grid, encoder.embed_dim))
    init_linears_and_norms((*(encoder.modules() if encoder_init else ()), *predictor.modules()),
                           lambda w: nn.init.trunc_normal_(w, std=0.02), (nn.Linear, nn.Conv2d))
    nn.init.trunc_normal_(predictor.mask_token, std=0.02)
