"""Continued pretraining against the same budget from scratch (issue 50, item 2): the adapt-fmnist preset pair.

One source model (``adapt-fmnist-source``, seed 0: MoCo v3's micro ViT on Fashion-MNIST's classes 0-4, 5 epochs),
then per seed the same budget on classes 5-9 (2 epochs) two ways: ``adapt-fmnist`` (the source's weights, a quarter
of the lr, a 0.1-epoch warm-up) and ``adapt-fmnist-scratch`` (a random init, the from-scratch preset's lr and
warm-up). Each run's end-of-run report scores it with kNN@20 (T 0.07) on classes 5-9 of the test split (5,000
images), beside its starting point (``backbone_init``: the source model for the adapted run, the seed's random init
for the scratch one). The table: each arm's mean and 95% interval over seeds (Student t,
``selfsup.claims.stats``) and the paired gain of adapting over scratch. A run already in ``--runs`` with its
``knn.json`` is read, not re-run. Writes ``benchmarks/results/adapt_pair.json``.

    python -m benchmarks.adapt_pair --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from benchmarks.harness import cpu_kind, has_fashion_mnist, pretrain, trained, write_report

ARMS = ("adapt-fmnist", "adapt-fmnist-scratch")


def stats(values: list[float]) -> dict:
    from selfsup.claims.stats import interval, summary

    n, mean, sd = summary(values)
    lo, hi = interval(mean, sd, n) if sd is not None else (None, None)
    return {"mean": round(mean, 2), "interval": [round(lo, 2), round(hi, 2)] if lo is not None else None,
            "values": [round(v, 2) for v in values]}


def run_once(preset: str, overrides: list[str], run: Path):
    """The run in ``run``: read where its report exists, else trained here; (its kNN report, its wall seconds)."""
    if (run / "knn.json").exists():
        done = trained(run)
        return done.knn, done.facts.get("fit_seconds")
    done = pretrain(preset, [*overrides, "trainer.progress_bar=false"], run)
    return done.knn, done.wall_s


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--runs", default="runs/adapt_pair")
    p.add_argument("--out", default="benchmarks/results/adapt_pair.json")
    args = p.parse_args(argv)
    if not has_fashion_mnist():
        print("error: Fashion-MNIST is not installed (apt-get install -y dataset-fashion-mnist)", file=sys.stderr)
        return 2
    seeds, runs = [int(s) for s in args.seeds.split(",")], Path(args.runs)
    torch.set_num_threads(1)
    source = runs / "adapt-fmnist-source"
    knn, wall = run_once("adapt-fmnist-source", ["trainer.seed=0"], source)
    source_top1 = knn["pretrained"]["top1"]
    print(f"source: kNN {source_top1:.2f} on classes 0-4 ({wall:.0f} s)", flush=True)
    rows = {arm: [] for arm in ARMS}
    for seed in seeds:
        for arm in ARMS:
            weights = [f"model.weights={source}"] if arm == "adapt-fmnist" else []
            knn, wall = run_once(arm, [f"trainer.seed={seed}", *weights], runs / f"{arm}-s{seed}")
            rows[arm].append({"seed": seed, "knn20_top1": round(knn["pretrained"]["top1"], 2),
                              "start_knn20_top1": round(knn["random_init"]["top1"], 2),
                              "wall_s": round(wall) if wall is not None else None})
            print(arm, json.dumps(rows[arm][-1]), flush=True)
    gains = [a["knn20_top1"] - s["knn20_top1"] for a, s in zip(*rows.values())]
    report = {"note": "kNN@20 T 0.07 on Fashion-MNIST's classes 5-9 (5,000 test images); the adapted runs start "
                      "from one source model (seed 0, classes 0-4), the scratch runs from each seed's random init; "
                      "one thread per run on a shared 2-core machine",
              "machine": cpu_kind(), "source": {"knn20_top1_classes_0_4": round(source_top1, 2)},
              "arms": {arm: {"knn20": stats([r["knn20_top1"] for r in rs]),
                             "start_knn20": stats([r["start_knn20_top1"] for r in rs]), "runs": rs}
                       for arm, rs in rows.items()},
              "adapt_minus_scratch": stats(gains)}
    write_report(report, args.out)
    g = report["adapt_minus_scratch"]
    print(f"adapt - scratch: {g['mean']:+.2f} {g['interval']}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
