"""The recipe sized to a folder (issue 49, item 1), measured: ``selfsup pretrain <method> data.root=FOLDER`` on
Fashion-MNIST written out as a folder of PNG files, at 2,000 and 10,000 training images.

The folder: the first N training images of a seeded, class-stratified draw as ``train/<class>/<i>.png`` and 2,000
test images (200 a class) as ``val/<class>/<i>.png``, 28 x 28 grayscale, written once per size under ``--data``.
Each (method, size, seed) is one ``selfsup.pretrain(method, {"data.root": FOLDER, "trainer.seed": S})`` with
nothing else set: the recipe resolves size, patch, batch, epochs, warm-up and the data-sized heads, prints its
block and records it in ``config.yaml``. The end-of-run report scores the trained backbone and the same seed's init
with kNN@20 (T 0.07) on the 2,000 ``val`` images (``RUN/knn.json``); the gain is paired. The table gives each
(method, size) the mean gain and its 95% interval over the seeds (Student t, ``selfsup.claims.stats``), the
resolved recipe, and the wall seconds. A run already in ``--runs`` with its ``knn.json`` is read, not re-run.
``--merge`` keeps the other rows of ``--out``.

    python -m benchmarks.folder_recipe --methods simclr,mae,dinov2 --sizes 2000,10000 --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from benchmarks.harness import cpu_kind, has_fashion_mnist, read_report, trained, write_report

TEST_PER_CLASS = 200
RECIPE_KEYS = ("data.image_size", "model.patch_size", "data.batch_size", "trainer.max_epochs", "optim.warmup_epochs",
               "method.out_dim", "method.queue_size")


def write_folder(root: Path, n: int, seed: int = 0) -> Path:
    """Fashion-MNIST's first ``n`` images of a seeded class-stratified order as PNG files (train/, val/)."""
    from PIL import Image

    from selfsup.data.datasets import load_fashion_mnist

    folder = root / f"fmnist-{n}"
    done = folder / "done"
    if done.exists():
        return folder
    g = np.random.default_rng(seed)
    for split, dest, count in (("train", "train", n), ("test", "val", TEST_PER_CLASS * 10)):
        data = load_fashion_mnist(split)
        images, labels = data.images.numpy(), data.labels.numpy()
        per_class = [g.permutation(np.flatnonzero(labels == c))[:count // 10] for c in range(10)]
        for c, idx in enumerate(per_class):
            (folder / dest / f"{c}").mkdir(parents=True, exist_ok=True)
            for i in idx:
                Image.fromarray(images[i].reshape(28, 28)).save(folder / dest / f"{c}" / f"{i}.png")
    done.write_text("")
    return folder


def recipe_of(run: Path) -> dict:
    """The resolved recipe's keys (RECIPE_KEYS) as the run's config.yaml records them."""
    import yaml

    cfg = yaml.safe_load((run / "config.yaml").read_text())
    out = {}
    for key in RECIPE_KEYS:
        section, name = key.split(".")
        if name in (cfg.get(section) or {}):
            out[key] = cfg[section][name]
    return out


def row(method: str, size: int, runs: list[dict]) -> dict:
    from selfsup.claims.stats import interval, summary

    n, mean, sd = summary([r["gain"] for r in runs])
    lo, hi = interval(mean, sd, n) if sd is not None else (None, None)
    return {"method": method, "images": size, "seeds": [r["seed"] for r in runs], "gain_mean": round(mean, 2),
            "gain_interval": [round(lo, 2), round(hi, 2)] if lo is not None else None,
            "knn20_mean": round(sum(r["knn20_top1"] for r in runs) / len(runs), 2),
            "recipe": runs[0]["recipe"], "runs": runs}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", default="simclr,mae,dinov2")
    p.add_argument("--sizes", default="2000,10000")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--data", default="runs/folder_recipe/data", help="where the PNG folders are written")
    p.add_argument("--runs", default="runs/folder_recipe")
    p.add_argument("--merge", action="store_true", help="keep the other rows of --out")
    p.add_argument("--out", default="benchmarks/results/folder_recipe.json")
    args = p.parse_args(argv)
    if not has_fashion_mnist():
        print("error: Fashion-MNIST is not installed (apt-get install -y dataset-fashion-mnist)", file=sys.stderr)
        return 2
    from selfsup import pretrain
    from selfsup.runs.recipe import BASES

    methods = [m for m in args.methods.split(",") if m]
    for method in methods:
        if method not in BASES:
            print(f"error: --methods {method}: no folder recipe (one of {', '.join(BASES)})", file=sys.stderr)
            return 2
    sizes, seeds = [int(s) for s in args.sizes.split(",")], [int(s) for s in args.seeds.split(",")]
    torch.set_num_threads(1)
    old = read_report(args.out) if args.merge else {}
    rows = {(r["method"], r["images"]): r for r in old.get("rows", [])}
    for size in sizes:
        folder = write_folder(Path(args.data), size)
        for method in methods:
            runs = []
            for seed in seeds:
                run = Path(args.runs) / f"{method}-{size}-s{seed}"
                if not (run / "knn.json").exists():
                    pretrain(method, {"data.root": str(folder), "trainer.seed": seed, "trainer.progress_bar": False,
                                      "output_dir": str(run.parent), "name": run.name})
                done = trained(run)
                top1, init = done.knn["pretrained"]["top1"], done.knn["random_init"]["top1"]
                runs.append({"seed": seed, "knn20_top1": round(top1, 2), "random_init": round(init, 2),
                             "gain": round(top1 - init, 2), "fit_s": round(done.facts.get("fit_seconds") or 0),
                             "steps": done.facts.get("global_step"), "recipe": recipe_of(run)})
                print(method, size, json.dumps(runs[-1]), flush=True)
            rows[(method, size)] = row(method, size, runs)
            r = rows[(method, size)]
            print(f"{method} on {size} images: gain {r['gain_mean']:+.1f} {r['gain_interval']}", flush=True)
    report = {"note": "Fashion-MNIST as PNG folders (train/<class>/, val/<class>/ of 2,000 test images); each run "
                      "is selfsup.pretrain(method, data.root=FOLDER, trainer.seed=S) with the recipe's own values; "
                      "kNN@20 T 0.07 on val against the same seed's init; one thread per run on a shared 2-core CPU",
              "machine": cpu_kind() if methods else old.get("machine"),
              "rows": sorted(rows.values(), key=lambda r: (r["images"], r["method"]))}
    write_report(report, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
