"""Two-process CPU DDP (gloo) against one process on the concatenated batch, for every method.

What is compared. A fixed global batch of 16 view pairs is split in rank order: rank r gets samples
[8r, 8r + 8). Each rank wraps its method in ``DistributedDataParallel`` and runs ``forward_views`` +
``backward`` once. Then (a) the mean over ranks of the loss must equal the loss of one process on all
16 pairs, and (b) the DDP-averaged gradient of every trainable parameter must equal that process's
gradient. (b) is where distributed self-supervised code goes wrong: a gather whose backward does not
sum the gradient of every process (or no gradient through the gathered negatives at all) leaves
the loss unchanged but the gradient off (often by a factor of the world size on the cross terms).
To show the comparison can see this, SimCLR is also run with two wrong gathers (one that keeps only
the local slice's gradient, one without any gradient) and their gradients must *differ* from the
reference while their loss still matches.

Batch norm. With BN in training mode each rank normalises with its own half-batch statistics, so
DDP matches the whole batch only with SyncBatchNorm, and torch's SyncBatchNorm runs on GPUs only
(its forward rejects CPU tensors and DDP refuses to wrap a CPU module holding one). The test
therefore puts every BN layer in eval mode (running statistics, the same on every rank) in both the
DDP run and the reference. That removes BN's batch coupling, which SyncBN handles and is not selfsup's
code, and leaves exactly what selfsup does across processes: the gathers in the losses (MoCo v3 keys
without gradient, rank-offset labels; SimCLR negatives with gradient), per-rank loss means, and the
gradient averaging. Everything else runs as in training (dropout/drop-path are zero in these models).

MAE has one view and draws each sample's mask from noise; the test gives both runs the same noise per sample
(rank r its slice), so the per-rank masked-patch means average to the whole batch's (every sample removes
the same number of patches) and the averaged gradients must match.

One spawn runs all variants (each process imports torch and Lightning once) to stay well under a minute.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from torch import nn

from spawn import spawn_and_join
from ssl_helpers import METHOD_NAMES, ViewsLoss, batchnorm_eval, tiny_method

pytestmark = pytest.mark.spawn  # tests/tiers.py

WORLD = 2
BATCH = 16  # global
WRONG_SIMCLR = ("simclr_local_grad", "simclr_no_grad")
VARIANTS = METHOD_NAMES + WRONG_SIMCLR + ("mae",)
TIMEOUT_S = 240


def fixed_views() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1234)
    return [torch.randn(BATCH, 1, 8, 8, generator=g), torch.randn(BATCH, 1, 8, 8, generator=g)]


def fixed_noise() -> torch.Tensor:
    """MAE's mask noise for the 16 samples (16 patches each)."""
    return torch.rand(BATCH, 16, generator=torch.Generator().manual_seed(99))


def _gather_local_grad(x):
    """Wrong: all-gather without gradient, then put back this process's slice with its gradient
    (equivalently, a gather whose backward returns the local slice without summing over processes)."""
    rank, size = dist.get_rank(), dist.get_world_size()
    parts = [torch.empty_like(x) for _ in range(size)]
    dist.all_gather(parts, x.detach().contiguous())
    parts[rank] = x
    return torch.cat(parts)


def _gather_detached(x):
    """Wrong: the negatives of every process without gradient."""
    from selfsup.distributed import gather_no_grad

    return gather_no_grad(x)


def method_for(variant: str) -> nn.Module:
    return batchnorm_eval(tiny_method("simclr" if variant in WRONG_SIMCLR else variant))


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        import selfsup.methods.simclr as simclr_module

        correct_gather = simclr_module.gather_with_grad
        x1, x2, noise = (v[rank * BATCH // WORLD:(rank + 1) * BATCH // WORLD] for v in (*fixed_views(), fixed_noise()))
        for variant in VARIANTS:
            simclr_module.gather_with_grad = {"simclr_local_grad": _gather_local_grad,
                                              "simclr_no_grad": _gather_detached}.get(variant, correct_gather)
            method = method_for(variant)
            ddp = nn.parallel.DistributedDataParallel(ViewsLoss(method))
            loss = ddp(x1, noise=noise) if variant == "mae" else ddp(x1, x2)
            loss.backward()
            grads = {n: p.grad.detach().clone() for n, p in method.named_parameters() if p.grad is not None}
            torch.save({"loss": loss.detach(), "grads": grads}, os.path.join(out_dir, f"{variant}-{rank}.pt"))
        simclr_module.gather_with_grad = correct_gather
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ddp_results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ddp")
    spawn_and_join(_worker, (str(tmp / "rendezvous"), str(tmp)), WORLD, TIMEOUT_S, poll_s=5)
    return {v: [torch.load(tmp / f"{v}-{r}.pt") for r in range(WORLD)] for v in VARIANTS}


def reference(variant: str) -> tuple[torch.Tensor, dict[str, torch.Tensor], list[str]]:
    """One process, the whole batch (not distributed: the gathers are identities); also the trainable names."""
    assert not dist.is_initialized()
    method = method_for(variant)
    views = fixed_views()
    loss = (method.forward_views(views[:1], fixed_noise()) if variant == "mae" else method.forward_views(views)).loss
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in method.named_parameters() if p.grad is not None}
    return loss.detach(), grads, [n for n, p in method.named_parameters() if p.requires_grad]


def _max_rel_err(grads: dict, ref: dict) -> float:
    return max(((grads[n] - ref[n]).abs().max() / ref[n].abs().max().clamp_min(1e-12)).item() for n in ref)


@pytest.mark.parametrize("name", METHOD_NAMES + ("mae",))
def test_ddp_matches_single_process(ddp_results, name):
    results = ddp_results[name]
    ref_loss, ref_grads, trainable = reference(name)
    assert sorted(ref_grads) == sorted(trainable)
    # the per-rank losses differ (different halves), their mean is the whole-batch loss
    losses = [r["loss"] for r in results]
    assert not torch.allclose(losses[0], losses[1])
    torch.testing.assert_close(sum(losses) / WORLD, ref_loss, rtol=1e-5, atol=1e-6)
    for rank in range(WORLD):
        grads = results[rank]["grads"]
        assert sorted(grads) == sorted(ref_grads)
        for n, g in ref_grads.items():
            scale = g.abs().max().item()
            torch.testing.assert_close(grads[n], g, rtol=1e-4, atol=1e-5 * scale + 1e-9,
                                       msg=lambda m, n=n: f"{name} rank {rank} gradient of {n}: {m}")


@pytest.mark.parametrize("variant", WRONG_SIMCLR)
def test_wrong_simclr_gathers_are_caught(ddp_results, variant):
    """The power of the comparison: a wrong gather keeps the loss but changes the gradient."""
    ref_loss, ref_grads, _ = reference("simclr")
    results = ddp_results[variant]
    torch.testing.assert_close(sum(r["loss"] for r in results) / WORLD, ref_loss, rtol=1e-5, atol=1e-6)
    assert _max_rel_err(results[0]["grads"], ref_grads) > 1e-2
    assert _max_rel_err(ddp_results["simclr"][0]["grads"], ref_grads) < 1e-4
