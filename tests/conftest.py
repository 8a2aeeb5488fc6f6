"""Shared fixtures: the tiny run overrides every end-to-end test uses (CPU, seconds per run)."""

from __future__ import annotations

import os

import pytest
import torch

# Tiny models on a few shared cores: one thread each (OpenMP spinning across busy cores costs 5x here);
# subprocesses (the CLI, DDP workers) inherit it through the environment.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)

TINY = [
    "method.proj_hidden_dim=64", "method.pred_hidden_dim=64", "method.dim=32", "data.batch_size=64",
    "trainer.max_epochs=1", "trainer.limit_train_batches=2", "trainer.progress_bar=false",
    "trainer.log_every_n_steps=1", "trainer.accelerator=cpu", "trainer.devices=1",
]


@pytest.fixture
def tiny():
    """Overrides for a seconds-long run; append ``output_dir=...`` and ``name=...``."""
    return list(TINY)
