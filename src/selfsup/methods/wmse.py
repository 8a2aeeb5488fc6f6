"""W-MSE (Ermolov et al. 2021): the MSE between whitened embeddings of every pair of views, as htdt/self-supervised.

Per step (methods/w_mse.py:19-36; file:line in docs/reference SWAV-WMSE-NNCLR.md, section 2):

    h = head(cat_v backbone(x_v))          # the backbone once per view, the head (with BN) on all views at once
    for each of w_iter iterations:
        perm = randperm(B) cut into chunks of w_size           # from the step's seeded generator
        z_v[chunk] = W_chunk,v (h_v[chunk] − mean)              # each view's chunk whitened on its own
        loss += Σ_{i<j} 2 − 2 · mean cos(z_i, z_j)
    loss /= w_iter · d (d − 1) / 2

Whitening (``losses.cholesky_whiten``): the unbiased covariance of the chunk, its Cholesky factor L, W = L⁻¹
(not ZCA), ``w_eps`` shrinkage (0 in the code), float32, the gradient through the mean, the covariance, the
factor and the solve. A chunk of w_size samples has a covariance of rank ≤ w_size − 1, so w_size must exceed
the embedding width (the recipes use 2×: 128 for 64, 256 for 128); w_size must divide the per-process batch.
The official code has no DDP gather (issue #7): each process whitens its own batch, as here. lr: the code's
linear warm-up over ``warmup_iters`` iterations, then ``lr_schedule`` step (×0.2 at E − 50 and E − 25, the
code's default), cos (CosineAnnealingWarmRestarts with T_0 = E) or selfsup's warm-up + cosine (``optim.*``).
The schedules are the lr train.py's loop actually sets (pinned against torch's own schedulers in
tests/test_wmse.py): a milestone E − d < 0 (a run shorter than d epochs) is never reached, a drop reached inside
the warm-up is overwritten by it and lost, and the cosine of iteration k is the one set after iteration k − 1.
The ResNet's replaced 3×3 conv1 keeps nn.Conv2d's own init, as model.py (``method.conv1_init``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from selfsup.errors import UserError
from selfsup.losses import wmse_loss
from selfsup.methods.base import SSLMethod, TrainingCollapsed, encode_views
from selfsup.models.heads import mlp
from selfsup.schedules import StepValues
from selfsup.step import StepOutput


@dataclass
class WMSEConfig:
    """W-MSE hyper-parameters; defaults are the code's (cfg.py: emb 64, w_size 128, w_iter 1, head 1024)."""

    emb: int = 64
    head_size: int = 1024
    head_layers: int = 2
    add_bn: bool = True  # BN in the head's hidden layer (--no_add_bn removes it)
    w_size: int | None = 128  # None: the whole (per-process) batch
    w_iter: int = 1
    w_eps: float = 0.0
    norm: bool = True  # L2-normalise after whitening (norm_mse); false: plain MSE (--no_norm)
    lr_schedule: str = "selfsup"  # selfsup (optim.* warm-up + cosine) | step (the code's default) | cos
    warmup_iters: int = 500  # step / cos: linear warm-up lr·(k + 1) / warmup_iters (train.py:43, :50-54)
    lr_drops: list[int] = field(default_factory=lambda: [50, 25])  # step: x lr_drop_factor at E - 50, E - 25
    lr_drop_factor: float = 0.2
    # The ResNet's replaced 3x3 conv1 (model.small_stem): pytorch keeps nn.Conv2d's own init, as the code's
    # model.py get_model does (the conv is made after torchvision's init); kaiming_normal is torchvision's
    # init of its convolutions (selfsup's ResNet stem, and this method's before issue 37).
    conv1_init: str = "pytorch"

    def validate(self) -> None:
        for key in ("emb", "head_size", "head_layers", "w_iter"):
            if getattr(self, key) < 1:
                raise UserError(f"method.{key}={getattr(self, key)} must be >= 1")
        if self.w_size is not None and self.w_size < 2:
            raise UserError(f"method.w_size={self.w_size} must be >= 2 (or null: the whole batch)")
        if not 0 <= self.w_eps < 1:
            raise UserError(f"method.w_eps={self.w_eps} must be in [0, 1) (0: the code's plain covariance)")
        if self.lr_schedule not in ("selfsup", "step", "cos"):
            raise UserError(f"method.lr_schedule={self.lr_schedule!r} is not known; use selfsup, step or cos")
        if self.conv1_init not in ("pytorch", "kaiming_normal"):
            raise UserError(f"method.conv1_init={self.conv1_init!r} is not known; use pytorch or kaiming_normal")
        if self.warmup_iters < 0 or not 0 < self.lr_drop_factor <= 1:
            raise UserError("method.warmup_iters must be >= 0 and method.lr_drop_factor in (0, 1]")


class WMSE(SSLMethod):
    """h = head(backbone(x)); loss = MSE of the normalised, per-chunk Cholesky-whitened h of every view pair."""

    Config = WMSEConfig
    collapse_remedy = ("a lower optim.base_lr (a sixth of it kept the backbone's rank on fmnist); method.w_size "
                       "at least 2 x method.emb")
    recipe = "simsiam"  # jitter (0.4, 0.4, 0.4, 0.1) p 0.8, crop (0.2, 1), flip; presets: grey 0.1, no blur
    loss_embedding = ("projector",)

    def __init__(self, cfg, info):
        super().__init__(cfg, info)
        c = cfg.method
        w, batch = c.w_size or cfg.data.batch_size, cfg.data.batch_size
        if w > batch or batch % w:
            raise UserError(f"method.w_size={w} must divide data.batch_size={batch} (the code's randperm(bs)"
                            f".view(-1, w_size)); e.g. method.w_size={math.gcd(w, batch)}")
        if w <= c.emb and c.w_eps == 0:
            raise UserError(f"method.w_size={w} must exceed method.emb={c.emb}: the covariance of {w} samples has "
                            f"rank <= {w - 1} and its Cholesky factor fails; use w_size >= {2 * c.emb} (the "
                            "recipes' 2x) or a larger data.batch_size")
        if c.conv1_init == "pytorch" and cfg.model.small_stem and isinstance(getattr(self.backbone, "conv1", None),
                                                                              torch.nn.Conv2d):
            self.backbone.conv1.reset_parameters()  # model.py get_model: the new conv keeps nn.Conv2d's init
        self.projector = mlp(self.backbone.num_features, c.head_size, c.emb, c.head_layers, bias=True,
                             hidden_bn=c.add_bn)  # model.py:5-16: Linear (bias) -> BN -> ReLU, then Linear

    def trainable(self):
        return {"backbone": self.backbone, "projector": self.projector}

    def step_draws(self, views: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        """The w_iter permutations of the batch, from the step's generator after the augmentation's draws (exact on
        resume), drawn before the (compiled) step."""
        bs, device = views[0].shape[0], views[0].device
        g = self.rng(device)
        return {"perms": torch.stack([torch.randperm(bs, generator=g, device=device)
                                      for _ in range(self.cfg.method.w_iter)])}

    def forward_views(self, views, perms: torch.Tensor | None = None):
        c = self.cfg.method
        perms = self.step_draws(views)["perms"] if perms is None else perms
        feats = encode_views(self.backbone, views)  # per view where the backbone has BatchNorm (w_mse.py:20)
        h = self.grad_scale(self.projector(torch.cat(feats))).chunk(len(views))  # the head once on all views
        bs = h[0].shape[0]
        w = c.w_size or bs
        if bs % w or w <= c.emb and c.w_eps == 0:
            raise UserError(f"method.w_size={w} must divide the per-process batch {bs} and exceed method.emb="
                            f"{c.emb}; set data.batch_size to a multiple of w_size x the number of processes")
        perms = list(perms.unbind(0))
        with torch.autocast(h[0].device.type, enabled=False):  # Cholesky in float32
            try:
                loss = wmse_loss([x.float() for x in h], perms, w, c.w_eps, c.norm)
            except torch.linalg.LinAlgError:  # the code stops with this traceback; here, one line naming it
                trainer = self._trainer  # None in a plain loop (selfsup.method)
                at = f" at step {trainer.global_step}" if trainer is not None else ""
                raise TrainingCollapsed(
                    f"W-MSE's whitening failed{at}: the covariance of a sub-batch of {w} embeddings is no longer "
                    f"positive definite, so the head's {c.emb} outputs have collapsed onto fewer dimensions (the "
                    f"sign instruments/wmse_cov_condition rises before it); try {self.collapse_remedy}, or "
                    "method.w_eps=1e-3 (shrinkage toward the identity: the whitening then runs, but it does not "
                    "stop a collapse; w_eps 0.1 took wmse-vit-fmnist to rank 1)") from None
        return StepOutput(loss, embedding=feats[0].detach(), embedding2=feats[1].detach(), projection=h[0].detach(),
                          instruments=self.collapse_signs(h[0].detach().float(), perms[0], w))

    @torch.no_grad()
    def collapse_signs(self, h: torch.Tensor, perm: torch.Tensor, w: int) -> dict[str, torch.Tensor]:
        """The condition number λmax / λmin of the covariance that the first chunk's Cholesky factor inverts (view
        1, before whitening): it grows as the embedding collapses onto fewer dimensions, and whitening then
        amplifies noise until the factorisation fails. (The whitened embeddings' own covariance is the identity
        by construction, over a chunk and over the batch of whitened chunks: no sign there.)"""
        x = h[perm.view(-1, w)[0]]
        xc = x - x.mean(0)
        ev = torch.linalg.eigvalsh(xc.t() @ xc / (x.shape[0] - 1))
        return {"wmse_cov_condition": ev[-1] / ev[0].clamp_min(1e-12)}

    # ----------------------------------------------------------------- the code's lr schedules
    def drops_applied(self, epoch: int) -> int:
        """How many of the step schedule's drops act in ``epoch``, as train.py runs MultiStepLR(milestones = [E − d
        for d in drop]), stepped after each epoch: a milestone m acts from epoch m on; a negative one (a run
        shorter than d epochs) is never reached; one reached inside the warm-up (m · steps per epoch <
        ``warmup_iters``) is lost, as the warm-up sets every group's lr to ``lr · (k + 1) / 500`` after it and
        MultiStepLR only multiplies the lr it finds at its milestone."""
        c, spe = self.cfg.method, self.steps_per_epoch
        return sum(0 <= m <= epoch and m * spe >= c.warmup_iters for m in (self.max_epochs - d for d in c.lr_drops))

    def schedule(self, step: int, epoch: int) -> StepValues:
        """``method.lr_schedule`` selfsup: the base's; step / cos: the code's (train.py:43-66), E = the run's
        ``max_epochs``."""
        c = self.cfg.method
        if c.lr_schedule == "selfsup":
            return super().schedule(step, epoch)
        spe, peak, epochs = self.steps_per_epoch, self.peak_lr(), self.max_epochs
        if step < c.warmup_iters:
            lr = peak * (step + 1) / c.warmup_iters
        elif c.lr_schedule == "step":
            lr = peak * c.lr_drop_factor ** self.drops_applied(step // spe)
        else:  # CosineAnnealingWarmRestarts(T_0 = E, eta_min = min_lr), stepped after each iteration with that
            # iteration's epoch fraction: iteration k trains at the cosine of k − 1 (of 0 for the first)
            final = self.final_lr()
            lr = final + (peak - final) * 0.5 * (1 + math.cos(math.pi * (max(step - 1, 0) / spe) / epochs))
        return StepValues(lr, peak)
