"""The pieces of a momentum (EMA) target that need no method: ``check_momentum`` (the config's momentum),
``frozen_copy`` (the target) and ``momentum_update`` (its update). ``TrainingBase`` keeps the pairs and schedules m."""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from selfsup.errors import UserError


def check_momentum(cfg) -> None:
    """Validate an EMA method's ``momentum`` (in [0, 1]) and ``momentum_schedule`` (cosine | constant)."""
    if not 0 <= cfg.momentum <= 1:
        raise UserError(f"method.momentum={cfg.momentum} must be in [0, 1]")
    if cfg.momentum_schedule not in ("cosine", "constant"):
        raise UserError(f"method.momentum_schedule={cfg.momentum_schedule!r}; use cosine or constant")


def frozen_copy(module: nn.Module) -> nn.Module:
    """A copy of ``module`` that receives no gradient (a momentum / EMA target)."""
    target = copy.deepcopy(module)
    for p in target.parameters():
        p.requires_grad_(False)
    return target


@torch.no_grad()
def momentum_update(online: list[Tensor], target: list[Tensor], m: float | Tensor) -> None:
    """``target ← m · target + (1 − m) · online`` for each pair of parameters (MoCo / BYOL EMA); ``m`` a float, or
    the weight ``1 − m`` itself as a 0-d tensor on the parameters' device (a compiled step's input, never read
    back to the host; the same float32 weight as the float's)."""
    if isinstance(m, Tensor):
        torch._foreach_lerp_(target, online, [m] * len(target))
    else:
        torch._foreach_lerp_(target, online, 1.0 - m)
