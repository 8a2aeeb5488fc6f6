"""The I-JEPA collapse sign's calibration: the logged spreads of the digits runs that collapsed and of those that
did not, for ``tests/test_collapse_alarm.py`` to replay through the alarm.

A run is labelled by its loss, an instrument the sign does not read: collapsed when its last loss is under 1% of its
first (the predictor then has one target to predict; the ``ijepa-digits`` runs with the EMA from 0.9 end at
1e-4-8e-4 from 0.37), not collapsed otherwise (``code_lr`` ends at 0.29, ``m0.99`` at 0.069). Each run folder's
``metrics.csv`` gives the two spreads (``ijepa_target_std``, ``ijepa_prediction_std``) every 10 steps; its
``config.yaml`` and ``run.json`` the warm-up's steps, before which the alarm does not judge.

    python -m benchmarks.jepa_collapse_series RUN [RUN ...]   # e.g. runs/jepa_choice/* runs/digits_table/ijepa-*
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from benchmarks.harness import write_report

OUT = Path("benchmarks/results/ijepa_collapse_series.json")
SERIES = ("ijepa_target_std", "ijepa_prediction_std")


def read_run(run: Path) -> dict:
    from selfsup.claims.suite import column as logged

    def column(key: str) -> list[list[float]]:
        return [[step, round(value, 6)] for step, value in logged(run, key)]

    loss = column("train/loss")
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    facts = json.loads((run / "run.json").read_text())
    steps_per_epoch = facts["global_step"] / cfg["trainer"]["max_epochs"]
    return {"run": run.name, "loss_first": loss[0][1], "loss_last": loss[-1][1],
            "collapsed": loss[-1][1] < 0.01 * loss[0][1],
            "warmup_steps": round(cfg["optim"]["warmup_epochs"] * steps_per_epoch),
            "series": {name: column(f"instruments/{name}") for name in SERIES}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path)
    args = p.parse_args(argv)
    rows = [read_run(r) for r in args.runs if (r / "metrics.csv").exists()]
    for r in rows:
        print(f"{r['run']}: loss {r['loss_first']:.3g} -> {r['loss_last']:.3g}, collapsed {r['collapsed']}")
    write_report({"note": "ijepa-digits runs of 2026-12-05 (benchmarks/jepa_choice.py's variants at seeds 100-101, "
                          "the digits table's seeds 0-2): the spreads every 10 steps, the label from the loss",
                  "runs": rows}, OUT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
