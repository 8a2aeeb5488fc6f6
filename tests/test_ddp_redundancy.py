"""Two-process gloo DDP against one process on the concatenated batch, for Barlow Twins and VICReg.

A fixed global batch of 16 view pairs is split in rank order (rank r: samples [8r, 8r + 8)); each rank
runs ``forward_views`` + ``backward`` under ``DistributedDataParallel`` and then one LARS step at a fixed lr
(weight decay 0); one process does the same on all 16. As in tests/test_ddp_two_view.py, the projector's hidden
BatchNorm layers are in eval mode on both sides (torch's SyncBatchNorm is GPU-only). Barlow Twins' final
standardisation is not a BN layer but the loss's (statistics of the gathered global batch), so it is
compared in training semantics, with the cross-correlation summed over the processes.

What must hold:
- VICReg: the mean over ranks of the loss (local invariance + global variance / covariance) and the
  DDP-averaged gradient equal one process's (the gather's backward sums the gradients, as the official
  FullGatherLayer).
- Barlow Twins, ``ddp_gradient=global``: every rank's loss and the averaged gradient equal one process's.
- Barlow Twins, ``ddp_gradient=official``: every rank's loss equals one process's, the averaged gradient is
  exactly half of it (1 / world_size, the official all_reduce's), so after the LARS step the weights
  (ndim > 1, trust-ratio normalised) equal one process's while the biases and BN parameters moved half as far.
- And the comparison can fail: VICReg with a gather that passes no gradient keeps the loss, not the gradient.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from torch import nn

from spawn import spawn_and_join
from selfsup.optim import lars_exempt
from ssl_helpers import ViewsLoss, batchnorm_eval, tiny_method

pytestmark = pytest.mark.spawn  # tests/tiers.py

WORLD = 2
BATCH = 16
VARIANTS = {"vicreg": ("vicreg", {}), "bt_global": ("barlow_twins", {"ddp_gradient": "global"}),
            "bt_official": ("barlow_twins", {"ddp_gradient": "official"}),
            "vicreg_detached_gather": ("vicreg", {})}  # wrong on purpose: the gather passes no gradient
LR = 0.05
TIMEOUT_S = 240


def fixed_views() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(4321)
    return [torch.randn(BATCH, 1, 8, 8, generator=g), torch.randn(BATCH, 1, 8, 8, generator=g)]


def build(variant: str) -> nn.Module:
    name, extra = VARIANTS[variant]
    return batchnorm_eval(tiny_method(name, extra, optim={"name": "lars", "weight_decay": 0.0, "lr_1d_mult": 0.5}))


def step(method: nn.Module, loss_fn) -> dict:
    """Loss, backward, one LARS step at lr ``LR`` × the group's scale: loss, gradients, parameters."""
    before = {n: p.detach().clone() for n, p in method.named_parameters()}
    loss = loss_fn()
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in method.named_parameters() if p.grad is not None}
    opt = method.configure_optimizers()
    for group in opt.param_groups:
        group["lr"] = LR * group["lr_scale"]
    opt.step()
    after = {n: p.detach().clone() for n, p in method.named_parameters()}
    return {"loss": loss.detach(), "grads": grads, "before": before, "after": after}


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        x1, x2 = (v[rank * BATCH // WORLD:(rank + 1) * BATCH // WORLD] for v in fixed_views())
        import selfsup.methods.vicreg as vicreg_module
        from selfsup.distributed import gather_no_grad

        correct = vicreg_module.gather_with_grad
        for variant in VARIANTS:
            vicreg_module.gather_with_grad = gather_no_grad if variant == "vicreg_detached_gather" else correct
            method = build(variant)
            ddp = nn.parallel.DistributedDataParallel(ViewsLoss(method))
            torch.save(step(method, lambda ddp=ddp: ddp(x1, x2)), os.path.join(out_dir, f"{variant}-{rank}.pt"))
        vicreg_module.gather_with_grad = correct
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ddp_redundancy")
    spawn_and_join(_worker, (str(tmp / "rendezvous"), str(tmp)), WORLD, TIMEOUT_S, poll_s=5)
    return {v: [torch.load(tmp / f"{v}-{r}.pt") for r in range(WORLD)] for v in VARIANTS}


def reference(variant: str) -> dict:
    assert not dist.is_initialized()
    method = build(variant)
    return step(method, lambda: method.forward_views(fixed_views()).loss)


def close(a, b, name, what, floor=1e-8):
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5 * b.abs().max().item() + floor,
                               msg=lambda m: f"{what} of {name}: {m}")


@pytest.mark.parametrize("variant", ["vicreg", "bt_global", "bt_official"])
def test_ddp_against_one_process(results, variant):
    ref = reference(variant)
    ranks = results[variant]
    losses = [r["loss"] for r in ranks]
    if variant == "vicreg":  # the invariance term is the local batch's: the ranks differ, their mean is the whole
        assert not torch.allclose(losses[0], losses[1])
        torch.testing.assert_close(sum(losses) / WORLD, ref["loss"], rtol=1e-5, atol=1e-6)
    else:  # the loss of the summed cross-correlation: the same on every rank
        for loss in losses:
            torch.testing.assert_close(loss, ref["loss"], rtol=1e-5, atol=1e-6)
    scale = 1 / WORLD if variant == "bt_official" else 1.0
    method = build(variant)  # LARS's exempt group (plain SGD, no trust ratio) moves with the gradient's scale
    exempt = set().union(*(lars_exempt(m) for m in method.trainable().values()))
    exempt = {n for n, p in method.named_parameters() if id(p) in exempt}
    for r in ranks:
        assert sorted(r["grads"]) == sorted(ref["grads"]) and ref["grads"]
        for n, g in ref["grads"].items():
            close(r["grads"][n], g * scale, n, f"rank gradient ({variant})")
        for n, p in ref["after"].items():
            torch.testing.assert_close(r["before"][n], ref["before"][n], rtol=0, atol=0)
            moved, ref_moved = r["after"][n] - r["before"][n], p - ref["before"][n]
            expected = ref_moved * scale if (variant == "bt_official" and n in exempt) else ref_moved
            # a displacement is a difference of parameters: float32 rounding of |p| is its floor
            close(moved, expected, n, f"LARS step ({variant})", floor=4 * torch.finfo().eps * p.abs().max().item())
    if variant == "bt_official":  # the comparison sees the factor: exempt parameters did move, by half
        one_d = [n for n, p in ref["after"].items() if n in exempt and (p - ref["before"][n]).abs().max() > 1e-6]
        assert one_d


def test_a_gather_without_gradient_is_caught(results):
    """The power of the comparison: VICReg with a detached gather keeps the loss but not the gradient."""
    ref = reference("vicreg")
    wrong = results["vicreg_detached_gather"]
    torch.testing.assert_close(sum(r["loss"] for r in wrong) / WORLD, ref["loss"], rtol=1e-5, atol=1e-6)
    err = max(((wrong[0]["grads"][n] - g).abs().max() / g.abs().max().clamp_min(1e-12)).item()
              for n, g in ref["grads"].items())
    assert err > 1e-2
