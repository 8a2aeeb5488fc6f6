"""The fixed cost of a claim's training run, with and without what a claim's runs share: each split of an
in-memory dataset read once per process (``claims.suite.shared_datasets``) and the random-init kNN computed once
per init (``runs.finish.init_knn_key``).

Two arms of one seed (same init) as a paired claim runs them, a few steps each so that the fixed cost shows;
shared and unshared pairs alternate, so both sides see the same machine load. Prints the wall time of each pair
and the ratio of the medians.

    python -m benchmarks.claims_fixed_cost [--preset moco-v3-vit-digits] [--repeats 3]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
from pathlib import Path

import torch

from benchmarks.harness import timed


def pair(work: Path, preset: str, shared: bool, extra: list[str]) -> None:
    from selfsup.claims import suite
    from selfsup.runs import finish

    suite._SPLITS.clear()  # every pair starts cold: shared, its second run reuses what its first read
    finish._INIT_KNN.clear()
    ctx = suite.Context(quick=True, seeds=1, work=work, progress=lambda m: None)
    scope = suite.shared_datasets() if shared else contextlib.nullcontext()
    with scope:
        for arm, overrides in (("a", []), ("b", ["optim.base_lr=1e-4"])):  # the same init, another lr
            if not shared:
                finish._INIT_KNN.clear()  # as before the cache: every run computes its own
            suite.pretrain_run(ctx, preset, f"{arm}-{shared}", ["trainer.seed=0", *extra, *overrides])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="moco-v3-vit-digits")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2, help="training batches per run")
    parser.add_argument("--set", nargs="*", default=[], help="extra overrides (data.root=... for Fashion-MNIST)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    extra = ["trainer.max_epochs=1", f"trainer.limit_train_batches={args.steps}", "eval.knn_every_n_steps=0",
             *args.set]
    with tempfile.TemporaryDirectory() as tmp:
        pair(Path(tmp), args.preset, True, extra)  # imports and the first reads, outside the timing
        times = {True: [], False: []}
        for _ in range(args.repeats):
            for shared in (False, True):
                (wall, _), = timed(lambda: pair(Path(tmp), args.preset, shared, extra), 1)
                times[shared].append(wall)
                print(f"{'shared' if shared else 'unshared':>8}: {times[shared][-1]:.2f} s per pair", flush=True)
    a, b = statistics.median(times[False]), statistics.median(times[True])
    print(f"{args.preset}, {args.steps} steps per run: unshared {a:.2f} s, shared {b:.2f} s per pair of runs "
          f"(median of {args.repeats}); shared / unshared = {b / a:.2f}, {a - b:.2f} s saved per pair")


if __name__ == "__main__":
    main()
