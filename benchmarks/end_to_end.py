"""End to end against the step alone (issue 39): does the data path keep the accelerator busy?

One preset (default ``dino-vit-s-imagenet``: ViT-S/16, 2 x 224 + 8 x 96 crops) trained through the engine
(``make_trainer`` + ``PretrainData`` + the method, as ``selfsup pretrain`` runs it) on synthetic JPEGs whose sizes
follow ``decode.py``'s ImageNet-like model, in arms run one after the other in one process:

* ``device``: the image folder with ``data.decode=device`` (the workers read bytes and boxes, the module decodes
  the batch on the accelerator: nvJPEG on a GPU);
* ``cpu``: the same folder with ``data.decode=cpu`` (the workers decode and crop, ``decode.FolderCrops``);
* ``shards``: the same images as webdataset shards (``selfsup data shards`` at ``--max-side``), decoded on the CPU;
* ``step_only``: the same loop with the data free: every batch is the first batch's decoded crops, made once (no
  worker, no decode), so only the transfer, the on-device augmentation and the step remain.

Each arm times ``--steps`` steps after ``--warmup`` (wall, the device synchronised at each step end) and reports
images/s; the figure is each arm's rate over ``step_only``'s (the issue's goal: end to end >= 90% of step-only).
``--quick`` shrinks everything (a micro ViT at 32 px, 48 images, 4 steps) to check the script on a CPU.

    python -m benchmarks.end_to_end                         # on a GPU host
    python -m benchmarks.end_to_end --quick --out /tmp/e2e.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from benchmarks.decode import make_jpegs, realistic_sizes  # the ImageNet-like synthetic JPEGs
from benchmarks.harness import RESULTS, default_device, fit_step_times, machine_info, pretrain_data, write_report

QUICK = ["data.image_size=32", "augment.local_crops_size=16", "augment.local_crops_number=2",
         "model.backbone=vit_micro", "model.patch_size=8", "method.out_dim=256", "method.hidden_dim=64",
         "method.bottleneck_dim=32"]


def timed_fit(cfg, dataset, steps: int, warmup: int, ready: bool = False) -> list[float]:
    """Per-step wall seconds after ``warmup`` of ``trainer.fit`` on ``dataset``; ``ready``: every batch the first."""
    from selfsup.data.decode import FolderCrops

    data = pretrain_data(cfg, dataset)
    if ready:  # the first batch's decoded crops for every batch: the data path costs nothing
        loader = data.train_dataloader

        def ready_loader():
            real = loader()
            crops = real.dataset.images
            assert isinstance(crops, FolderCrops) and data.trainer.lightning_module.device_views.encoded is None
            first = real.dataset[next(iter(real.sampler))][0]
            crops.crops = lambda index, epoch: first
            return torch.utils.data.DataLoader(real.dataset, sampler=real.sampler, batch_size=None, num_workers=0,
                                               pin_memory=real.pin_memory)
        data.train_dataloader = ready_loader
    with tempfile.TemporaryDirectory(prefix="selfsup-e2e-") as tmp:
        times = fit_step_times(cfg, dataset, Path(tmp) / "run", warmup, steps, default_device(), data=data)
    return [wall for wall, _ in times]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="dino-vit-s-imagenet")
    p.add_argument("--images", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=128, help="global batch (one device)")
    p.add_argument("--workers", type=int, default=12, help="data.num_workers")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--max-side", type=int, default=320, help="the shards' re-encoding (selfsup data shards)")
    p.add_argument("--arms", default="step_only,device,cpu,shards")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="more preset overrides")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=str(RESULTS / "end_to_end.json"))
    args = p.parse_args(argv)
    from selfsup.config import load_run_config
    from selfsup.data.datasets import load_dataset
    from selfsup.data.prepare import write_shards

    if args.quick:
        args.images, args.batch_size, args.workers, args.steps, args.warmup = 48, 8, 1, 4, 1
    gpu = torch.cuda.is_available()
    base = [f"data.batch_size={args.batch_size}", f"data.num_workers={args.workers}", "trainer.devices=1",
            "trainer.strategy=auto", "trainer.progress_bar=false", "trainer.log_every_n_steps=1000",
            "trainer.checkpoint_every_n_steps=0", "instruments.enabled=false", "trainer.max_epochs=1000",
            f"trainer.accelerator={'gpu' if gpu else 'cpu'}", *(["trainer.precision=bf16-mixed"] if gpu else []),
            *(QUICK if args.quick else []), *args.set]
    report = {"preset": args.preset, "images": args.images, "batch_size": args.batch_size, "workers": args.workers,
              "steps": args.steps, "warmup": args.warmup, "overrides": base, **machine_info(
                  torch.device("cuda" if gpu else "cpu")), "arms": {}}
    with tempfile.TemporaryDirectory(prefix="selfsup-e2e-data-") as tmp:
        folder = Path(tmp) / "images" / "c0"
        folder.mkdir(parents=True)
        make_jpegs(folder, args.images, sizes=realistic_sizes(args.images, np.random.default_rng(0)))
        shards = Path(tmp) / "shards"
        for arm in args.arms.split(","):
            if arm == "shards":
                write_shards(Path(tmp) / "images", shards, max_side=args.max_side,  # a shard for each stream, twice
                             shard_size=max(1, args.images // (2 * max(1, args.workers))))
                data = ["data.name=webdataset", f"data.root={shards}", f"data.num_samples={args.images}"]
            else:
                data = ["data.name=images", f"data.root={Path(tmp) / 'images'}",
                        f"data.decode={'device' if arm == 'device' else 'cpu'}"]
            cfg = load_run_config(args.preset, base + data + ["output_dir=" + tmp, f"name={arm}"])
            steps = timed_fit(cfg, load_dataset(cfg.data, "train"), args.steps, args.warmup, ready=arm == "step_only")
            mean = sum(steps) / len(steps)
            report["arms"][arm] = {"step_ms_mean": round(1000 * mean, 2), "step_ms_median": round(
                1000 * float(np.median(steps)), 2), "images_per_s": round(args.batch_size / mean, 1),
                "step_ms": [round(1000 * t, 1) for t in steps]}  # each step: where the slow ones fall
            print(arm, {k: v for k, v in report["arms"][arm].items() if k != "step_ms"}, flush=True)
    ref = report["arms"].get("step_only")
    if ref:
        for arm, r in report["arms"].items():
            r["of_step_only"] = round(r["images_per_s"] / ref["images_per_s"], 3)
    write_report(report, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
