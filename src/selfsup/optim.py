"""Optimisers and parameter groups: LARS (MoCo v3 / BYOL), LARC (SwAV), AdamW, Adam (W-MSE), SGD; predictor lr
and wd."""

from __future__ import annotations

import torch
from torch import nn

from selfsup.choices import OptimConfig


class LARS(torch.optim.Optimizer):
    """LARS as in moco-v3 ``optimizer.py``: parameters with ``ndim <= 1`` get neither weight decay
    nor adaptation; for the rest ``dp = g + wd·p``, trust ``q = η‖p‖/‖dp‖`` (1 where a norm is 0),
    ``μ ← m·μ + q·dp``, ``p ← p − lr·μ``."""

    def __init__(self, params, lr: float = 0.0, weight_decay: float = 0.0, momentum: float = 0.9,
                 trust_coefficient: float = 0.001):
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, trust_coefficient=trust_coefficient)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                dp = p.grad
                if p.ndim > 1:
                    dp = dp.add(p, alpha=group["weight_decay"])
                    param_norm, update_norm = torch.norm(p), torch.norm(dp)
                    one = torch.ones_like(param_norm)
                    q = torch.where(param_norm > 0.0,
                                    torch.where(update_norm > 0,
                                                group["trust_coefficient"] * param_norm / update_norm, one),
                                    one)
                    dp = dp.mul(q)
                state = self.state[p]
                if "mu" not in state:
                    state["mu"] = torch.zeros_like(p)
                mu = state["mu"]
                mu.mul_(group["momentum"]).add_(dp)
                p.add_(mu, alpha=-group["lr"])
        return loss


class LARC(torch.optim.Optimizer):
    """apex ``LARC(SGD(momentum, weight_decay), trust_coefficient, clip=False)`` as SwAV uses it (main_swav.py:171-182;
    apex/parallel/LARC.py ``step``): every parameter (biases and norms too) with ‖p‖ ≠ 0 and ‖g‖ ≠ 0 gets
    ``g ← (g + wd·p) · η‖p‖ / (‖g‖ + wd‖p‖ + 1e-8)``; otherwise the raw gradient (no decay, no scaling); then SGD
    without weight decay: ``μ ← m·μ + g``, ``p ← p − lr·μ``. Computed on the device (no host read)."""

    def __init__(self, params, lr: float = 0.0, weight_decay: float = 0.0, momentum: float = 0.9,
                 trust_coefficient: float = 0.001, eps: float = 1e-8):
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, trust_coefficient=trust_coefficient,
                        eps=eps)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            wd, trust = group["weight_decay"], group["trust_coefficient"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                param_norm, grad_norm = torch.norm(p), torch.norm(p.grad)
                adaptive = trust * param_norm / (grad_norm + param_norm * wd + group["eps"])
                scaled = p.grad.add(p, alpha=wd).mul_(adaptive)
                dp = torch.where((param_norm != 0) & (grad_norm != 0), scaled, p.grad)
                state = self.state[p]
                if "mu" not in state:
                    state["mu"] = torch.zeros_like(p)
                mu = state["mu"]
                mu.mul_(group["momentum"]).add_(dp)
                p.add_(mu, alpha=-group["lr"])
        return loss


def param_groups(modules: dict[str, nn.Module], cfg: OptimConfig) -> list[dict]:
    """One group per (predictor or not) × (decayed or not); each carries ``lr_scale`` and ``fixed_lr``.

    ``modules`` maps a name to a sub-module; the one named ``predictor`` gets the predictor lr
    multiplier and weight decay. Frozen parameters (e.g. MoCo v3's random patch projection) are left out.
    ``lr_1d_mult`` ≠ 1 puts the biases and norm weights (ndim ≤ 1) in a group of their own at that multiple
    of the lr (Barlow Twins main.py:90-97, :167-168; LARS exempts them from decay and adaptation anyway).
    """
    groups = []
    for name, module in modules.items():
        is_pred = name == "predictor"
        wd = cfg.predictor_weight_decay if (is_pred and cfg.predictor_weight_decay is not None) else cfg.weight_decay
        params = [p for p in module.parameters() if p.requires_grad]
        split = not (cfg.decay_1d or cfg.name == "lars") or cfg.lr_1d_mult != 1.0
        one_d = [p for p in params if p.ndim <= 1] if split else []
        decay = [p for p in params if all(p is not q for q in one_d)]
        common = dict(lr_scale=cfg.predictor_lr_mult if is_pred else 1.0, fixed_lr=is_pred and cfg.fix_predictor_lr,
                      name=name)
        if decay:
            groups.append(dict(params=decay, weight_decay=wd, **common))
        if one_d:
            groups.append(dict(params=one_d, weight_decay=wd if (cfg.decay_1d or cfg.name == "lars") else 0.0,
                               **{**common, "lr_scale": common["lr_scale"] * cfg.lr_1d_mult}))
    return groups


def build_optimizer(groups: list[dict], cfg: OptimConfig) -> torch.optim.Optimizer:
    """The optimiser named by ``cfg.name`` over ``groups`` (lr is set each step by the schedule)."""
    if cfg.name == "lars":
        return LARS(groups, lr=0.0, momentum=cfg.momentum, trust_coefficient=cfg.trust_coefficient)
    if cfg.name == "larc":
        return LARC(groups, lr=0.0, momentum=cfg.momentum, trust_coefficient=cfg.trust_coefficient)
    if cfg.name == "adam":  # weight decay as an L2 term in the gradient (W-MSE train.py:39)
        return torch.optim.Adam(groups, lr=0.0, betas=tuple(cfg.betas))
    if cfg.name == "sgd":
        return torch.optim.SGD(groups, lr=0.0, momentum=cfg.momentum)
    return torch.optim.AdamW(groups, lr=0.0, betas=tuple(cfg.betas), fused=cfg.fused or None)
