"""Barlow Twins and VICReg beside SimCLR on Fashion-MNIST for a fixed budget: kNN@20 and a linear probe.

Each preset (``barlow-twins-fmnist``, ``vicreg-fmnist``, ``simclr-fmnist`` by default) is pretrained through
``selfsup.engine.pretrain`` for the same number of steps at the same batch size and seed (1 epoch cut to
``--steps`` batches, 10% warmup); the engine's own end-of-run kNN on the whole dataset is skipped to keep the
budget (it would extract 70k features twice per run). Both exported backbones of each run, the trained one and
the random-init one (``backbone_init.safetensors``; the same network for every preset here), are then evaluated
on a fixed subset of the training split (``--eval-train`` images, seeded) against the whole test split:
weighted kNN (k = 20, T = 0.07, DINO's protocol, ``selfsup.eval.knn``) and a linear probe on the frozen
features (``selfsup.eval.linear.probe_features``: SGD over an lr grid, chosen on a held-out 10%).
Without the Fashion-MNIST files the script falls back to digits (8×8, patch 2) and says so in the JSON.

    python -m benchmarks.redundancy                    # the default budget (<= 10 min on a busy 2-core machine)
    python -m benchmarks.redundancy --steps 300 --presets barlow-twins-fmnist,vicreg-fmnist
    python -m benchmarks.redundancy --quick            # smoke test: digits, a few steps
    python -m benchmarks.redundancy --presets vicreg-fmnist,vicreg-fmnist+method.normalize_embeddings=true
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.harness import has_fashion_mnist, pretrain, write_report

DEFAULT_PRESETS = ("barlow-twins-fmnist", "vicreg-fmnist", "simclr-fmnist")


def overrides(args, fallback: bool, out_dir: str, name: str) -> list[str]:
    o = ["trainer.max_epochs=1", f"trainer.limit_train_batches={args.steps}", "optim.warmup_epochs=0.1",
         f"data.batch_size={args.batch_size}", f"trainer.seed={args.seed}", "trainer.accelerator=cpu",
         "trainer.devices=1", "trainer.progress_bar=false", "trainer.log_every_n_steps=10",
         "instruments.enabled=false", f"output_dir={out_dir}", f"name={name}"]
    if fallback:
        o += ["data.name=digits", "model.patch_size=2", "augment.crop_min=0.3", "augment.hflip_p=0.0"]
    return o


def evaluate(backbone_file: Path, train, test, args) -> dict:
    from selfsup.eval.features import extract_features
    from selfsup.eval.knn import knn_accuracy
    from selfsup.eval.linear import ProbeConfig, default_base_lr, probe_features
    from selfsup.export import load_exported

    backbone, meta = load_exported(backbone_file)
    t0 = time.perf_counter()
    size, mean, std = meta["image_size"], meta["mean"], meta["std"]
    ftr, ytr = extract_features(backbone, train, size, mean, std, 512, device="cpu")
    fte, yte = extract_features(backbone, test, size, mean, std, 512, device="cpu")
    knn = knn_accuracy(ftr, ytr, fte, yte, k=20, temperature=0.07)
    probe_cfg = ProbeConfig.for_protocol("moco_v3", epochs=args.probe_epochs, batch_size=256, seed=args.seed)
    probe = probe_features(ftr, ytr, fte, yte, train.num_classes, probe_cfg, default_base_lr(meta["backbone"]))
    return {"knn20_top1": knn["top1"], "knn20_top5": knn["top5"], "linear_top1": probe["test"]["top1"],
            "linear_top5": probe["test"]["top5"], "linear_chosen": probe["chosen"],
            "eval_s": round(time.perf_counter() - t0, 1)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", default=",".join(DEFAULT_PRESETS),
                   help="comma list; preset+key=value+... adds overrides")
    p.add_argument("--steps", type=int, default=60, help="training steps per preset")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--eval-train", type=int, default=10000, help="training images the kNN / probe fit on")
    p.add_argument("--probe-epochs", type=int, default=20)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="digits, 5 steps, small evaluation")
    p.add_argument("--out", default="benchmarks/results/redundancy.json")
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.batch_size, args.eval_train, args.probe_epochs = 5, 64, 500, 2
    torch.set_num_threads(args.threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))

    from selfsup.config import DataConfig, load_run
    from selfsup.data.datasets import load_dataset

    fallback = args.quick or not has_fashion_mnist()
    dataset = "digits" if fallback else "fashion-mnist"
    if fallback and not args.quick:
        print("Fashion-MNIST files not found: running on digits instead", file=sys.stderr)
    train, test = (load_dataset(DataConfig(name=dataset), s) for s in ("train", "test"))
    g = torch.Generator().manual_seed(args.seed)
    idx = torch.randperm(len(train), generator=g)[:args.eval_train]
    train_eval = dataclasses.replace(train, images=train.images[idx], labels=train.labels[idx])

    results = {"dataset": dataset, "fallback_to_digits": fallback and not args.quick, "steps": args.steps,
               "batch_size": args.batch_size, "seed": args.seed, "threads": args.threads,
               "eval_train_size": len(train_eval), "test_size": len(test), "knn": {"k": 20, "temperature": 0.07},
               "probe_epochs": args.probe_epochs, "host": platform.node(), "cpus": os.cpu_count(),
               "note": "wall times on a machine shared with other work", "runs": []}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        random_init = None
        for i, entry in enumerate(args.presets.split(",")):
            preset, *extra = entry.split("+")  # preset+key=value+...: a variant with overrides
            done = pretrain(preset, overrides(args, fallback, tmp, f"run{i}") + extra, report=False)  # the kNN below
            run, method = done.run, type(load_run(done.run).method).__name__.removesuffix("Config")
            row = {"preset": preset, "overrides": extra, "method": method, "train_wall_s": round(done.wall_s, 1),
                   **evaluate(run / "backbone.safetensors", train_eval, test, args)}
            if random_init is None:  # the same seeded micro ViT for every preset: evaluated once
                random_init = evaluate(run / "backbone_init.safetensors", train_eval, test, args)
            results["runs"].append(row)
            print(json.dumps(row), flush=True)
        results["random_init"] = random_init
    results["total_wall_s"] = round(time.perf_counter() - started, 1)
    out = write_report(results, args.out)
    print(f"random init: {json.dumps(random_init)}\nwrote {out} ({results['total_wall_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
