"""Predictor choices: DirectPred / DirectCopy formulas, the running correlation F, freq, DDP agreement, config."""

from __future__ import annotations

import math
import pytest
import torch
from torch import nn

from selfsup.errors import UserError
from selfsup.predictors import (DirectPredConfig, TrackedLinearPredictor, directcopy_weight,
                                       directpred_weight)
from ssl_helpers import assert_user_error, raises_user_error, random_views, run_cli, tiny_config, tiny_method

# --------------------------------------------------------------------------- the formulas against known F


def known_corr(eigenvalues, seed=0):
    """F = Q diag(s) Qᵀ with a random orthogonal Q (float64)."""
    d = len(eigenvalues)
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64))
    return q @ torch.diag(torch.tensor(eigenvalues, dtype=torch.float64)) @ q.T, q


@pytest.mark.parametrize("eps, inside", [(0.01, False), (0.0, False), (0.01, True), (0.3, True)])
def test_directpred_keeps_eigenvectors_and_maps_eigenvalues(eps, inside):
    s = [4.0, 1.0, 0.25, 0.0, -0.1]  # a rank-deficient F with a small negative (numerical) eigenvalue
    corr, q = known_corr(s)
    w = directpred_weight(corr, eps, inside)
    lam = [max(v, 0.0) / 4.0 for v in s]
    if inside:
        expected = [math.sqrt(max(v + eps, 1e-4)) for v in lam]
    else:
        expected = [max(math.sqrt(v) + eps, 1e-4) for v in lam]
    torch.testing.assert_close(w, w.T)
    for i in range(len(s)):  # each eigenvector of F is an eigenvector of W_p with the formula's eigenvalue
        torch.testing.assert_close(w @ q[:, i], expected[i] * q[:, i], atol=1e-10, rtol=1e-9)


def test_directpred_on_zero_and_tiny_correlation_has_no_nan():
    w = directpred_weight(torch.zeros(6, 6, dtype=torch.float64), 0.01)
    torch.testing.assert_close(w, 0.01 * torch.eye(6, dtype=torch.float64))
    w0 = directpred_weight(torch.zeros(6, 6, dtype=torch.float64), 0.0)
    torch.testing.assert_close(w0, 1e-4 * torch.eye(6, dtype=torch.float64))  # the clamp p >= 1e-4
    tiny, q = known_corr([1e-300, 5e-301, 0.0, 0.0])  # scale-free: λ = s / max(s)
    w = directpred_weight(tiny, 0.0)
    assert torch.isfinite(w).all()
    torch.testing.assert_close(w @ q[:, 0], q[:, 0], atol=1e-9, rtol=1e-7)
    rank1 = torch.outer(torch.ones(5, dtype=torch.float64), torch.ones(5, dtype=torch.float64))
    assert torch.isfinite(directpred_weight(rank1, 0.01)).all()


def test_directcopy_norms():
    corr, _ = known_corr([3.0, 2.0, 0.5])
    eye = torch.eye(3, dtype=torch.float64)
    torch.testing.assert_close(directcopy_weight(corr, 0.01), corr + 0.01 * eye)
    torch.testing.assert_close(directcopy_weight(corr, 0.01, "fro"), corr / math.sqrt(9 + 4 + 0.25) + 0.01 * eye)
    torch.testing.assert_close(directcopy_weight(corr, 0.01, "spectral"), corr / 3.0 + 0.01 * eye)
    assert torch.isfinite(directcopy_weight(torch.zeros(3, 3, dtype=torch.float64), 0.0, "fro")).all()


# --------------------------------------------------------------------------- the running correlation


def _step(pred: TrackedLinearPredictor, *views: torch.Tensor) -> None:
    for v in views:
        pred(v)
    pred.after_optimizer_step()


def test_running_correlation_update_by_hand():
    cfg = DirectPredConfig(rho=0.3)
    pred = TrackedLinearPredictor(4, "directpred", cfg).train()
    g = torch.Generator().manual_seed(0)
    a1, a2, b1, b2 = (torch.randn(6, 4, generator=g) for _ in range(4))
    _step(pred, a1, a2)
    fa = torch.cat([a1, a2])
    f1 = fa.T @ fa / 12  # the first step sets F to the batch's mean f fᵀ over both views
    torch.testing.assert_close(pred.correlation, f1)
    torch.testing.assert_close(pred.weight, directpred_weight(f1.double(), 0.01).float())
    _step(pred, b1, b2)
    fb = torch.cat([b1, b2])
    f2 = 0.3 * f1 + 0.7 * (fb.T @ fb / 12)
    torch.testing.assert_close(pred.correlation, f2)
    torch.testing.assert_close(pred.mean, 0.3 * fa.mean(0) + 0.7 * fb.mean(0))
    torch.testing.assert_close(pred.weight, directpred_weight(f2.double(), 0.01).float())
    assert int(pred.steps) == 2
    # no statistics outside training, or without gradient (e.g. an instrument calling the predictor)
    pred.eval()(b1)
    with torch.no_grad():
        pred.train()(b1)
    pred.after_optimizer_step()
    assert int(pred.steps) == 2


def test_zero_mean_subtracts_running_mean_product():
    pred = TrackedLinearPredictor(3, "directcopy", DirectPredConfig(zero_mean=True, eps=0.0)).train()
    f = torch.randn(10, 3, generator=torch.Generator().manual_seed(1)) + 2.0
    _step(pred, f)
    cov = f.T @ f / 10 - torch.outer(f.mean(0), f.mean(0))
    torch.testing.assert_close(pred.weight, cov, atol=1e-5, rtol=1e-5)


def test_a_linear_predictor_is_a_bias_free_square_matrix_with_nn_linears_init():
    """The official predictor is a bias-free nn.Linear(d, d): same single parameter, same initial values."""
    torch.manual_seed(3)
    pred = TrackedLinearPredictor(32, "linear", DirectPredConfig())
    torch.manual_seed(3)
    reference = nn.Linear(32, 32, bias=False)
    assert [name for name, _ in pred.named_parameters()] == ["weight"] and pred.weight.requires_grad
    assert torch.equal(pred.weight, reference.weight)
    z = torch.randn(5, 32)
    torch.testing.assert_close(pred.eval()(z), reference(z))


def test_freq_leaves_gradient_steps_in_between():
    cfg = DirectPredConfig(freq=3)
    torch.manual_seed(0)
    pred = TrackedLinearPredictor(4, "directpred", cfg).train()
    assert pred.weight.requires_grad
    opt = torch.optim.SGD(pred.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(2)
    for step in range(5):
        x, target = torch.randn(8, 4, generator=g), torch.randn(8, 4, generator=g)
        before = pred.weight.detach().clone()
        loss = (pred(x) - target).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        grad = pred.weight.grad.clone()
        opt.step()
        pred.after_optimizer_step()
        if step % 3 == 0:  # steps 0 and 3: set from F
            torch.testing.assert_close(pred.weight, directpred_weight(pred.correlation.double(), 0.01).float())
        else:  # steps 1, 2, 4: an ordinary gradient step
            torch.testing.assert_close(pred.weight, before - 0.1 * grad)


def test_freq_one_gets_no_gradient_and_no_optimizer_group():
    m = tiny_method("byol", {"predictor": "directpred"})
    assert not m.predictor.weight.requires_grad
    out = m.forward_views(random_views(8))
    out.loss.backward()
    assert m.predictor.weight.grad is None
    groups = m.configure_optimizers().param_groups
    assert all(g["name"] != "predictor" for g in groups)


def test_symmetric_predictor_takes_symmetrised_gradient_steps():
    pred = TrackedLinearPredictor(5, "symmetric", DirectPredConfig()).train()
    torch.testing.assert_close(pred.weight, pred.weight.T)
    opt = torch.optim.SGD(pred.parameters(), lr=0.1)
    before = pred.weight.detach().clone()
    (pred(torch.randn(3, 5)) * torch.randn(3, 5)).sum().backward()
    grad = pred.weight.grad.clone()
    assert not torch.allclose(grad, grad.T)
    opt.step()
    pred.after_optimizer_step()
    torch.testing.assert_close(pred.weight, before - 0.1 * 0.5 * (grad + grad.T))


@pytest.mark.parametrize("method", ["byol", "simsiam", "moco_v3"])
@pytest.mark.parametrize("kind", ["mlp", "linear", "symmetric", "directpred", "directcopy"])
def test_every_predictor_method_accepts_every_kind(method, kind):
    m = tiny_method(method, {"predictor": kind})
    if kind == "mlp":
        assert isinstance(m.predictor, nn.Sequential)
    else:
        assert isinstance(m.predictor, TrackedLinearPredictor) and m.predictor.weight.shape == (32, 32)
        assert "predictor.correlation" in m.state_dict()
    out = m.forward_views(random_views(8))
    assert torch.isfinite(out.loss) and out.prediction.shape == (8, 32)


def test_predictor_input_dimension_mismatch_is_a_user_error():
    pred = TrackedLinearPredictor(8, "directpred", DirectPredConfig())
    with pytest.raises(UserError, match="8-dim inputs but got 5"):
        pred(torch.randn(2, 5))


@pytest.mark.parametrize("overrides, message", [
    ({"name": "simclr", "predictor": "directpred"}, "simclr has no predictor"),
    ({"predictor": "directpredd"}, "method.predictor='directpredd' is not known"),
    ({"directpred": {"eps": -0.1}}, "method.directpred.eps=-0.1 must be >= 0"),
    ({"directpred": {"freq": 0}}, "method.directpred.freq=0 must be >= 1"),
    ({"directpred": {"rho": 1.0}}, "method.directpred.rho=1.0 must be in"),
    ({"directpred": {"copy_norm": "l1"}}, "copy_norm='l1'"),
])
def test_bad_predictor_config_is_one_line_user_error(overrides, message):
    method = "simclr" if overrides.get("name") == "simclr" else "byol"
    extra = {k: v for k, v in overrides.items() if k != "name"}
    with raises_user_error(message):
        tiny_config(method, extra)


def test_cli_bad_predictor_exits_2_with_one_line():
    code, _, err = run_cli("pretrain", "simclr-digits", "method.predictor=directpred")
    assert_user_error(code, err, "simclr has no predictor")


# --------------------------------------------------------------------------- through the engine


@pytest.mark.train
def test_pretrain_sets_w_from_f_and_checkpoints_f(tmp_path, tiny):
    from selfsup.config import load_run_config
    from selfsup.engine import pretrain

    cfg = load_run_config("byol-directpred-fmnist", tiny + ["data.name=digits", "model.patch_size=2",
                                                             f"output_dir={tmp_path}", "name=dp"])
    run = pretrain(cfg)
    state = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    assert int(state["predictor.steps"]) == 2
    corr = state["predictor.correlation"]
    assert corr.shape == (32, 32) and torch.isfinite(corr).all() and corr.abs().sum() > 0
    torch.testing.assert_close(state["predictor.weight"], directpred_weight(corr.double(), 0.01).float(),
                               atol=1e-6, rtol=1e-5)



def test_state_dict_round_trip_continues_the_same_run():
    """A checkpoint (state_dict) keeps F, μ and the step count: freq=3 sets W_p at steps 0 and 3, the second
    after loading into a fresh predictor, exactly as the uninterrupted one."""
    cfg = DirectPredConfig(freq=3)
    g = torch.Generator().manual_seed(3)
    batches = [torch.randn(6, 4, generator=g) for _ in range(4)]
    straight = TrackedLinearPredictor(4, "directpred", cfg).train()
    for b in batches:
        _step(straight, b)
    first = TrackedLinearPredictor(4, "directpred", cfg).train()
    for b in batches[:2]:
        _step(first, b)
    resumed = TrackedLinearPredictor(4, "directpred", cfg).train()
    _step(resumed, batches[0])  # a fresh process may have stepped before the checkpoint is loaded
    resumed.load_state_dict(first.state_dict())
    for b in batches[2:]:
        _step(resumed, b)
    assert set(straight.state_dict()) == {"weight", "correlation", "mean", "steps"}
    for key, value in straight.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[key], value)
