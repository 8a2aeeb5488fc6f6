"""The progress of a run on its console: Lightning's tqdm bar on a terminal; where stdout is not one (redirected to
a file, a batch job's log, a pipe) a plain line every ``trainer.log_every_n_steps`` batches and at each epoch's end,
instead of the bar's redraws, which fill such a log with thousands of carriage-returned lines."""

from __future__ import annotations

import math
import sys
import time

from lightning.pytorch.callbacks import ProgressBar


class PlainProgress(ProgressBar):
    """A line ``epoch E/N batch B/T step S  loss 1.23 ...  R it/s`` every ``every`` batches of an epoch and at its
    last one (rank 0 only: ``ProgressBar.setup`` disables the others), flushed at once."""

    def __init__(self, every: int):
        super().__init__()
        self.every, self.enabled = max(1, int(every)), True
        self.started, self.first = 0.0, 0  # when and at which batch this session's epoch started (a resume: mid-way)

    def disable(self) -> None:
        self.enabled = False

    def enable(self) -> None:
        self.enabled = True

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self.started, self.first = time.perf_counter(), trainer.fit_loop.epoch_loop.batch_progress.current.ready

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        done, total = batch_idx + 1, self.total_train_batches
        if self.enabled and (done % self.every == 0 or done == total):
            self.print_line(trainer, pl_module, done, total)

    def print_line(self, trainer, pl_module, done: int, total: int | float) -> None:
        epochs = trainer.max_epochs if trainer.max_epochs and trainer.max_epochs > 0 else None
        metrics = {k: v for k, v in self.get_metrics(trainer, pl_module).items() if k != "v_num"}
        values = "  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items())
        rate = (done - self.first) / max(time.perf_counter() - self.started, 1e-9)
        print(f"epoch {trainer.current_epoch + 1}{f'/{epochs}' if epochs else ''} batch {done}"
              f"{'' if math.isinf(total) else f'/{int(total)}'} step {trainer.global_step}"
              f"{'  ' + values if values else ''}  {rate:.2f} it/s", flush=True)


def on_terminal() -> bool:
    """Whether stdout is a terminal (Lightning's redrawn bar) or a file or pipe (plain lines)."""
    return sys.stdout.isatty()


def progress_bars(trainer) -> list:
    """The progress bar of a run's ``trainer`` config: none when ``progress_bar`` is off, Lightning's own (tqdm) on
    a terminal, else ``PlainProgress`` every ``log_every_n_steps`` batches."""
    return [PlainProgress(trainer.log_every_n_steps)] if trainer.progress_bar and not on_terminal() else []
