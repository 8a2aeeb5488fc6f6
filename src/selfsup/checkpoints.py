"""Reading and writing ``.ckpt`` files: never running code from them, never leaving a damaged one.

A ``.ckpt`` is a pickle, and unpickling an arbitrary file can call any function it names. Every
checkpoint selfsup writes (``checkpoints/last.ckpt``: weights, optimiser state, loop counters,
callback state, the RNG state) holds only dicts, lists, tuples, strings, numbers and tensors, all of
which ``torch.load(weights_only=True)`` accepts without an allow-list of our own
(``EXTRA_SAFE_GLOBALS`` is empty on purpose). A file naming anything else is refused before any of it
runs. Exported ``.safetensors`` files hold no code at all and are the way to share weights.

Writes (:func:`write_checkpoint`) are atomic on any file system: a temp file in the checkpoint's own folder,
fsync, then a rename over the previous file (kept until then), then an fsync of the folder; a killed write
leaves only a ``.*.tmp`` file, removed by :func:`remove_partial_writes` at the next start. Each file holds the
sha256 of its contents (every tensor's bytes, dtype and shape and every other value, :func:`content_digest`)
under ``selfsup_sha256``; :func:`load_checkpoint` recomputes it and refuses a file whose bytes changed.

:class:`RunCheckpoints` decides when a run writes ``last.ckpt``: at every epoch end, every
``trainer.checkpoint_every_n_steps`` steps, every ``trainer.checkpoint_every_n_minutes`` of wall time, on
SIGINT / SIGTERM (then training stops) and at ``trainer.max_steps``; only with finite weights.
"""

from __future__ import annotations

import hashlib
import re
import signal
import sys
import time
import warnings
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins import TorchCheckpointIO

from selfsup.diskspace import TEMP_SUFFIX, atomic_write, tensor_bytes
from selfsup.errors import UserError

EXTRA_SAFE_GLOBALS: list = []  # nothing beyond torch's own weights-only set: selfsup checkpoints need no more
DIGEST_KEY = "selfsup_sha256"


def _feed(h, value) -> None:
    """Hash ``value`` in a fixed order: dicts by sorted key, tensors by dtype, shape and bytes."""
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy())  # the bytes, read in place
    elif isinstance(value, dict):
        h.update(b"{")
        for k in sorted(value, key=repr):
            h.update(repr(k).encode())
            _feed(h, value[k])
        h.update(b"}")
    elif isinstance(value, (list, tuple)):
        h.update(b"[" if isinstance(value, list) else b"(")
        for v in value:
            _feed(h, v)
        h.update(b"]")
    else:
        h.update(f"{type(value).__name__}:{value!r};".encode())


def content_digest(checkpoint: dict) -> str:
    """sha256 of everything in ``checkpoint`` but its own digest."""
    h = hashlib.sha256()
    _feed(h, {k: v for k, v in checkpoint.items() if k != DIGEST_KEY})
    return h.hexdigest()


def write_checkpoint(checkpoint: dict, path: Path) -> None:
    """Write ``checkpoint`` (with its digest) to ``path`` atomically (``diskspace.atomic_write``: temp file beside
    it, fsync, rename); out of space, a one-line :class:`~selfsup.diskspace.DiskFull`, the previous file whole."""
    checkpoint[DIGEST_KEY] = content_digest(checkpoint)
    atomic_write(Path(path), lambda f: torch.save(checkpoint, f), "the checkpoint", tensor_bytes(checkpoint))


def remove_partial_writes(folder: Path) -> list[Path]:
    """Delete the temp files a killed write left in ``folder``; the removed paths."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    removed = [p for p in folder.glob(f".*{TEMP_SUFFIX}") if p.is_file()]
    for p in removed:
        p.unlink()
    return removed


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writer, writing with :func:`write_checkpoint` (in place of its temp-folder move)."""

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        write_checkpoint(checkpoint, Path(path))


def load_checkpoint(path: Path, fix: str) -> dict:
    """The contents of the checkpoint ``path``, loaded with ``weights_only=True`` and checked against its digest;
    a one-line UserError ending in ``fix`` when the file is unreadable or damaged, and a refusal naming the
    foreign object when it holds code."""
    path = Path(path)
    try:
        with torch.serialization.safe_globals(EXTRA_SAFE_GLOBALS), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*Detected pickle protocol.*")  # Lightning saves protocol 4
            ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        foreign = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(e))
        if foreign:
            raise UserError(f"refusing {path}: it names {foreign.group(1)}, an object selfsup checkpoints "
                            "never hold, which could run code when loaded; use only checkpoints you made, and share "
                            "weights as exported .safetensors") from None
        raise UserError(f"{path} is not a readable selfsup checkpoint ({type(e).__name__}); {fix}") from None
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("state_dict"), dict):
        raise UserError(f"{path} is not a selfsup checkpoint (no state_dict); {fix}")
    if DIGEST_KEY in ckpt and ckpt[DIGEST_KEY] != content_digest(ckpt):
        raise UserError(f"{path} is damaged: its contents do not match the sha256 written with it; {fix}")
    return ckpt


def check_checkpoint(path: Path, model: torch.nn.Module) -> dict:
    """A readable checkpoint (loaded weights-only: a file holding code is refused) whose weights fit ``model``,
    or a one-line UserError."""
    ckpt = load_checkpoint(path, "delete it to restart the run from scratch")
    state = ckpt["state_dict"]
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    mismatched = [k for k in own if k in state and state[k].shape != own[k].shape]
    if missing or mismatched or set(state) - set(own):
        what = f"missing {missing[0]}" if missing else (f"shape of {mismatched[0]}" if mismatched else "extra weights")
        raise UserError(f"checkpoint {path} does not fit this run's model ({what}); it was made with another config")
    return ckpt


class NonFiniteWeights(UserError):
    """The weights became NaN or Inf: training stops without writing them."""


def all_finite(module: torch.nn.Module) -> bool:
    """Whether every floating-point parameter and buffer of ``module`` is finite (one host read)."""
    flags = [torch.isfinite(t).all() for t in module.state_dict().values()
             if isinstance(t, torch.Tensor) and t.is_floating_point()]
    return bool(torch.stack(flags).all()) if flags else True


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class RunCheckpoints(pl.Callback):
    """When a run writes ``RUN/checkpoints/last.ckpt`` (the folder is the trainer's ``default_root_dir`` at each
    write, so a moved run folder keeps writing into itself):

    - at every epoch end;
    - after every ``every_n_steps`` optimiser steps (0: off), every ``every_n_minutes`` of wall time (0: off), at
      ``max_steps`` (0: none; training then stops) and at the step boundary after SIGINT / SIGTERM (training
      then stops, ``signal_received`` says which; a second SIGINT interrupts at once).

    A step checkpoint due at an epoch's last batch is written at that epoch's end instead: Lightning 2.6 restores
    a checkpoint written in ``on_train_batch_end`` of an epoch's last batch as an unfinished epoch whose end it
    then replays without counting the next epoch as started, so every checkpoint written after such a resume
    would send the next resume back to the start of its epoch. An epoch-end checkpoint holds the same state
    (nothing trains between the two) in the form Lightning restores exactly.

    Under several processes the decision to write (and to stop) is rank 0's signal or clock, all-reduced at each
    step. Weights are checked finite before every write (:class:`NonFiniteWeights` stops training otherwise), and
    the loggers' buffered rows of earlier steps are flushed first, so ``metrics.csv`` holds every row the
    checkpoint stands for."""

    def __init__(self, every_n_steps: int = 0, every_n_minutes: float = 0.0, max_steps: int = 0):
        super().__init__()
        self.every_n_steps, self.every_n_minutes, self.max_steps = every_n_steps, every_n_minutes, max_steps
        self.saved_step: int | None = None  # global step of the newest checkpoint on disk (resumed: the loaded one)
        self.signal_received: int | None = None
        self.started = False  # training began (a failure before it is a failed start)
        self._last_time = time.monotonic()
        self._handlers: dict = {}
        self._flag = False

    # ---------------------------------------------------------------- where and when
    @staticmethod
    def path(trainer) -> Path:
        return Path(trainer.default_root_dir) / "checkpoints" / "last.ckpt"

    def _on_signal(self, signum, frame) -> None:
        if self._flag and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now
        if not self._flag:  # said at once: a long step may run on for a while
            print(f"selfsup: {signal.Signals(signum).name} received: stopping after this step, with a checkpoint "
                  "(a second Ctrl-C stops at once)", file=sys.stderr, flush=True)
        self._flag = True
        self.signal_received = signum

    def on_train_start(self, trainer, pl_module) -> None:
        self.started = True
        self.saved_step = trainer.global_step if trainer.ckpt_path else None
        self._last_time = time.monotonic()
        if self.max_steps > 0 and trainer.global_step >= self.max_steps:
            trainer.should_stop = True  # resumed at its last step: nothing to train
        try:
            self._handlers = {s: signal.signal(s, self._on_signal) for s in STOP_SIGNALS}
        except ValueError:  # not the main thread: Lightning's own handling stays
            self._handlers = {}

    def _restore_handlers(self) -> None:
        for s, h in self._handlers.items():
            signal.signal(s, h)
        self._handlers = {}

    def on_train_end(self, trainer, pl_module) -> None:
        self._restore_handlers()

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._restore_handlers()

    def _agreed(self, trainer, *flags: bool) -> list[bool]:
        """``flags`` OR-ed over the processes (one all-reduce per step, only with several processes)."""
        if trainer.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
            t = torch.tensor([float(f) for f in flags], device=trainer.strategy.root_device)
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
            return [bool(v) for v in t.tolist()]
        return list(flags)

    # ---------------------------------------------------------------- the hooks
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if trainer.fit_loop.epoch_loop._should_accumulate():  # not an optimiser step (gradient accumulation)
            return
        step = trainer.global_step
        timed = self.every_n_minutes > 0 and time.monotonic() - self._last_time >= 60 * self.every_n_minutes
        stop_signal, timed = self._agreed(trainer, self._flag, timed)
        at_max = self.max_steps > 0 and step >= self.max_steps
        due = stop_signal or timed or at_max or (self.every_n_steps > 0 and step % self.every_n_steps == 0)
        if stop_signal and self.signal_received is None:
            self.signal_received = signal.SIGTERM  # another process's signal
        if stop_signal or at_max:
            trainer.should_stop = True
        if not due:
            return
        if not trainer.fit_loop.epoch_loop._num_ready_batches_reached():  # an epoch's last: written at its end
            self.save(trainer, pl_module, flush_all=False)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if not trainer.fit_loop.epoch_loop._num_ready_batches_reached():
            return  # an epoch cut short by a stop: its checkpoint was written at the stopping step
        if self.saved_step != trainer.global_step:
            self.save(trainer, pl_module, flush_all=True)

    # ---------------------------------------------------------------- the write
    def save(self, trainer, pl_module, flush_all: bool) -> None:
        watch = getattr(pl_module, "finite_watch", None)
        if watch is not None:
            watch.check()  # a non-finite loss stops training before anything is written
        finite = all_finite(pl_module)
        if trainer.world_size > 1:
            finite = bool(trainer.strategy.reduce_boolean_decision(finite, all=True))
        if not finite:
            raise NonFiniteWeights(f"the weights became non-finite by step {trainer.global_step - 1}; training "
                                   "stopped without writing them. Lower optim.base_lr, add warmup, or set "
                                   "trainer.gradient_clip_val")
        for callback in trainer.callbacks:  # instruments that buffer: what they hold reaches their files first
            before = getattr(callback, "before_checkpoint", None)
            if callable(before):
                before(trainer)
        flush_loggers(trainer, None if flush_all else trainer.global_step - 1)
        trainer.save_checkpoint(self.path(trainer), weights_only=False)
        self.saved_step = trainer.global_step
        self._last_time = time.monotonic()


def flush_loggers(trainer, open_step: int | None) -> None:
    """Write the loggers' buffered rows to disk, but for those of ``open_step`` (still being logged) when given."""
    if not trainer.is_global_zero:
        return
    for logger in trainer.loggers:
        writer = getattr(logger, "_experiment", None)  # the CSV logger's writer buffers rows in .metrics
        rows = getattr(writer, "metrics", None)
        if open_step is not None and isinstance(rows, list):
            writer.metrics = [r for r in rows if r.get("step") != open_step]
            logger.save()
            writer.metrics = [r for r in rows if r.get("step") == open_step] + list(writer.metrics)
        else:
            logger.save()
