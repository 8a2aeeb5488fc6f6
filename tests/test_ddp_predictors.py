"""Two processes (gloo): after an update from different local batches every replica holds the same F and W_p,
and F is the whole global batch's (not the local half's). Imports stay light (no Lightning) so the spawn is quick."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from selfsup.predictors import DirectPredConfig, TrackedLinearPredictor, directpred_weight
from spawn import spawn_and_join
import pytest

pytestmark = pytest.mark.spawn  # tests/tiers.py

WORLD, BATCH, DIM, TIMEOUT_S = 2, 16, 6, 120


def global_batches() -> list[list[torch.Tensor]]:
    """Two steps, each two views of BATCH inputs (anisotropic, so F has distinct eigenvalues)."""
    g = torch.Generator().manual_seed(7)
    scale = torch.linspace(0.5, 2.0, DIM)
    return [[torch.randn(BATCH, DIM, generator=g) * scale for _ in range(2)] for _ in range(2)]


def run_steps(pred: TrackedLinearPredictor, batches, rows: slice) -> list[dict]:
    out = []
    for views in batches:
        for v in views:
            pred(v[rows])
        pred.after_optimizer_step()
        out.append({"weight": pred.weight.detach().clone(), "corr": pred.correlation.clone()})
    return out


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        torch.manual_seed(rank)  # different initial W on each rank: the update must overwrite it identically
        pred = TrackedLinearPredictor(DIM, "directpred", DirectPredConfig()).train()
        local = slice(rank * BATCH // WORLD, (rank + 1) * BATCH // WORLD)
        torch.save(run_steps(pred, global_batches(), local), os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_ddp_replicas_hold_identical_predictor(tmp_path):
    spawn_and_join(_worker, (str(tmp_path / "rendezvous"), str(tmp_path)), WORLD, TIMEOUT_S)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD))
    whole = run_steps(TrackedLinearPredictor(DIM, "directpred", DirectPredConfig()).train(), global_batches(),
                      slice(0, BATCH))
    half = run_steps(TrackedLinearPredictor(DIM, "directpred", DirectPredConfig()).train(), global_batches(),
                     slice(0, BATCH // WORLD))
    for step in range(2):
        assert torch.equal(r0[step]["weight"], r1[step]["weight"]) and torch.equal(r0[step]["corr"], r1[step]["corr"])
        torch.testing.assert_close(r0[step]["corr"], whole[step]["corr"])  # the global batch's F ...
        torch.testing.assert_close(r0[step]["weight"], whole[step]["weight"])
        assert not torch.allclose(r0[step]["corr"], half[step]["corr"], atol=1e-3)  # ... not the local half's
    torch.testing.assert_close(r0[1]["weight"], directpred_weight(r0[1]["corr"].double(), 0.01).float())
