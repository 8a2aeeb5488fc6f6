"""BYOL (Grill et al. 2020): an online predictor regresses an EMA target's projection.

Loss ``2 − 2·cos(p, sg(z'))`` per direction, summed over the two directions and averaged over the
batch (official byol_experiment.py); target decay τ = 1 − (1 − τ_base)·½(1 + cos(πt/T)).
Heads: Linear (with bias) → BN → ReLU → Linear (no bias), 4096 → 256, no final BN (the official
haiku MLP: ``with_bias=False`` on its output Linear). Optional multi-crop (``augment.local_crops_number``,
off by default; not in the official code): local crops go through the online network only and each predicts
both global targets (SwAV-style); the pair terms are averaged and scaled to the two-view loss's sum of two.
Ablations (DirectPred §1, BYOL Tab. 5): ``method.predictor=none`` removes the predictor;
``method.stop_gradient=false`` (with ``momentum=0``, constant: the target is then the online network) lets the
gradient flow through the target branch as well. Both collapse.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from selfsup.errors import UserError
from selfsup.losses import byol_regression
from selfsup.methods.base import SSLMethod, encode_views, multicrop_mean
from selfsup.methods.ema import check_momentum
from selfsup.models.heads import mlp
from selfsup.predictors import DirectPredConfig, after_step_hooks, build_predictor, check_predictor
from selfsup.step import StepOutput


@dataclass
class BYOLConfig:
    """BYOL hyper-parameters; defaults from the paper / official code (1000-epoch τ_base 0.996)."""

    momentum: float = 0.996  # τ_base
    momentum_schedule: str = "cosine"  # cosine (official) | constant
    proj_hidden_dim: int = 4096
    dim: int = 256
    pred_hidden_dim: int = 4096
    predictor: str = "mlp"  # mlp | linear | symmetric | directpred | directcopy | none (selfsup.predictors)
    directpred: DirectPredConfig = field(default_factory=DirectPredConfig)
    stop_gradient: bool = True  # false: the targets keep their gradient (needs momentum=0, constant)

    def validate(self) -> None:
        check_momentum(self)
        check_predictor(self)
        if not self.stop_gradient and (self.momentum != 0 or self.momentum_schedule != "constant"):
            raise UserError("method.stop_gradient=false needs method.momentum=0 and method.momentum_schedule="
                            "constant (an EMA target has no gradient to let through)")


class BYOL(SSLMethod):
    """p = predictor(projector(backbone(x))); z' = target_projector(target_backbone(x'))."""

    Config = BYOLConfig
    collapse_remedy = ("keep the predictor and a momentum target (method.momentum < 1); raise the predictor's lr "
                       "(optim.predictor_lr_mult); lower optim.base_lr")
    recipe = "byol"
    loss_embedding = ("projector", "predictor")  # the predictions are normalised by the loss
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
        h, z, p = self.predict_views(views)  # after the in-step EMA with this step's self.momentum
        sg = self.cfg.method.stop_gradient
        if sg:
            with torch.no_grad():  # targets from the two global views only
                t1, t2 = (self.target_projector(x) for x in encode_views(self.target_backbone, views[:2]))
        else:  # m = 0 without the stop-gradient: the target is the online network, gradient included
            t1, t2 = z[0], z[1]
        loss = byol_regression(p[0], t2, sg) + byol_regression(p[1], t1, sg)
        if len(views) > 2:  # multi-crop (augment.local_crops_number): each local crop predicts both targets
            loss = multicrop_mean(loss, [byol_regression(q, t, sg) for q in p[2:] for t in (t1, t2)])
        return StepOutput(loss, embedding=h[0].detach(), embedding2=h[1].detach(), projection=z[0].detach(),
                          prediction=p[0].detach(), target=t2.detach())
