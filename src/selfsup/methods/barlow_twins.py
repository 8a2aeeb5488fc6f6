"""Barlow Twins (Zbontar et al. 2021): the cross-correlation of the two views' embeddings pushed to the identity.

As the official code (facebookresearch/barlowtwins main.py; NEW-METHODS.md §4): each view goes through the
backbone and the projector on its own (BatchNorm statistics per view, :207-209); the projector is
[Linear (no bias) → BN → ReLU] × 2 → Linear (no bias), 8192-8192-8192 (:195-202); its outputs are
standardised per dimension with the statistics of the global batch, as the official
BatchNorm1d(affine=False) under SyncBN (:205, :89; written here as ``selfsup.losses.batch_standardize``
on the gathered batch, so it holds on any backend, CPU gloo included); ``C = bn(z1)ᵀ bn(z2) / N`` with N
the global batch, summed over processes (:212-216); ``L = Σᵢ (1 − Cᵢᵢ)² + λ Σ_{i≠j} Cᵢⱼ²``, λ = 0.0051
(:218-220, :39). The loss is computed in float32.

The gradient across processes (``ddp_gradient``). The official sum of C over processes is an in-place
``torch.distributed.all_reduce``, which autograd does not see: every process's loss has the value of
the global C but back-propagates only its own share, so after DDP's averaging the gradient is
1 / world_size of the global-batch loss's gradient (NEW-METHODS.md §4, "DDP caveat"). ``official``
(default) reproduces that gradient exactly; under LARS it changes the weights' step only through the
weight-decay balance (the trust ratio normalises the update) but scales the step of the biases and BN
parameters, which LARS leaves unadapted, by 1 / world_size. ``global`` sums C differentiably
(``torch.distributed.nn.all_reduce``, the fix the author proposed in barlowtwins issue #8): the
gradient of one process on the global batch, whatever the number of processes.

``normalize_embeddings`` L2-normalises the projector outputs before the standardisation (off in the
official code; the embedding-norm study reports that Barlow Twins collapses with it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from selfsup.distributed import all_reduce_local_grad, all_reduce_with_grad, gather_with_grad
from selfsup.errors import UserError
from selfsup.losses import barlow_twins_loss, cross_correlation
from selfsup.methods.base import SSLMethod
from selfsup.models.heads import mlp
from selfsup.step import StepOutput


@dataclass
class BarlowTwinsConfig:
    """Barlow Twins hyper-parameters; defaults from the official code (main.py:33-41)."""

    lambd: float = 0.0051  # weight of the off-diagonal (redundancy-reduction) term
    proj_hidden_dim: int = 8192
    dim: int = 8192
    proj_layers: int = 3  # '8192-8192-8192': 2 hidden [Linear, BN, ReLU] blocks and the output Linear
    bn_eps: float = 1e-5  # of the standardisation (BatchNorm1d's default)
    ddp_gradient: str = "official"  # official (1 / world_size of the global gradient) | global
    normalize_embeddings: bool = False  # L2-normalise the projector outputs before the loss

    def validate(self) -> None:
        if self.lambd < 0:
            raise UserError(f"method.lambd={self.lambd} must be >= 0")
        if self.proj_layers < 1:
            raise UserError(f"method.proj_layers={self.proj_layers} must be >= 1")
        if self.bn_eps <= 0:
            raise UserError(f"method.bn_eps={self.bn_eps} must be > 0")
        if self.ddp_gradient not in ("official", "global"):
            raise UserError(f"method.ddp_gradient={self.ddp_gradient!r} is not known; use official or global")


class BarlowTwins(SSLMethod):
    """z = projector(backbone(x)) per view; C = bn(z1)ᵀ bn(z2) / N over the global batch; L_BT(C)."""

    Config = BarlowTwinsConfig
    collapse_remedy = ("keep method.lambd > 0 (the redundancy term) and the projector's BatchNorm; lower "
                       "optim.base_lr")
    recipe = "byol"  # the official augmentations are BYOL's: blur 1.0 / 0.1, solarize 0 / 0.2 (main.py:290-326)

    def __init__(self, cfg, info):
        super().__init__(cfg, info)
        c = cfg.method
        self.projector = mlp(self.backbone.num_features, c.proj_hidden_dim, c.dim, c.proj_layers, bias=False)

    def trainable(self):
        return {"backbone": self.backbone, "projector": self.projector}

    def forward_views(self, views):
        c = self.cfg.method
        h1, h2, z1, z2 = self.project_pair(views, c.normalize_embeddings)  # the projector's BN: per-view statistics
        with torch.autocast(z1.device.type, enabled=False):
            z1f, z2f = z1.float(), z2.float()
            all_z1, all_z2 = gather_with_grad(z1f), gather_with_grad(z2f)
            corr = cross_correlation(z1f, z2f, all_z1=all_z1, all_z2=all_z2, batch_size=all_z1.shape[0],
                                     eps=c.bn_eps)
            corr = (all_reduce_local_grad if c.ddp_gradient == "official" else all_reduce_with_grad)(corr)
            loss = barlow_twins_loss(corr, c.lambd)
        return StepOutput(loss, embedding=h1.detach(), embedding2=h2.detach(), projection=z1.detach())
