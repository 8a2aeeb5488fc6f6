"""Run a test's worker in N spawned processes and wait for them, with a deadline (the gloo DDP tests)."""

from __future__ import annotations

import time

import torch.multiprocessing as mp


def spawn_and_join(worker, args: tuple, nprocs: int, timeout_s: float, poll_s: float = 1.0) -> None:
    """``worker(rank, *args)`` in ``nprocs`` spawned processes; a worker's exception is re-raised here, and
    workers still alive after ``timeout_s`` are terminated (TimeoutError)."""
    ctx = mp.start_processes(worker, args=args, nprocs=nprocs, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=poll_s):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the DDP workers did not finish within {timeout_s} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.terminate()
