"""What the benchmarks share: where they ran (machine facts), the JSON they write, one timing loop, one summary of
timed steps, and training a preset in this process (its run facts and kNN back).

The benchmarks are modules of the ``benchmarks`` package, run from the repository root::

    python -m benchmarks.throughput --quick

Timing: ``timed`` calls a function and returns the (wall, process CPU) seconds of each call; ``step_clock`` marks
the end of every training step of a Lightning fit, and ``between`` turns its marks into the same pairs. Process CPU
time (all threads) is given beside wall time everywhere: it is less disturbed by other processes sharing the cores.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"

Times = list[tuple[float, float]]  # (wall, process CPU) seconds of each timed call or step


# --------------------------------------------------------------------------- machine facts
def cpu_model_and_flags() -> tuple[str, set[str]]:
    """The CPU's model name and its /proc/cpuinfo flags (no flags where there is no /proc/cpuinfo)."""
    name, flags = platform.processor() or "unknown CPU", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                name = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    return name, flags


def cpu_kind() -> str:
    """The CPU's model name, torch's vector ISA on it (AVX2 / AVX512) and its AMX / AVX-512 FP16 flags, which
    decide what the CPU kernels run."""
    name, flags = cpu_model_and_flags()
    extra = [f for f in ("amx_bf16", "amx_tile", "avx512_fp16", "avx512_bf16") if f in flags]
    return f"{name}; torch ISA {torch.backends.cpu.get_cpu_capability()}" + (f"; {' '.join(extra)}" if extra else "")


def default_device() -> torch.device:
    """cuda when torch sees a GPU, else cpu."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def machine_info(device: torch.device) -> dict:
    """Where a benchmark ran: platform, CPU kind, cores, torch, GPU name, load average at the end."""
    return {"platform": platform.platform(), "cpu": cpu_kind(), "cpu_count": os.cpu_count(), "torch": torch.__version__,
            "cuda": torch.cuda.get_device_name(0) if device.type == "cuda" else None,
            "loadavg_at_end": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}


def has_fashion_mnist() -> bool:
    """Whether the Fashion-MNIST IDX files are where ``data.name=fashion-mnist`` looks by default (the benchmarks
    that fall back to digits without them)."""
    from selfsup.data.datasets import fashion_mnist_default

    return (fashion_mnist_default() / "train-images-idx3-ubyte.gz").exists()


# --------------------------------------------------------------------------- the JSON writer
def write_report(report: dict, path: str | Path, indent: int = 2) -> Path:
    """``report`` as JSON at ``path`` (its folder made), written whole through a temporary file: a benchmark
    stopped midway leaves the previous file, never half of one."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=indent) + "\n")
    tmp.replace(out)
    return out


def read_report(path: str | Path) -> dict:
    """The JSON at ``path``, or an empty mapping where there is none yet (the benchmarks that merge into a file)."""
    path = Path(path)
    return json.loads(path.read_text()) if path.exists() else {}


# --------------------------------------------------------------------------- timing
def sync(device: torch.device | None) -> None:
    """Wait for the device's queued work (a no-op on the CPU), so that a clock read after it counts that work."""
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def clock() -> tuple[float, float]:
    """(wall, process CPU) seconds now."""
    return time.perf_counter(), time.process_time()


def between(marks: list[tuple[float, float]]) -> Times:
    """(wall, CPU) seconds between successive ``clock()`` marks."""
    return [(w1 - w0, c1 - c0) for (w0, c0), (w1, c1) in zip(marks, marks[1:])]


def timed(fn: Callable[[], object], calls: int, warmup: int = 0, device: torch.device | None = None) -> Times:
    """The timing loop: (wall, process CPU) seconds of each of ``calls`` calls of ``fn`` after ``warmup`` untimed
    ones, the device synchronised at each call's end."""
    out = []
    for i in range(warmup + calls):
        start = clock()
        fn()
        sync(device)
        if i >= warmup:
            out.append(between([start, clock()])[0])
    return out


def mean_ms(times: Times) -> tuple[float, float]:
    """The mean (wall, CPU) milliseconds of a list of timed calls."""
    return 1000 * sum(w for w, _ in times) / len(times), 1000 * sum(c for _, c in times) / len(times)


def summarize(reps: list[Times], batch_size: int, lowest: str = "min") -> dict:
    """Per repetition the mean step time; the lowest (``step_ms_<lowest>``: ``min`` in throughput's and
    self_flow's JSON, ``best`` in mfu's) and the median across repetitions, the median of all single steps, and
    images/s; wall time and process CPU time (all threads: less disturbed by other processes on the cores)."""
    means = [sum(w for w, _ in r) / len(r) for r in reps]
    cpu = [sum(c for _, c in r) / len(r) for r in reps]
    best, med = min(means), statistics.median(means)
    return {
        f"cpu_step_ms_{lowest}": 1000 * min(cpu), "cpu_step_ms_median": 1000 * statistics.median(cpu),
        f"step_ms_{lowest}": 1000 * best, "step_ms_median": 1000 * med,
        "step_ms_median_all_steps": 1000 * statistics.median(w for r in reps for w, _ in r),
        "images_per_s_best": batch_size / best, "images_per_s_median": batch_size / med,
        "rep_step_ms": [round(1000 * m, 2) for m in means], "rep_cpu_step_ms": [round(1000 * m, 2) for m in cpu],
    }


def step_clock(stop_after: int | None = None, device: torch.device | None = None):
    """A Lightning callback that marks ``clock()`` at the end of every training step (the device synchronised
    first) and stops the fit after ``stop_after`` steps; ``.times(warmup)`` gives the (wall, CPU) seconds of the
    steps after the first ``warmup``."""
    import lightning.pytorch as pl

    class StepClock(pl.Callback):
        def __init__(self):
            self.marks: list[tuple[float, float]] = []

        def on_train_batch_end(self, trainer, *_):
            sync(device)
            self.marks.append(clock())
            if stop_after is not None and len(self.marks) >= stop_after:
                trainer.should_stop = True

        def times(self, warmup: int) -> Times:
            """Steps ``warmup + 1`` on (the first ``warmup`` >= 1 steps are the warm-up)."""
            return between(self.marks[warmup - 1:])

    return StepClock()


# --------------------------------------------------------------------------- the engine in this process
def fit(cfg, dataset, run_dir: Path, callbacks: Iterable = (), data=None, seed: int | None = None):
    """``trainer.fit`` of ``cfg``'s method on ``dataset`` as ``selfsup pretrain`` builds it (the engine's Trainer,
    its data module or ``data``), ``callbacks`` appended to the Trainer's, in ``run_dir``; no run folder, export or
    report around it. ``seed``: ``torch.manual_seed`` before the model is built. The Trainer."""
    from selfsup.engine import PretrainData, make_trainer
    from selfsup.methods.build import build_method, data_info

    if seed is not None:
        torch.manual_seed(seed)
    model = build_method(cfg, data_info(cfg, dataset))
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    trainer = make_trainer(cfg, Path(run_dir))
    trainer.callbacks.extend(callbacks)
    trainer.fit(model, datamodule=data if data is not None else PretrainData(cfg, dataset))
    return trainer


def pretrain_data(cfg, dataset):
    """The engine's data module of ``cfg`` on ``dataset`` (for a benchmark that changes its loader)."""
    from selfsup.engine import PretrainData

    return PretrainData(cfg, dataset)


def fit_step_times(cfg, dataset, run_dir: Path, warmup: int, steps: int, device: torch.device | None = None,
                   seed: int | None = None, data=None) -> Times:
    """(wall, CPU) seconds of ``steps`` engine training steps after ``warmup`` (>= 1) ones (``fit``)."""
    marks = step_clock(warmup + steps, device)
    fit(cfg, dataset, run_dir, [marks], data, seed)
    return marks.times(warmup)[:steps]


@dataclass(frozen=True)
class Trained:
    """A pretraining run: its folder, its facts (``run.json``: status, steps, ``fit_seconds``), its end-of-run
    kNN report (``knn.json``; None when the report was skipped) and the wall seconds of ``pretrain`` (None: read)."""

    run: Path
    facts: dict
    knn: dict | None
    wall_s: float | None


def trained(run: str | Path, wall_s: float | None = None) -> Trained:
    """What a run folder holds (``selfsup.api.Run``'s facts, its ``knn.json``)."""
    from selfsup.api import Run

    run = Path(run)
    knn = run / "knn.json"
    return Trained(run, Run(run).facts, json.loads(knn.read_text()) if knn.exists() else None, wall_s)


def pretrain(preset: str, overrides: list[str], run: str | Path | None = None, *, report: bool = True,
             callbacks: Iterable = (), fresh: bool = False) -> Trained:
    """``selfsup pretrain PRESET OVERRIDES`` in this process (``selfsup.engine.pretrain``), into ``run``
    (``output_dir`` / ``name`` set from it after the overrides; None: where the overrides say); its run facts and
    kNN. ``report=False`` skips the end-of-run kNN report (two feature passes over the dataset) for a benchmark
    that scores the run its own way; ``callbacks`` go first on the Trainer; ``fresh``: an earlier run in ``run``
    is removed first. A run that stops itself (a collapse, a non-finite loss) raises as the engine does."""
    import selfsup.engine as engine
    from selfsup.config import load_run_config

    where = [f"output_dir={Path(run).parent}", f"name={Path(run).name}"] if run is not None else []
    if fresh and run is not None:
        shutil.rmtree(run, ignore_errors=True)
    cfg = load_run_config(preset, [*overrides, *where])
    start = time.perf_counter()
    path = engine.pretrain(cfg, preset, callbacks=callbacks, report=report)
    return trained(path, time.perf_counter() - start)


# --------------------------------------------------------------------------- the command line in a new process
def child_env(**extra: str) -> dict[str, str]:
    """This process's environment with ``src/`` and the repository root first on PYTHONPATH: a child process
    imports this tree's selfsup and its ``benchmarks`` package wherever it starts."""
    path = os.pathsep.join([str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, **extra}


def selfsup_cli(*args: str, capture: bool = False, check: bool = True, **env: str):
    """``python -m selfsup ARGS`` in a new process, as a user would type it (printed first unless ``capture``);
    (the finished process, its wall seconds)."""
    cmd = [sys.executable, "-m", "selfsup", *args]
    if not capture:
        print("+", " ".join(cmd), flush=True)
    start = time.perf_counter()
    done = subprocess.run(cmd, env=child_env(**env), capture_output=capture, text=True, check=check)
    return done, time.perf_counter() - start


def module_cli(name: str, *args: str) -> list[str]:
    """The command line of benchmark ``name`` (``python -m benchmarks.NAME ARGS``); run it with ``child_env()``."""
    return [sys.executable, "-m", f"benchmarks.{name}", *args]
