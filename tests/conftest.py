"""Shared fixtures: the tiny run overrides (``ssl_helpers.TINY``: CPU, seconds per run) and one thread per process."""

from __future__ import annotations

import os

import pytest
import torch

# Tiny models on a few shared cores: one thread each (OpenMP spinning across busy cores costs 5x here);
# subprocesses (the CLI, DDP workers) inherit it through the environment. Set, not defaulted: a test that
# compares an in-process run with a subprocess run bit for bit needs both on one thread count (a user's
# OMP_NUM_THREADS=2 gave the child two threads, other reduction orders, and a resume that differed by 1e-6).
os.environ["OMP_NUM_THREADS"] = "1"
torch.set_num_threads(1)

from ssl_helpers import TINY  # noqa: E402  (after the thread settings)
from tiers import add_timeouts, pytest_fixture_setup, pytest_runtest_protocol  # noqa: E402, F401  (the tiers' hooks)


def pytest_collection_modifyitems(config, items):
    add_timeouts(items)


@pytest.fixture
def tiny():
    """Overrides for a seconds-long run; append ``output_dir=...`` and ``name=...``."""
    return list(TINY)
