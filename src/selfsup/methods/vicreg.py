"""VICReg (Bardes et al. 2022): invariance, variance and covariance regularisation of the two views' embeddings.

As the official code (facebookresearch/vicreg main_vicreg.py; NEW-METHODS.md §5): each view goes through
the backbone and the projector on its own (:195-196); the projector ("expander") is [Linear (bias) → BN →
ReLU] × 2 → Linear (no bias), 8192-8192-8192, no final BN (:223-232). The invariance term is the mean
squared error on this process's batch, computed before any gather (:198); the embeddings are then
gathered from every process with gradient (the official FullGatherLayer, whose backward sums the
gradients: :307-323; ``selfsup.distributed.gather_with_grad`` does the same) and the variance and
covariance terms are taken on the global batch (:200-213): hinge on the standard deviation
``sqrt(Var + 1e-4)`` with the official extra ½ per view (not in the paper's eq. 1), covariance
``zᵀz / (N − 1)`` whose squared off-diagonal entries are summed and divided by D, per view. Weights
λ, μ, ν = 25, 25, 1 (:58-63). The loss is computed in float32. Under DDP the gradient equals one process's
on the global batch.

``normalize_embeddings`` L2-normalises the projector outputs before the loss (off in the official code;
the embedding-norm study reports that VICReg collapses with it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from selfsup.distributed import gather_with_grad
from selfsup.errors import UserError
from selfsup.losses import vicreg_loss
from selfsup.methods.base import SSLMethod
from selfsup.models.heads import mlp
from selfsup.step import StepOutput


@dataclass
class VICRegConfig:
    """VICReg hyper-parameters; defaults from the official code (main_vicreg.py:44-63)."""

    sim_coeff: float = 25.0  # λ, invariance
    std_coeff: float = 25.0  # μ, variance
    cov_coeff: float = 1.0  # ν, covariance
    proj_hidden_dim: int = 8192
    dim: int = 8192
    proj_layers: int = 3  # '8192-8192-8192': 2 hidden [Linear, BN, ReLU] blocks and the output Linear
    eps: float = 1e-4  # inside the square root of the variance
    normalize_embeddings: bool = False  # L2-normalise the projector outputs before the loss

    def validate(self) -> None:
        for key in ("sim_coeff", "std_coeff", "cov_coeff"):
            if getattr(self, key) < 0:
                raise UserError(f"method.{key}={getattr(self, key)} must be >= 0")
        if self.proj_layers < 1:
            raise UserError(f"method.proj_layers={self.proj_layers} must be >= 1")
        if self.eps <= 0:
            raise UserError(f"method.eps={self.eps} must be > 0")


class VICReg(SSLMethod):
    """z = projector(backbone(x)) per view; L = λ s(z, z') + μ v(Z) + ν c(Z), Z the global batch."""

    Config = VICRegConfig
    collapse_remedy = ("keep method.std_coeff and method.cov_coeff > 0 (the variance and covariance terms are what"
                       " prevent collapse); a lower optim.base_lr")
    recipe = "byol"  # the official augmentations are BYOL's: blur 1.0 / 0.1, solarize 0 / 0.2 (augmentations.py)

    def __init__(self, cfg, info):
        super().__init__(cfg, info)
        c = cfg.method
        self.projector = mlp(self.backbone.num_features, c.proj_hidden_dim, c.dim, c.proj_layers, bias=True,
                             last_bias=False)

    def trainable(self):
        return {"backbone": self.backbone, "projector": self.projector}

    def forward_views(self, views):
        c = self.cfg.method
        h1, h2, z1, z2 = self.project_pair(views, c.normalize_embeddings)
        with torch.autocast(z1.device.type, enabled=False):
            z1f, z2f = z1.float(), z2.float()
            loss = vicreg_loss(z1f, z2f, all_z1=gather_with_grad(z1f), all_z2=gather_with_grad(z2f),
                               sim_coeff=c.sim_coeff, std_coeff=c.std_coeff, cov_coeff=c.cov_coeff, eps=c.eps)
        return StepOutput(loss, embedding=h1.detach(), embedding2=h2.detach(), projection=z1.detach())
