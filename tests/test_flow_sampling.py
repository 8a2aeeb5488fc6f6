"""Sampler (Euler ODE / Euler–Maruyama SDE / guidance) on known velocity fields, and the metrics' formulas."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from selfsup.flow.metrics import class_fidelity, feature_frechet_distance, frechet_distance, gaussian_stats
from selfsup.flow.sampler import euler_maruyama, guided, sample
from ssl_helpers import raises_user_error


def point_field(mu):
    """Exact velocity of the path from the point mass at ``mu`` (t = 0) to N(0, I) (t = 1): (x − μ)/t."""
    def v(x, t, y):
        return (x - mu) / t.view(-1, *([1] * (x.dim() - 1)))
    return v


def gaussian_field(m, s):
    """Exact velocity E[ε − x_0 | x_t] for data N(m, s²) per coordinate, path x_t = (1 − t)x_0 + tε."""
    def v(x, t, y):
        t = t.view(-1, *([1] * (x.dim() - 1)))
        var = (1 - t) ** 2 * s ** 2 + t ** 2
        r = x - (1 - t) * m  # centred x_t
        e_eps = t / var * r
        e_x0 = m + (1 - t) * s ** 2 / var * r
        return e_eps - e_x0
    return v


@pytest.mark.parametrize("steps", [1, 3, 50])
def test_euler_integrates_the_point_field_exactly(steps):
    mu = torch.tensor([[[[0.5, -2.0], [3.0, 0.25]]]], dtype=torch.float64)
    noise = torch.randn(4, 1, 2, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    y = torch.zeros(4, dtype=torch.long)
    out = sample(point_field(mu), noise, y, steps=steps, method="ode")
    torch.testing.assert_close(out, mu.expand(4, -1, -1, -1), rtol=0, atol=1e-12)


def test_euler_trajectory_is_the_straight_line():
    """Each intermediate state lies on x_t = (1 − t)μ + tε (linear field: Euler exact at every step)."""
    mu = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    eps = torch.tensor([[0.3, 2.0]], dtype=torch.float64)
    v = point_field(mu)
    x, t, h = eps, 1.0, 0.25
    for _ in range(3):
        x = x - h * v(x, torch.tensor([t], dtype=torch.float64), None)
        t -= h
        torch.testing.assert_close(x, (1 - t) * mu + t * eps, rtol=0, atol=1e-12)


def test_sde_reaches_the_data_distribution():
    """Euler–Maruyama with the exact score of Gaussian data N(2, 0.5²) ends with that mean and std."""
    gen = torch.Generator().manual_seed(0)
    noise = torch.randn(20000, 1, dtype=torch.float64, generator=gen)
    y = torch.zeros(20000, dtype=torch.long)
    out = sample(gaussian_field(2.0, 0.5), noise, y, steps=200, method="sde", generator=gen)
    assert abs(out.mean().item() - 2.0) < 0.02
    assert abs(out.std().item() - 0.5) < 0.02
    ode = sample(gaussian_field(2.0, 0.5), noise, y, steps=200, method="ode")
    assert abs(ode.std().item() - 0.5) < 0.01
    assert not torch.allclose(out, ode, atol=1e-3)  # the SDE injects noise


def test_sde_without_diffusion_is_euler_on_its_grid():
    """norm 0: w = 0, drift −v; on the point field every Euler step is exact, so it lands on μ."""
    mu = torch.tensor([[1.5, -0.5]], dtype=torch.float64)
    noise = torch.randn(3, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    out = euler_maruyama(point_field(mu), noise, torch.zeros(3, dtype=torch.long), steps=7, diffusion_norm=0.0)
    torch.testing.assert_close(out, mu.expand(3, -1), rtol=0, atol=1e-12)


def test_sde_one_step_is_refused_not_garbage():
    """One SDE step would be the noise-free last step alone from t = 1: x + (−v − x) = −v = x̂₀ − ε̂ on the point
    field (measured 2.1 off, the ODE's one step is exact). Refused, in the sampler itself too; 2 steps run."""
    mu = torch.tensor([[1.5, -0.5]], dtype=torch.float64)
    noise = torch.randn(3, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    y = torch.zeros(3, dtype=torch.long)
    torch.testing.assert_close(sample(point_field(mu), noise, y, steps=1), mu.expand(3, -1), rtol=0, atol=1e-12)
    with raises_user_error("--sampler sde needs --steps >= 2"):
        euler_maruyama(point_field(mu), noise, y, steps=1)
    out = euler_maruyama(point_field(mu), noise, y, steps=2, generator=torch.Generator().manual_seed(0))
    assert torch.isfinite(out).all()


def test_generate_refuses_an_empty_batch():
    from selfsup.flow.sampler import generate

    with raises_user_error("batch size 0 must be >= 1"):
        generate(Linear(), torch.zeros(2, dtype=torch.long), batch_size=0)


def test_sde_score_conversion_matches_the_gaussian_score():
    """w·s from the velocity equals norm·t·∇log p_t for Gaussian data (closed form)."""
    from selfsup.flow.sampler import sde_drift

    m, s, norm = 0.7, 1.3, 0.6
    x = torch.linspace(-3, 3, 11, dtype=torch.float64).view(-1, 1)
    for t_val in (0.1, 0.5, 0.9):
        t = torch.full((11,), t_val, dtype=torch.float64)
        v = gaussian_field(m, s)(x, t, None)
        var = (1 - t_val) ** 2 * s ** 2 + t_val ** 2
        score = -(x - (1 - t_val) * m) / var
        torch.testing.assert_close(sde_drift(x, v, t, norm), -v + norm * t_val * score, rtol=0, atol=1e-12)


class Linear:
    """A toy class-conditional velocity: v = a·x + b[y] (the null class has its own b); counts forwards."""

    def __init__(self, num_classes=3):
        self.b = torch.randn(num_classes + 1, 2, generator=torch.Generator().manual_seed(2))
        self.calls = []

    def __call__(self, x, t, y):
        self.calls.append(len(x))
        return 0.5 * x + self.b[y] * t.view(-1, 1)


def test_guidance_at_scale_one_is_the_conditional_model():
    noise = torch.randn(5, 2, generator=torch.Generator().manual_seed(3))
    y = torch.tensor([0, 1, 2, 0, 1])
    m1, m2 = Linear(), Linear()
    torch.testing.assert_close(sample(m1, noise, y, steps=4, cfg_scale=1.0, null_class=3),
                               sample(m2, noise, y, steps=4), rtol=0, atol=0)
    x, t = noise, torch.full((5,), 0.3)
    torch.testing.assert_close(guided(Linear(), 1.0, 3)(x, t, y), Linear()(x, t, y))


def test_guidance_formula_in_one_batched_forward():
    m = Linear()
    x, t, y = torch.randn(4, 2), torch.full((4,), 0.6), torch.tensor([0, 1, 2, 2])
    out = guided(m, 2.5, 3)(x, t, y)
    assert m.calls == [8]  # conditional and unconditional halves in one forward
    v_c, v_u = Linear()(x, t, y), Linear()(x, t, torch.full_like(y, 3))
    torch.testing.assert_close(out, v_u + 2.5 * (v_c - v_u))
    torch.testing.assert_close(guided(Linear(), 0.0, 3)(x, t, y), v_u)


@pytest.mark.parametrize("kwargs, words", [
    (dict(steps=0), ["--steps 0 must be >= 1"]),
    (dict(cfg_scale=-1.0, null_class=3), ["--cfg -1.0 must be a finite number >= 0"]),
    (dict(method="heun"), ["--sampler 'heun' is not one of ode, sde"]),
    (dict(cfg_scale=2.0), ["classifier-free guidance needs the model's null class"]),
    (dict(cfg_scale=math.nan, null_class=3), ["--cfg nan must be a finite number >= 0"]),
    (dict(method="sde", steps=1), ["--sampler sde needs --steps >= 2 (got 1)"]),
    (dict(method="sde", steps=4, diffusion_norm=-1.0), ["diffusion_norm -1.0 must be >= 0"]),
])
def test_bad_sampling_options_are_user_errors(kwargs, words):
    with raises_user_error(*words):
        sample(Linear(), torch.zeros(1, 2), torch.zeros(1, dtype=torch.long), **kwargs)


# --------------------------------------------------------------------------- metrics


def test_frechet_distance_closed_forms():
    # diagonal covariances: ‖Δμ‖² + Σ (σ₁ − σ₂)²  = (1 + 4) + (1 − 2)² + (2 − 3)² = 7
    d = frechet_distance(torch.zeros(2), torch.diag(torch.tensor([1.0, 4.0])),
                         torch.tensor([1.0, 2.0]), torch.diag(torch.tensor([4.0, 9.0])))
    assert d == pytest.approx(7.0, abs=1e-12)
    # 1-D: (μ₁ − μ₂)² + (σ₁ − σ₂)²
    assert frechet_distance(torch.tensor([0.5]), torch.tensor([[0.25]]), torch.tensor([-1.0]),
                            torch.tensor([[4.0]])) == pytest.approx(1.5 ** 2 + 1.5 ** 2, abs=1e-12)


def test_frechet_distance_matches_scipy_sqrtm_for_non_commuting_covariances():
    from scipy.linalg import sqrtm

    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(5, 5)), rng.normal(size=(5, 5))
    s1, s2 = a @ a.T + 0.1 * np.eye(5), b @ b.T + 0.1 * np.eye(5)
    m1, m2 = rng.normal(size=5), rng.normal(size=5)
    ref = float(((m1 - m2) ** 2).sum() + np.trace(s1 + s2 - 2 * sqrtm(s1 @ s2).real))
    got = frechet_distance(*(torch.from_numpy(v) for v in (m1, s1, m2, s2)))
    assert got == pytest.approx(ref, rel=1e-9)


def test_frechet_distance_of_a_set_is_zero_with_itself_and_grows_with_a_shift():
    f = torch.randn(500, 16, generator=torch.Generator().manual_seed(4))
    assert feature_frechet_distance(f, f) == pytest.approx(0.0, abs=1e-9)
    shifts = [feature_frechet_distance(f, f + c) for c in (0.1, 0.5, 1.0)]
    # same covariance: exactly ‖c·1‖² = 16 c²
    assert shifts == pytest.approx([16 * 0.01, 16 * 0.25, 16.0], rel=1e-6)
    assert feature_frechet_distance(f, 2 * f) > 0


def test_gaussian_stats_match_numpy():
    f = torch.randn(50, 4, generator=torch.Generator().manual_seed(5))
    mu, cov = gaussian_stats(f)
    np.testing.assert_allclose(cov.numpy(), np.cov(f.double().numpy(), rowvar=False), rtol=1e-12)
    np.testing.assert_allclose(mu.numpy(), f.double().numpy().mean(0), rtol=1e-12)
    with raises_user_error("needs at least 2 samples per set (got 1)", "raise --n"):
        gaussian_stats(f[:1])


def test_class_fidelity_counts_samples_classified_as_requested():
    centres = torch.eye(3) * 10
    train = torch.cat([centres[c] + 0.1 * torch.randn(20, 3) for c in range(3)])
    labels = torch.arange(3).repeat_interleave(20)
    samples = centres[[0, 0, 1, 2]] + 0.1 * torch.randn(4, 3)
    res = class_fidelity(train, labels, samples, torch.tensor([0, 1, 1, 2]), k=5)
    assert res["class_fidelity"] == pytest.approx(75.0)
    assert res["per_class"] == {0: 100.0, 1: 50.0, 2: 100.0}


def test_heldout_velocity_error_is_zero_for_the_exact_field_and_the_target_energy_for_zero():
    from selfsup.flow.metrics import heldout_velocity_error

    mu = torch.tensor([0.5, -1.0, 0.25], dtype=torch.float64)
    x0 = mu.expand(6, 3).clone()
    y = torch.zeros(6, dtype=torch.long)
    exact = heldout_velocity_error(point_field(mu), x0, y, seed=3, batch_size=4)
    assert exact["val"] < 1e-20 and len(exact["per_level"]) == 7
    zero = heldout_velocity_error(lambda x, t, y: torch.zeros_like(x), x0, y, levels=(0.2, 0.9), seed=3)
    eps = torch.randn(6, 3, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    expected = (eps - x0).square().mean().item()  # the target ε − x₀ at every level, the same noise
    assert zero["per_level"] == pytest.approx({0.2: expected, 0.9: expected}, rel=1e-12)
    assert zero["val"] == pytest.approx(expected, rel=1e-12)


def test_metric_classifier_learns_a_separable_toy_and_is_seeded():
    from selfsup.flow.metrics import classifier_features, fit_metric_classifier

    gen = torch.Generator().manual_seed(0)
    labels = torch.arange(200) % 2
    images = torch.randint(0, 60, (200, 1, 8, 8), generator=gen, dtype=torch.uint8)
    images[labels == 1, :, :4] += 150  # class 1: a bright top half
    a = fit_metric_classifier(images, labels, 2, epochs=15, batch_size=50, seed=1)
    b = fit_metric_classifier(images, labels, 2, epochs=15, batch_size=50, seed=1)
    assert (a(images).argmax(1) == labels).float().mean() == 1.0
    fa, fb = classifier_features(a, images, 64), classifier_features(b, images, 64)
    assert fa.shape == (200, 128) and torch.equal(fa, fb)
