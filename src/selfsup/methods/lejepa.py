"""LeJEPA (Balestriero & LeCun 2025, "LeJEPA: Provable and Scalable Self-Supervised Learning Without the
Heuristics"), as rbalestr-lab/lejepa. Facts with file:line in docs/JEPA.md §2.

Every view goes through the backbone and the projector (MINIMAL.md:78-93: one projector call on all views, its
BatchNorm over all of them); the loss is ``λ · SIGReg + (1 − λ) · predictive`` (:171-174): the predictive term is
the mean squared distance of each view's projection to the mean of the global views' projections
(``losses.lejepa_predictive``; in MINIMAL.md every view is global), SIGReg the sliced Epps-Pulley statistic of
each view's projections against an isotropic Gaussian (``losses.sigreg``), with new random slices every step, the
same on every process (lejepa multivariate/slicing.py:131-143) and the characteristic functions averaged over
processes (univariate/epps_pulley.py:91-93). No teacher, no stop-gradient, no EMA. The lr warms up linearly from
``0.01 ×`` the peak over the first epoch and follows a cosine to ``optim.min_lr`` (MINIMAL.md:157-161).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from selfsup.distributed import all_reduce_mean_with_grad, world
from selfsup.errors import UserError
from selfsup.losses import epps_pulley_grid, lejepa_loss, lejepa_predictive, sigreg, sigreg_slices
from selfsup.methods.base import SSLMethod, encode_views
from selfsup.models.heads import mlp
from selfsup.schedules import StepValues, step_seed
from selfsup.step import StepOutput


@dataclass
class LeJEPAConfig:
    """LeJEPA hyper-parameters; defaults from MINIMAL.md (SIGReg :57-75, the projector :88, the loss :172-174,
    the command :218)."""

    lamb: float = 0.02  # λ, SIGReg's weight; the predictive term's is 1 − λ
    num_slices: int = 256  # random 1-D directions per step (MINIMAL.md:70; the library's README: 1024)
    knots: int = 17  # integration points on [0, t_max]
    t_max: float = 3.0
    proj_dim: int = 16  # the projector's output (the embeddings SIGReg and the predictive term see)
    proj_hidden_dim: int = 2048
    proj_layers: int = 3  # torchvision MLP(512, [2048, 2048, proj_dim], BatchNorm1d)
    warmup_start_factor: float = 0.01  # LinearLR(start_factor=0.01) over the warm-up

    def validate(self) -> None:
        if not 0 <= self.lamb <= 1:
            raise UserError(f"method.lamb={self.lamb} must be in [0, 1] (LeJEPA: 0.02)")
        for key in ("num_slices", "proj_dim", "proj_hidden_dim", "proj_layers"):
            if getattr(self, key) < 1:
                raise UserError(f"method.{key}={getattr(self, key)} must be >= 1")
        if self.knots < 3 or self.knots % 2 == 0:
            raise UserError(f"method.knots={self.knots} must be odd and >= 3 (epps_pulley.py:66)")
        if self.t_max <= 0 or not 0 < self.warmup_start_factor <= 1:
            raise UserError("method.t_max must be > 0 and method.warmup_start_factor in (0, 1]")


class LeJEPA(SSLMethod):
    """z_v = projector(backbone(x_v)); L = λ · mean_v SIGReg(z_v) + (1 − λ) · mean_v ‖mean_g z_g − z_v‖² / K."""

    Config = LeJEPAConfig
    collapse_remedy = ("a larger method.lamb (SIGReg's weight), more method.num_slices, or a lower optim.base_lr")
    recipe = "lejepa"
    loss_embedding = ()

    def __init__(self, cfg, info):
        super().__init__(cfg, info)
        c = cfg.method
        self.projector = mlp(self.backbone.num_features, c.proj_hidden_dim, c.proj_dim, c.proj_layers, bias=True)
        self.n_global = len(self.augment.branches) - self.local_views()
        self._slice_generator: torch.Generator | None = None
        _, phi, weights = epps_pulley_grid(c.t_max, c.knots)
        # the statistic per sample of a point mass at 0 (every projection 0): the collapse sign's unit
        self.point_mass = float(((1 - phi) ** 2 @ weights))

    def local_views(self) -> int:
        return self.cfg.augment.local_crops_number

    def trainable(self):
        return {"backbone": self.backbone, "projector": self.projector}

    # ----------------------------------------------------------------- the slices
    def slice_seed(self) -> int:
        """The slices' seed: the step's, without the rank (every process projects on the same directions, as the
        code's all-reduced step counter, slicing.py:131-138)."""
        t = self._trainer
        return self.cfg.trainer.seed if t is None else step_seed(t, self.cfg.trainer.seed)

    def slices(self, device) -> Tensor:
        if self._slice_generator is None or self._slice_generator.device != torch.device(device):
            self._slice_generator = torch.Generator(device=device)
        g = self._slice_generator.manual_seed(self.slice_seed())
        return sigreg_slices(self.cfg.method.proj_dim, self.cfg.method.num_slices, g, device)

    def step_draws(self, views: list[Tensor]) -> dict[str, Tensor]:
        return {"slices": self.slices(views[0].device)}

    # ----------------------------------------------------------------- the step
    def forward_views(self, views: list[Tensor], slices: Tensor | None = None) -> StepOutput:
        c = self.cfg.method
        slices = self.slices(views[0].device) if slices is None else slices
        h = encode_views(self.backbone, views)
        z = self.projector(torch.cat(h)).view(len(views), views[0].shape[0], -1)  # (V, N, K)
        with torch.autocast(z.device.type, enabled=False):
            zf = z.float()
            predictive = lejepa_predictive(zf, self.n_global)
            statistic = sigreg(zf, slices, t_max=c.t_max, knots=c.knots, mean=all_reduce_mean_with_grad,
                               world_size=world()[1])
            loss = lejepa_loss(predictive, statistic, c.lamb)
        n = views[0].shape[0] * world()[1]
        signs = {"lejepa_sigreg_over_point_mass": statistic.detach() / (n * self.point_mass)}
        return StepOutput(loss, embedding=h[0].detach(), embedding2=h[1].detach() if len(h) > 1 else None,
                          projection=z[0].detach(), scalars={"sigreg": statistic.detach(),
                                                             "predictive": predictive.detach()},
                          instruments=signs)

    # ----------------------------------------------------------------- the schedule
    def schedule(self, step: int, epoch: int) -> StepValues:
        """MINIMAL.md:157-161: ``LinearLR(start_factor, total_iters=warmup)`` then ``CosineAnnealingLR(T_max=total −
        warmup, eta_min=optim.min_lr)`` in a ``SequentialLR``, stepped after each iteration: iteration ``step`` runs
        at ``peak · (f + (1 − f) · step / warmup)`` while ``step < warmup``, then ``min + (peak − min) · ½ (1 +
        cos(π (step − warmup) / (total − warmup)))``; the warm-up is ``optim.warmup_epochs`` (the code's: one
        epoch, ``len(train)``)."""
        c = self.cfg.method
        peak, final = self.peak_lr(), self.final_lr()
        warmup, total = self.warmup_steps(), self.total_steps
        if step < warmup:
            lr = peak * (c.warmup_start_factor + (1 - c.warmup_start_factor) * step / warmup)
        else:
            lr = final + (peak - final) * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(total - warmup, 1)))
        return StepValues(lr, peak)
