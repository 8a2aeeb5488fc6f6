"""One per-step seed formula (``schedules.step_seed``) for its four callers: the augmentation's generator
(``TrainingBase.seed_step``), I-JEPA's block sizes (``size_seed``), LeJEPA's slices (``slice_seed``) and the
distillation's mixup (``Distill.step_draws``). Each gives the seed its own formula gave before, for the cases below
worked out by hand from ``((seed · 1_000_003 + global_step) · k + micro_batch)``, so resumed runs draw as before."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from ssl_helpers import tiny_method
from test_distill import distill


def trainer(global_step: int, k: int, completed: int):
    """A stand-in trainer at ``global_step``, ``completed`` batches into its epoch, accumulating ``k`` batches."""
    progress = SimpleNamespace(current=SimpleNamespace(completed=completed))
    return SimpleNamespace(global_step=global_step, accumulate_grad_batches=k,
                           fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=progress)))


# (seed, global_step, k, completed, world size, rank) → the old formulas' seeds, by hand; the step term s is
# (seed · 1_000_003 + global_step) · k + completed % k:
#   s = 0;  s = 7_000_021 + 5 = 7_000_026;  s = (3_000_009 + 2) · 4 + 3 = 12_000_047;  s = (12_000_036 + 100) · 2 + 1
CASES = [  # ..., seed_step s · size + rank, size_seed s · 7919 + 1, slice_seed s, mixup 7919 · s + 17
    ((0, 0, 1, 0, 1, 0), 0, 1, 0, 17),
    ((7, 5, 1, 0, 1, 0), 7_000_026, 55_433_205_895, 7_000_026, 55_433_205_911),
    ((3, 2, 4, 11, 2, 1), 24_000_095, 95_028_372_194, 12_000_047, 95_028_372_210),
    ((12, 100, 2, 5, 4, 3), 96_001_095, 190_058_161_888, 24_000_273, 190_058_161_904),
]


@pytest.mark.parametrize("case,augment,sizes,slices,mixup", CASES)
def test_every_callers_step_seed_is_its_old_formulas(case, augment, sizes, slices, mixup, monkeypatch, tmp_path):
    seed, step, k, completed, size, rank = case
    monkeypatch.setattr("selfsup.methods.base.world", lambda: (rank, size))
    ijepa, lejepa = tiny_method("ijepa"), tiny_method("lejepa")
    for m in (ijepa, lejepa):
        m.cfg.trainer.seed, m._trainer = seed, trainer(step, k, completed)
    assert ijepa.seed_step("cpu").initial_seed() == augment
    assert ijepa.size_seed() == sizes
    assert lejepa.slice_seed() == slices
    m = distill(tmp_path)
    m.cfg.trainer.seed, m._trainer = seed, trainer(step, k, completed)
    x = torch.randn(4, 1, 8, 8)
    g = torch.Generator().manual_seed(mixup)
    lam, perm = torch.rand((), generator=g), torch.randperm(4, generator=g)  # one process: world() is unpatched here
    draws = m.step_draws([x])
    assert torch.equal(draws["lam"], lam) and torch.equal(draws["perm"], perm)


def test_outside_fit_the_rank_free_seeds_are_the_old_ones(tmp_path):
    """No trainer: LeJEPA's slices take the seed itself; the mixup step 0's, 7919 · seed · 1_000_003 + 17."""
    lejepa = tiny_method("lejepa")
    lejepa.cfg.trainer.seed = 7
    assert lejepa.slice_seed() == 7
    m = distill(tmp_path)
    m.cfg.trainer.seed = 7
    g = torch.Generator().manual_seed(55_433_166_316)  # 7919 · 7_000_021 + 17
    draws = m.step_draws([torch.randn(4, 1, 8, 8)])
    assert torch.equal(draws["lam"], torch.rand((), generator=g))
    assert torch.equal(draws["perm"], torch.randperm(4, generator=g))
