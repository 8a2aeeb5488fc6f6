"""BYOL (Grill et al. 2020): an online predictor regresses an EMA target's projection.

Loss ``2 − 2·cos(p, sg(z'))`` per direction, summed over the two directions and averaged over the
batch (official byol_experiment.py); target decay τ = 1 − (1 − τ_base)·½(1 + cos(πt/T)).
Heads: Linear (with bias) → BN → ReLU → Linear (no bias), 4096 → 256, no final BN (the official
haiku MLP: ``with_bias=False`` on its output Linear).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from selfsup.losses import byol_regression
from selfsup.methods.base import SSLMethod, check_momentum, encode_views
from selfsup.models.heads import mlp
from selfsup.predictors import DirectPredConfig, after_step_hooks, build_predictor, check_predictor


@dataclass
class BYOLConfig:
    """BYOL hyper-parameters; defaults from the paper / official code (1000-epoch τ_base 0.996)."""

    momentum: float = 0.996  # τ_base
    momentum_schedule: str = "cosine"  # cosine (official) | constant
    proj_hidden_dim: int = 4096
    dim: int = 256
    pred_hidden_dim: int = 4096
    predictor: str = "mlp"  # mlp | linear | symmetric | directpred | directcopy (selfsup.predictors)
    directpred: DirectPredConfig = field(default_factory=DirectPredConfig)

    def validate(self) -> None:
        check_momentum(self)
        check_predictor(self)


class BYOL(SSLMethod):
    """p = predictor(projector(backbone(x))); z' = target_projector(target_backbone(x'))."""

    Config = BYOLConfig
    recipe = "byol"
    uses_momentum = True

    def __init__(self, cfg, info):
        super().__init__(cfg, info)
        c = cfg.method
        self.projector = mlp(self.backbone.num_features, c.proj_hidden_dim, c.dim, 2, bias=True, last_bias=False)
        self.predictor = build_predictor(c, c.dim, lambda: mlp(c.dim, c.pred_hidden_dim, c.dim, 2, bias=True,
                                                               last_bias=False))
        self.target_backbone = self.momentum_target(self.backbone)
        self.target_projector = self.momentum_target(self.projector)
        self.post_step_hooks += after_step_hooks(self.predictor)

    def trainable(self):
        return {"backbone": self.backbone, "projector": self.projector, "predictor": self.predictor}

    def forward_views(self, views):
        self.update_momentum_encoder(self.momentum)
        h1, h2 = encode_views(self.backbone, views)  # one call when the backbone has no BatchNorm
        z1, z2 = self.projector(h1), self.projector(h2)
        p1, p2 = self.grad_scale(self.predictor(z1)), self.grad_scale(self.predictor(z2))
        with torch.no_grad():
            t1, t2 = (self.target_projector(h) for h in encode_views(self.target_backbone, views))
        loss = byol_regression(p1, t2) + byol_regression(p2, t1)
        return {"loss": loss, "embedding": h1.detach(), "embedding2": h2.detach(), "projection": z1.detach(),
                "prediction": p1.detach(), "target": t2}
