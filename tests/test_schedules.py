"""Per-iteration schedules (selfsup.schedules) at their landmark steps."""

import math

import pytest

from selfsup.schedules import momentum_cosine, scaled_lr, warmup_cosine


def test_warmup_cosine_landmarks():
    total, warmup, peak, final = 110, 10, 2.0, 0.5
    assert warmup_cosine(0, total, warmup, peak, final) == pytest.approx(0.0)
    assert warmup_cosine(5, total, warmup, peak, final) == pytest.approx(1.0)  # half of peak mid-warmup
    assert warmup_cosine(2.5, total, warmup, peak, final) == pytest.approx(0.5)  # fractional step
    assert warmup_cosine(10, total, warmup, peak, final) == pytest.approx(peak)  # end of warmup
    assert warmup_cosine(60, total, warmup, peak, final) == pytest.approx((peak + final) / 2)  # mid-cosine
    assert warmup_cosine(110, total, warmup, peak, final) == pytest.approx(final)  # the end
    # a quarter into the cosine: final + (peak − final)·½(1 + cos(π/4))
    assert warmup_cosine(35, total, warmup, peak, final) == pytest.approx(0.5 + 1.5 * 0.5 * (1 + math.sqrt(0.5)))


def test_warmup_cosine_default_final_is_zero_and_no_warmup():
    assert warmup_cosine(0, 100, 0, 3.0) == pytest.approx(3.0)
    assert warmup_cosine(50, 100, 0, 3.0) == pytest.approx(1.5)
    assert warmup_cosine(100, 100, 0, 3.0) == pytest.approx(0.0, abs=1e-12)


def test_warmup_cosine_is_monotone():
    values = [warmup_cosine(s, 50, 5, 1.0, 0.1) for s in range(51)]
    assert all(a <= b for a, b in zip(values[:5], values[1:6]))
    assert all(a >= b for a, b in zip(values[5:], values[6:]))
    assert max(values) == pytest.approx(1.0)


def test_momentum_cosine_landmarks():
    m0 = 0.99
    assert momentum_cosine(0, 100, m0) == pytest.approx(m0)
    assert momentum_cosine(50, 100, m0) == pytest.approx((1 + m0) / 2)
    assert momentum_cosine(100, 100, m0) == pytest.approx(1.0)
    assert momentum_cosine(25, 100, 0.9) == pytest.approx(1 - 0.1 * 0.5 * (1 + math.sqrt(0.5)))
    values = [momentum_cosine(s, 40, 0.996) for s in range(41)]
    assert all(a <= b for a, b in zip(values, values[1:]))


def test_scaled_lr_linear_rule():
    assert scaled_lr(1.5e-4, 4096) == pytest.approx(2.4e-3)
    assert scaled_lr(0.05, 256) == pytest.approx(0.05)
    assert scaled_lr(0.3, 512) == pytest.approx(0.6)
    assert scaled_lr(0.1, 64) == pytest.approx(0.025)


def _lr_at(method, step: int, total: int, steps_per_epoch: int) -> float:
    """The lr a method's ``on_train_batch_start`` sets at ``step`` of ``total`` (a stand-in trainer, no fit)."""
    from types import SimpleNamespace

    import torch

    opt = torch.optim.SGD([{"params": [torch.zeros(1)], "lr_scale": 1.0, "fixed_lr": False, "decayed": True}], lr=0.0)
    method._trainer = SimpleNamespace(global_step=step, optimizers=[opt], current_epoch=step // steps_per_epoch)
    method.total_steps, method.steps_per_epoch = total, steps_per_epoch
    method.on_train_batch_start(None, 0)
    return opt.param_groups[0]["lr"]


@pytest.mark.parametrize("name", ["dino", "ibot", "mae", "barlow_twins"])
def test_the_last_lr_of_each_method_is_the_official_one(name):
    """DINO / iBOT (main_dino.py:238-243, main_ibot.py: ``cosine_scheduler(lr·B/256, min_lr, ...)``, last value
    ``min_lr + ½(peak − min_lr)(1 + cos(π (n−1)/n))``) and MAE (util/lr_sched.py:9-21: ``min_lr + (lr − min_lr)·½(1 +
    cos(π (e − W)/(E − W)))`` at the last iteration's fractional epoch) end at min_lr as given, at batch 1024; Barlow
    Twins' end lr scales with the batch (``end_lr = 0.001 · base_lr · B/256``, main.py adjust_learning_rate)."""
    from ssl_helpers import tiny_method

    batch, epochs, niter, warmup, base, min_lr = 1024, 4, 5, 1, 5e-4, 1e-6
    total = epochs * niter
    optim = {"base_lr": base, "min_lr": min_lr, "warmup_epochs": warmup}
    method = tiny_method(name, data={"batch_size": batch}, optim=optim)
    peak = base * batch / 256
    if name in ("dino", "ibot"):
        n = total - warmup * niter
        official = min_lr + 0.5 * (peak - min_lr) * (1 + math.cos(math.pi * (n - 1) / n))
    else:
        final = min_lr * batch / 256 if name == "barlow_twins" else min_lr
        e = epochs - 1 / niter  # the last iteration: data_iter_step / len(loader) + epoch
        official = final + (peak - final) * 0.5 * (1 + math.cos(math.pi * (e - warmup) / (epochs - warmup)))
    assert _lr_at(method, total - 1, total, niter) == pytest.approx(official, rel=1e-12)
    if name != "barlow_twins":  # optim.scale_min_lr=true: the former scaled end (4e-6 at batch 1024)
        scaled = tiny_method(name, data={"batch_size": batch}, optim={**optim, "scale_min_lr": True})
        assert scaled.final_lr() == pytest.approx(min_lr * 4) and method.final_lr() == min_lr
    else:
        assert method.final_lr() == pytest.approx(min_lr * 4)


def test_the_imagenet_presets_end_at_the_official_min_lr():
    """dino-vit-s-imagenet and ibot-vit-s-imagenet end their cosine at 1e-6 (batch 1024), MAE's at 0."""
    from selfsup.config import load_run_config

    for preset, final in (("dino-vit-s-imagenet", 1e-6), ("ibot-vit-s-imagenet", 1e-6), ("mae-vit-b-imagenet", 0.0)):
        cfg = load_run_config(preset)
        assert cfg.optim.min_lr == final and cfg.optim.scale_min_lr is None, preset
