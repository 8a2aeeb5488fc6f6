"""DINOv2 under two-process CPU DDP (gloo) against one process on the concatenated batch.

A fixed global batch of 16 samples (2 global crops of 8 px, 2 local crops of 4 px) and fixed masks of its 32
global crops are split in rank order (crop-major: rank r holds images r·8 … r·8+7 of both global crops). What the
official code promises across processes (ssl_meta_arch.py, dinov2/loss/*):

- Sinkhorn-Knopp over the global batch, for the [CLS] rows and for the masked patch rows (B = the masked patches
  counted over the processes): the mean of the ranks' losses and the DDP-averaged gradients equal one process's;
  a run whose all-reduce is skipped does not (the test sees it);
- the EMA centres: C over the global batch; C2 the mean over the processes of each one's mean over its masked
  patches (ibot_patch_loss.py:128-151), which this test computes from the one-process teacher outputs.

KoLeo is per process in the official code (its nearest neighbours are the rank's), so it is off here.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn

from spawn import spawn_and_join
import pytest

pytestmark = pytest.mark.spawn  # tests/tiers.py

WORLD, BATCH, TIMEOUT_S = 2, 16, 240
VARIANTS = ("sinkhorn_knopp", "centering", "sinkhorn_no_all_reduce")


def fixed_views() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(99)
    return [torch.randn(BATCH, 1, s, s, generator=g) for s in (8, 8, 4, 4)]


def fixed_masks() -> torch.Tensor:
    from selfsup.data.masks import dinov2_masks

    return dinov2_masks(2 * BATCH, (4, 4), torch.Generator().manual_seed(5)).flatten(1)


def rank_slice(x: torch.Tensor, rank: int) -> torch.Tensor:
    """Rank ``rank``'s crops of a crop-major (2·BATCH, …) tensor."""
    n = BATCH // WORLD
    return torch.cat([x[rank * n:(rank + 1) * n], x[BATCH + rank * n:BATCH + (rank + 1) * n]])


def method(centering: str):
    from ssl_helpers import tiny_method

    torch.manual_seed(0)
    m = tiny_method("dinov2", {"out_dim": 64, "hidden_dim": 32, "bottleneck_dim": 16, "centering": centering,
                               "koleo_loss_weight": 0.0, "warmup_teacher_temp_epochs": 0},
                    data={"batch_size": BATCH}, augment={"local_crops_number": 2, "local_crops_size": 4}).train()
    with torch.no_grad():
        m.center.copy_(torch.linspace(-0.1, 0.1, m.center.shape[1]))
        for p in m.teacher_head.parameters():  # a teacher other than the student
            p.mul_(0.9)
    return m


class StepLoss(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.method = m

    def forward(self, masks, *views):
        return self.method.forward_views(list(views), masks).loss


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        import selfsup.methods.dinov2 as dinov2_module

        n = BATCH // WORLD
        views = [v[rank * n:(rank + 1) * n] for v in fixed_views()]
        masks = rank_slice(fixed_masks(), rank)
        for variant in VARIANTS:
            correct = dinov2_module.all_reduce_sum
            if variant == "sinkhorn_no_all_reduce":
                dinov2_module.all_reduce_sum = lambda x: x
            m = method("centering" if variant == "centering" else "sinkhorn_knopp")
            ddp = nn.parallel.DistributedDataParallel(StepLoss(m), broadcast_buffers=False)
            loss = ddp(masks, *views)
            loss.backward()
            dinov2_module.all_reduce_sum = correct
            grads = {k: p.grad.detach().clone() for k, p in m.named_parameters() if p.grad is not None}
            torch.save({"loss": loss.detach(), "grads": grads, "center": m.center.clone(),
                        "center2": m.center2.clone()}, os.path.join(out_dir, f"{variant}-{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_dinov2_ddp_matches_one_process(tmp_path):
    spawn_and_join(_worker, (str(tmp_path / "rendezvous"), str(tmp_path)), WORLD, TIMEOUT_S, poll_s=2)
    results = {v: [torch.load(tmp_path / f"{v}-{r}.pt") for r in range(WORLD)] for v in VARIANTS}
    masks = fixed_masks()
    for variant in ("sinkhorn_knopp", "centering"):
        m = method(variant)
        ref_loss = m.forward_views(fixed_views(), masks).loss
        ref_loss.backward()
        ref_grads = {k: p.grad for k, p in m.named_parameters() if p.grad is not None}
        losses = [r["loss"] for r in results[variant]]
        assert not torch.allclose(losses[0], losses[1])
        torch.testing.assert_close(sum(losses) / WORLD, ref_loss.detach(), rtol=1e-5, atol=1e-6)
        for r in results[variant]:
            assert sorted(r["grads"]) == sorted(ref_grads) and len(ref_grads) > 0
            for k, g in ref_grads.items():
                torch.testing.assert_close(r["grads"][k], g, rtol=1e-4, atol=1e-5 * g.abs().max().item() + 1e-9)
    # the centres: C over the global batch, C2 the mean of the ranks' masked means
    m = method("centering")
    with torch.no_grad():
        tokens = m.teacher_backbone(torch.cat(fixed_views()[:2]), return_all_tokens=True)
        t_cls, t_patch = m.teacher_head(tokens[:, 0]), m.teacher_head(tokens[:, 1:])
    c2 = sum(rank_slice(t_patch, r)[rank_slice(masks, r)].mean(0) for r in range(WORLD)) / WORLD
    for r in results["centering"]:
        torch.testing.assert_close(r["center"], 0.9 * m.center + 0.1 * t_cls.mean(0, keepdim=True), rtol=1e-5,
                                   atol=1e-7)
        torch.testing.assert_close(r["center2"], 0.1 * c2.view(1, 1, -1), rtol=1e-5, atol=1e-7)
    wrong = [r["loss"] for r in results["sinkhorn_no_all_reduce"]]
    right = [r["loss"] for r in results["sinkhorn_knopp"]]
    assert not torch.allclose(sum(wrong), sum(right), rtol=1e-4, atol=1e-6)
