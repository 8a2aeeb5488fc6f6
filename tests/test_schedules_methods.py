"""Every registered method's ``schedule(step, epoch)``, without a Trainer, against its official code's formula
written out here independently (numpy arrays as the official codes build them, or the closed form at the
fractional epoch); then the one hook that applies a schedule, and the training step that logs it.

The run: global batch 16, 5 epochs of 10 optimiser steps, 2 warm-up epochs, base_lr 1e-3 (peak 1e-3 · 16/256).
A method added to ``selfsup.methods.METHODS`` fails here until its official schedule is written in ``OFFICIAL``.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from selfsup.config import load_run_config
from selfsup.data.datasets import load_dataset
from selfsup.methods import METHODS
from selfsup.methods.build import build_method, data_info
from selfsup.schedules import StepValues
from selfsup.step import StepOutput
from ssl_helpers import STUDENT_HEADS, dinov2_teacher_run, tiny_method

SPE, EPOCHS, WARMUP, BATCH = 10, 5, 2, 16
TOTAL = SPE * EPOCHS
BASE_LR, MIN_LR = 1e-3, 2e-5
PEAK = BASE_LR * BATCH / 256  # the linear scaling rule: lr · batch / 256 (every code here)
STEPS = (0, 1, 7, 19, 20, 21, 33, 40, 48, TOTAL - 1)
OPTIM = {"base_lr": BASE_LR, "min_lr": MIN_LR, "warmup_epochs": WARMUP}


def cosine_scheduler(base, final, epochs, niter, warmup_epochs=0, start_warmup=0.0):
    """DINO's utils.cosine_scheduler (utils.py:187-198; iBOT's, SwAV's lr array main_swav.py:171-182): linspace
    warm-up, then ``final + ½ (base − final)(1 + cos(π i / n))`` for i < n."""
    warmup = np.linspace(start_warmup, base, warmup_epochs * niter) if warmup_epochs else np.array([])
    iters = np.arange(epochs * niter - warmup_epochs * niter)
    return np.concatenate((warmup, final + 0.5 * (base - final) * (1 + np.cos(np.pi * iters / len(iters)))))


def warmup_cosine_at_epoch(step, peak, final):
    """MoCo v3's / MAE's lr at the fractional epoch e = step / niter (main_moco.py adjust_learning_rate,
    util/lr_sched.py:9-21): ``peak · e / W`` during the warm-up, then ``final + (peak − final) · ½(1 + cos(π (e − W) /
    (E − W)))`` (MoCo v3 has no final lr: 0; selfsup's ``optim.min_lr`` enters as MAE's ``min_lr``)."""
    e = step / SPE
    if e < WARMUP:
        return peak * e / WARMUP
    return final + (peak - final) * 0.5 * (1 + math.cos(math.pi * (e - WARMUP) / (EPOCHS - WARMUP)))


def ema_cosine(step, m0):
    """MoCo v3's adjust_moco_momentum / BYOL's τ: ``1 − (1 − m0) · ½ (1 + cos(π k / K))``."""
    return 1 - 0.5 * (1 + math.cos(math.pi * step / TOTAL)) * (1 - m0)


def barlow_lr(step):
    """Barlow Twins main.py adjust_learning_rate (VICReg's the same): warm-up per step, then the cosine from
    base to ``0.001 · base`` (base = lr · batch / 256)."""
    warmup = WARMUP * SPE
    if step < warmup:
        return PEAK * step / warmup
    q = 0.5 * (1 + math.cos(math.pi * (step - warmup) / (TOTAL - warmup)))
    return PEAK * q + PEAK * 0.001 * (1 - q)


def teacher_temps(warmup_temp, temp, warmup_epochs, epochs=EPOCHS):
    """main_dino.py:374-378: ``concatenate(linspace(warmup_temp, temp, warmup_epochs), ones(rest) · temp)``."""
    return np.concatenate((np.linspace(warmup_temp, temp, warmup_epochs), np.ones(epochs - warmup_epochs) * temp))


# ----------------------------------------------------------------------------- each method's run and official values
def joint(name, extra=None, **sections):
    return tiny_method(name, extra, data={"batch_size": BATCH}, optim={**OPTIM, **sections.pop("optim", {})},
                       **sections)


def flow(preset, *overrides):
    cfg = load_run_config(preset, [f"data.batch_size={BATCH}", "trainer.accelerator=cpu", "trainer.devices=1",
                                   f"optim.base_lr={BASE_LR}", f"optim.min_lr={MIN_LR}",
                                   f"optim.warmup_epochs={WARMUP}", "optim.lr_scaling=linear", *overrides])
    return build_method(cfg, data_info(cfg, load_dataset(cfg.data, "train")))


def repa_encoder(tmp_path):
    from selfsup.export import export_backbone
    from selfsup.models.backbones import build_backbone

    kwargs = dict(in_chans=1, image_size=8, patch_size=4)
    meta = {"backbone": "vit_micro", "kwargs": kwargs, "image_size": 8, "in_chans": 1, "mean": [0.3], "std": [0.3],
            "dataset": "digits", "method": "moco_v3"}
    torch.manual_seed(0)
    return export_backbone(build_backbone("vit_micro", **kwargs), tmp_path / "encoder.safetensors", meta)


def with_warmup_cosine(final, momentum=None):
    """Official values of a warm-up + cosine method (and its EMA momentum schedule)."""
    def values(step, epoch):
        lr = warmup_cosine_at_epoch(step, PEAK, final)
        return StepValues(lr, PEAK, momentum=None if momentum is None else momentum(step))
    return values


def dino_values(m0=0.996, wd=0.05, wd_end=0.4, temps=(0.02, 0.05, 3)):
    lr = cosine_scheduler(PEAK, MIN_LR, EPOCHS, SPE, WARMUP)  # min_lr as given (main_dino.py:238-243)
    wds = cosine_scheduler(wd, wd_end, EPOCHS, SPE)
    momenta = cosine_scheduler(m0, 1, EPOCHS, SPE)
    tt = teacher_temps(*temps)
    return lambda step, epoch: StepValues(lr[step], PEAK, weight_decay=wds[step], momentum=momenta[step],
                                          extras={"teacher_temp": tt[epoch]})


def ibot_values(start=1, temps=(0.03, 0.07)):
    dino = dino_values()
    patch = teacher_temps(*temps, 3, EPOCHS - start)  # main_ibot.py:498-512, shifted by pred_start_epoch

    def values(step, epoch):
        v = dino(step, epoch)
        return StepValues(v.lr, v.peak_lr, v.weight_decay, v.momentum,
                          {**v.extras, "teacher_patch_temp": temps[0] if epoch < start else patch[epoch - start]})
    return values


def dinov2_scheduler(base, final, total_iters, warmup_iters=0, start_warmup=0.0):
    """dinov2/utils/utils.py ``CosineScheduler``: linspace warm-up over ``warmup_iters``, then the cosine over the
    rest; an iteration at or past ``total_iters`` gets ``final``."""
    warmup = np.linspace(start_warmup, base, warmup_iters)
    iters = np.arange(total_iters - warmup_iters)
    schedule = np.concatenate((warmup, final + 0.5 * (base - final) * (1 + np.cos(np.pi * iters / len(iters)))))
    return lambda it: final if it >= total_iters else schedule[it]


def dinov2_values(m0=0.992, wd=0.05, wd_end=0.4, temps=(0.02, 0.05, 3), freeze=1):
    """train.py:65-101 (epochs of SPE iterations): lr at base · sqrt(batch / 1024), wd, momentum; τt over
    ``warmup_teacher_temp_epochs`` (a CosineScheduler whose warm-up is all of it), the last layer's lr 0."""
    peak = BASE_LR * math.sqrt(BATCH / 1024)
    lr = dinov2_scheduler(peak, MIN_LR, TOTAL, WARMUP * SPE)
    wds, momenta = dinov2_scheduler(wd, wd_end, TOTAL), dinov2_scheduler(m0, 1, TOTAL)
    tt = dinov2_scheduler(temps[1], temps[1], temps[2] * SPE, temps[2] * SPE, temps[0])
    return lambda step, epoch: StepValues(lr(step), peak, weight_decay=wds(step), momentum=momenta(step),
                                          extras={"teacher_temp": tt(step)},
                                          frozen=("last_layer",) if step < freeze * SPE else ())


def dinov3_values(start=1, gram=(0.0, 0.5, 2.0, 2, 1)):
    """DINOv2's values, and the Gram weight: 0 before iteration ``start`` · SPE (it_load_ema_teacher), then
    linear_warmup_cosine_decay (cosine_lr_scheduler.py:54-85) as numpy builds it over the run."""
    base = dinov2_values()
    s0, peak, end, warm, cos = gram
    array = np.concatenate([np.linspace(s0, peak, warm * SPE, endpoint=False),
                            (peak - end) * (np.cos(np.linspace(0, np.pi, cos * SPE)) + 1) / 2 + end,
                            np.full((TOTAL - (warm + cos) * SPE,), end)])

    def values(step, epoch):
        v = base(step, epoch)
        v.extras["gram_weight"] = 0.0 if step < start * SPE else float(array[step])
        return v
    return values


def swav_values(start_warmup=1e-5):
    lr = cosine_scheduler(PEAK, MIN_LR * BATCH / 256, EPOCHS, SPE, WARMUP, start_warmup)  # final_lr scaled
    return lambda step, epoch: StepValues(lr[step], PEAK)


def wmse_values(warmup_iters=5, drops=(2, 1), factor=0.2):
    """W-MSE train.py:43-66: ``lr · (k + 1) / warmup_iters`` over the first iterations, then MultiStepLR at epochs
    E − 50, E − 25 (here E − 2, E − 1), × 0.2 each, stepped per epoch."""
    def values(step, epoch):
        if step < warmup_iters:
            return StepValues(PEAK * (step + 1) / warmup_iters, PEAK)
        milestones = [EPOCHS - d for d in drops]  # MultiStepLR's: reached after epoch m − 1, never when negative
        return StepValues(PEAK * factor ** sum(0 <= m <= step // SPE and m * SPE >= warmup_iters for m in milestones),
                          PEAK)
    return values


def simsiam_values(step, epoch):
    """main_simsiam.py adjust_learning_rate, once per epoch: ``init_lr · ½ (1 + cos(π epoch / epochs))``, no warm-up;
    ``--fix-pred-lr``: the predictor keeps init_lr."""
    return StepValues(PEAK * 0.5 * (1 + math.cos(math.pi * (step // SPE) / EPOCHS)), PEAK)


def moco_v2_values(step, epoch):
    """moco main_moco.py:488-497 with --cos, once per epoch: ``lr · ½ (1 + cos(π epoch / epochs))``, no warm-up;
    the key encoder's m constant (builder.py:63)."""
    return StepValues(PEAK * 0.5 * (1 + math.cos(math.pi * (step // SPE) / EPOCHS)), PEAK, momentum=0.99)


def ramped(values, weight, ramp):
    """Self-Flow's / REPA's representation weight, ramped linearly from 0 over ``ramp`` steps (selfsup's own
    option: both official codes use the full weight from step 0)."""
    def out(step, epoch):
        v = values(step, epoch)
        return StepValues(v.lr, v.peak_lr, v.weight_decay, v.momentum, {"rep_weight": weight * min(1, step / ramp)})
    return out


def ijepa_values(start=2e-4, ema=(0.996, 1.0), wd=(0.04, 0.4), ipe_scale=1.25):
    """I-JEPA's schedulers (utils/schedulers.py:11-76, stepped before each iteration: at step + 1) over
    ``T = int(ipe_scale · E · ipe)``: lr from ``start_lr`` (scaled as the peak) over ``int(warmup · ipe)`` iterations,
    then the cosine to the final lr floored at it; wd by the cosine from 0.04 to 0.4 capped at 0.4; the momentum of
    the EMA after the step ``ema0 + k (ema1 − ema0) / (ipe · E · ipe_scale)`` (train.py:227-229)."""
    T, W = int(ipe_scale * EPOCHS * SPE), int(WARMUP * SPE)
    start, final = start * BATCH / 256, SCALED_MIN

    def values(step, epoch):
        n = step + 1
        if n < W:
            lr = start + n / W * (PEAK - start)
        else:
            lr = max(final, final + (PEAK - final) * 0.5 * (1 + math.cos(math.pi * (n - W) / (T - W))))
        w = min(wd[1], wd[1] + (wd[0] - wd[1]) * 0.5 * (1 + math.cos(math.pi * n / T)))
        return StepValues(lr, PEAK, w, ema[0] + step * (ema[1] - ema[0]) / (SPE * EPOCHS * ipe_scale))
    return values


def lejepa_values(step, epoch):
    """MINIMAL.md:157-161: LinearLR(start_factor 0.01, warm-up iterations) then CosineAnnealingLR(T_max = total −
    warm-up, eta_min = the final lr) in a SequentialLR, stepped after each iteration."""
    W = WARMUP * SPE
    if step < W:
        return StepValues(PEAK * (0.01 + 0.99 * step / W), PEAK)
    return StepValues(SCALED_MIN + (PEAK - SCALED_MIN) * 0.5 * (1 + math.cos(math.pi * (step - W) / (TOTAL - W))),
                      PEAK)


DINO_TEMPS = {"warmup_teacher_temp": 0.02, "teacher_temp": 0.05, "warmup_teacher_temp_epochs": 3}
SCALED_MIN = MIN_LR * BATCH / 256  # optim.min_lr scaled as the peak (the methods whose official end lr scales)
OFFICIAL = {  # name -> (build the method, its official values at (step, epoch))
    "moco_v3": (lambda tmp: joint("moco_v3", {"momentum": 0.99}, optim={"min_lr": 0.0}),
                with_warmup_cosine(0.0, lambda s: ema_cosine(s, 0.99))),
    "byol": (lambda tmp: joint("byol", {"momentum": 0.99}, optim={"min_lr": 0.0}),
             with_warmup_cosine(0.0, lambda s: ema_cosine(s, 0.99))),
    "simsiam": (lambda tmp: joint("simsiam", optim={"warmup_epochs": 0, "min_lr": 0.0, "lr_schedule_unit": "epoch",
                                                    "fix_predictor_lr": True}), simsiam_values),
    "simclr": (lambda tmp: joint("simclr", optim={"min_lr": 0.0}), with_warmup_cosine(0.0)),  # warm-up, cosine to 0
    "barlow_twins": (lambda tmp: joint("barlow_twins", optim={"min_lr": BASE_LR * 0.001}),
                     lambda s, e: StepValues(barlow_lr(s), PEAK)),
    "vicreg": (lambda tmp: joint("vicreg", optim={"min_lr": BASE_LR * 0.001}),
               lambda s, e: StepValues(barlow_lr(s), PEAK)),
    "dino": (lambda tmp: joint("dino", DINO_TEMPS, optim={"decay_1d": False}), dino_values()),
    "ibot": (lambda tmp: joint("ibot", {**DINO_TEMPS, "warmup_teacher_patch_temp": 0.03, "teacher_patch_temp": 0.07,
                                        "pred_start_epoch": 1}, optim={"decay_1d": False}), ibot_values()),
    "dinov2": (lambda tmp: joint("dinov2", {**DINO_TEMPS, "momentum": 0.992, "freeze_last_layer": 1},
                                 optim={"lr_scaling": "sqrt_1024", "weight_decay": 0.05}), dinov2_values()),
    "dinov3": (lambda tmp: joint("dinov3", {**DINO_TEMPS, "momentum": 0.992, "freeze_last_layer": 1,
                                            "gram_it_load_ema_teacher": 1,
                                            "gram_loss_weight_schedule": [0, 0.5, 2, 2, 1]},
                                 optim={"lr_scaling": "sqrt_1024", "weight_decay": 0.05}), dinov3_values()),
    "mae": (lambda tmp: joint("mae", model={"backbone": "vit_micro", "stop_grad_conv1": False}),
            with_warmup_cosine(MIN_LR)),  # min_lr as given
    "swav": (lambda tmp: joint("swav", {"start_warmup_lr": 1e-5}), swav_values()),
    "wmse": (lambda tmp: joint("wmse", {"lr_schedule": "step", "warmup_iters": 5, "lr_drops": [2, 1]}), wmse_values()),
    "nnclr": (lambda tmp: joint("nnclr"), with_warmup_cosine(SCALED_MIN)),  # no official code: selfsup's own
    "moco_v2": (lambda tmp: joint("moco_v2", {"momentum": 0.99}, optim={"warmup_epochs": 0, "min_lr": 0.0,
                                                                       "lr_schedule_unit": "epoch"}), moco_v2_values),
    # no official code: lightly's benchmark (tico.py:50-57, 119-130): warm-up + cosine per step, m0 → 1 by a cosine
    "tico": (lambda tmp: joint("tico", {"momentum": 0.99}, optim={"min_lr": 0.0}),
             with_warmup_cosine(0.0, lambda s: ema_cosine(s, 0.99))),
    "ijepa": (lambda tmp: joint("ijepa", {"ipe_scale": 1.25}, optim={"weight_decay": 0.04}), ijepa_values()),
    "lejepa": (lambda tmp: joint("lejepa"), lejepa_values),
    # LightlyTrain's distillation: the shared warm-up + cosine per step (lightly CosineWarmupScheduler; its end value
    # 0.001 of the peak is the presets' optim.min_lr), min_lr scaled as the peak
    "distill": (lambda tmp: joint("distill", {"teacher": {"weights": str(repa_encoder(tmp))}, "queue_size": 16}),
                with_warmup_cosine(SCALED_MIN)),
    # DINOv2's distillation: DINOv2's schedule, its momentum the spare EMA's
    "distill_dinov2": (lambda tmp: joint("distill_dinov2", {**DINO_TEMPS, "momentum": 0.992, "freeze_last_layer": 1,
                                                            "teacher": {"weights": str(dinov2_teacher_run(tmp))},
                                                            **STUDENT_HEADS},
                                         optim={"lr_scaling": "sqrt_1024", "weight_decay": 0.05}), dinov2_values()),
    "flow_matching": (lambda tmp: flow("flow-matching-digits"), with_warmup_cosine(SCALED_MIN)),
    "self_flow": (lambda tmp: flow("self-flow-digits", "method.rep_warmup_steps=20"),
                  ramped(with_warmup_cosine(SCALED_MIN), 0.8, 20)),
    "repa": (lambda tmp: flow("repa-digits", f"method.encoder={repa_encoder(tmp)}", "method.rep_warmup_steps=30"),
             ramped(with_warmup_cosine(SCALED_MIN), 0.5, 30)),
}


def run_length(method):
    method.total_steps, method.steps_per_epoch, method.max_epochs = TOTAL, SPE, EPOCHS
    return method


@pytest.mark.parametrize("name", list(METHODS))
def test_each_methods_schedule_is_its_official_one(name, tmp_path):
    assert name in OFFICIAL, f"{name}: write its official schedule in OFFICIAL"
    build, official = OFFICIAL[name]
    method = run_length(build(tmp_path))
    for step in STEPS:
        got, want = method.schedule(step, step // SPE), official(step, step // SPE)
        assert isinstance(got, StepValues)
        assert got.frozen == want.frozen, (step, got.frozen)
        for key in ("lr", "peak_lr", "weight_decay", "momentum"):
            a, b = getattr(got, key), getattr(want, key)
            assert (a is None) == (b is None) and (a is None or a == pytest.approx(b, rel=1e-12, abs=1e-15)), \
                (step, key, a, b)
        assert got.extras.keys() == want.extras.keys(), step
        for key in want.extras:
            assert got.extras[key] == pytest.approx(want.extras[key], rel=1e-12), (step, key)


@pytest.mark.parametrize("name", list(METHODS))
def test_a_schedule_is_a_pure_function(name, tmp_path):
    """The same (step, epoch) gives the same values, whatever was asked before; the module is left as it was."""
    method = run_length(OFFICIAL[name][0](tmp_path))
    before = (method.lr, method.momentum, method.step_values, dict(vars(method)).keys())
    first = [method.schedule(s, s // SPE) for s in STEPS]
    assert [method.schedule(s, s // SPE) for s in reversed(STEPS)] == first[::-1]
    assert (method.lr, method.momentum, method.step_values, dict(vars(method)).keys()) == before


def test_the_flow_ema_decay_ramps_over_the_steps_done():
    """The flow EMA's post-step decay after n optimiser steps: ``ema_decay · min(1, n / ema_warmup_steps)``."""
    method = flow("flow-matching-digits", "method.ema_decay=0.9", "method.ema_warmup_steps=8")
    for n, want in ((1, 0.9 / 8), (4, 0.45), (8, 0.9), (50, 0.9)):
        method.update_ema(n)
        assert method.ema_decay == pytest.approx(want, rel=1e-15)


# ----------------------------------------------------------------------------- the hook and the step
def stand_in_trainer(method, step, epoch, micro=0):
    opt = method.configure_optimizers()
    batches = SimpleNamespace(current=SimpleNamespace(completed=micro))
    method._trainer = SimpleNamespace(global_step=step, current_epoch=epoch, optimizers=[opt],
                                      accumulate_grad_batches=2 if micro else 1,
                                      fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=batches)))
    return opt


@pytest.mark.parametrize("name", ["moco_v3", "simsiam", "dino", "ibot"])
def test_the_hook_applies_the_schedule(name, tmp_path):
    """``on_train_batch_start`` writes exactly the schedule's values: each group's lr × lr_scale (fixed_lr groups:
    the peak), the decayed groups' weight decay, the momentum and its device weight, the extras as attributes."""
    method = run_length(OFFICIAL[name][0](tmp_path))
    step, epoch = 23, 2
    opt = stand_in_trainer(method, step, epoch)
    method.on_train_batch_start(None, 0)
    v = method.schedule(step, epoch)
    assert method.step_values == v and method.lr == v.lr
    for group in opt.param_groups:
        assert group["lr"] == (v.peak_lr if group["fixed_lr"] else v.lr) * group["lr_scale"]
        if v.weight_decay is not None:
            assert group["weight_decay"] == (v.weight_decay if group["decayed"] else 0.0)
    if name == "simsiam":
        assert any(g["fixed_lr"] for g in opt.param_groups) and v.peak_lr != v.lr
    if v.momentum is not None:
        assert method.momentum == v.momentum
        assert method.ema_weight.item() == pytest.approx(1 - v.momentum, rel=1e-6)
    for key, value in v.extras.items():
        assert getattr(method, key) == value
    if name.endswith(("dino", "ibot")):  # the step reads τt (τt2) as a device tensor set with it
        assert method.step_teacher_temp.item() == pytest.approx(v.extras["teacher_temp"], rel=1e-6)
    stand_in_trainer(method, step, epoch, micro=1)  # a later micro-batch of an accumulated step: no in-step EMA
    method.on_train_batch_start(None, 0)
    assert method.ema_weight.item() == 0.0


def test_the_training_step_logs_the_schedule_and_the_steps_scalars_and_returns_its_output():
    """iBOT's step: Lightning gets ``{"loss", "step"}``; the logged names are the schedule's (lr, wd, momentum,
    τt, τt2) and the method's scalars (its two loss terms), each with this step's value."""
    from ssl_helpers import random_views

    method = run_length(joint("ibot", {"warmup_teacher_temp_epochs": 3, "pred_start_epoch": 1}))
    stand_in_trainer(method, 9, 0)
    method.trainer.log_every_n_steps, method.trainer.should_stop = 1, False
    method.on_train_batch_start(None, 0)
    logged = {}
    method.log = lambda name, value, **kw: logged.__setitem__(name, float(value))
    labels = torch.arange(8)
    result = method.training_step((random_views(8), labels), 0)
    assert set(result) == {"loss", "step"} and result["loss"].requires_grad
    out, v = result["step"], method.step_values
    assert isinstance(out, StepOutput) and not out.loss.requires_grad and out.labels is labels
    assert torch.equal(out.loss, result["loss"].detach())
    assert set(logged) == {"train/loss", "train/lr", "train/wd", "train/momentum", "train/teacher_temp",
                           "train/teacher_patch_temp", "train/loss_cls", "train/loss_patch"}
    for name, value in (("lr", v.lr), ("wd", v.weight_decay), ("momentum", v.momentum),
                        ("teacher_temp", v.extras["teacher_temp"]),
                        ("teacher_patch_temp", v.extras["teacher_patch_temp"]),
                        ("loss_cls", out.scalars["loss_cls"]), ("loss_patch", out.scalars["loss_patch"]),
                        ("loss", out.loss)):  # logged as float32
        assert logged[f"train/{name}"] == pytest.approx(float(value), rel=1e-6), name
