"""Per-iteration schedules of the official MoCo v3 / BYOL code, as pure functions of the step."""

from __future__ import annotations

import math


def warmup_cosine(step: float, total_steps: int, warmup_steps: int, peak: float, final: float = 0.0) -> float:
    """Linear warmup to ``peak`` then cosine decay to ``final`` (moco-v3 main_moco.py ``adjust_learning_rate``).

    ``peak · step / warmup`` while ``step < warmup``, then
    ``final + (peak − final) · ½ (1 + cos(π (step − warmup) / (total − warmup)))``.
    """
    if step < warmup_steps:
        return peak * step / warmup_steps
    span = max(total_steps - warmup_steps, 1)
    progress = min((step - warmup_steps) / span, 1.0)
    return final + (peak - final) * 0.5 * (1.0 + math.cos(math.pi * progress))


def momentum_cosine(step: float, total_steps: int, m0: float) -> float:
    """EMA coefficient rising from ``m0`` to 1: ``1 − (1 − m0) · ½ (1 + cos(π step / total))``.

    MoCo v3 main_moco.py ``adjust_moco_momentum``; BYOL's target decay τ has the same form.
    """
    progress = min(step / max(total_steps, 1), 1.0)
    return 1.0 - (1.0 - m0) * 0.5 * (1.0 + math.cos(math.pi * progress))


def scaled_lr(base_lr: float, batch_size: int, rule: str = "linear") -> float:
    """``lr = base_lr · batch / 256`` (linear rule, Goyal et al.) or ``base_lr · sqrt(batch / 256)`` (the square-root
    rule of SimCLR's appendix B.1, which the SSL cookbook §3.5 recommends for small batches); batch = global batch."""
    if rule == "linear":
        return base_lr * batch_size / 256
    if rule == "sqrt":
        return base_lr * math.sqrt(batch_size / 256)
    raise ValueError(f"unknown lr scaling rule {rule!r}; use linear or sqrt")
