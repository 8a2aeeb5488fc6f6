"""A run's facts (``RUN/run.json``): how its last session ended, steps and epochs done, devices, fit wall time, and
which of the finishing steps are done; what a stopped run says of its kept checkpoint (``RunInterrupted``,
``out_of_space``). Read without Lightning: ``selfsup report`` and the resume rules read it."""

from __future__ import annotations

import json
from pathlib import Path

from selfsup.diskspace import DiskFull, write_text, written_by_selfsup

RUN_FACTS = "run.json"


def read_run_facts(run_dir: Path) -> dict:
    """``RUN/run.json`` as a mapping (empty when absent or unreadable)."""
    try:
        facts = json.loads((Path(run_dir) / RUN_FACTS).read_text())
    except (OSError, ValueError):
        return {}
    return facts if isinstance(facts, dict) else {}


def mark_run(run_dir: Path, drop: tuple[str, ...] = (), **facts) -> None:
    """Update ``RUN/run.json`` with ``facts``, without the keys ``drop`` (written whole through a temp file)."""
    merged = {k: v for k, v in read_run_facts(run_dir).items() if k not in drop}
    write_text(Path(run_dir) / RUN_FACTS, json.dumps({**merged, **facts}, indent=2), "the run's facts")


def start_label(run_dir: Path, random: str = "random init") -> str:
    """What a run's ``backbone_init.safetensors`` holds: ``start (weights: SOURCE)`` for a run started from
    ``model.weights`` (run.json's ``weights``), else ``random``."""
    weights = read_run_facts(run_dir).get("weights")
    source = weights.get("source") if isinstance(weights, dict) else None
    return f"start (weights: {source})" if source else random


def record_start_facts(run_dir: Path, facts: dict) -> None:
    """What a run starts from, beside a random init (``TrainingBase.run_facts``: ``model.weights``, a distillation
    teacher), each a source and the sha256 of its tensors: recorded in run.json under its key and printed."""
    if facts:
        mark_run(run_dir, **facts)
        for key, fact in facts.items():
            print(f"{key}: {fact['source']} (sha256 {fact['sha256'][:12]})")


def write_run_facts(trainer, run_dir: Path, seconds: float, status: str = "finished", **extra) -> None:
    """``RUN/run.json``: what the config cannot say about a run (read by ``selfsup report``): how its last session
    ended (``status``: running while it trains, so a killed run keeps that; finished, interrupted, nan, failed),
    steps and epochs done, the devices it ran on, and the wall time of fit, summed over the sessions of a
    resumed run."""
    before = read_run_facts(run_dir)
    kind = type(trainer.accelerator).__name__.replace("Accelerator", "").lower()
    device = _cuda_name(trainer.strategy.root_device) if kind == "cuda" else kind
    facts = {"status": status, "global_step": int(trainer.global_step), "epochs": int(trainer.current_epoch),
             "fit_seconds": float(before.get("fit_seconds", 0.0)) + seconds,
             "sessions": int(before.get("sessions", 0)) + 1, "world_size": int(trainer.world_size),
             "num_nodes": int(trainer.num_nodes), "accelerator": kind, "device": device}
    mark_run(run_dir, drop=("signal", "stopped_at_step", "reason"), **facts, **extra)


def _cuda_name(device) -> str:
    import torch  # only a training run writes run.json: reading it (the resume rules, `selfsup report`) needs no torch

    return torch.cuda.get_device_name(device)


class RunInterrupted(KeyboardInterrupt):
    """A run stopped by SIGINT / SIGTERM after writing its checkpoint; the CLI exits with 128 + ``signum``."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def out_of_space(exc: BaseException, run_dir: Path, saved_step: int | None) -> DiskFull:
    """A run stopped by a full disk, in one line: the write of selfsup's own that failed (its file and size) or,
    for a logger's write (Lightning's metrics.csv, TensorBoard), the run folder and the size of its checkpoint,
    which the run needs free to go on; and the checkpoint kept."""
    kept = kept_checkpoint(run_dir, saved_step)
    own = written_by_selfsup(exc)
    if own is not None:
        return own.keeping(kept)
    last = run_dir / "checkpoints" / "last.ckpt"
    return DiskFull(run_dir, "the run's logs in", last.stat().st_size if last.exists() else None, kept)


def kept_checkpoint(run_dir: Path, saved_step: int | None) -> str:
    """What a stopped run says of its checkpoint."""
    if saved_step is None:
        return "no checkpoint was written before it (the run cannot be resumed)"
    return (f"the last checkpoint, with finite weights, is step {saved_step}: {run_dir / 'checkpoints' / 'last.ckpt'}"
            f" (selfsup pretrain --resume {run_dir} continues from it)")

