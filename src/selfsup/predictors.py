"""The predictor of BYOL, SimSiam and MoCo v3, chosen by ``method.predictor``.

* ``mlp`` (default): the method's own MLP (see each method file).
* ``linear``: a bias-free d × d Linear trained by gradient (DirectPred paper's baseline).
* ``symmetric``: trained by gradient and symmetrised, W_p ← (W_p + W_pᵀ)/2, after every optimiser step (the
  official code's ``predictor_reg=symmetric``; with SGD the same as training A in W_p = (A + Aᵀ)/2).
* ``directpred`` (Tian, Chen & Ganguli 2021): W_p set from the eigendecomposition of the running correlation F.
* ``directcopy`` (Wang, Chen, Du & Tian 2021): W_p = F̂ + ε·I, no eigendecomposition.
* ``none``: no predictor (W_p = I), the ablation after which BYOL and SimSiam collapse (DirectPred §1, SimSiam
  Tab. 1, BYOL Tab. 5) and MoCo v3 loses about a point (MoCo v3 §6.2).

Every linear kind tracks F of its detached inputs (both views), so instruments can compare W_p with F.
Official code: facebookresearch/luckmatters ``ssl/real-dataset/byol_trainer.py`` (``Accumulator``,
``compute_w_corr`` with ``balance_type=boost_scale``, ``predictor_reg=corr``):

  F_batch = mean over the 2B inputs f of f fᵀ;   F ← ρ·F + (1 − ρ)·F_batch   (the first step sets F = F_batch)
  zero_mean:  F − μ μᵀ, μ the running mean of f (same ρ)
  every ``freq`` steps (steps 0, freq, 2·freq, ...), after the optimiser step:
    directpred:  F = Q diag(s) Qᵀ,  λ = clamp(s, 0) / max(s)
                 p = max(√λ + ε, 1e-4)          (ε outside the root, the default)
                 p = √max(λ + ε, 1e-4)          (``eps_inside``, as the code clamps before the root)
                 W_p = Q diag(p) Qᵀ
    directcopy:  W_p = F̂ + ε·I, the DirectCopy paper's formula, which selfsup implements. The public trainer
                 has a ``predictor_reg=directcopy`` branch that would compute it (``w = M + dyn_eps·I`` on the raw
                 running F; byol_trainer.py:421-432 at commit 625b5f7) but refuses that value before reaching it,
                 at every commit that has it: the assert at byol_trainer.py:363 (one linear layer; :503 for two)
                 lists no ``directcopy``. ``copy_norm: none`` (default) is F̂ = F as that branch; ``fro``: F/‖F‖_F
                 and ``spectral``: F/λ_max(F) are scale-free options for the normalised F̂ the paper writes, whose
                 norm no public code states

F is averaged over all processes before each update, and the eigendecomposition runs in float64 on the
training device, so every replica sets the same W_p. With ``freq = 1`` W_p receives no gradient; with
``freq > 1`` it takes ordinary gradient steps in between.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from selfsup.distributed import world
from selfsup.errors import UserError

PREDICTORS = ("mlp", "linear", "symmetric", "directpred", "directcopy", "none")
LINEAR = ("linear", "symmetric", "directpred", "directcopy")  # the tracked d × d kinds
DIRECT = ("directpred", "directcopy")
COPY_NORMS = ("none", "fro", "spectral")
MIN_EIGEN = 1e-4  # the official clamp of p


@dataclass
class DirectPredConfig:
    """``method.directpred.*``: the running correlation and the direct setting of W_p (official defaults)."""

    freq: int = 1  # set W_p every `freq` optimiser steps; 1: W_p gets no gradient
    rho: float = 0.3  # F ← ρ·F + (1 − ρ)·F_batch (dyn_lambda)
    eps: float = 0.01  # ε (dyn_eps)
    eps_inside: bool = False  # p = √(λ + ε) instead of √λ + ε (dyn_eps_inside)
    zero_mean: bool = False  # use F − μμᵀ (dyn_zero_mean)
    copy_norm: str = "none"  # DirectCopy's F̂: none (F, as the public code's unreachable branch) | fro | spectral

    def validate(self) -> None:
        if self.freq < 1:
            raise UserError(f"method.directpred.freq={self.freq} must be >= 1 (1 = set W_p every step)")
        if not 0 <= self.rho < 1:
            raise UserError(f"method.directpred.rho={self.rho} must be in [0, 1)")
        if self.eps < 0:
            raise UserError(f"method.directpred.eps={self.eps} must be >= 0")
        if self.copy_norm not in COPY_NORMS:
            raise UserError(f"method.directpred.copy_norm={self.copy_norm!r}; use one of {', '.join(COPY_NORMS)}")


def check_predictor(method_cfg) -> None:
    """Validate ``method.predictor``."""
    if method_cfg.predictor not in PREDICTORS:
        raise UserError(f"method.predictor={method_cfg.predictor!r} is not known; use one of {', '.join(PREDICTORS)}")


def build_predictor(method_cfg, dim: int, mlp: Callable[[], nn.Module]) -> nn.Module:
    """The predictor ``method_cfg.predictor`` names: ``mlp()`` (the method's own), a d × d linear kind, or the
    identity (``none``)."""
    if method_cfg.predictor == "mlp":
        return mlp()
    if method_cfg.predictor == "none":
        return nn.Identity()
    return TrackedLinearPredictor(dim, method_cfg.predictor, method_cfg.directpred)


def after_step_hooks(predictor: nn.Module) -> list[Callable[[], None]]:
    """What ``predictor`` does after each optimiser step, for a method's ``post_step_hooks``: a tracked
    linear predictor's update (running F, W_p), nothing for an MLP."""
    return [predictor.after_optimizer_step] if isinstance(predictor, TrackedLinearPredictor) else []


@torch.no_grad()
def directpred_weight(corr: Tensor, eps: float, eps_inside: bool = False) -> Tensor:
    """DirectPred's W_p = Q diag(p) Qᵀ from F = Q diag(s) Qᵀ (float64 eigh; a zero or rank-deficient F is fine)."""
    s, q = torch.linalg.eigh(corr)
    top = s.max().clamp_min(torch.finfo(s.dtype).tiny)  # F = 0: λ = 0 and W_p = max(ε, 1e-4)·I, no NaN
    lam = s.clamp_min(0) / top
    p = (lam + eps).clamp_min(MIN_EIGEN).sqrt() if eps_inside else (lam.sqrt() + eps).clamp_min(MIN_EIGEN)
    return (q * p) @ q.T


@torch.no_grad()
def directcopy_weight(corr: Tensor, eps: float, norm: str = "none") -> Tensor:
    """DirectCopy's W_p = F̂ + ε·I, F̂ = F (none), F/‖F‖_F (fro) or F/λ_max(F) (spectral)."""
    if norm == "fro":
        corr = corr / torch.linalg.matrix_norm(corr).clamp_min(torch.finfo(corr.dtype).tiny)
    elif norm == "spectral":
        corr = corr / torch.linalg.eigvalsh(corr)[-1].clamp_min(torch.finfo(corr.dtype).tiny)
    return corr + eps * torch.eye(corr.shape[0], dtype=corr.dtype, device=corr.device)


class TrackedLinearPredictor(nn.Module):
    """A bias-free d × d predictor (linear, symmetric, directpred or directcopy) that tracks the running
    correlation F of its inputs in the buffer ``correlation`` (kept in checkpoints)."""

    def __init__(self, dim: int, kind: str, cfg: DirectPredConfig):
        super().__init__()
        if kind not in LINEAR:
            raise ValueError(f"unknown linear predictor kind {kind!r}")
        self.dim, self.kind, self.cfg = dim, kind, cfg
        trained = kind not in DIRECT or cfg.freq > 1
        self.weight = nn.Parameter(torch.empty(dim, dim), requires_grad=trained)
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))  # nn.Linear's init (the official predictor is one)
        if kind == "symmetric":
            with torch.no_grad():
                self.weight.copy_(0.5 * (self.weight + self.weight.T))
        self.register_buffer("correlation", torch.zeros(dim, dim))
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))  # optimiser steps folded into F
        # this step's Σ [f; 1][f; 1]ᵀ = [[Σ f fᵀ, Σ f], [Σ fᵀ, n]] (transient: folded after every step)
        self._pending: Tensor | None = None
        self._step: int | None = None  # host copy of ``steps`` (no device sync per step)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, kind={self.kind}"

    def forward(self, z: Tensor) -> Tensor:
        if z.shape[-1] != self.dim:
            raise UserError(f"the predictor takes {self.dim}-dim inputs but got {z.shape[-1]}; "
                            "set method.dim to the projector's output size")
        if self.training and torch.is_grad_enabled():
            self.observe(z)
        return F.linear(z, self.weight)

    @torch.no_grad()
    def observe(self, f: Tensor) -> None:
        """Add a batch of (detached) inputs to this step's statistics."""
        with torch.autocast(f.device.type, enabled=False):
            f1 = F.pad(f.detach().float().flatten(0, -2), (0, 1), value=1.0)
            stats = f1.T @ f1
        self._pending = stats if self._pending is None else self._pending.add_(stats)

    @torch.no_grad()
    def after_optimizer_step(self) -> None:
        """Symmetrise W_p (``symmetric``); fold this step's statistics into F (averaged over processes);
        every ``freq`` steps set W_p (``directpred``, ``directcopy``)."""
        if self.kind == "symmetric":
            self.weight.copy_(0.5 * (self.weight + self.weight.T))
        if self._pending is None:
            return
        stats, self._pending = self._pending, None
        if world()[1] > 1:
            dist.all_reduce(stats)  # sums over processes: the global batch's statistics
        d = self.dim
        batch_corr, batch_mean = stats[:d, :d] / stats[d, d], stats[d, :d] / stats[d, d]
        if self._step is None:
            self._step = int(self.steps)
        if self._step == 0:  # the official Accumulator: the first batch sets F
            self.correlation.copy_(batch_corr)
            self.mean.copy_(batch_mean)
        else:
            rho = self.cfg.rho
            self.correlation.mul_(rho).add_(batch_corr, alpha=1 - rho)
            self.mean.mul_(rho).add_(batch_mean, alpha=1 - rho)
        if self.kind in DIRECT and self._step % self.cfg.freq == 0:
            self.weight.copy_(self.direct_weight().to(self.weight.dtype))
        self.steps += 1
        self._step += 1

    def _load_from_state_dict(self, *args, **kwargs):
        super()._load_from_state_dict(*args, **kwargs)
        self._step, self._pending = None, None  # re-read ``steps`` after a resume

    @torch.no_grad()
    def direct_weight(self) -> Tensor:
        """W_p from the current F (float64, on F's device)."""
        corr = self.correlation.double()
        if self.cfg.zero_mean:
            mean = self.mean.double()
            corr = corr - torch.outer(mean, mean)
        corr = 0.5 * (corr + corr.T)
        if self.kind == "directpred":
            return directpred_weight(corr, self.cfg.eps, self.cfg.eps_inside)
        return directcopy_weight(corr, self.cfg.eps, self.cfg.copy_norm)
