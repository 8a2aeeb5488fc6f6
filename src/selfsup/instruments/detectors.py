"""Event detectors on scalar series, and the machine-readable event log ``RUN/events.jsonl``.

``SpikeDetector``: a value is a spike when it exceeds ``median + k · MAD`` of the previous ``window``
values (MoCo v3 §4.1: gradient spikes of the first layer precede kNN dips). The MAD is floored at
``mad_floor · |median|`` so a flat series does not alarm on rounding noise.
``DipDetector``: a kNN dip starts when accuracy falls more than ``threshold`` points below the running
best, and ends when it is back within the threshold; one event per dip.
``log_metrics``, ``event_log`` and ``report_event``: how every instrument writes a value, an event and its console
line (the plumbing the callbacks of ``dynamics.py`` and ``knn_monitor.py`` share).
"""

from __future__ import annotations

import json
import sys
from collections import deque
from pathlib import Path
from statistics import median

import torch
from lightning.pytorch.loggers import CSVLogger
from torch import Tensor

from selfsup.diskspace import writing

PREFIX = "instruments"


class SpikeDetector:
    """Robust running baseline of one series; ``update`` returns the baseline threshold when ``value`` is a spike."""

    def __init__(self, k: float = 10.0, window: int = 100, min_history: int = 20, mad_floor: float = 0.01):
        if k <= 0 or window < 2 or not 2 <= min_history <= window:
            raise ValueError("need k > 0, window >= 2 and 2 <= min_history <= window")
        self.k, self.window, self.min_history, self.mad_floor = k, window, min_history, mad_floor
        self.history: deque[float] = deque(maxlen=window)

    def threshold(self) -> tuple[float, float] | None:
        """(median, median + k·MAD) of the window, or None while it holds fewer than ``min_history`` values."""
        if len(self.history) < self.min_history:
            return None
        med = median(self.history)
        mad = max(median(abs(v - med) for v in self.history), self.mad_floor * abs(med))
        return med, med + self.k * mad

    def update(self, value: float) -> tuple[float, float] | None:
        """Add ``value``; (median, threshold) when it is a spike, else None. Non-finite values are spikes."""
        base = self.threshold()
        spike = base is not None and (value > base[1] or value != value or value == float("inf"))
        if value == value and value != float("inf"):
            self.history.append(value)
        return base if spike else None

    def state_dict(self) -> dict:
        return {"history": list(self.history)}

    def load_state_dict(self, state: dict) -> None:
        self.history = deque(state.get("history", []), maxlen=self.window)


class DipDetector:
    """Running best of an accuracy series; ``update`` returns the best when a dip of more than ``threshold`` starts."""

    def __init__(self, threshold: float = 3.0):
        if threshold <= 0:
            raise ValueError("threshold must be > 0")
        self.threshold, self.best, self.in_dip = threshold, float("-inf"), False

    def update(self, value: float) -> float | None:
        dipping = value < self.best - self.threshold
        start = dipping and not self.in_dip
        self.in_dip = dipping
        best = self.best
        self.best = max(self.best, value)
        return best if start else None

    def state_dict(self) -> dict:
        return {"best": self.best, "in_dip": self.in_dip}

    def load_state_dict(self, state: dict) -> None:
        self.best, self.in_dip = state.get("best", float("-inf")), state.get("in_dip", False)


class EventLog:
    """Appends one JSON object per event to ``path``: ``{"step", "kind", "value", "baseline", ...}``, and writes
    the value as ``events/<kind>[/<group>]`` at the event's step to each of ``loggers`` (TensorBoard, W&B)."""

    def __init__(self, path: str | Path, loggers=()):
        self.path, self.loggers = Path(path), list(loggers)

    def write(self, step: int, kind: str, value: float, baseline: float, **extra) -> dict:
        event = {"step": int(step), "kind": kind, "value": float(value), "baseline": float(baseline), **extra}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with writing(self.path, "an event"), self.path.open("a") as f:
            f.write(json.dumps(event) + "\n")
        key = f"events/{kind}" + (f"/{extra['group']}" if "group" in extra else "")
        for logger in self.loggers:
            logger.log_metrics({key: float(value)}, step=int(step))
        return event


def read_events(path: str | Path) -> list[dict]:
    """The events of an ``events.jsonl`` (empty when absent; unreadable lines skipped)."""
    path = Path(path)
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def log_metrics(trainer, values: dict, step: int, prefix: str = PREFIX) -> dict[str, float]:
    """Write ``values`` (floats or 0-d tensors, read back in one sync) under ``prefix/`` at ``step`` straight to
    the run's loggers (CSV, TensorBoard; rank 0 only): a value appears once, labelled with the step it measures,
    whatever ``trainer.log_every_n_steps`` is (``LightningModule.log`` would repeat it at later logging steps).
    Returns the values as host floats (empty on the other ranks)."""
    if not values or not trainer.is_global_zero:
        return {}
    tensors = {k: v for k, v in values.items() if isinstance(v, Tensor)}
    if tensors:
        read = torch.stack([v.detach().float().reshape(()) for v in tensors.values()]).tolist()
        values = {**values, **dict(zip(tensors, read))}
    values = {k: float(v) for k, v in values.items()}
    metrics = {f"{prefix}/{k}": v for k, v in values.items()}
    for logger in trainer.loggers:
        logger.log_metrics(metrics, step=step)
    return values


def measured_step(trainer) -> int:
    """The index of the optimiser step that just ran (from on_train_batch_end)."""
    return trainer.global_step - 1


def stepped(trainer) -> bool:
    """Whether the batch that just ended took an optimiser step (with ``trainer.accumulate_grad_batches`` > 1
    the batches before the step's last only add gradients): the step-output instruments measure once per step."""
    loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
    return loop is None or not loop._should_accumulate()


def event_log(trainer, run_dir: str | Path | None = None) -> EventLog:
    """``RUN/events.jsonl``, the events also sent to the run's loggers but the CSV one (whose events are that file)."""
    loggers = [lg for lg in getattr(trainer, "loggers", []) if not isinstance(lg, CSVLogger)]
    return EventLog(Path(run_dir or trainer.default_root_dir) / "events.jsonl", loggers)


def report_collapse(event: dict) -> None:
    """The collapse alarm's one console line: the sign, its value, the step and the method's usual remedies."""
    print(f"selfsup: collapse at step {event['step']}: {event['sign']} = {event['value']:.4g} ({event['meaning']}; "
          f"threshold {event['baseline']:.4g}, past it for {event['window']} measurement"
          f"{'s' if event['window'] != 1 else ''}); try: {event['remedy']}",
          file=sys.stderr)


def report_event(event: dict) -> None:
    group = f" ({event['group']})" if "group" in event else ""
    print(f"selfsup: {event['kind']}{group} at step {event['step']}: {event['value']:.4g} "
          f"(baseline {event['baseline']:.4g})", file=sys.stderr)
