"""BYOL with four predictors on the small Fashion-MNIST recipe: kNN at fixed checkpoints, predictor alignment,
and the cost of DirectPred's eigendecomposition per step.

Variants (same preset ``byol-fmnist``, same seed, same steps; only ``method.predictor`` differs):
  mlp (the default 2-layer predictor), linear (bias-free, trained by gradient), directpred (W_p from the
  eigendecomposition of F every step, no gradient), directcopy (W_p = F + εI every step).
Each run goes through ``selfsup.engine.pretrain`` with the kNN monitor (``eval.knn_every_n_steps``, fixed
train/test subsets) and the instruments (predictor alignment for the linear kinds); the final kNN on the
whole test set comes from the run's ``knn.json``.

Cost: ``after_optimizer_step`` of a DirectPred predictor (fold F + float64 eigh + set W_p) against a linear
one (fold F only) and against one bare training step (forward, backward, optimiser) of the same model.

    python -m benchmarks.directpred                              # 1 epoch of Fashion-MNIST per variant
    python -m benchmarks.directpred --epochs 2 --variants mlp,directpred
    python -m benchmarks.directpred --quick                      # smoke test: digits, a few steps
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from benchmarks.harness import pretrain, timed, write_report

VARIANTS = ("mlp", "linear", "directpred", "directcopy")


def overrides(args, variant: str, out_dir: str) -> list[str]:
    o = [f"method.predictor={variant}", f"trainer.max_epochs={args.epochs}", f"trainer.seed={args.seed}",
         "trainer.accelerator=cpu", "trainer.devices=1", "trainer.progress_bar=false", "trainer.log_every_n_steps=1",
         f"eval.knn_every_n_steps={args.knn_every}", f"eval.knn_monitor_train={args.knn_train}",
         f"eval.knn_monitor_test={args.knn_test}", f"output_dir={out_dir}", f"name={variant}"]
    if args.limit_batches:
        o.append(f"trainer.limit_train_batches={args.limit_batches}")
    # only the predictor-alignment instrument (the rest is not needed here and costs time)
    o += ["instruments.embedding_norms=false", "instruments.gradients=false", "instruments.alignment=false",
          "instruments.rank_every_n_steps=0"]
    if args.quick:
        o += ["data.name=digits", "model.patch_size=2", "data.batch_size=64"]
    return o + args.extra


def read_metrics(run_dir: Path, knn_every: int, instruments_every: int) -> dict[str, list[tuple[int, float]]]:
    """metrics.csv → {column: [(steps trained, value), ...]} for the kNN monitor, loss and predictor alignment.

    A row's ``step`` is the index of the step just run (steps trained − 1); Lightning repeats the last value
    of a metric on later rows, so only the rows where the monitor / instrument ran are kept."""
    out: dict[str, list[tuple[int, float]]] = {}
    with (run_dir / "metrics.csv").open(newline="") as f:
        for row in csv.DictReader(f):
            done = int(row["step"]) + 1
            for key, value in row.items():
                if value in ("", None):
                    continue
                if (key == "train/loss" or (key == "monitor/knn_top1" and done % knn_every == 0)
                        or ("pred_" in key and (done - 1) % instruments_every == 0)):
                    out.setdefault(key, []).append((done, float(value)))
    return out


def train_variant(args, variant: str, out_dir: str) -> dict:
    """Train one variant through ``selfsup.engine.pretrain`` (no end-of-run report: the kNN monitor's fixed
    subsets give every point of the curve, the random init included)."""
    import lightning.pytorch as pl

    from selfsup.instruments.knn_monitor import KNNMonitor

    seen = {}

    class Seen(pl.Callback):  # the monitor and the trained module, for the curve and the init's point
        def on_train_end(self, trainer, module):
            seen.update(monitor=next(c for c in trainer.callbacks if isinstance(c, KNNMonitor)), model=module)

    run = pretrain(args.preset, overrides(args, variant, out_dir), report=False, callbacks=[Seen()])
    monitor, model = seen["monitor"], seen["model"]
    curve = [(0, monitor_init_knn(monitor, model))] + [(int(s), float(v)) for s, v in monitor.history]
    metrics = read_metrics(run.run, args.knn_every, model.cfg.instruments.every_n_steps)
    return {"wall_s": run.facts["fit_seconds"], "steps": int(run.facts["global_step"]), "knn_curve": curve,
            "loss_last": metrics.get("train/loss", [(0, math.nan)])[-1][1],
            "alignment": {k.split("/")[-1]: v for k, v in metrics.items() if "pred_" in k}}


def monitor_init_knn(monitor, model) -> float:
    """The monitor's kNN for the random-init backbone of the same seed (rebuilt, same subsets)."""
    from selfsup.methods.build import build_method

    init = build_method(model.cfg, model.info)
    return float(monitor.measure(init))


def time_calls(fn, reps: int) -> list[float]:
    return [w for w, _ in timed(fn, reps)]


def update_cost(args) -> dict:
    """Seconds per ``after_optimizer_step`` (directpred vs linear) and per bare training step of the model."""
    from selfsup.config import load_run_config
    from selfsup.data.datasets import load_dataset
    from selfsup.methods.build import build_method, data_info

    out = {}
    cfg = load_run_config(args.preset, overrides(args, "directpred", tempfile.gettempdir()))
    train = load_dataset(cfg.data, "train")
    model = build_method(cfg, data_info(cfg, train)).train()
    opt = model.configure_optimizers()
    bs = cfg.data.batch_size
    g = torch.Generator().manual_seed(0)
    views = model.augment(train[torch.arange(bs)][0], g)

    def train_step():
        out_ = model.forward_views(views)
        opt.zero_grad()
        out_.loss.backward()
        opt.step()

    def update(kind):
        pred = model.predictor
        pred.kind = kind
        z = torch.randn(bs, pred.dim, generator=g)

        def call():
            pred.observe(z)
            pred.observe(z)
            pred.after_optimizer_step()
        return call

    train_step()  # warm-up
    step_times = time_calls(train_step, args.cost_steps)
    for kind in ("directpred", "directcopy", "linear"):
        update(kind)()
        out[f"update_{kind}_s"] = statistics.median(time_calls(update(kind), args.cost_reps))
    model.predictor.kind = "directpred"
    out["train_step_s"] = statistics.median(step_times)
    out["eigh_fraction_of_step"] = (out["update_directpred_s"] - out["update_linear_s"]) / out["train_step_s"]
    out["dim"] = model.predictor.dim
    out["batch_size"] = bs
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="byol-fmnist")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--limit-batches", type=int, default=0, help="steps per epoch (0: the whole epoch)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--knn-every", type=int, default=50, help="kNN monitor every N steps (fixed subsets)")
    p.add_argument("--knn-train", type=int, default=5000)
    p.add_argument("--knn-test", type=int, default=1000)
    p.add_argument("--cost-steps", type=int, default=5)
    p.add_argument("--cost-reps", type=int, default=50)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="smoke test: digits, 8 steps")
    p.add_argument("--out", default="benchmarks/results/directpred.json")
    p.add_argument("extra", nargs="*", help="more config overrides for every variant")
    args = p.parse_args(argv)
    if args.quick:
        args.epochs, args.limit_batches, args.knn_every, args.cost_steps, args.cost_reps = 1, 8, 4, 2, 5
        args.knn_train, args.knn_test = 500, 200
    torch.set_num_threads(args.threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    variants = [v for v in args.variants.split(",") if v]
    result = {"preset": args.preset, "epochs": args.epochs, "seed": args.seed, "threads": args.threads,
              "extra_overrides": args.extra, "machine": platform.platform(), "torch": torch.__version__,
              "note": "timings on a shared 2-core machine (other jobs running)", "runs": {}}
    out_path = Path(args.out)
    with tempfile.TemporaryDirectory() as tmp:
        for variant in variants:
            result["runs"].pop(variant, None)
            print(f"== {variant}", flush=True)
            result["runs"][variant] = train_variant(args, variant, tmp)
            write_report(result, out_path)
    result["cost"] = update_cost(args)
    write_report(result, out_path)

    steps = sorted({s for r in result["runs"].values() for s, _ in r["knn_curve"]})
    print(f"\nkNN top-1 % (k=20, T=0.07; monitor subsets: at most {args.knn_train} train / "
          f"{args.knn_test} test images) by steps trained")
    print(f"{'variant':<12}" + "".join(f"{s:>8}" for s in steps) + f"{'wall s':>9}")
    for variant, r in result["runs"].items():
        curve = dict(r["knn_curve"])
        cells = "".join(f"{curve[s]:8.2f}" if s in curve else f"{'-':>8}" for s in steps)
        print(f"{variant:<12}{cells}{r['wall_s']:9.0f}")
    for variant, r in result["runs"].items():
        a = r["alignment"]
        if a:
            last = {k: v[-1][1] for k, v in a.items()}
            print(f"{variant:<12} predictor alignment at step "
                  f"{a['pred_commutator'][-1][0] if 'pred_commutator' in a else '?'}: "
                  + ", ".join(f"{k.removeprefix('pred_')} {v:.3f}" for k, v in sorted(last.items())))
    c = result["cost"]
    print(f"\nper step (d={c['dim']}, batch {c['batch_size']}): train step {c['train_step_s'] * 1e3:.1f} ms; "
          f"predictor update directpred {c['update_directpred_s'] * 1e3:.2f} ms, directcopy "
          f"{c['update_directcopy_s'] * 1e3:.2f} ms, linear (F only) {c['update_linear_s'] * 1e3:.2f} ms; "
          f"eigendecomposition = {100 * c['eigh_fraction_of_step']:.1f}% of a step")
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
