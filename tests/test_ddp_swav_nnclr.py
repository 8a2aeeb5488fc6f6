"""SwAV and NNCLR under two-process CPU DDP (gloo) against one process on the concatenated batch.

As tests/test_ddp_two_view.py: a fixed global batch of 16 is split in rank order, each rank runs ``forward_views`` +
backward under DistributedDataParallel, BatchNorm in eval mode (torch's SyncBN is GPU-only). What each method
promises across processes:
- SwAV: Sinkhorn-Knopp over the global batch (main_swav.py:353-376: the total and the row sums all-reduced,
  B = local · world), with and without a full queue (each rank prepends its own rows of it). The mean loss,
  the averaged gradients, the codes and the queue after the step equal one process's. Sinkhorn per process
  (the all-reduce skipped, lightly's default) keeps neither: the test sees it.
- NNCLR: the support set is one global FIFO (view 1's z of every process, all-gathered in rank order), the
  negatives the predictions of the global batch gathered with gradient: loss, gradients and the support set after
  the step equal one process's. A per-process bank (lightly's) or local negatives are caught.
W-MSE promises nothing across processes (the official code whitens each GPU's batch; issue #7: no DDP gather),
so it has no test here.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from torch import nn

from spawn import spawn_and_join
from ssl_helpers import MULTICROP, ViewsLoss, batchnorm_eval, tiny_method

pytestmark = pytest.mark.spawn  # tests/tiers.py

WORLD, BATCH, TIMEOUT_S = 2, 16, 240
VARIANTS = ("swav", "swav_queue", "swav_local_sinkhorn", "nnclr", "nnclr_local_bank", "nnclr_local_negatives")


def fixed_views() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return [torch.randn(BATCH, 1, s, s, generator=g) for s in (8, 8, 4, 4)]


def method_for(variant: str) -> nn.Module:
    if variant.startswith("swav"):
        extra = {"queue_length": 32, "epoch_queue_starts": 0} if variant == "swav_queue" else {}
        m = batchnorm_eval(tiny_method("swav", extra, augment=MULTICROP))
        if variant == "swav_queue":  # a full queue, the same rows in both runs
            with torch.no_grad():
                m.queue.copy_(torch.nn.functional.normalize(
                    torch.randn(m.queue.shape, generator=torch.Generator().manual_seed(3)), dim=-1))
                m.queue_rows.fill_(32)
        return m
    return batchnorm_eval(tiny_method("nnclr", {"queue_size": 40}))


def state_of(m) -> dict:
    out = {}
    for key in ("queue", "support", "support_ptr"):
        if hasattr(m, key):
            out[key] = getattr(m, key).clone()
    return out


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        import selfsup.methods.nnclr as nnclr_module
        import selfsup.methods.swav as swav_module

        correct = swav_module.all_reduce_sum
        gathers = nnclr_module.gather_no_grad, nnclr_module.gather_with_grad, nnclr_module.world
        views = [v[rank * BATCH // WORLD:(rank + 1) * BATCH // WORLD] for v in fixed_views()]
        for variant in VARIANTS:
            swav_module.all_reduce_sum = (lambda x: x) if variant == "swav_local_sinkhorn" else correct
            nnclr_module.gather_no_grad = (lambda x: x) if variant == "nnclr_local_bank" else gathers[0]
            local = variant == "nnclr_local_negatives"  # each rank's own predictions as candidates, rank 0's labels
            nnclr_module.gather_with_grad = (lambda x: x) if local else gathers[1]
            nnclr_module.world = (lambda: (0, 1)) if local else gathers[2]
            m = method_for(variant)
            ddp = nn.parallel.DistributedDataParallel(ViewsLoss(m), broadcast_buffers=False)
            loss = ddp(*views)
            loss.backward()
            grads = {n: p.grad.detach().clone() for n, p in m.named_parameters() if p.grad is not None}
            torch.save({"loss": loss.detach(), "grads": grads, **state_of(m)},
                       os.path.join(out_dir, f"{variant}-{rank}.pt"))
        swav_module.all_reduce_sum = correct
        nnclr_module.gather_no_grad, nnclr_module.gather_with_grad, nnclr_module.world = gathers
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ddp_results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ddp_new")
    spawn_and_join(_worker, (str(tmp / "rendezvous"), str(tmp)), WORLD, TIMEOUT_S, poll_s=2)
    return {v: [torch.load(tmp / f"{v}-{r}.pt") for r in range(WORLD)] for v in VARIANTS}


def reference(variant: str):
    assert not dist.is_initialized()
    m = method_for(variant)
    loss = m.forward_views(fixed_views()).loss
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in m.named_parameters() if p.grad is not None}
    return loss.detach(), grads, state_of(m)


def assert_matches(results, ref_loss, ref_grads, ref_state):
    losses = [r["loss"] for r in results]
    assert not torch.allclose(losses[0], losses[1])
    torch.testing.assert_close(sum(losses) / WORLD, ref_loss, rtol=1e-5, atol=1e-6)
    for r in results:
        assert sorted(r["grads"]) == sorted(ref_grads) and ref_grads
        for n, g in ref_grads.items():
            torch.testing.assert_close(r["grads"][n], g, rtol=1e-4, atol=1e-5 * g.abs().max().item() + 1e-9,
                                       msg=lambda msg, n=n: f"gradient of {n}: {msg}")
        for key, value in ref_state.items():
            torch.testing.assert_close(r[key], value, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("variant", ["swav", "swav_queue"])
def test_swav_ddp_matches_one_process(ddp_results, variant):
    assert_matches(ddp_results[variant], *reference(variant))


def test_per_process_sinkhorn_is_caught(ddp_results):
    ref_loss, _, _ = reference("swav")
    wrong = ddp_results["swav_local_sinkhorn"]
    assert (sum(r["loss"] for r in wrong) / WORLD - ref_loss).abs() > 1e-4


def test_nnclr_ddp_matches_one_process(ddp_results):
    assert_matches(ddp_results["nnclr"], *reference("nnclr"))


def test_nnclr_per_process_bank_and_local_negatives_are_caught(ddp_results):
    ref_loss, _, ref_state = reference("nnclr")
    bank = ddp_results["nnclr_local_bank"]
    assert not torch.allclose(bank[0]["support"], ref_state["support"])
    assert not torch.allclose(bank[0]["support"], bank[1]["support"])  # each rank kept its own rows
    local = ddp_results["nnclr_local_negatives"]
    assert (sum(r["loss"] for r in local) / WORLD - ref_loss).abs() > 1e-4
