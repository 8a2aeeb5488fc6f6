"""MAE's CPU presets judged by MAE's own protocols: fine-tuning top-1 with the global pool + fc_norm (MAE's
default) against the class token, and the linear probe with MAE's recipe (BatchNorm(affine=False) + LARS at
base lr 0.1, 10 of 90 warm-up epochs), each for the pretrained encoder and its random initialisation.

    python -m benchmarks.mae_eval --preset mae-digits --ft-epochs 20
    python -m benchmarks.mae_eval --preset mae-fmnist --ft-epochs 3 --train-limit 10000
    python -m benchmarks.mae_eval --preset mae-digits --run /tmp/maeruns/digits100   # an existing run

Runs the command line as a user would (``selfsup pretrain`` unless ``--run``, then ``selfsup eval finetune``
and ``selfsup eval linear``); a step whose JSON is already in the work folder is read, not run again. The
probe is also run over a LARS lr grid chosen on a validation split, since LARS moves a weight by
lr · 0.001 · ‖w‖ a step and the official lr is sized for 90 epochs of ImageNet at batch 16384.
Writes ``benchmarks/results/mae_eval.json`` (one entry per preset, merged with the file's others).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from benchmarks.harness import RESULTS, read_report, selfsup_cli, write_report

LARS_GRID = "0.1,1,10,100"


def step(out: Path, name: str, *args: str) -> dict:
    """``selfsup eval ARGS --out OUT`` unless OUT/NAME.json exists; its JSON."""
    path = out / f"{name}.json"
    if not path.exists():
        out.mkdir(parents=True, exist_ok=True)
        selfsup_cli("eval", *args, "--out", str(out))
    return json.loads(path.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="mae-digits")
    parser.add_argument("--run", help="an existing run folder of the preset (default: pretrain one)")
    parser.add_argument("--ft-epochs", type=int, default=20)
    parser.add_argument("--train-limit", type=int, help="fine-tune and probe on a fixed subset of train")
    parser.add_argument("--pools", default="global,cls", help="fine-tuning pools to run (default global,cls)")
    parser.add_argument("--random-pools", help="pools of the random-init side (default: --pools)")
    parser.add_argument("--work", default="runs/mae-eval", help="folder of the run and the evaluations")
    parser.add_argument("--out", default=str(RESULTS / "mae_eval.json"))
    args = parser.parse_args()
    work = Path(args.work) / args.preset
    run = Path(args.run) if args.run else work / "run"
    if not args.run and not (run / "backbone.safetensors").exists():
        selfsup_cli("pretrain", args.preset, "trainer.progress_bar=false", f"output_dir={run.parent}",
                    f"name={run.name}")
    limit = ["--train-limit", str(args.train_limit)] if args.train_limit else []
    ft = ["--epochs", str(args.ft_epochs), *limit]
    pools = [p for p in args.pools.split(",") if p]
    random_pools = [p for p in (args.pools if args.random_pools is None else args.random_pools).split(",") if p]
    t0 = time.perf_counter()
    results = {}
    for side, source in (("pretrained", run), ("random_init", run / "backbone_init.safetensors")):
        o = work / side
        r = {}
        for pool in pools if side == "pretrained" else random_pools:
            res = step(o / f"ft_{pool}", "finetune", "finetune", str(source), *ft, "--pool", pool)
            r[f"finetune_{pool}_top1"] = res["test"]["top1"]
        lin = step(o / "linear_mae", "linear", "linear", str(source), *limit)
        assert lin["protocol"] == "mae" and lin["optimizer"] == "lars"
        r["linear_mae_top1"] = lin["test"]["top1"]
        r["linear_mae_lr"] = lin["lr"]
        grid = step(o / "linear_mae_grid", "linear", "linear", str(source), *limit, "--lr-grid", LARS_GRID)
        r["linear_mae_lr_grid_top1"] = grid["test"]["top1"]
        r["linear_mae_lr_grid_chosen_base_lr"] = grid["base_lr"]
        results[side] = r
    p, z = results["pretrained"], results["random_init"]
    entry = {
        "run": str(run), "finetune_flags": ft, "probe_flags": limit, "results": results,
        "finetune_global_minus_cls": {s: results[s]["finetune_global_top1"] - results[s]["finetune_cls_top1"]
                                      for s in results if {"global", "cls"} <= set(pools if s == "pretrained"
                                                                                 else random_pools)},
        "gain_over_random_init": {k: p[k] - z[k] for k in (*(f"finetune_{pool}_top1" for pool in random_pools),
                                                           "linear_mae_top1", "linear_mae_lr_grid_top1")},
        "probe": "features path (cached features, no augmentation), 90 epochs, batch 256, LARS; the grid "
                 f"{LARS_GRID} chosen on a 10% validation split",
        "finetune": "plain crop + flip recipe (the in-memory sets' default), layer decay 0.75, drop path 0.1, "
                    "label smoothing 0.1, position table trained; only the pool differs",
        "wall_s_evals": round(time.perf_counter() - t0, 1),
        "note": "wall times on a 2-core machine shared with other work",
    }
    report = read_report(args.out)
    report[args.preset] = entry
    write_report(report, args.out)
    print(json.dumps(entry, indent=2))


if __name__ == "__main__":
    main()
