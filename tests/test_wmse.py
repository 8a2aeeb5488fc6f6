"""W-MSE: the step as w_mse.py (the head once on all views, permutations from the step's generator, whitening per
view and chunk), the collapse signs, the code's lr schedules, and one-line config errors."""

from __future__ import annotations

import math

import torch

from selfsup.losses import wmse_loss
from ssl_helpers import random_views, raises_user_error, tiny_method
import pytest


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
    # set after iteration 19 from its position 19 / 10 (train.py scheduler.step(ep + n_iter / iters))
    assert math.isclose(lr_at(20), peak * 0.5 * (1 + math.cos(math.pi * 1.9 / 4)))


def official_lrs(peak, epochs, spe, schedule, warmup=500, drops=(50, 25), gamma=0.2, eta_min=0.0):
    """The lr of each iteration as htdt/self-supervised train.py runs it, with torch's own schedulers: Adam at
    ``lr``; MultiStepLR(milestones = [E − d]) stepped after each epoch, or CosineAnnealingWarmRestarts(T_0 = E)
    stepped with ``ep + n_iter / iters`` after each iteration once the warm-up is over; the warm-up sets every
    group's lr to ``lr · (k + 1) / warmup`` before each of the first ``warmup`` iterations."""
    from torch.optim.lr_scheduler import CosineAnnealingWarmRestarts, MultiStepLR

    opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=peak)
    if schedule == "step":
        sched = MultiStepLR(opt, milestones=[epochs - d for d in drops], gamma=gamma)
    else:
        sched = CosineAnnealingWarmRestarts(opt, T_0=epochs, T_mult=1, eta_min=eta_min)
    done, lrs = (0 if warmup else 500), []
    for ep in range(epochs):
        for n_iter in range(spe):
            if done < 500:  # train.py's warm-up counter: 500 iterations, (k + 1) / 500
                opt.param_groups[0]["lr"] = peak * (done + 1) / 500
                done += 1
            lrs.append(opt.param_groups[0]["lr"])
            if schedule == "cos" and done >= 500:
                sched.step(ep + n_iter / spe)
        if schedule == "step":
            sched.step()
    return lrs


def test_the_step_and_cos_schedules_are_the_codes_at_every_iteration():
    """The three ways a short run meets the code's schedule (issue 37): a run shorter than 50 epochs never reaches
    the negative milestones (no drop: the lr stays at its peak, not at 4% of it); a drop reached inside the 500
    warm-up iterations is overwritten by the warm-up and never comes back; a drop after it acts. The cosine is
    set after each iteration from that iteration's position."""
    import warnings

    warnings.filterwarnings("ignore", message=".*lr_scheduler.step.*")
    for epochs, spe, drops, schedule in ((20, 60, [50, 25], "step"),  # both milestones negative
                                         (60, 60, [50, 25], "step"),  # milestone 10 (600 >= 500), 35
                                         (60, 40, [58, 25], "step"),  # milestone 2 at iteration 80 < 500: lost
                                         (12, 60, [50, 25], "cos"), (30, 7, [50, 25], "cos")):
        m = wmse(lr_schedule=schedule, warmup_iters=500, lr_drops=drops)
        m.steps_per_epoch, m.max_epochs, peak = spe, epochs, m.cfg.optim.base_lr * 16 / 256
        m.cfg.optim.min_lr = 0.0
        want = official_lrs(peak, epochs, spe, schedule, drops=drops)
        got = [m.schedule(step, step // spe).lr for step in range(epochs * spe)]
        for step, (a, b) in enumerate(zip(got, want)):
            assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15), (epochs, spe, drops, schedule, step, a, b)
    m = wmse(lr_schedule="step", warmup_iters=500)
    m.steps_per_epoch, m.max_epochs = 234, 5  # wmse-vit-fmnist's length: 5 epochs, no drop
    assert m.schedule(5 * 234 - 1, 4).lr == m.peak_lr()


def test_the_replaced_conv1_keeps_pytorchs_init_as_the_codes_model_py():
    """get_model makes the 3x3 conv1 after torchvision's init, so it keeps nn.Conv2d's kaiming-uniform (a = √5):
    a bound of 1 / √fan_in; torchvision's kaiming-normal (fan_out) has an sd of √(2 / fan_out)."""
    from selfsup.methods.build import build_method
    from selfsup.methods import DataInfo
    from ssl_helpers import tiny_config

    def conv1(init):
        cfg = tiny_config("wmse", {"conv1_init": init}, data={"batch_size": 16},
                          model={"backbone": "resnet18", "small_stem": True, "stop_grad_conv1": False})
        torch.manual_seed(0)
        return build_method(cfg, DataInfo(3, 8, (0.5,) * 3, (0.25,) * 3)).backbone.conv1.weight.detach()

    code, torchvision_init = conv1("pytorch"), conv1("kaiming_normal")
    fan_in = 3 * 3 * 3
    assert code.abs().max() <= 1 / math.sqrt(fan_in) and code.std() < 0.3 / math.sqrt(fan_in) * 2
    assert math.isclose(float(torchvision_init.std()), math.sqrt(2 / (64 * 9)), rel_tol=0.1)
    with raises_user_error("method.conv1_init"):
        tiny_method("wmse", {"conv1_init": "xavier"})


def _collapse_head(m) -> None:
    """The head's last layer onto one direction: every embedding on a line, a rank-1 covariance."""
    last = [mod for mod in m.projector.modules() if isinstance(mod, torch.nn.Linear)][-1]
    with torch.no_grad():
        last.weight.copy_(last.weight[:1].expand_as(last.weight))


def test_a_collapsed_embedding_stops_in_one_line_naming_the_whitening():
    """Where the code's Cholesky raises a LinAlgError traceback, a collapsed head (rank 1 < emb) ends in one line:
    the whitening, the sub-batch, the collapse and its remedies."""
    m = wmse()
    _collapse_head(m)
    with raises_user_error("W-MSE's whitening failed", "sub-batch of 8 embeddings", "collapsed",
                           "method.w_eps=1e-3", "optim.base_lr"):
        m.forward_views(random_views(16))


@pytest.mark.train
def test_a_run_whose_whitening_fails_ends_collapsed_with_its_checkpoint(tmp_path, monkeypatch):
    import json

    import selfsup.methods.wmse as wmse_module
    from ssl_helpers import assert_user_error, run_cli, tiny_run

    forward = wmse_module.WMSE.forward_views

    def collapse_at_step_1(self, views, perms=None):
        if self.trainer.global_step == 1:
            _collapse_head(self)
        return forward(self, views, perms)

    monkeypatch.setattr(wmse_module.WMSE, "forward_views", collapse_at_step_1)
    code, _, err = run_cli("pretrain", "wmse-digits", *tiny_run(heads=False), "method.emb=16", "method.w_size=32",
                           "trainer.checkpoint_every_n_steps=1", f"output_dir={tmp_path}", "name=r")
    assert_user_error(code, err, "W-MSE's whitening failed at step 1", "the last checkpoint, with finite weights, is "
                      "step 1", only_line=False)
    assert "Traceback" not in err
    facts = json.loads((tmp_path / "r" / "run.json").read_text())
    assert facts["status"] == "collapsed" and facts["reason"].startswith("W-MSE's whitening failed at step 1")
