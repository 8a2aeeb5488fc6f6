"""SimCLR (Chen et al. 2020): NT-Xent over 2N views, negatives from every process (with gradient).

As the official TF code (tf2/model.py), both views go through the network as one concatenated batch, and the
projection head is bias-free Linear → BN → ReLU … → Linear → BN whose last BN has a scale but no shift
(``center=False``); ``proj_bn=false proj_bias=true`` is the embedding-norm code's head (Linear → ReLU → Linear
with biases, no BN: its output norm is free). ``proj_layers`` 2 is the SimCLR v1 paper's head; the v2 code
uses 3. ``decoupled=True`` drops the positive from the denominator (DCL). ``projector_momentum`` > 0 takes
each anchor's positive from an EMA copy of the projector (Pham et al. 2022, cookbook §3.4); the negatives stay
online. GradScale (``interventions.grad_scale_p``) acts on the projector outputs. Optional multi-crop
(``augment.local_crops_number``, off by default; not in the official code): NT-Xent of every (global, local)
pair beside the global pair's, their mean (an EMA positive applies to the global pair only).

``loss_scale`` multiplies NT-Xent (the paper's mean over the 2N anchors). The official code
(objective.py ``add_contrastive_loss``) adds the two directions' batch means, i.e. twice that mean;
under LARS the factor changes the balance between the loss gradient and weight decay for the
parameters LARS leaves unadapted (BN, biases), so the ImageNet preset sets ``loss_scale: 2.0``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from selfsup.distributed import gather_with_grad, world
from selfsup.errors import UserError
from selfsup.losses import nt_xent
from selfsup.methods.base import SSLMethod, encode_views, multicrop_mean
from selfsup.models.heads import mlp
from selfsup.step import StepOutput


@dataclass
class SimCLRConfig:
    """SimCLR hyper-parameters; τ = 0.1 is the paper's large-batch ImageNet value."""

    temperature: float = 0.1
    proj_hidden_dim: int = 2048
    dim: int = 128
    proj_layers: int = 2
    decoupled: bool = False
    loss_scale: float = 1.0  # 2.0 = the official code's sum of the two directions' means
    projector_momentum: float = 0.0  # > 0: positives from an EMA copy of the projector with this decay (Pham et al.)
    # false: no BatchNorm anywhere in the projector, the embedding-norm code's SimCLR head (SSLEmbeddingNorms
    # configs/simclr_default.yml ``bn: False``, models.py:29-84), whose output norm is free to grow
    proj_bn: bool = True
    proj_bias: bool = False  # Linear biases in the projector (the embedding-norm code's head has them)

    def validate(self) -> None:
        if self.temperature <= 0:
            raise UserError(f"method.temperature={self.temperature} must be > 0")
        if self.loss_scale <= 0:
            raise UserError(f"method.loss_scale={self.loss_scale} must be > 0")
        if not 0 <= self.projector_momentum < 1:
            raise UserError(f"method.projector_momentum={self.projector_momentum} must be in [0, 1) (0 = off)")


class SimCLR(SSLMethod):
    """z = projector(backbone(x)) for both views at once; loss = NT-Xent(z1, z2)."""

    Config = SimCLRConfig
    collapse_remedy = "a lower optim.base_lr; a larger batch (more negatives); method.temperature 0.1-0.5"
    recipe = "simclr"
    loss_embedding = ("projector",)  # the projector outputs are normalised by NT-Xent

    def __init__(self, cfg, info):
        super().__init__(cfg, info)
        c = cfg.method
        self.projector = mlp(self.backbone.num_features, c.proj_hidden_dim, c.dim, c.proj_layers, last_bn=c.proj_bn,
                             last_bn_affine=True, bias=c.proj_bias, hidden_bn=c.proj_bn)
        if c.proj_bn:
            self.projector[-1].bias.requires_grad_(False)  # scale without shift, as BN(center=False)
        if c.projector_momentum > 0:  # constant EMA decay of the positives' projector
            self.momentum = c.projector_momentum
            self.target_projector = self.momentum_target(self.projector)

    def trainable(self):
        return {"backbone": self.backbone, "projector": self.projector}

    def forward_views(self, views):
        x1, x2 = views[:2]
        self.update_momentum_encoder()  # with this step's self.momentum
        h = self.backbone(torch.cat([x1, x2]))
        z = self.grad_scale(self.projector(h))  # GradScale before NT-Xent's normalisation
        (h1, h2), (z1, z2) = h.chunk(2), z.chunk(2)
        rank, _ = world()
        c = self.cfg.method
        positives = None
        if c.projector_momentum > 0:  # the positive of view 1 is view 2 through the EMA projector, and back
            with torch.no_grad():
                positives = self.target_projector(torch.cat([h2, h1]).detach())
        all_z1, all_z2 = gather_with_grad(z1), gather_with_grad(z2)
        loss = nt_xent(z1, z2, c.temperature, all_z1=all_z1, all_z2=all_z2,
                       rank=rank, decoupled=c.decoupled, positives=positives)
        if len(views) > 2:  # multi-crop (augment.local_crops_number): NT-Xent of each (global, local) pair
            local = views[2:]
            zl = self.grad_scale(self.projector(torch.cat(encode_views(self.backbone, local)))).chunk(len(local))
            terms = [nt_xent(zg, z_l, c.temperature, all_z1=all_g, all_z2=gather_with_grad(z_l), rank=rank,
                             decoupled=c.decoupled) for z_l in zl for zg, all_g in ((z1, all_z1), (z2, all_z2))]
            loss = multicrop_mean(loss, terms, two_view_terms=1)
        loss = loss * c.loss_scale
        return StepOutput(loss, embedding=h1.detach(), embedding2=h2.detach(), projection=z1.detach())
