"""MoCo v3 (Chen, Xie, He 2021): symmetric InfoNCE between a predictor's queries and momentum keys.

Follows facebookresearch/moco-v3 builder.py: heads are bias-free MLPs ending in BN(affine=False);
the momentum encoder (backbone + projector, no predictor) is updated at the start of the step,
before the keys are computed (alg. 1 updates after the optimiser step: the keys are the same);
the official code forwards each view separately: here the two views go through a backbone without BatchNorm
(the ViT) in one batched call, which gives the same per-sample outputs, and through a ResNet and the BN heads
one call per view, so each view keeps its own batch statistics (``encode_views``); keys are gathered from all
processes without gradient.
Optional multi-crop (``augment.local_crops_number``, off by default; not in the official code): local crops
are queries only, each against both global views' keys (SwAV-style), pair terms averaged to the two-view scale.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from selfsup.distributed import gather_no_grad, world
from selfsup.errors import UserError
from selfsup.losses import info_nce
from selfsup.methods.base import SSLMethod, encode_views, multicrop_mean
from selfsup.methods.ema import check_momentum
from selfsup.models.heads import mlp
from selfsup.predictors import DirectPredConfig, after_step_hooks, build_predictor, check_predictor
from selfsup.step import StepOutput


@dataclass
class MoCoV3Config:
    """MoCo v3 hyper-parameters; defaults are the official ViT recipe (CONFIG.md)."""

    temperature: float = 0.2  # code default 1.0 (the ResNet recipe); ViT commands and paper: 0.2
    momentum: float = 0.99  # m0
    momentum_schedule: str = "cosine"  # cosine (code: m rises to 1) | constant (paper's ViT default)
    proj_layers: int = 3  # ViT 3, ResNet 2
    proj_hidden_dim: int = 4096
    dim: int = 256
    pred_hidden_dim: int = 4096
    pred_last_bn: bool = True  # ViT predictor ends in BN(affine=False); ResNet's does not
    predictor: str = "mlp"  # mlp | linear | symmetric | directpred | directcopy | none (selfsup.predictors)
    directpred: DirectPredConfig = field(default_factory=DirectPredConfig)

    def validate(self) -> None:
        if self.temperature <= 0:
            raise UserError(f"method.temperature={self.temperature} must be > 0")
        check_momentum(self)
        check_predictor(self)


class MoCoV3(SSLMethod):
    """q = predictor(projector(backbone(x))); k = momentum_projector(momentum_backbone(x))."""

    Config = MoCoV3Config
    collapse_remedy = "a lower optim.base_lr; a larger batch (more negatives); method.temperature 0.2"
    recipe = "moco_v3"
    loss_embedding = ("projector", "predictor")  # the predictions are normalised by the loss
    uses_momentum = True

    def __init__(self, cfg, info):
        super().__init__(cfg, info)
        c = cfg.method
        self.projector = mlp(self.backbone.num_features, c.proj_hidden_dim, c.dim, c.proj_layers, last_bn=True)
        self.predictor = build_predictor(c, c.dim,
                                         lambda: mlp(c.dim, c.pred_hidden_dim, c.dim, 2, last_bn=c.pred_last_bn))
        self.momentum_backbone = self.momentum_target(self.backbone)
        self.momentum_projector = self.momentum_target(self.projector)
        self.post_step_hooks += after_step_hooks(self.predictor)

    def trainable(self):
        return {"backbone": self.backbone, "projector": self.projector, "predictor": self.predictor}

    def forward_views(self, views):
        h, z, q = self.predict_views(views)  # the queries, after the in-step EMA with this step's self.momentum
        with torch.no_grad():  # keys from the two global views only
            k1, k2 = (self.momentum_projector(x) for x in encode_views(self.momentum_backbone, views[:2]))
        rank, _ = world()
        t = self.cfg.method.temperature
        keys1, keys2 = gather_no_grad(k1), gather_no_grad(k2)
        loss = info_nce(q[0], keys2, t, rank=rank) + info_nce(q[1], keys1, t, rank=rank)
        if len(views) > 2:  # multi-crop (augment.local_crops_number): each local query against both keys
            loss = multicrop_mean(loss, [info_nce(ql, k, t, rank=rank) for ql in q[2:] for k in (keys1, keys2)])
        return StepOutput(loss, embedding=h[0].detach(), embedding2=h[1].detach(), projection=z[0].detach(),
                          prediction=q[0].detach(), target=k2)
