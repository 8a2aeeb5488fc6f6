"""Per-iteration schedules of the official codes, as pure functions of the step, ``StepValues``, what a
method's ``schedule(step, epoch)`` gives one optimiser step, and the step's place in the run: ``micro_batch`` and
``step_seed``, the one formula of every per-step seed."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class StepValues:
    """One optimiser step's scheduled values (``TrainingBase.schedule``), applied before the step by one hook and
    logged at logging steps: ``train/lr``, ``train/wd`` and ``train/momentum`` where not None, ``train/<name>`` for
    each extra."""

    lr: float  # the scheduled lr; each parameter group gets it times its lr_scale
    peak_lr: float  # the lr of the fixed_lr groups (SimSiam's --fix-pred-lr: the peak), times their lr_scale
    weight_decay: float | None = None  # the decayed groups' weight decay (DINO's cosine); None: as the optimiser has it
    momentum: float | None = None  # the momentum m of the step's EMA targets; None: none scheduled
    extras: dict[str, float] = field(default_factory=dict)  # the method's own (DINO's teacher_temp): set as attributes
    frozen: tuple[str, ...] = ()  # names of parameter groups whose lr is 0 this step (DINOv2's last layer, epoch 0)


def micro_batch(trainer) -> int:
    """Which micro-batch of its optimiser step the batch being transferred or trained is: 0 … k − 1 for
    ``trainer.accumulate_grad_batches`` = k (Lightning steps after every k-th batch of an epoch and after its
    last). ``trainer.global_step`` counts optimiser steps: the unit of every per-iteration schedule."""
    k = getattr(trainer, "accumulate_grad_batches", 1)
    return trainer.fit_loop.epoch_loop.batch_progress.current.completed % k if k > 1 else 0


def step_seed(trainer, seed: int, times: int = 1, plus: int = 0) -> int:
    """The seed of the batch being trained, ``((seed · 1_000_003 + global_step) · k + micro_batch) · times + plus``
    (k = ``trainer.accumulate_grad_batches``; with k = 1 the micro-batch term vanishes); ``trainer`` None (outside
    fit): ``seed · 1_000_003 · times + plus``. ``times``, ``plus``: the world size and the rank (a per-process
    seed: the augmentation's) or a caller's own constants (a seed every process draws alike)."""
    step = seed * 1_000_003
    if trainer is not None:
        step = (step + trainer.global_step) * getattr(trainer, "accumulate_grad_batches", 1) + micro_batch(trainer)
    return step * times + plus


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
    """``lr = base_lr · batch / 256`` (linear rule, Goyal et al.), ``base_lr · sqrt(batch / 256)`` (the square-root
    rule of SimCLR's appendix B.1, which the SSL cookbook §3.5 recommends for small batches) or ``base_lr ·
    sqrt(batch / 1024)`` (``sqrt_1024``: DINOv2's only rule, dinov2/utils/config.py:21-26 ``sqrt_wrt_1024``);
    batch = global batch."""
    if rule == "linear":
        return base_lr * batch_size / 256
    if rule == "sqrt":
        return base_lr * math.sqrt(batch_size / 256)
    if rule == "sqrt_1024":
        return base_lr * math.sqrt(batch_size / 1024)
    raise ValueError(f"unknown lr scaling rule {rule!r}; use linear, sqrt or sqrt_1024")


def dino_cosine(step: int, total_steps: int, warmup_steps: int, base: float, final: float,
                start_warmup: float = 0.0) -> float:
    """DINO's ``utils.cosine_scheduler`` at iteration ``step`` (utils.py:187-198): ``linspace(start_warmup, base,
    warmup)`` (both ends included) for the first ``warmup`` iterations, then ``final + ½ (base − final)
    (1 + cos(π i / n))`` for i = 0 … n−1, n = total − warmup (it never quite reaches ``final``). Used for
    DINO's lr, weight decay and teacher momentum; ``step`` past the end keeps the last value."""
    step = min(max(int(step), 0), max(total_steps - 1, 0))
    if step < warmup_steps:
        if warmup_steps == 1:
            return start_warmup
        return start_warmup + (base - start_warmup) * step / (warmup_steps - 1)
    span = max(total_steps - warmup_steps, 1)
    return final + 0.5 * (base - final) * (1.0 + math.cos(math.pi * (step - warmup_steps) / span))


def teacher_temperature(epoch: int, warmup_temp: float, temp: float, warmup_epochs: int) -> float:
    """DINO's teacher temperature of ``epoch`` (main_dino.py:374-378): ``linspace(warmup_temp, temp,
    warmup_epochs)`` (both ends included) over the first ``warmup_epochs`` epochs, then ``temp``."""
    if epoch >= warmup_epochs:
        return temp
    if warmup_epochs == 1:
        return warmup_temp
    return warmup_temp + (temp - warmup_temp) * epoch / (warmup_epochs - 1)


def linear_ramp(step: int, value: float, ramp_steps: int) -> float:
    """``value · min(1, step / ramp_steps)``: 0 at step 0, ``value`` from ``ramp_steps`` on (``ramp_steps`` 0: ``value``
    from step 0)."""
    return value * min(1.0, step / ramp_steps) if ramp_steps > 0 else value


def linear_warmup_cosine_decay(step: int, start: float, peak: float, end: float, warmup_steps: int,
                               total_steps: int, cosine_steps: int | None = None) -> float:
    """DINOv3's ``linear_warmup_cosine_decay`` at iteration ``step`` (dinov3/train/cosine_lr_scheduler.py:54-85):
    ``linspace(start, peak, warmup, endpoint=False)``, then ``end + (peak − end) · ½ (1 + cos(π i / (n − 1)))`` for
    i = 0 … n − 1 (``linspace(0, π, n)``: both ends reached), n = ``cosine_steps`` (None: the rest of the run), then
    ``end``; past the array's end (its ``[it]`` would fail) ``end``."""
    step = max(int(step), 0)
    if step < warmup_steps:
        return start + (peak - start) * step / warmup_steps
    n = total_steps - warmup_steps if cosine_steps is None else cosine_steps
    i = step - warmup_steps
    if i >= n:
        return end
    return end + (peak - end) * 0.5 * (1.0 + math.cos(math.pi * i / (n - 1))) if n > 1 else peak


def gram_refreshes_before(step: int, first: int, every: int, max_updates: int) -> int:
    """How many times DINOv3's Gram teacher was refreshed from the EMA teacher before iteration ``step``
    (dinov3/train/train.py:534-544: after iteration ``it`` when ``it + 1 >= first`` and ``(it + 1) % every == 0``,
    at most ``max_updates`` times, −1: no limit): the multiples of ``every`` in [max(first, 1), step], capped. A
    pure function of the step, so a resumed run counts as the uninterrupted one (the code's resume count,
    train.py:441-452, is the same where ``first`` is a multiple of ``every``)."""
    lo = max(first, 1)
    n = max(0, step // every - (lo - 1) // every) if step >= lo else 0
    return n if max_updates < 0 else min(n, max_updates)


def gram_refresh_after(it: int, first: int, every: int, max_updates: int) -> bool:
    """Whether the Gram teacher is refreshed right after iteration ``it``'s optimiser step and EMA update
    (train.py:534-544)."""
    n = it + 1
    return (n >= first and n % every == 0
            and (max_updates < 0 or gram_refreshes_before(it, first, every, max_updates) < max_updates))


# Every schedule phase a method has (the config section, the key, its unit). A phase longer than the run (a 5-epoch
# warm-up in a 1-epoch run: every step on the ramp, the peak never reached) is shortened to PHASE_SHARE of the run,
# the share of the official recipes' warm-ups (DINO 10 of 100 epochs, SimCLR 10 of 100, MoCo v3 40 of 300), unless
# ``optim.keep_phases`` keeps them as configured.
def _wmse_code_schedule(cfg) -> bool:
    return getattr(cfg.method, "lr_schedule", None) in ("step", "cos")  # W-MSE's own warm-up, not optim.*'s


PHASES: tuple[tuple[str, str, str, Callable[[Any], bool] | None], ...] = (  # (section, key, unit, where it applies)
    ("optim", "warmup_epochs", "epochs", lambda cfg: not _wmse_code_schedule(cfg)),  # every method's lr warm-up
    ("method", "warmup_teacher_temp_epochs", "epochs", None),  # DINO, iBOT, DINOv2: τt's ramp
    ("method", "freeze_last_layer", "epochs", None),  # DINO, iBOT, DINOv2: the head's last layer frozen
    ("method", "freeze_prototypes_niters", "steps", None),  # SwAV: the prototypes frozen
    ("method", "warmup_iters", "steps", _wmse_code_schedule),  # W-MSE's own warm-up (lr_schedule step / cos)
    ("method", "ema_warmup_steps", "steps", None),  # flow: the EMA decay's ramp
    ("method", "rep_warmup_steps", "steps", None),  # Self-Flow, REPA: rep_weight's ramp
)
PHASE_SHARE = 0.1


def fit_phases(cfg, total_steps: int, epoch_steps: int, share: float = PHASE_SHARE) -> list[dict]:
    """Shorten in ``cfg`` (in place) each schedule phase of ``PHASES`` longer than the run (``total_steps``
    optimiser steps, ``epoch_steps`` of them a schedule epoch) to ``share`` of the run, in the phase's unit (an
    integer key stays an integer, rounded down). Returns one record per phase shortened: key, was, now, the run's
    length and the unit. ``optim.keep_phases``: none is shortened (an official recipe's schedule in a short run)."""
    if getattr(getattr(cfg, "optim", None), "keep_phases", False):
        return []
    epochs = total_steps / max(epoch_steps, 1)
    fitted = []
    for section, key, unit, applies in PHASES:
        if applies is not None and not applies(cfg):
            continue
        values = getattr(cfg, section, None)
        value = getattr(values, key, None)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            continue
        run = epochs if unit == "epochs" else total_steps
        if value <= run:  # a phase the run completes (one as long as the run ends with it) is the user's choice
            continue
        now = int(share * run) if isinstance(value, int) else round(share * run, 4)
        setattr(values, key, now)
        fitted.append({"key": f"{section}.{key}", "was": value, "now": now, "run": round(run, 4), "unit": unit})
    return fitted


def fitted_line(record: dict) -> str:
    """The console line of one shortened phase (``fit_phases``)."""
    return (f"selfsup: {record['key']}={record['was']:g} is longer than the run ({record['run']:g} "
            f"{record['unit']}); shortened to {record['now']:g} ({PHASE_SHARE:g} of the run; set a shorter "
            f"{record['key']} or a longer run to choose, or optim.keep_phases=true to keep it)")
