"""LeJEPA and SIGReg against an independent re-implementation of rbalestr-lab/lejepa written here from its code's
facts (docs/JEPA.md §2): nothing of the official package is imported.

- SIGReg: MINIMAL.md's ``SIGReg`` module (:57-75) and the library's ``EppsPulley`` + ``SlicingUnivariateTest``
  (univariate/epps_pulley.py:62-99, multivariate/slicing.py:119-153, the slices from a generator seeded by the
  step counter), values and gradients;
- the predictive term and the single trade-off (MINIMAL.md:172-174);
- the schedule: torch's own ``LinearLR`` → ``CosineAnnealingLR`` in a ``SequentialLR``, as MINIMAL.md:157-161 builds
  it, at every iteration;
- three whole training steps on the same tensors (backbone, BatchNorm projector, AdamW with weight decay on
  every tensor);
- two processes (gloo): the all-reduce of the characteristic functions (AVG, with gradient, × world size),
  the slices the same on every process, and a step of two processes equal to one on the concatenated batch.
"""

from __future__ import annotations

import copy
import math
import os
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch import nn

from selfsup.distributed import all_reduce_mean_with_grad
from selfsup.losses import epps_pulley_grid, lejepa_loss, lejepa_predictive, sigreg, sigreg_slices

from spawn import spawn_and_join
from ssl_helpers import batchnorm_eval, raises_user_error, tiny_method

WORLD, TIMEOUT_S = 2, 240


# ----------------------------------------------------------------------------- the reference (official facts)
class RefSIGReg(nn.Module):
    """MINIMAL.md:57-75, the slices passed in (the code draws them on the GPU without a generator)."""

    def __init__(self, knots=17):
        super().__init__()
        t = torch.linspace(0, 3, knots, dtype=torch.float32)
        dt = 3 / (knots - 1)
        weights = torch.full((knots,), 2 * dt, dtype=torch.float32)
        weights[[0, -1]] = dt
        window = torch.exp(-t.square() / 2.0)
        self.register_buffer("t", t)
        self.register_buffer("phi", window)
        self.register_buffer("weights", weights * window)

    def forward(self, proj, A):
        x_t = (proj @ A).unsqueeze(-1) * self.t
        err = (x_t.cos().mean(-3) - self.phi).square() + x_t.sin().mean(-3).square()
        statistic = (err @ self.weights) * proj.size(-2)
        return statistic.mean()


def ref_library_sigreg(x, num_slices, global_step, t_max=3.0, n_points=17, world_size=1, avg=None):
    """EppsPulley(t_max, n_points) inside SlicingUnivariateTest(num_slices, reduction='mean') (no clipping)."""
    g = torch.Generator(device=x.device)
    g.manual_seed(global_step)
    A = torch.randn((x.size(-1), num_slices), device=x.device, generator=g)
    A /= A.norm(p=2, dim=0)
    t = torch.linspace(0, t_max, n_points, dtype=torch.float32)
    dt = t_max / (n_points - 1)
    weights = torch.full((n_points,), 2 * dt, dtype=torch.float32)
    weights[[0, -1]] = dt
    phi = t.square().mul_(0.5).neg_().exp_()
    weights = weights * phi
    x = x @ A
    N = x.size(-2)
    x_t = x.unsqueeze(-1) * t
    cos_mean, sin_mean = torch.cos(x_t).mean(-3), torch.sin(x_t).mean(-3)
    if avg is not None:
        cos_mean, sin_mean = avg(cos_mean), avg(sin_mean)
    err = (cos_mean - phi).square() + sin_mean.square()
    return ((err @ weights) * N * world_size).mean()


def ref_lejepa_loss(net_backbone, net_proj, vs, A, lamb):
    """MINIMAL.md:91-93, :171-174: vs (N, V, C, H, W)."""
    N, V = vs.shape[:2]
    emb = net_backbone(vs.flatten(0, 1))
    proj = net_proj(emb).reshape(N, V, -1).transpose(0, 1)
    inv_loss = (proj.mean(0) - proj).square().mean()
    sigreg_loss = RefSIGReg()(proj, A)
    return sigreg_loss * lamb + inv_loss * (1 - lamb), sigreg_loss, inv_loss


# ----------------------------------------------------------------------------- SIGReg
def test_sigreg_is_minimals_and_the_librarys():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(3, 64, 16, generator=g) * 1.3 + 0.2
    A = sigreg_slices(16, 32, torch.Generator().manual_seed(5))
    torch.testing.assert_close(sigreg(z, A), RefSIGReg()(z, A), rtol=1e-6, atol=1e-6)
    # the library: slices from a generator seeded by the step counter; the same numbers from the same seed
    ours = sigreg(z[0], sigreg_slices(16, 100, torch.Generator().manual_seed(7)))
    torch.testing.assert_close(ours, ref_library_sigreg(z[0], 100, 7), rtol=1e-6, atol=1e-6)
    ours = sigreg(z, sigreg_slices(16, 100, torch.Generator().manual_seed(7)), t_max=5.0, knots=21)
    torch.testing.assert_close(ours, ref_library_sigreg(z, 100, 7, t_max=5.0, n_points=21), rtol=1e-6, atol=1e-6)


def test_sigreg_gradients_and_values_by_hand():
    z = torch.randn(128, 8, generator=torch.Generator().manual_seed(1), requires_grad=True)
    A = sigreg_slices(8, 16, torch.Generator().manual_seed(2))
    zr = z.detach().clone().requires_grad_(True)
    sigreg(z, A).backward()
    RefSIGReg()(zr, A).backward()
    torch.testing.assert_close(z.grad, zr.grad, rtol=1e-5, atol=1e-7)
    # the grid: trapezoid weights 2dt (dt at both ends) times exp(-t^2/2) on linspace(0, 3, 17)
    t, phi, w = epps_pulley_grid()
    assert t[-1] == 3 and len(t) == 17 and phi[0] == 1
    torch.testing.assert_close(w[1], torch.tensor(2 * 3 / 16 * math.exp(-(3 / 16) ** 2 / 2)))
    torch.testing.assert_close(w[0], torch.tensor(3 / 16))
    # a point mass at 0: err = (1 - phi)^2 per knot, times N
    zero = torch.zeros(10, 8)
    torch.testing.assert_close(sigreg(zero, A), (((1 - phi) ** 2) @ w) * 10)
    # slices are unit columns
    torch.testing.assert_close(A.norm(dim=0), torch.ones(16))


def test_sigreg_is_near_zero_for_a_gaussian_and_large_for_a_collapse():
    g = torch.Generator().manual_seed(3)
    A = sigreg_slices(16, 64, g)
    gauss = sigreg(torch.randn(4096, 16, generator=g), A)
    collapsed = sigreg(torch.randn(4096, 1, generator=g).expand(4096, 16) * 0.01, A)
    assert gauss < 2 and collapsed > 100 * gauss


def test_the_predictive_term_and_the_trade_off():
    z = torch.randn(4, 16, 8, generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(lejepa_predictive(z, 4), (z.mean(0) - z).square().mean())
    # the centre is the global views' mean; every view is compared with it
    torch.testing.assert_close(lejepa_predictive(z, 2), (z[:2].mean(0) - z).square().mean())
    assert lejepa_loss(torch.tensor(2.0), torch.tensor(10.0), 0.02) == pytest.approx(10 * 0.02 + 2 * 0.98)


# ----------------------------------------------------------------------------- the method
def lejepa(extra=None, **sections):
    return tiny_method("lejepa", extra, **sections)


def stand_in_trainer(method, step, epoch):
    method._trainer = SimpleNamespace(global_step=step, current_epoch=epoch, optimizers=[getattr(method, "_opt", None)],
                                      accumulate_grad_batches=1,
                                      fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(
                                          batch_progress=SimpleNamespace(current=SimpleNamespace(completed=0)))))


def views_of(seed, n=16, v=2):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, 1, 8, 8, generator=g) for _ in range(v)]


def test_the_schedule_is_torchs_sequential_lr_as_minimal_builds_it():
    m = lejepa(optim={"base_lr": 2e-3, "min_lr": 1e-3, "warmup_epochs": 1}, data={"batch_size": 256})
    m.total_steps, m.steps_per_epoch, m.max_epochs = 40, 8, 5
    p = nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([p], lr=2e-3)
    s1 = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.01, total_iters=8)
    s2 = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=40 - 8, eta_min=1e-3)
    sched = torch.optim.lr_scheduler.SequentialLR(opt, schedulers=[s1, s2], milestones=[8])
    for step in range(40):
        assert m.schedule(step, step // 8).lr == pytest.approx(opt.param_groups[0]["lr"], rel=1e-6), step
        opt.step()
        sched.step()


def test_the_step_is_minimals_loss_and_nothing_is_stopped():
    m = lejepa()
    m.train()
    ref = copy.deepcopy(m)
    views = views_of(0)
    A = sigreg_slices(8, 16, torch.Generator().manual_seed(9))
    out = m.forward_views(views, A)
    vs = torch.stack(views, dim=1)
    loss, sig, inv = ref_lejepa_loss(ref.backbone, ref.projector, vs, A, 0.02)
    torch.testing.assert_close(out.loss, loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.scalars["sigreg"], sig.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.scalars["predictive"], inv.detach(), rtol=1e-5, atol=1e-6)
    out.loss.backward()
    loss.backward()
    scale = max(q.grad.abs().max().item() for q in ref.parameters() if q.grad is not None)
    for (name, p), (_, q) in zip(m.named_parameters(), ref.named_parameters()):
        if p.grad is not None or q.grad is not None:
            # the backbone sees the views in another order (MINIMAL: sample-major): float rounding only
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5 * scale, msg=name)
    assert not m.momentum_pairs and not m.post_step_hooks  # no teacher, no EMA


def test_local_views_are_compared_with_the_global_centre():
    m = lejepa(augment={"local_crops_number": 2, "local_crops_size": 4})
    assert m.n_global == 2 and len(m.augment.sizes) == 4
    views = views_of(1)[:2] + [torch.randn(16, 1, 4, 4, generator=torch.Generator().manual_seed(s)) for s in (3, 4)]
    A = sigreg_slices(8, 16, torch.Generator().manual_seed(9))
    m.train()
    out = m.forward_views(views, A)
    with torch.no_grad():
        z = m.projector(torch.cat([m.backbone(v) for v in views])).view(4, 16, -1)
    torch.testing.assert_close(out.scalars["predictive"], (z[:2].mean(0) - z).square().mean(), rtol=1e-5,
                               atol=1e-6)


def test_three_training_steps_are_minimals():
    """Steps 0-2 (the warm-up from 0.01 x the lr): the method through its own hook and optimiser; the reference:
    MINIMAL.md's loop body with AdamW (weight decay on every tensor) and torch's schedulers."""
    m = lejepa(optim={"base_lr": 2e-3, "min_lr": 1e-3, "weight_decay": 0.05, "warmup_epochs": 1, "fused": False,
                      "decay_1d": True}, model={"stop_grad_conv1": False}, data={"batch_size": 256})
    m.total_steps, m.steps_per_epoch, m.max_epochs = 6, 2, 3
    m.train()
    ref = copy.deepcopy(m)
    m._opt = m.configure_optimizers()
    params = [p for p in [*ref.backbone.parameters(), *ref.projector.parameters()] if p.requires_grad]
    opt = torch.optim.AdamW([{"params": params, "lr": 2e-3, "weight_decay": 5e-2}])
    s1 = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.01, total_iters=2)
    s2 = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=4, eta_min=1e-3)
    sched = torch.optim.lr_scheduler.SequentialLR(opt, schedulers=[s1, s2], milestones=[2])
    for step in range(3):
        views = views_of(20 + step)
        A = sigreg_slices(8, 16, torch.Generator().manual_seed(step))
        stand_in_trainer(m, step, step // 2)
        m.on_train_batch_start(None, step)
        m._opt.zero_grad(set_to_none=True)
        loss = m.forward_views(views, A).loss
        loss.backward()
        m._opt.step()
        ref_loss = ref_lejepa_loss(ref.backbone, ref.projector, torch.stack(views, 1), A, 0.02)[0]
        opt.zero_grad()
        ref_loss.backward()
        opt.step()
        sched.step()
        torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    # Values whose gradient is zero in exact arithmetic: the biases feeding a BatchNorm (the projector's hidden
    # Linears; the backbone's final norm bias, whose shift reaches only the first of them), the running means they
    # move, the keys' third of each qkv bias (softmax ignores it). Their rounding noise, which the two orders of the
    # views (MINIMAL: sample-major) make differ, moves them by up to the lr per Adam step: not compared.
    noise = ("projector.0.bias", "projector.3.bias", "backbone.norm.bias", "projector.1.running_mean",
             "projector.4.running_mean")
    d = m.backbone.embed_dim
    for (name, p), (_, q) in zip(m.state_dict().items(), ref.state_dict().items()):
        if name in noise:
            continue
        if name.endswith("qkv.bias"):
            p, q = torch.cat([p[:d], p[2 * d:]]), torch.cat([q[:d], q[2 * d:]])
        torch.testing.assert_close(p, q, rtol=1e-4, atol=3e-5, msg=name)


def test_slices_are_new_each_step_and_do_not_depend_on_the_rank():
    m = lejepa()
    stand_in_trainer(m, 3, 0)
    a, b = m.slices("cpu"), m.slices("cpu")
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    stand_in_trainer(m, 4, 0)
    assert not torch.allclose(m.slices("cpu"), a)
    assert "world" not in m.slice_seed.__code__.co_names  # the seed names no rank


def test_the_collapse_sign_is_one_for_a_point_mass():
    m = lejepa()
    m.eval()
    with torch.no_grad():
        for p in m.projector[-1].parameters():
            p.zero_()
    out = m.forward_views(views_of(2), sigreg_slices(8, 16, torch.Generator().manual_seed(0)))
    assert out.instruments["lejepa_sigreg_over_point_mass"].item() == pytest.approx(1.0, rel=1e-5)


def test_user_errors():
    with raises_user_error("method.lamb"):
        lejepa({"lamb": 1.5})
    with raises_user_error("method.knots"):
        lejepa({"knots": 16})


# ----------------------------------------------------------------------------- two processes
B = 16


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(B, 8, generator=g)[rank * B // WORLD:(rank + 1) * B // WORLD].requires_grad_(True)
        A = sigreg_slices(8, 16, torch.Generator().manual_seed(1))
        value = sigreg(x, A, mean=all_reduce_mean_with_grad, world_size=WORLD)
        value.backward()
        m = batchnorm_eval(lejepa())
        stand_in_trainer(m, 7, 0)
        slices = m.slices("cpu")
        views = [v[rank * B // WORLD:(rank + 1) * B // WORLD] for v in views_of(5, n=B)]
        ddp = nn.parallel.DistributedDataParallel(_Loss(m, slices), broadcast_buffers=False)
        loss = ddp(*views)
        loss.backward()
        grads = {n: p.grad.detach().clone() for n, p in m.named_parameters() if p.grad is not None}
        torch.save({"sigreg": value.detach(), "x_grad": x.grad, "slices": slices, "loss": loss.detach(),
                    "grads": grads}, os.path.join(out_dir, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


class _Loss(nn.Module):
    def __init__(self, method, slices):
        super().__init__()
        self.method, self.slices = method, slices

    def forward(self, *views):
        return self.method.forward_views(list(views), self.slices).loss


@pytest.fixture(scope="module")
def ddp_results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ddp_lejepa")
    spawn_and_join(_worker, (str(tmp / "rendezvous"), str(tmp)), WORLD, TIMEOUT_S, poll_s=2)
    return [torch.load(tmp / f"{r}.pt") for r in range(WORLD)]


@pytest.mark.spawn
def test_sigreg_across_two_processes_is_the_global_batchs(ddp_results):
    """epps_pulley.py:91-99: the batch means all-reduced (AVG), the statistic times N · world size: every process
    holds the global batch's statistic; torch.distributed.nn's AVG backward averages the gradient over the
    processes, so each process's gradient of its rows is the world size times their share of the one-process
    gradient, which DDP's averaging of the parameter gradients brings back to it."""
    x = torch.randn(B, 8, generator=torch.Generator().manual_seed(0)).requires_grad_(True)
    A = sigreg_slices(8, 16, torch.Generator().manual_seed(1))
    value = sigreg(x, A)
    value.backward()
    for rank, r in enumerate(ddp_results):
        torch.testing.assert_close(r["sigreg"], value.detach(), rtol=1e-5, atol=1e-6)
        rows = slice(rank * B // WORLD, (rank + 1) * B // WORLD)
        torch.testing.assert_close(r["x_grad"], WORLD * x.grad[rows], rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(ddp_results[0]["slices"], ddp_results[1]["slices"], rtol=0, atol=0)


@pytest.mark.spawn
def test_a_step_of_two_processes_is_one_processs(ddp_results):
    m = batchnorm_eval(lejepa())
    stand_in_trainer(m, 7, 0)
    loss = m.forward_views(views_of(5, n=B), m.slices("cpu")).loss
    loss.backward()
    grads = {n: p.grad for n, p in m.named_parameters() if p.grad is not None}
    torch.testing.assert_close(sum(r["loss"] for r in ddp_results) / WORLD, loss.detach(), rtol=1e-5, atol=1e-6)
    for r in ddp_results:
        assert sorted(r["grads"]) == sorted(grads)
        for n, g in grads.items():
            torch.testing.assert_close(r["grads"][n], g, rtol=1e-4, atol=1e-5 * g.abs().max().item() + 1e-9, msg=n)
