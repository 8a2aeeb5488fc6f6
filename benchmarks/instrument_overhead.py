"""Cost of leaving the instruments on at their defaults: CPU step time with ``instruments.enabled`` true vs false.

The same seeded run (a shipped recipe, default 'simsiam-digits': micro ViT, batch 256) is trained through the
Lightning engine with the instruments on and off, alternately, ``--reps`` times in one process. A timing
callback takes the wall time between successive ``on_train_batch_start`` calls (the whole step: augmentation,
forward, backward, optimiser, callbacks, logging); the first ``--warmup`` steps are dropped. The instruments'
default cadence (every 10 steps; rank every 100) is amortised, so use at least 100 counted steps.
Overhead = median over repetitions of (mean step on / mean step off) − 1; and, steadier on a busy machine,
the share of the "on" run's step time spent inside the instruments' per-step hooks (same run, same load).

    python -m benchmarks.instrument_overhead                       # 1 rep × 100 steps each way
    python -m benchmarks.instrument_overhead --preset simclr-fmnist --steps 100
    python -m benchmarks.instrument_overhead --toggle instruments.collapse_alarm --reps 4   # the collapse alarm alone

``--toggle KEY`` flips another boolean key between the two runs instead (the other instruments stay on): the
collapse alarm's cost is its step time ratio and the difference of the two runs' shares inside the hooks.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.harness import RESULTS, fit, step_clock, write_report


def hook_timer(clock, warmup: int):
    """A Lightning callback that, when fit starts, wraps the instruments' per-step hooks to add up the wall seconds
    spent inside them once ``clock`` has marked ``warmup`` steps (``.seconds``)."""
    import lightning.pytorch as pl

    class HookTimer(pl.Callback):
        seconds = 0.0

        def on_fit_start(self, trainer, pl_module):
            for callback in trainer.callbacks:
                if type(callback).__module__.startswith("selfsup.instruments"):
                    for name in ("on_train_batch_end", "on_before_optimizer_step"):
                        setattr(callback, name, self.timing(getattr(callback, name)))

        def timing(self, hook):
            def timed_hook(*args, **kwargs):
                start = time.perf_counter()
                try:
                    return hook(*args, **kwargs)
                finally:
                    if len(clock.marks) >= warmup:
                        self.seconds += time.perf_counter() - start
            return timed_hook

    return HookTimer()


def timed_run(preset: str, instruments: bool, steps: int, warmup: int, extra: list[str],
              toggle: str = "instruments.enabled") -> tuple[float, float]:
    """The mean wall seconds of a step after ``warmup`` and the share of it inside the instruments' hooks."""
    from selfsup.config import load_run_config
    from selfsup.data.datasets import load_dataset

    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_run_config(preset, [f"{toggle}={str(instruments).lower()}", "trainer.progress_bar=false",
                                       "trainer.accelerator=cpu", "trainer.devices=1", f"output_dir={tmp}",
                                       "trainer.max_epochs=1000", *extra])
        clock = step_clock(stop_after=warmup + steps)
        hooks = hook_timer(clock, warmup)
        fit(cfg, load_dataset(cfg.data, "train"), Path(tmp), [hooks, clock])
    times = [wall for wall, _ in clock.times(warmup)]
    return sum(times) / len(times), hooks.seconds / sum(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="simsiam-digits")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--out", default=str(RESULTS / "instrument_overhead.json"))
    parser.add_argument("--toggle", default="instruments.enabled", help="the boolean key that is on in one run, off in "
                        "the other")
    parser.add_argument("extra", nargs="*", help="config overrides for both runs")
    args = parser.parse_args()
    import warnings

    warnings.filterwarnings("ignore")
    on, off, share, share_off = [], [], [], []
    for rep in range(args.reps):
        for flag, bucket in ((False, off), (True, on)) if rep % 2 == 0 else ((True, on), (False, off)):
            step, hooks = timed_run(args.preset, flag, args.steps, args.warmup, args.extra, args.toggle)
            bucket.append(step)
            (share if flag else share_off).append(hooks)
            print(f"rep {rep} {args.toggle} {'on ' if flag else 'off'}: {1000 * step:.1f} ms/step, "
                  f"{100 * hooks:.2f}% of it inside the instruments' hooks", flush=True)
    ratios = [a / b - 1 for a, b in zip(on, off)]
    result = {"toggle": args.toggle, "preset": args.preset, "steps": args.steps, "warmup": args.warmup,
              "reps": args.reps, "extra_overrides": args.extra, "ms_per_step_on": [1000 * t for t in on],
              "ms_per_step_off": [1000 * t for t in off], "overhead_per_rep": ratios,
              "overhead_median": statistics.median(ratios), "hook_share_per_rep": share,
              "hook_share_median": statistics.median(share), "hook_share_off_per_rep": share_off,
              "threads": torch.get_num_threads(),
              "host": platform.node(), "cpus": os.cpu_count(),
              "note": "shared machine: other jobs were running; the alternating order limits drift bias, and the "
                      "share of time inside the instruments' hooks (same run) is the steadier figure"}
    write_report(result, args.out)
    print(f"{args.toggle} on: {100 * result['hook_share_median']:.2f}% of the step time inside the instruments' hooks "
          f"(off: {100 * statistics.median(share_off):.2f}%); "
          f"on/off step time {100 * result['overhead_median']:+.1f}% (per rep: "
          f"{', '.join(f'{100 * r:+.1f}%' for r in ratios)}); wrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
