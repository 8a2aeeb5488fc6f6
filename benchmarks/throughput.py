"""Training throughput (images/s) of each method: the Lightning engine next to a bare PyTorch loop.

For every method the same step is timed two ways, alternately, ``--reps`` times in one process:

* engine: ``selfsup.engine.make_trainer`` + ``PretrainData`` + the method's LightningModule, as
  ``selfsup pretrain`` runs it (hooks, lr/momentum schedule, logging to CSV + TensorBoard, progress
  bar, isfinite check, epoch sampler, checkpoint at each epoch end);
* bare: the same model objects (backbone, heads, momentum encoders), the same batched augmentation
  with the same per-step seeded generator, ``forward_views`` and its loss, ``loss.backward()`` and a
  plain ``optimizer.step()`` / ``zero_grad`` from ``configure_optimizers``; no Lightning.

Only steady-state steps count: the clock starts when the ``--warmup`` first steps are done and
stops after ``--steps`` more (epoch boundaries, logging and checkpoints inside that span count).
Per repetition the mean step time is taken; across repetitions the min and the median are reported,
plus the median of all single steady-state steps. Overhead = engine time / bare time − 1.

    python -m benchmarks.throughput                      # all methods, digits 8x8, batch 256
    python -m benchmarks.throughput --quick              # smoke test, < ~1 min
    python -m benchmarks.throughput --methods moco_v3 --dataset fashion-mnist --steps 20
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

from benchmarks.harness import RESULTS, Times, default_device, fit_step_times, machine_info, mean_ms, summarize, timed
from benchmarks.harness import write_report

METHODS = ("moco_v3", "byol", "simsiam", "simclr")
# Heads scaled down for the micro ViT, as in the moco-v3-vit-digits demo (512 hidden, 128 out).
METHOD_SETTINGS = {
    "moco_v3": dict(temperature=0.2, momentum=0.99, proj_layers=3, proj_hidden_dim=512, dim=128,
                    pred_hidden_dim=512),
    "byol": dict(momentum=0.99, proj_hidden_dim=512, dim=128, pred_hidden_dim=512),
    "simsiam": dict(proj_hidden_dim=512, dim=128, pred_hidden_dim=128),
    "simclr": dict(temperature=0.2, proj_hidden_dim=512, dim=128),
}
DATASET_SETTINGS = {  # (patch size, augment overrides)
    "digits": (2, dict(crop_min=0.3, hflip_p=0.0)),
    "fashion-mnist": (7, dict(crop_min=0.3)),
}


def run_config(method: str, dataset: str, batch_size: int, max_epochs: int, out_dir: str):
    """A resolved RunConfig built as a dict (independent of the shipped presets)."""
    from selfsup.config import resolve

    patch, augment = DATASET_SETTINGS[dataset]
    return resolve({
        "method": {"name": method, **METHOD_SETTINGS[method]},
        "name": "bench", "output_dir": out_dir,
        "data": {"name": dataset, "batch_size": batch_size},
        "augment": augment,
        "model": {"backbone": "vit_micro", "patch_size": patch, "stop_grad_conv1": True},
        "optim": {"name": "adamw", "base_lr": 1.5e-3, "weight_decay": 0.1, "warmup_epochs": 10},
        "trainer": {"max_epochs": max_epochs, "log_every_n_steps": 5, "seed": 0},
    })


def run_bare(method: str, dataset, args) -> Times:
    """(wall, CPU) seconds of each bare-loop step, warm-up steps excluded."""
    from selfsup.methods.build import build_method, data_info

    device = default_device()
    cfg = run_config(method, args.dataset, args.batch_size, 1, tempfile.gettempdir())
    model = build_method(cfg, data_info(cfg, dataset)).to(device)
    model.train()
    opt = model.configure_optimizers()
    for group in opt.param_groups:  # a constant lr (the schedule's peak); the engine sets it per step
        group["lr"] = cfg.optim.base_lr * cfg.data.batch_size / 256 * group["lr_scale"]
    gen = torch.Generator(device=device)
    n, b = len(dataset), args.batch_size

    def steps():  # one training step per next(); an epoch's reshuffle falls in the step that crosses it
        step, epoch = 0, 0
        while True:
            order = torch.randperm(n, generator=torch.Generator().manual_seed(cfg.trainer.seed * 100_003 + epoch))
            for i in range(n // b):
                idx = order[i * b:(i + 1) * b]
                images = dataset.images[idx].to(device, non_blocking=True)
                gen.manual_seed(cfg.trainer.seed * 1_000_003 + step)
                views = model.augment(images, gen)
                loss = model.forward_views(views).loss
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                step += 1
                yield
            epoch += 1

    loop = steps()
    return timed(lambda: next(loop), args.steps, args.warmup, device)


def run_engine(method: str, dataset, args) -> Times:
    """(wall, CPU) seconds of each ``selfsup.engine`` step (Trainer.fit), warm-up steps excluded."""
    total = args.warmup + args.steps
    per_epoch = len(dataset) // args.batch_size
    with tempfile.TemporaryDirectory(prefix="selfsup-bench-") as tmp:
        cfg = run_config(method, args.dataset, args.batch_size, math.ceil(total / per_epoch) + 1, tmp)
        return fit_step_times(cfg, dataset, Path(tmp) / "bench", args.warmup, args.steps, default_device())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of " + ",".join(METHODS))
    p.add_argument("--steps", type=int, default=10, help="steady-state steps timed per repetition")
    p.add_argument("--warmup", type=int, default=3, help="warm-up steps excluded from the timing")
    p.add_argument("--reps", type=int, default=3, help="repetitions (engine and bare loop alternate)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--dataset", default="digits", choices=sorted(DATASET_SETTINGS))
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads for both (default: torch's own; 1 with --quick)")
    p.add_argument("--out", default=str(RESULTS / "throughput.json"))
    p.add_argument("--quick", action="store_true", help="smoke test: batch 32, 1 warm-up + 2 steps, 1 repetition")
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.warmup, args.reps, args.batch_size = 2, 1, 1, 32
        args.threads = args.threads or 1  # a busy machine makes multi-threaded tiny ops crawl
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown or args.steps < 1 or args.warmup < 1 or args.reps < 1:
        p.error(f"unknown method {unknown[0]}" if unknown else "--steps, --warmup and --reps must be >= 1")

    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*is smaller than the logging interval.*")
    import logging
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    args.threads = args.threads or torch.get_num_threads()
    torch.set_num_threads(args.threads)
    if default_device().type == "cpu":  # what the engine sets for CPU training, for both sides from the start
        from selfsup import host
        host.cache_freed_memory()

    from selfsup.config import DataConfig
    from selfsup.data.datasets import load_dataset

    dataset = load_dataset(DataConfig(name=args.dataset, batch_size=args.batch_size), "train")
    if len(dataset) < args.batch_size:
        p.error(f"--batch-size {args.batch_size} exceeds the {len(dataset)} training images")
    device = default_device()
    results = {}
    started = time.perf_counter()
    for method in methods:
        runs: dict[str, list[Times]] = {"bare": [], "engine": []}
        for rep in range(args.reps):  # alternate which goes first, so drift in machine load hits both
            order = ("bare", "engine") if rep % 2 == 0 else ("engine", "bare")
            for kind in order:
                steps = (run_bare if kind == "bare" else run_engine)(method, dataset, args)
                runs[kind].append(steps)
                wall, cpu = mean_ms(steps)
                print(f"[{method} rep {rep + 1}/{args.reps}] {kind:<6} {wall:8.1f} ms/step wall, "
                      f"{cpu:8.1f} ms/step CPU", file=sys.stderr, flush=True)
        bare, engine = summarize(runs["bare"], args.batch_size), summarize(runs["engine"], args.batch_size)
        results[method] = {
            "bare": bare, "engine": engine,
            "overhead_pct_median": 100 * (engine["step_ms_median"] / bare["step_ms_median"] - 1),
            "overhead_pct_min": 100 * (engine["step_ms_min"] / bare["step_ms_min"] - 1),
            "overhead_pct_median_all_steps":
                100 * (engine["step_ms_median_all_steps"] / bare["step_ms_median_all_steps"] - 1),
            "overhead_pct_cpu_min": 100 * (engine["cpu_step_ms_min"] / bare["cpu_step_ms_min"] - 1),
        }
    report = {
        "benchmark": "throughput",
        "settings": {"dataset": args.dataset, "image_size": dataset.image_size,
                     "patch_size": DATASET_SETTINGS[args.dataset][0], "backbone": "vit_micro",
                     "batch_size": args.batch_size, "steps": args.steps, "warmup": args.warmup, "reps": args.reps,
                     "quick": args.quick, "threads": args.threads, "device": str(device),
                     "method_settings": {m: METHOD_SETTINGS[m] for m in methods}},
        "machine": machine_info(device),
        "wall_s": time.perf_counter() - started,
        "results": results,
    }
    write_report(report, args.out)

    print(f"\n{args.dataset} {dataset.image_size}x{dataset.image_size}, "
          f"vit_micro patch {DATASET_SETTINGS[args.dataset][0]}, "
          f"batch {args.batch_size}, {device}, {args.threads} threads; {args.steps} steps x {args.reps} reps "
          f"after {args.warmup} warm-up")
    print(f"{'method':<9} {'bare img/s (best/med)':>22} {'engine img/s (best/med)':>24} {'overhead min/med':>18}"
          f" {'CPU-time overhead':>18}")
    for method, r in results.items():
        b, e = r["bare"], r["engine"]
        print(f"{method:<9} {b['images_per_s_best']:>10.1f} / {b['images_per_s_median']:<9.1f} "
              f"{e['images_per_s_best']:>11.1f} / {e['images_per_s_median']:<10.1f} "
              f"{r['overhead_pct_min']:>+7.1f}% / {r['overhead_pct_median']:+6.1f}% "
              f"{r['overhead_pct_cpu_min']:>+9.1f}%")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
