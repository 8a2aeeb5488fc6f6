"""Dense scores of the digits ViT presets against their random init (issue 65): each preset trained for its own
default budget (``selfsup pretrain PRESET``, seed 0, 1 thread), then ``selfsup eval segment`` on the generated
``digits-canvas`` task (both protocols, their defaults) of the trained backbone (DINO / iBOT: the teacher, as
exported) and of its ``backbone_init.safetensors``. Writes ``benchmarks/results/segment_digits.json`` and prints the
table (markdown). A run folder already in ``--runs`` (``PRESET``) with its backbone exported is scored, not retrained.

    OMP_NUM_THREADS=1 python -m benchmarks.segment_digits --runs /tmp/seg-runs
    python -m benchmarks.segment_digits --table

``train s``: the run's fit seconds (``run.json``), 1 thread on a shared 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from benchmarks.harness import cpu_kind, pretrain, trained, write_report

PRESETS = ("moco-v3-vit-digits", "dino-digits", "ibot-digits", "mae-digits")
OUT = Path("benchmarks/results/segment_digits.json")


def segment(weights: Path, out: Path) -> dict:
    """``selfsup eval segment WEIGHTS --device cpu --out OUT``'s results (its JSON)."""
    from selfsup.commands.main import main as selfsup

    if selfsup(["eval", "segment", str(weights), "--device", "cpu", "--out", str(out)]):
        raise RuntimeError(f"selfsup eval segment {weights} failed")
    tag = ".init" if weights.name == "backbone_init.safetensors" else ""
    return json.loads((out / f"segment{tag}.json").read_text())


def scores(res: dict) -> dict:
    return {f"segment_{p}_{key}": round(res[p][key], 2) for p in ("linear", "knn") for key in ("miou", "miou_fg")}


def table(results: dict) -> str:
    lines = ["digits-canvas (24 px canvases, 2 digits each, 11 classes with the background; 1000 train / 200 test), "
             "frozen patch features: DINOv2's linear head (BatchNorm + 1x1 linear) and a patch kNN (k 20, T 0.07); "
             "mIoU % with the background (fg: without it), trained / random init (`benchmarks/segment_digits.py`)", "",
             "| preset | linear mIoU | linear fg mIoU | kNN mIoU | kNN fg mIoU | train s |",
             "|---|---|---|---|---|---|"]
    for r in results["runs"]:
        t, i = r["trained"], r["init"]
        cells = [f"{t[k]:.1f} / {i[k]:.1f}" for k in ("segment_linear_miou", "segment_linear_miou_fg",
                                                       "segment_knn_miou", "segment_knn_miou_fg")]
        lines.append(f"| `{r['preset']}` | {' | '.join(cells)} | {r['train_wall_s']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", default=",".join(PRESETS))
    p.add_argument("--runs", default="runs/segment-digits", help="the run folders (PRESET), trained when missing")
    p.add_argument("--table", action="store_true", help="only print the table of the existing JSON")
    p.add_argument("--out", default=str(OUT))
    args = p.parse_args(argv)
    if args.table:
        print(table(json.loads(Path(args.out).read_text())))
        return 0
    torch.set_num_threads(1)
    results = {"task": "digits-canvas", "threads": 1, "machine": cpu_kind(), "seed": 0,
               "note": "wall times on a 2-core machine shared with other work", "runs": []}
    for preset in args.presets.split(","):
        run = Path(args.runs) / preset
        if not (run / "backbone.safetensors").exists():
            pretrain(preset, [], run, report=False)
        t0 = time.perf_counter()
        row = {"preset": preset, "train_wall_s": round(trained(run).facts.get("fit_seconds", 0), 1),  # the fit's
               "trained": scores(segment(run / "backbone.safetensors", run / "eval")),
               "init": scores(segment(run / "backbone_init.safetensors", run / "eval"))}
        row["eval_wall_s"] = round(time.perf_counter() - t0, 1)
        results["runs"].append(row)
        print(json.dumps(row), flush=True)
        write_report(results, args.out)
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
