"""MAE (He et al. 2022, "Masked Autoencoders Are Scalable Vision Learners"), as facebookresearch/mae.

Per image (models_mae.py:150-214): patches + positions, keep a random 25% per sample, the ViT encoder on
the kept patches only, a light decoder fills the removed positions with a learned mask token, predicts
every patch's pixels, and the loss is the MSE against the (per-patch normalised) pixels of the removed
patches only. The encoder is the run's own ViT (``model.backbone``), exported like any other backbone.
Optimisation (main_pretrain.py) is the shared AdamW + per-iteration warm-up / cosine of the presets.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from selfsup.errors import UserError
from selfsup.losses import masked_patch_mse, normalized_pixel_target
from selfsup.methods.base import SSLMethod
from selfsup.models.mae import MAEDecoder, mae_init_, num_kept, patchify, random_masking, unpatchify
from selfsup.models.vit import VisionTransformer
from selfsup.step import StepOutput


@dataclass
class MAEConfig:
    """MAE hyper-parameters; defaults are the official pre-training command (PRETRAIN.md) and decoder
    (512-d, 8 blocks)."""

    mask_ratio: float = 0.75  # share of patches removed per sample
    # per-patch normalised pixel target; code default off, the command and released models on
    norm_pix_loss: bool = True
    decoder_embed_dim: int = 512
    decoder_depth: int = 8
    decoder_num_heads: int = 16
    decoder_mlp_ratio: float = 4.0

    def validate(self) -> None:
        if not 0 < self.mask_ratio < 1:
            raise UserError(f"method.mask_ratio={self.mask_ratio} must be in (0, 1) (MAE: 0.75)")
        for key in ("decoder_embed_dim", "decoder_depth", "decoder_num_heads"):
            if getattr(self, key) < 1:
                raise UserError(f"method.{key}={getattr(self, key)} must be >= 1")
        if self.decoder_embed_dim % 4 or self.decoder_embed_dim % self.decoder_num_heads:
            raise UserError(f"method.decoder_embed_dim={self.decoder_embed_dim} must divide by 4 (sin-cos positions) "
                            f"and by method.decoder_num_heads={self.decoder_num_heads}")
        if not self.decoder_mlp_ratio > 0:
            raise UserError(f"method.decoder_mlp_ratio={self.decoder_mlp_ratio} must be > 0")


class MAE(SSLMethod):
    """pred = decoder(encoder(x[kept]), ids_restore); loss = mean over removed patches of ‖pred − target‖² / (p²C)."""

    Config = MAEConfig
    collapse_remedy = "a lower optim.base_lr or a longer optim.warmup_epochs; method.mask_ratio in 0.6-0.8"
    recipe = "mae"
    scales_min_lr = False  # util/lr_sched.py: args.min_lr + (args.lr − args.min_lr) · cosine; min_lr as given

    def __init__(self, cfg, info):
        super().__init__(cfg, info)
        c, vit = cfg.method, self.backbone
        if not isinstance(vit, VisionTransformer):
            raise UserError(f"method mae needs a selfsup ViT backbone (vit_micro, vit_tiny, vit_small, vit_base, "
                            f"vit_large), not model.backbone={cfg.model.backbone!r}")
        grid = vit.image_size // vit.patch_size
        self.num_patches = grid * grid
        self.len_keep = num_kept(self.num_patches, c.mask_ratio)
        if not 1 <= self.len_keep < self.num_patches:
            raise UserError(f"method.mask_ratio={c.mask_ratio} keeps {self.len_keep} of {self.num_patches} patches; "
                            "the encoder needs at least one and the loss one removed: change it or model.patch_size")
        self.decoder = MAEDecoder(grid, vit.embed_dim, vit.patch_size ** 2 * vit.in_chans, c.decoder_embed_dim,
                                  c.decoder_depth, c.decoder_num_heads, c.decoder_mlp_ratio)
        mae_init_(vit, self.decoder)

    def trainable(self):
        """The modules the optimiser trains: the encoder and the decoder."""
        return {"backbone": self.backbone, "decoder": self.decoder}

    def mask_noise(self, batch: int, device) -> Tensor:
        """U(0, 1) noise (B, L) that decides the mask: from the step's generator (seeded by seed, step and rank,
        after the augmentation drew from it), so a resumed run masks as the uninterrupted one."""
        return torch.rand(batch, self.num_patches, generator=self.rng(device), device=device)

    def target(self, x: Tensor) -> Tensor:
        """The pixel target (B, L, p²·C) of the normalised images, per-patch normalised with ``norm_pix_loss``."""
        patches = patchify(x, self.backbone.patch_size)
        return normalized_pixel_target(patches) if self.cfg.method.norm_pix_loss else patches

    def forward_mae(self, x: Tensor, noise: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(loss, latent (B, 1+K, D), pred (B, L, p²·C), mask (B, L)) for images ``x`` and mask noise ``noise``."""
        ids_keep, mask, ids_restore = random_masking(noise, self.len_keep)
        latent = self.backbone.forward_visible(x, ids_keep)  # the encoder sees the kept patches only
        pred = self.decoder(latent, ids_restore)
        return masked_patch_mse(pred.float(), self.target(x), mask), latent, pred, mask

    def step_draws(self, views: list[Tensor]) -> dict[str, Tensor]:
        """The mask noise, drawn before the (compiled) step."""
        return {"noise": self.mask_noise(views[0].shape[0], views[0].device)}

    def forward_views(self, views: list[Tensor], noise: Tensor | None = None) -> StepOutput:
        (x,) = views
        noise = self.mask_noise(x.shape[0], x.device) if noise is None else noise
        loss, latent, _, _ = self.forward_mae(x, noise)
        return StepOutput(loss, embedding=latent[:, 0].detach())

    @torch.no_grad()
    def reconstruct(self, x: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
        """(reconstruction (B, C, H, W) in the input's normalisation, mask (B, L)). With ``norm_pix_loss`` the
        prediction is per-patch normalised; each patch is mapped back with the input patch's own mean and std
        (a display convention: those statistics of the removed patches are not the model's)."""
        _, _, pred, mask = self.forward_mae(x, noise)
        pred = pred.float()
        if self.cfg.method.norm_pix_loss:
            patches = patchify(x, self.backbone.patch_size)
            pred = pred * (patches.var(dim=-1, keepdim=True) + 1e-6) ** 0.5 + patches.mean(dim=-1, keepdim=True)
        return unpatchify(pred, self.backbone.patch_size, x.shape[1]), mask
