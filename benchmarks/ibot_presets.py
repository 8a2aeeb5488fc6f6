"""iBOT's CPU presets: the end-of-run weighted kNN (the run's ``knn.json``: the teacher against its random init,
the floor) and the last collapse signs and losses the run logged.

    python -m benchmarks.ibot_presets --preset ibot-digits [OVERRIDE ...]
    python -m benchmarks.ibot_presets --preset ibot-digits --collect RUN   # only read an existing run's results

Runs ``selfsup pretrain PRESET OVERRIDE ...`` as a user would and writes ``benchmarks/results/<preset>.json``.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import yaml

from benchmarks.harness import RESULTS, selfsup_cli, write_report

SIGNS = ("train/loss", "train/loss_cls", "train/loss_patch", "instruments/dino_teacher_entropy",
         "instruments/dino_center_norm", "instruments/ibot_center2_norm", "instruments/ibot_masked_share",
         "instruments/rankme_embedding")


def last_logged(run: Path) -> dict:
    """The last value of each of ``SIGNS`` in the run's metrics.csv, with its step."""
    out: dict = {}
    with (run / "metrics.csv").open(newline="") as f:
        for row in csv.DictReader(f):
            for key in SIGNS:
                if row.get(key):
                    out[key] = {"step": int(row["step"]), "value": float(row[key])}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="ibot-digits")
    parser.add_argument("--runs", default="runs/ibot-presets", help="folder of the run")
    parser.add_argument("--collect", help="an existing run folder to read instead of training")
    parser.add_argument("--out", help="default benchmarks/results/<preset>.json")
    parser.add_argument("overrides", nargs="*", help="dotted overrides passed to selfsup pretrain")
    args = parser.parse_args()
    run = Path(args.collect) if args.collect else Path(args.runs) / args.preset
    wall = None
    if not args.collect:
        _, wall = selfsup_cli("pretrain", args.preset, "trainer.progress_bar=false", f"output_dir={run.parent}",
                              f"name={run.name}", *args.overrides)
    knn = json.loads((run / "knn.json").read_text())
    config = yaml.safe_load((run / "config.yaml").read_text())
    report = {
        "preset": args.preset, "run": str(run), "overrides": args.overrides or None, "wall_s": wall,
        "epochs": config["trainer"]["max_epochs"], "batch_size": config["data"]["batch_size"],
        "knn": knn, "knn_gain_over_random_init": knn["pretrained"]["top1"] - knn["random_init"]["top1"],
        "last_logged": last_logged(run), "method": config["method"],
    }
    write_report(report, Path(args.out) if args.out else RESULTS / f"{args.preset}.json")
    print(json.dumps({k: report[k] for k in ("preset", "knn", "knn_gain_over_random_init")}, indent=2))


if __name__ == "__main__":
    main()
