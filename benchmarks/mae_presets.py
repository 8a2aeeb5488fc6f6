"""MAE's CPU presets judged as MAE is: fine-tuning top-1 of the pretrained encoder against the same fine-tuning
from its random initialisation (the floor), beside kNN@20 and the linear probe (BatchNorm(affine=False) head).

    python -m benchmarks.mae_presets --preset mae-digits --ft-epochs 20
    python -m benchmarks.mae_presets --preset mae-fmnist --ft-epochs 3 --train-limit 10000
    python -m benchmarks.mae_presets --preset mae-digits --collect RUN   # only read an existing run's results

Runs the command line as a user would: ``selfsup pretrain PRESET``, then ``selfsup eval finetune`` of the run and
of its ``backbone_init.safetensors`` with the same flags, and ``selfsup eval all`` of both;
writes ``benchmarks/results/<preset>.json``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.harness import RESULTS, selfsup_cli, write_report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="mae-digits")
    parser.add_argument("--ft-epochs", type=int, default=20)
    parser.add_argument("--train-limit", type=int, help="fine-tune on a fixed subset of train (both sides alike)")
    parser.add_argument("--runs", default="runs/mae-presets", help="folder of the run")
    parser.add_argument("--collect", help="an existing run folder whose results these commands already wrote")
    parser.add_argument("--out", help="default benchmarks/results/<preset>.json")
    args = parser.parse_args()
    run = Path(args.collect) if args.collect else Path(args.runs) / args.preset
    ft = ["--epochs", str(args.ft_epochs), *(["--train-limit", str(args.train_limit)] if args.train_limit else [])]
    sides = {"pretrained": (run, run / "eval" / "ft_pretrained"),
             "random_init": (run / "backbone_init.safetensors", run / "eval" / "ft_random_init")}
    if not args.collect:
        selfsup_cli("pretrain", args.preset, "trainer.progress_bar=false", f"output_dir={run.parent}",
                    f"name={run.name}")
        for source, out in sides.values():
            out.mkdir(parents=True, exist_ok=True)
            selfsup_cli("eval", "finetune", str(source), *ft, "--out", str(out))
            selfsup_cli("eval", "all", str(source), "--out", str(out.parent / f"all_{out.name[3:]}"))
    report = {"preset": args.preset, "run": str(run), "finetune_flags": ft, "results": {}}
    for side, (_, out) in sides.items():
        tag = ".init" if side == "random_init" else ""  # selfsup eval keys results by the weights they evaluated
        finetune = json.loads((out / f"finetune{tag}.json").read_text())
        every = json.loads((out.parent / f"all_{out.name[3:]}" / f"all{tag}.json").read_text())
        report["results"][side] = {
            "finetune_top1": finetune["test"]["top1"], "finetune_epochs": finetune["epochs"],
            "knn20_top1": every["knn"]["k=20"]["top1"], "linear_top1": every["linear"]["top1"],
            "rankme": every["rankme"]}
    r = report["results"]
    report["finetune_gain_over_random_init"] = r["pretrained"]["finetune_top1"] - r["random_init"]["finetune_top1"]
    write_report(report, args.out or RESULTS / f"{args.preset}.json")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
