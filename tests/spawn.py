"""Run a test's worker in N new processes and wait for them, with a deadline (the gloo DDP tests).

The workers start from a fork server (``forkserver``), not a new interpreter each (``spawn``): the server is a new
interpreter, as clean as spawn's (no thread, no state of the test process), that imports torch, Lightning and the
engine once (``PRELOAD``), and each worker is a fork of it. One start of those imports per test process, instead of
one per worker of every DDP test (two interpreters of ~6 CPU-seconds each, for each of a dozen tests)."""

from __future__ import annotations

import multiprocessing
import time

import torch.multiprocessing as mp

# what every worker imports (the test modules import ssl_helpers, which imports Lightning and the config)
PRELOAD = ["torch", "torch.distributed", "lightning.pytorch", "selfsup.engine", "ssl_helpers"]


def forkserver():
    """The multiprocessing context whose processes fork from the preloaded server (started by its first process)."""
    multiprocessing.set_forkserver_preload(PRELOAD)  # read when the server starts (the first process of this one)
    return multiprocessing.get_context("forkserver")


def spawn_and_join(worker, args: tuple, nprocs: int, timeout_s: float, poll_s: float = 1.0) -> None:
    """``worker(rank, *args)`` in ``nprocs`` new processes (forks of the preloaded server); a worker's exception is
    re-raised here, and workers still alive after ``timeout_s`` are terminated (TimeoutError)."""
    forkserver()
    ctx = mp.start_processes(worker, args=args, nprocs=nprocs, join=False, start_method="forkserver")
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=poll_s):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the DDP workers did not finish within {timeout_s} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.terminate()
