"""TiCo (Zhu et al. 2022): transformation invariance and covariance contrast, with a running covariance C.

The authors released no training code. The step follows sayannag/TiCo-pytorch at 2259b83 (TiCo/main.py, which
lightly's TiCoLoss names as its source), cross-checked with lightly (loss/tico_loss.py, the ImageNet benchmark
benchmarks/imagenet/resnet50/tico.py) and stable-pretraining (methods/tico.py); file:line in docs/contrastive.md.
Per step (main.py:116-129):

    θ_m ← m θ_m + (1 − m) θ                          # the momentum encoder's EMA, before the step's forward
    z1 = normalize(g(f(x_1))),  z2 = normalize(g_m(f_m(x_2)))   # g: Linear 4096 → BN → ReLU → Linear 256
    C ← β C + (1 − β) z1ᵀz1 / N                       # this step's C, B with its gradient (main.py:75-76)
    loss = −mean(z1 · z2) + ρ · mean(z1 C z1ᵀ)        # main.py:77; C detached after the step (main.py:125)

One direction, as the code (x_1 the online view, x_2 the momentum view). C is a buffer of the checkpoint (the
code's ``C_prev``), zeros at the start (main.py:110); across processes B is the global batch's (gathered with
gradient; lightly's ``gather_distributed``). Where the cross-checks differ: lightly detaches B
(``method.covariance_gradient=false``) and adds a constant 1; stable-pretraining updates a centred covariance of
both views and has no momentum encoder (not followed). The momentum ramps from m0 to 1 by a cosine per iteration
(lightly's benchmark, tico.py:50-57; the sayannag code's sine per epoch, main.py:80-81, starts at the same 0.99).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from selfsup.distributed import gather_with_grad
from selfsup.errors import UserError
from selfsup.losses import tico_loss
from selfsup.methods.base import SSLMethod
from selfsup.methods.ema import check_momentum
from selfsup.models.heads import mlp
from selfsup.step import StepOutput


@dataclass
class TiCoConfig:
    """TiCo hyper-parameters; defaults from the sayannag code and lightly (the paper's β and ρ as they cite it)."""

    beta: float = 0.9  # C's EMA coefficient (main.py:87; lightly tico_loss.py:48)
    rho: float = 8.0  # the covariance term's weight: the paper's (lightly tico_loss.py:49; main.py:88 says 8 too)
    momentum: float = 0.99  # m0 (main.py:90; lightly tico.py:53)
    momentum_schedule: str = "cosine"  # cosine (to 1) | constant
    proj_hidden_dim: int = 4096  # main.py:46; lightly heads.py:940
    dim: int = 256  # main.py:86 --final_dim
    covariance_gradient: bool = True  # B keeps its gradient in this step's C (main.py:75-77); false: lightly's

    def validate(self) -> None:
        if not 0 <= self.beta < 1:
            raise UserError(f"method.beta={self.beta} must be in [0, 1)")
        if self.rho < 0:
            raise UserError(f"method.rho={self.rho} must be >= 0")
        check_momentum(self)
        for key in ("proj_hidden_dim", "dim"):
            if getattr(self, key) < 1:
                raise UserError(f"method.{key}={getattr(self, key)} must be >= 1")


class TiCo(SSLMethod):
    """z1 = projector(backbone(x_1)); z2 = momentum_projector(momentum_backbone(x_2)); C a running covariance."""

    Config = TiCoConfig
    collapse_remedy = "a larger method.rho (the covariance term), method.beta 0.9, a lower optim.base_lr"
    recipe = "byol"  # lightly's TiCoTransform is BYOL's (transforms/tico_transform.py:8)
    loss_embedding = ("projector",)  # z1 is normalised by the loss
    uses_momentum = True

    def __init__(self, cfg, info):
        super().__init__(cfg, info)
        c = cfg.method
        if cfg.augment.local_crops_number:
            raise UserError("augment.local_crops_number: TiCo takes two views (online and momentum); set it to 0")
        # Linear (no bias) → BN → ReLU → Linear (bias) (main.py:46-47; lightly heads.py:944-947)
        self.projector = mlp(self.backbone.num_features, c.proj_hidden_dim, c.dim, 2, last_bias=True)
        self.momentum_backbone = self.momentum_target(self.backbone)
        self.momentum_projector = self.momentum_target(self.projector)
        self.register_buffer("covariance", torch.zeros(c.dim, c.dim))

    def trainable(self):
        return {"backbone": self.backbone, "projector": self.projector}

    def forward_views(self, views: list[Tensor]) -> StepOutput:
        c = self.cfg.method
        self.update_momentum_encoder()  # before the forward, with this step's momentum (main.py:118-119)
        h = self.backbone(views[0])
        z1 = self.grad_scale(self.projector(h))
        with torch.no_grad():
            z2 = self.momentum_projector(self.momentum_backbone(views[1]))
        with torch.autocast(z1.device.type, enabled=False):  # C accumulates in float32
            loss, cov = tico_loss(z1.float(), z2.float(), self.covariance, all_z1=gather_with_grad(z1.float()),
                                  beta=c.beta, rho=c.rho, covariance_gradient=c.covariance_gradient)
        self.covariance.copy_(cov)
        # the collapse sign: ‖C‖²_F / tr(C)², 1 when C has one direction, 1/D when it is isotropic
        signs = {"tico_covariance_concentration": (cov * cov).sum() / cov.trace().square().clamp_min(1e-12)}
        return StepOutput(loss, embedding=h.detach(), projection=z1.detach(), target=F.normalize(z2, dim=1),
                          instruments=signs)
