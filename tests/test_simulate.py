"""Theory simulators: norm-convergence against the paper's table, byol-dynamics against its closed forms, the CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from ssl_helpers import assert_user_error

from selfsup.simulate import byol_dynamics as bd
from selfsup.simulate import norm_convergence as nc

# --------------------------------------------------------------------------- norm-convergence


def test_gradient_matches_autograd():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 7, 5)), rng.standard_normal((2, 7, 5))
    loss, ga, gb = nc.loss_and_grads(a, b, gamma=0.7)
    ta, tb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    ref = -torch.nn.functional.cosine_similarity(ta, tb, dim=-1).mean(-1) + 0.7 * ta.norm(dim=-1).mean(-1)
    ref.sum().backward()
    np.testing.assert_allclose(loss, ref.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(ga, ta.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(gb, tb.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_steps_within_15_percent_of_the_paper():
    cfg = nc.NormConvergenceConfig(seed=0)
    a, b = nc.random_pairs(cfg.n_pairs, cfg.dim, np.random.default_rng(cfg.seed))
    norms = [0.5, 1.0, 2.0, 4.0]
    scale = np.array(norms)[:, None, None]
    steps, _ = nc.steps_to_converge(a * scale, b * scale, cfg.lr, cfg.tol, 0.0, 5000)
    for r, s in zip(norms, steps):
        assert s is not None and abs(s / nc.PAPER_STEPS[r] - 1) <= 0.15, (r, s, nc.PAPER_STEPS[r])
    assert abs(nc.fitted_exponent(norms, steps) - 2) < 0.1


def test_large_penalty_never_converges_and_small_one_speeds_up():
    cfg = nc.NormConvergenceConfig()
    a, b = nc.random_pairs(cfg.n_pairs, cfg.dim, np.random.default_rng(0))
    a, b = np.stack([a, a]) * 2.0, np.stack([b, b]) * 2.0
    base, _ = nc.steps_to_converge(a[:1], b[:1], cfg.lr, cfg.tol, 0.0, 5000)
    small, _ = nc.steps_to_converge(a[:1], b[:1], cfg.lr, cfg.tol, 1.0, 5000)
    big, _ = nc.steps_to_converge(a[:1], b[:1], cfg.lr, cfg.tol, 10.0, 3000, patience=500)
    assert small[0] < base[0] and big == [None]


def test_unit_norm_steps_follow_the_angle_law():
    cfg = nc.NormConvergenceConfig()
    a, b = nc.pairs_at_angle(cfg.n_pairs, cfg.dim, math.radians(90), np.random.default_rng(1))
    assert np.allclose((a * b).sum(-1), 0.0, atol=1e-12) and np.allclose(np.linalg.norm(b, axis=-1), 1.0)
    steps, _ = nc.steps_to_converge(a[None], b[None], cfg.lr, cfg.tol, 0.0, 5000)
    assert abs(steps[0] / nc.predicted_steps(1.0, math.pi / 2, cfg) - 1) < 0.05


# --------------------------------------------------------------------------- byol-dynamics


def test_invariant_decays_exactly_as_exp_minus_2_eta_t():
    cfg = bd.ByolDynamicsConfig(alpha_p=2.0, sigma2=0.5, eta=0.03)
    t, p, s, _ = bd.integrate(cfg, (0.4, 0.3, 0.2), 60.0, beta=0.1)  # BYOL, tau moving
    c = p * p / cfg.alpha_p - s
    np.testing.assert_allclose(c, c[0] * np.exp(-2 * cfg.eta * t), rtol=1e-6, atol=1e-9)
    t, p, s, _ = bd.integrate(cfg, (0.4, 0.3, 1.0), 60.0, beta=None, eta=0.0)  # no weight decay: conserved
    np.testing.assert_allclose(p * p / cfg.alpha_p - s, (0.16 / 2.0 - 0.3), rtol=1e-6)


def test_fixed_points_against_the_closed_form():
    sigma2, eta, tau = 0.5, 0.04, 0.8
    cfg = bd.ByolDynamicsConfig(alpha_p=1.0, sigma2=sigma2, eta=eta)
    root = math.sqrt(tau ** 2 - 4 * eta * (1 + sigma2))
    p_minus, p_plus = (tau - root) / 3.0, (tau + root) / 3.0
    assert bd.fixed_points(tau, sigma2, eta) == pytest.approx([0.0, p_minus, p_plus])
    t_end = 80 / eta
    assert bd.on_parabola(cfg, 1.1 * p_minus, tau, t_end, eta) == pytest.approx(p_plus, rel=1e-6)
    assert bd.on_parabola(cfg, 1.0, tau, t_end, eta) == pytest.approx(p_plus, rel=1e-6)
    assert abs(bd.on_parabola(cfg, 0.9 * p_minus, tau, t_end, eta)) < 1e-6
    assert bd.basin_edge(cfg, tau, eta, iters=30) == pytest.approx(p_minus, rel=1e-4)


def test_collapse_above_the_eta_threshold():
    cfg = bd.ByolDynamicsConfig(sigma2=1.0)
    thr = bd.eta_threshold(1.0, 1.0)
    assert thr == pytest.approx(0.125)
    assert bd.fixed_points(1.0, 1.0, 1.01 * thr) == [0.0]
    _, p, s, _ = bd.integrate(cfg, (2.0, 4.0, 1.0), 400.0, beta=None, eta=1.1 * thr)
    assert abs(p[-1]) < 1e-4 and s[-1] < 1e-4
    _, p, s, _ = bd.integrate(cfg, (2.0, 4.0, 1.0), 400.0, beta=None, eta=0.9 * thr)
    assert p[-1] == pytest.approx(bd.fixed_points(1.0, 1.0, 0.9 * thr)[2], rel=1e-5)


# --------------------------------------------------------------------------- CLI


def test_cli_norm_convergence_writes_json_png_and_table(tmp_path, capsys):
    from selfsup.commands.main import main

    out = tmp_path / "nc"
    assert main(["simulate", "norm-convergence", "--norms", "0.5,1", "--gammas", "1", "--angles", "45,90",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "paper" in printed and "fitted exponent" in printed and "confirmed" in printed
    result = json.loads((out / "norm_convergence.json").read_text())
    assert [r["paper"] for r in result["by_norm"]["rows"]] == [24, 96]
    assert (out / "norm_convergence.png").stat().st_size > 1000
    assert result["checks"][0]["confirmed"]


@pytest.mark.parametrize("argv, message", [
    (["simulate", "nope"], "invalid choice: 'nope'"),
    (["simulate", "norm-convergence", "--lr", "-1"], "--lr=-1.0 must be > 0"),
    (["simulate", "norm-convergence", "--dim", "1"], "--dim=1 must be >= 2"),
    (["simulate", "norm-convergence", "--norms", "1,x"], "not a comma-separated list"),
    (["simulate", "byol-dynamics", "--eta", "-0.5"], "--eta=-0.5 must be >= 0"),
    (["simulate", "byol-dynamics", "--alpha-p", "0"], "--alpha-p=0.0 must be > 0"),
])
def test_cli_bad_input_is_one_line_exit_2(argv, message, capsys, tmp_path):
    from selfsup.commands.main import main

    try:
        rc = main(argv + ["--out", str(tmp_path / "x")] if len(argv) > 2 else argv)
    except SystemExit as e:  # argparse's own errors (unknown name, malformed value)
        rc = e.code
    assert_user_error(rc, capsys.readouterr().err, message)
    assert not (tmp_path / "x").exists()
