"""W-MSE: the step as w_mse.py (the head once on all views, permutations from the step's generator, whitening per
view and chunk), the collapse signs, the code's lr schedules, and one-line config errors."""

from __future__ import annotations

import math

import torch

from selfsup.losses import wmse_loss
from ssl_helpers import random_views, raises_user_error, tiny_method


def wmse(**extra):
    return tiny_method("wmse", extra, data={"batch_size": 16}).train()


def test_forward_is_the_loss_of_the_step_generators_permutations():
    m = wmse(w_iter=2)
    rows = []
    m.projector.register_forward_hook(lambda mod, inp, out: rows.append(inp[0].shape[0]))
    v = random_views(16)
    out = m.forward_views(v)
    assert rows == [32]  # the head (its BN) sees both views at once
    g = torch.Generator().manual_seed(m.cfg.trainer.seed)  # what rng() gives outside fit
    perms = [torch.randperm(16, generator=g) for _ in range(2)]
    with torch.no_grad():
        h = m.projector(torch.cat([m.backbone(x) for x in v])).chunk(2)
    torch.testing.assert_close(out.loss.detach(), wmse_loss(list(h), perms, 8), rtol=1e-5, atol=1e-6)
    assert not torch.equal(perms[0], perms[1])
    out.loss.backward()
    assert all(p.grad is not None for p in m.projector.parameters())


def test_collapse_sign_is_the_condition_number_of_the_whitened_covariance():
    m = wmse(w_size=16)
    signs = m.forward_views(random_views(16)).instruments
    assert set(signs) == {"wmse_cov_condition"}
    g = torch.Generator().manual_seed(m.cfg.trainer.seed)
    h = torch.randn(16, 4, generator=g) @ torch.diag(torch.tensor([1.0, 1.0, 1.0, 1e-2]))
    cond = m.collapse_signs(h, torch.arange(16), 16)["wmse_cov_condition"]
    ev = torch.linalg.eigvalsh(torch.cov(h.t()))
    torch.testing.assert_close(cond, ev[-1] / ev[0])
    assert cond > 1e3  # a nearly collapsed dimension


def test_config_errors_are_one_line():
    with raises_user_error("method.w_size=32", "data.batch_size=16"):
        tiny_method("wmse", {"w_size": 32}, data={"batch_size": 16})
    with raises_user_error("method.w_size=6", "data.batch_size=16"):
        tiny_method("wmse", {"w_size": 6}, data={"batch_size": 16})
    with raises_user_error("method.w_size=8", "method.emb=8"):
        tiny_method("wmse", {"w_size": 8, "emb": 8}, data={"batch_size": 16})
    with raises_user_error("method.w_size=16", "method.emb=64", "data.batch_size"):
        tiny_method("wmse", {"w_size": None, "emb": 64}, data={"batch_size": 16})
    with raises_user_error("method.lr_schedule"):
        tiny_method("wmse", {"lr_schedule": "linear"})


def test_the_codes_lr_schedules():
    m = wmse(lr_schedule="step", warmup_iters=5, lr_drops=[2, 1])
    m.steps_per_epoch, m.max_epochs, peak = 10, 4, m.cfg.optim.base_lr * 16 / 256

    def lr_at(step):
        return m.schedule(step, step // 10).lr

    assert math.isclose(lr_at(0), peak / 5) and math.isclose(lr_at(4), peak)  # (k + 1) / warmup
    assert math.isclose(lr_at(19), peak) and math.isclose(lr_at(20), peak * 0.2)  # epoch E - 2 = 2
    assert math.isclose(lr_at(30), peak * 0.04)
    m.cfg.method.lr_schedule = "cos"
    assert math.isclose(lr_at(20), peak * 0.5 * (1 + math.cos(math.pi * 2 / 4)))
