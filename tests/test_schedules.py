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
