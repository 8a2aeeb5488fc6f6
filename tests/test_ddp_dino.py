"""DINO under two-process CPU DDP (gloo) against one process on the concatenated batch, with a multi-crop plan.

A fixed global batch of 16 samples (2 global crops of 8 px, 2 local crops of 4 px) is split in rank order.
Each rank wraps DINO in DistributedDataParallel and runs one ``forward_views`` + backward. The mean of the
ranks' losses must equal the single-process loss (the loss is a mean of per-pair batch means), the
DDP-averaged gradients the single-process gradients, and the centre after the step the single-process
centre on every rank: the centre's batch mean is all-reduced over the processes (main_dino.py:406-416). A
run whose all-reduce is skipped keeps the loss and gradient but its centre differs: the test can see it.
(No BatchNorm and no drop path in this model: everything else is the same on every rank.)
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn

from spawn import spawn_and_join
from ssl_helpers import ViewsLoss
import pytest

pytestmark = pytest.mark.spawn  # tests/tiers.py

WORLD, BATCH, TIMEOUT_S = 2, 16, 240


def fixed_views() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(99)
    return [torch.randn(BATCH, 1, s, s, generator=g) for s in (8, 8, 4, 4)]


def method():
    from ssl_helpers import tiny_dino as dino

    torch.manual_seed(0)
    m = dino().train()
    with torch.no_grad():
        m.center.copy_(torch.linspace(-0.1, 0.1, m.center.shape[1]))
        for p in m.teacher_head.parameters():  # a teacher other than the student
            p.mul_(0.9)
    return m


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        import selfsup.methods.dino as dino_module

        views = [v[rank * BATCH // WORLD:(rank + 1) * BATCH // WORLD] for v in fixed_views()]
        for variant in ("dino", "no_all_reduce"):
            correct = dino_module.all_reduce_sum
            if variant == "no_all_reduce":
                dino_module.all_reduce_sum = lambda x: x
            m = method()
            ddp = nn.parallel.DistributedDataParallel(ViewsLoss(m), broadcast_buffers=False)
            loss = ddp(*views)
            loss.backward()
            dino_module.all_reduce_sum = correct
            grads = {n: p.grad.detach().clone() for n, p in m.named_parameters() if p.grad is not None}
            torch.save({"loss": loss.detach(), "grads": grads, "center": m.center.clone()},
                       os.path.join(out_dir, f"{variant}-{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_dino_ddp_matches_one_process(tmp_path):
    spawn_and_join(_worker, (str(tmp_path / "rendezvous"), str(tmp_path)), WORLD, TIMEOUT_S, poll_s=2)
    results = {v: [torch.load(tmp_path / f"{v}-{r}.pt") for r in range(WORLD)] for v in ("dino", "no_all_reduce")}
    m = method()
    ref_loss = m.forward_views(fixed_views()).loss
    ref_loss.backward()
    ref_grads = {n: p.grad for n, p in m.named_parameters() if p.grad is not None}
    losses = [r["loss"] for r in results["dino"]]
    assert not torch.allclose(losses[0], losses[1])
    torch.testing.assert_close(sum(losses) / WORLD, ref_loss.detach(), rtol=1e-5, atol=1e-6)
    for r in results["dino"]:
        assert sorted(r["grads"]) == sorted(ref_grads) and len(ref_grads) > 0
        for n, g in ref_grads.items():
            torch.testing.assert_close(r["grads"][n], g, rtol=1e-4, atol=1e-5 * g.abs().max().item() + 1e-9)
        torch.testing.assert_close(r["center"], m.center, rtol=1e-5, atol=1e-7)
    wrong = [r["center"] for r in results["no_all_reduce"]]
    assert not torch.allclose(wrong[0], m.center, rtol=1e-3, atol=1e-5)
    assert not torch.allclose(wrong[0], wrong[1])  # each rank kept its own centre
