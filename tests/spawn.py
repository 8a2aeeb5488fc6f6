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


class Finished:
    """What ``subprocess.run(..., capture_output=True, text=True)`` gives back, the two streams in one."""

    def __init__(self, returncode: int, output: str):
        self.returncode, self.stdout, self.stderr = returncode, output, output


def run_script(script, args: list[str], cwd, env: dict, timeout: float) -> Finished:
    """``python SCRIPT ARGS...`` in ``cwd`` with the environment ``env``, as ``subprocess.run`` runs it (the return
    code: -N when signal N ended it), but forked from the preloaded fork server rather than a new interpreter: for
    the scripts of Lightning's DDP tests, whose launcher re-runs the script (``sys.argv[0]``) for the other ranks
    in new interpreters, as ever; rank 0 alone skips the start of torch and Lightning."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        output = Path(tmp) / "output.txt"
        exitcode = run_forked(_run_script, (str(script), list(args), str(cwd), dict(env), str(output)), timeout,
                              f"{script}")
        return Finished(exitcode, output.read_text(errors="replace") if output.exists() else "")


def run_forked(target, args: tuple, timeout: float, what: str) -> int:
    """``target(*args)`` in a fork of the preloaded server; its exit code. Killed after ``timeout`` seconds
    (TimeoutError naming ``what``)."""
    child = forkserver().Process(target=target, args=args)
    child.start()
    child.join(timeout)
    if child.is_alive():
        child.kill()
        child.join()
        raise TimeoutError(f"{what} did not finish within {timeout} s")
    return child.exitcode


def _run_script(script: str, args: list[str], cwd: str, env: dict, output: str) -> None:
    """The child of :func:`run_script`: its stdout and stderr (the file descriptors: the other ranks' too) to
    ``output``, then the script as ``__main__`` and the exit handlers an interpreter runs as it ends."""
    import atexit
    import os
    import runpy
    import sys

    fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.argv = [script, *args]
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        atexit._run_exitfuncs()  # a multiprocessing child ends with os._exit, which skips them
