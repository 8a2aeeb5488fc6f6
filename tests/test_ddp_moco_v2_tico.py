"""MoCo v2 and TiCo under two-process CPU DDP (gloo) against one process on the concatenated batch.

As tests/test_ddp_swav_nnclr.py: a fixed global batch of 16 split in rank order, ``forward_views`` + backward under
DistributedDataParallel, BatchNorm in eval mode (torch's SyncBN is GPU-only). What each promises across processes:
- MoCo v2 (on the BatchNorm ConvNet, so the shuffle runs): the keys of the global batch shuffled across the
  processes, encoded and put back in order (moco builder.py:81-126), then enqueued from every process in rank order
  (builder.py:65-79): the mean loss, the averaged gradients and the queue after the step equal one process's. A
  per-process enqueue (no gather) is caught.
- TiCo: B = z1ᵀz1 / N over the global batch (z1 gathered with gradient), so the running covariance C after the step
  and the gradients equal one process's. A per-process B is caught.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from torch import nn

from spawn import spawn_and_join
from ssl_helpers import ViewsLoss, batchnorm_eval, tiny_method

pytestmark = pytest.mark.spawn  # tests/tiers.py

WORLD, BATCH, TIMEOUT_S = 2, 16, 240
VARIANTS = ("moco_v2", "moco_v2_local_queue", "tico", "tico_local_b")
CNN = {"backbone": "bn_cnn_micro"}


def fixed_views() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return [torch.randn(BATCH, 1, 8, 8, generator=g) for _ in range(2)]


def method_for(variant: str) -> nn.Module:
    if variant.startswith("moco_v2"):
        return batchnorm_eval(tiny_method("moco_v2", {"queue_size": 48}, data={"batch_size": BATCH}, model=CNN))
    return batchnorm_eval(tiny_method("tico", data={"batch_size": BATCH}))


def state_of(m) -> dict:
    return {key: getattr(m, key).clone() for key in ("queue", "queue_ptr", "covariance") if hasattr(m, key)}


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        import selfsup.methods.tico as tico_module

        gather = tico_module.gather_with_grad
        views = [v[rank * BATCH // WORLD:(rank + 1) * BATCH // WORLD] for v in fixed_views()]
        for variant in VARIANTS:
            m = method_for(variant)
            if variant.startswith("moco_v2"):
                assert m.shuffles()
                shuffle = m.step_draws(views)["shuffle"]
                if variant == "moco_v2_local_queue":  # the shuffle's gathers kept, the enqueue's own rows only
                    m.dequeue_and_enqueue = _local_enqueue(m)
                ddp = nn.parallel.DistributedDataParallel(ViewsLoss(m), broadcast_buffers=False)
                loss = _forward_with(ddp, m, views, shuffle)
            else:
                tico_module.gather_with_grad = (lambda x: x) if variant == "tico_local_b" else gather
                ddp = nn.parallel.DistributedDataParallel(ViewsLoss(m), broadcast_buffers=False)
                loss = ddp(*views)
            loss.backward()
            grads = {n: p.grad.detach().clone() for n, p in m.named_parameters() if p.grad is not None}
            torch.save({"loss": loss.detach(), "grads": grads, **state_of(m)},
                       os.path.join(out_dir, f"{variant}-{rank}.pt"))
        tico_module.gather_with_grad = gather
    finally:
        dist.destroy_process_group()


def _local_enqueue(m):
    def enqueue(k):
        rows = (m.queue_ptr + torch.arange(k.shape[0])) % m.queue.shape[0]
        m.queue.index_copy_(0, rows, k.detach())
        m.queue_ptr.copy_((m.queue_ptr + k.shape[0]) % m.queue.shape[0])
    return enqueue


def _forward_with(ddp, m, views, shuffle):
    """DDP's forward with the step's shuffle passed as the step passes it (``forward_step``: ``step_draws``)."""
    inner = m.forward_views
    m.forward_views = lambda v: inner(v, shuffle=shuffle)
    try:
        return ddp(*views)
    finally:
        m.forward_views = inner


@pytest.fixture(scope="module")
def ddp_results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ddp_moco_v2_tico")
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


@pytest.mark.parametrize("variant", ["moco_v2", "tico"])
def test_ddp_matches_one_process(ddp_results, variant):
    assert_matches(ddp_results[variant], *reference(variant))


def test_a_per_process_queue_and_a_per_process_b_are_caught(ddp_results):
    _, _, ref_state = reference("moco_v2")
    local = ddp_results["moco_v2_local_queue"]
    assert not torch.allclose(local[0]["queue"], ref_state["queue"])
    assert not torch.allclose(local[0]["queue"], local[1]["queue"])  # each rank enqueued its own keys
    _, _, ref_state = reference("tico")
    assert not torch.allclose(ddp_results["tico_local_b"][0]["covariance"], ref_state["covariance"])
