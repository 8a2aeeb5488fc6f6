"""Embedding-norm interventions (Draganov et al.): SimCLR and SimSiam, default / cut-init c=3 / GradScale p=1.

Each run is ``selfsup pretrain <method>-<dataset>`` (the small recipe: micro ViT, batch 256) with the same
seed and number of steps; the kNN monitor measures top-1 at fixed steps (a fixed 5000/1000 subset), the
default instruments log the embedding norms, and the run's final weighted kNN on the whole test split
comes from its ``knn.json``. Written: ``benchmarks/results/embedding_norms.json`` and, per method, an
overlay report (``selfsup report`` of its three runs) in ``benchmarks/results/embedding_norms_<method>/``.

    python -m benchmarks.embedding_norms                           # Fashion-MNIST, 1 epoch (234 steps) per run
    python -m benchmarks.embedding_norms --dataset digits --epochs 20 --knn-every 20 --methods simclr --tag simclr
    python -m benchmarks.embedding_norms --quick                   # smoke test: digits, a few steps
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
from pathlib import Path

from benchmarks.harness import ROOT, has_fashion_mnist, selfsup_cli, write_report

VARIANTS = {"default": [], "cut_init_c3": ["interventions.cut_init=3"],
            "grad_scale_p1": ["interventions.grad_scale_p=1"],
            "cut_init_last_c3": ["interventions.cut_init=3", "interventions.cut_init_scope=projector_last"]}
DEFAULT_VARIANTS = ["default", "cut_init_c3", "grad_scale_p1"]
PRESETS = {"fashion-mnist": "{}-fmnist", "digits": "{}-digits"}


def series(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    with (run_dir / "metrics.csv").open(newline="") as f:
        for row in csv.DictReader(f):
            for key, raw in row.items():
                if key not in ("step", "epoch") and raw:
                    out.setdefault(key, []).append((int(row["step"]), float(raw)))
    return out


def run_one(method: str, variant: str, args, runs_dir: Path) -> dict:
    name = f"{method}-{variant}"
    run_dir = runs_dir / name
    if args.collect:
        return run_figures(method, variant, run_dir)
    if run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)
    cmd = ["pretrain", PRESETS[args.dataset].format(method),
           f"output_dir={runs_dir}", f"name={name}", f"trainer.max_epochs={args.epochs}", "trainer.seed=0",
           "trainer.progress_bar=false", "trainer.accelerator=cpu", "trainer.devices=1",
           f"eval.knn_every_n_steps={args.knn_every}", *VARIANTS[variant], *args.extra]
    if args.limit_batches:
        cmd.append(f"trainer.limit_train_batches={args.limit_batches}")
    proc, wall = selfsup_cli(*cmd, capture=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed:\n{proc.stderr[-2000:]}")
    (run_dir / "wall_s.txt").write_text(f"{wall:.1f}\n")
    return run_figures(method, variant, run_dir)


def run_figures(method: str, variant: str, run_dir: Path) -> dict:
    """The figures of one finished run folder (``--collect`` rereads them without training)."""
    wall = float((run_dir / "wall_s.txt").read_text())
    s = series(run_dir)
    knn_json = json.loads((run_dir / "knn.json").read_text())
    norms = {k.split("/")[1][len("norm_"):-len("_mean")]: v for k, v in s.items()
             if k.startswith("instruments/norm_") and k.endswith("_mean")}
    return {
        "method": method, "variant": variant, "run_dir": str(run_dir), "wall_s": round(wall, 1),
        "steps": max(step for pts in s.values() for step, _ in pts) + 1,
        "knn_monitor_top1": s.get("monitor/knn_top1", []),
        "final_knn_top1": knn_json["pretrained"]["top1"], "random_init_knn_top1": knn_json["random_init"]["top1"],
        "norm_mean_over_training": {k: sum(v for _, v in pts) / len(pts) for k, pts in norms.items()},
        "norm_first_last": {k: (pts[0][1], pts[-1][1]) for k, pts in norms.items()},
        "final_loss": s["train/loss"][-1][1] if "train/loss" in s else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", choices=list(PRESETS), default=None,
                        help="default: fashion-mnist when installed, else digits")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--knn-every", type=int, default=39, help="kNN monitor every N steps")
    parser.add_argument("--limit-batches", type=int, default=0, help="batches per epoch (0: all)")
    parser.add_argument("--methods", nargs="+", default=["simclr", "simsiam"])
    parser.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS, choices=list(VARIANTS),
                        help="cut_init_last_c3: cut-init of the projector's last layer only")
    parser.add_argument("--runs-dir", default=str(ROOT / "runs" / "bench-embedding-norms"))
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--collect", action="store_true", help="reread finished runs in --runs-dir, train nothing")
    parser.add_argument("--tag", default="", help="suffix of the JSON file (e.g. to run the methods in parallel)")
    parser.add_argument("--quick", action="store_true", help="digits, 1 epoch of 3 batches: a smoke test")
    parser.add_argument("extra", nargs="*", help="further config overrides for every run")
    args = parser.parse_args()
    if args.dataset is None:
        args.dataset = "fashion-mnist" if has_fashion_mnist() else "digits"
    if args.quick:
        args.dataset, args.epochs, args.limit_batches, args.knn_every = "digits", 1, 3, 1
        args.extra += ["trainer.log_every_n_steps=1", "instruments.every_n_steps=1"]
    runs_dir, out = Path(args.runs_dir), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for method in args.methods:
        for variant in args.variants:
            r = run_one(method, variant, args, runs_dir)
            results.append(r)
            knn = " ".join(f"{s}:{v:.1f}" for s, v in r["knn_monitor_top1"])
            norms = " ".join(f"{k}={v:.3g}" for k, v in r["norm_mean_over_training"].items())
            print(f"{method:<8} {variant:<14} final kNN {r['final_knn_top1']:6.2f}%  wall {r['wall_s']:7.1f}s  "
                  f"kNN@steps [{knn}]  mean norms {norms}", flush=True)
    from selfsup.report import write_report as overlay_report

    for method in args.methods:
        dirs = [r["run_dir"] for r in results if r["method"] == method]
        overlay_report(dirs, out / f"embedding_norms_{method}")
    payload = {"dataset": args.dataset, "epochs": args.epochs, "limit_batches": args.limit_batches,
               "knn_every": args.knn_every, "extra_overrides": args.extra, "host": platform.node(),
               "cpus": os.cpu_count(), "note": "wall times measured on a shared machine", "runs": results}
    path = out / f"embedding_norms{'_quick' if args.quick else ''}{'_' + args.tag if args.tag else ''}.json"
    write_report(payload, path)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
