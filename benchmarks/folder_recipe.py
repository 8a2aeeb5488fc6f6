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
``--merge`` keeps the other rows of ``--out``; the report is written after every run, so a process stopped midway
leaves the runs it finished. On a GPU the recipe takes the GPU itself (its ``trainer.accelerator``, grid and sizes).

Runs side by side (the GPU session, ``benchmarks/gpu_session.sh``'s part ``folder``): ``--write-only`` writes the
folder once, each process writes its own ``--out``, and ``--combine`` merges their runs per (method, size).
``--set KEY=VALUE`` adds an override to every run (the dry run's ``trainer.max_steps=2``; the recipe's own keys are
then the user's), ``--val-per-class`` shrinks the ``val`` split (a toy folder), and ``--as-gpu NAME`` resolves the
recipe as on a GPU of that name (its grid and sizes) but trains on the CPU: the dry run's check that the GPU's
recipe trains.

    python -m benchmarks.folder_recipe --methods simclr,mae,dinov2 --sizes 2000,10000 --seeds 0,1,2
    python -m benchmarks.folder_recipe --combine a.json b.json --side-by-side 6 --out folder_recipe_gpu.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import yaml

from benchmarks.harness import cpu_kind, has_fashion_mnist, read_report, trained, write_report

TEST_PER_CLASS = 200
RECIPE_KEYS = ("data.image_size", "model.patch_size", "data.batch_size", "trainer.max_epochs", "optim.warmup_epochs",
               "method.out_dim", "method.patch_out_dim", "method.queue_size", "data.channels", "trainer.accelerator",
               "trainer.devices", "data.num_workers")


def write_folder(root: Path, n: int, seed: int = 0, val_per_class: int = TEST_PER_CLASS) -> Path:
    """Fashion-MNIST's first ``n`` images of a seeded class-stratified order as PNG files (train/, val/ of
    ``val_per_class`` test images a class)."""
    from PIL import Image

    from selfsup.data.datasets import load_fashion_mnist

    folder = root / (f"fmnist-{n}" if val_per_class == TEST_PER_CLASS else f"fmnist-{n}-val{val_per_class * 10}")
    done = folder / "done"
    if done.exists():
        return folder
    g = np.random.default_rng(seed)
    for split, dest, count in (("train", "train", n), ("test", "val", val_per_class * 10)):
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


def machine() -> str:
    """The GPU's name where there is one (the recipe trains there), else the CPU's kind."""
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else cpu_kind()


def note(gpu: bool, side_by_side: int, extra: list[str]) -> str:
    where = "one GPU" if gpu else "a shared 2-core CPU, one thread a run"
    where = f"{side_by_side} runs side by side on {where} (the fit seconds under that sharing)" if side_by_side > 1 \
        else f"one run at a time on {where}"
    return ("Fashion-MNIST as PNG folders (train/<class>/, val/<class>/ of the test images); each run is "
            "selfsup.pretrain(method, data.root=FOLDER, trainer.seed=S) with the recipe's own values"
            + (f" and {' '.join(extra)}" if extra else "") + "; kNN@20 T 0.07 on val against the same seed's init; "
            + where)


def as_gpu(name: str) -> None:
    """The recipe resolved as on a GPU called ``name``: ``runs.recipe.folder_facts`` reports it (the run itself then
    needs ``trainer.accelerator=cpu``)."""
    import dataclasses

    import selfsup.runs.recipe as recipe

    facts = recipe.folder_facts
    recipe.folder_facts = lambda root: dataclasses.replace(facts(root), gpu=name)


def combine(paths: list[str], out: str, side_by_side: int) -> dict:
    """One report of the runs in ``paths`` (each a report of this script): per (method, size) every seed's run,
    the first file's where two hold one seed."""
    reports = [read_report(p) for p in paths if Path(p).exists()]
    runs: dict[tuple[str, int], dict[int, dict]] = {}
    for report in reports:
        for r in report.get("rows", []):
            for run in r["runs"]:
                runs.setdefault((r["method"], r["images"]), {}).setdefault(run["seed"], run)
    rows = [row(m, n, [by_seed[s] for s in sorted(by_seed)]) for (m, n), by_seed in sorted(runs.items())]
    first = reports[0] if reports else {}
    report = {"note": note(bool(first.get("gpu")), side_by_side, first.get("overrides", [])),
              "machine": first.get("machine"), "gpu": first.get("gpu"), "as_gpu": first.get("as_gpu"),
              "side_by_side": side_by_side,
              "overrides": first.get("overrides", []), "combined": [str(p) for p in paths],
              "rows": sorted(rows, key=lambda r: (r["images"], r["method"]))}
    write_report(report, out)
    return report


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", default="simclr,mae,dinov2")
    p.add_argument("--sizes", default="2000,10000")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--data", default="runs/folder_recipe/data", help="where the PNG folders are written")
    p.add_argument("--runs", default="runs/folder_recipe")
    p.add_argument("--merge", action="store_true", help="keep the other rows of --out")
    p.add_argument("--val-per-class", type=int, default=TEST_PER_CLASS, help="test images a class in val/")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an override for every run")
    p.add_argument("--write-only", action="store_true", help="write the folders and stop")
    p.add_argument("--combine", nargs="+", metavar="JSON", help="merge these reports' runs into --out and stop")
    p.add_argument("--side-by-side", type=int, default=1, help="the processes that ran at once (recorded)")
    p.add_argument("--as-gpu", metavar="NAME", help="resolve the recipe as on this GPU, train on the CPU (a dry run)")
    p.add_argument("--out", default="benchmarks/results/folder_recipe.json")
    args = p.parse_args(argv)
    if args.combine:
        report = combine(args.combine, args.out, args.side_by_side)
        for r in report["rows"]:
            print(f"{r['method']} on {r['images']} images, seeds {r['seeds']}: gain {r['gain_mean']:+.1f} "
                  f"{r['gain_interval']}, kNN {r['knn20_mean']}")
        print(f"wrote {args.out}")
        return 0
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
    extra = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            print(f"error: --set {item}: give KEY=VALUE", file=sys.stderr)
            return 2
        extra[key] = yaml.safe_load(value)
    if args.write_only:
        for size in sizes:
            print(f"wrote {write_folder(Path(args.data), size, val_per_class=args.val_per_class)}")
        return 0
    torch.set_num_threads(1)
    gpu = torch.cuda.is_available()
    if args.as_gpu:
        as_gpu(args.as_gpu)
        extra["trainer.accelerator"] = "cpu"
    old = read_report(args.out) if args.merge else {}
    rows = {(r["method"], r["images"]): r for r in old.get("rows", [])}

    def report() -> dict:
        return {"note": note(gpu, args.side_by_side, args.set), "machine": machine() if methods else old.get("machine"),
                "gpu": gpu, "as_gpu": args.as_gpu, "side_by_side": args.side_by_side, "overrides": args.set,
                "rows": sorted(rows.values(), key=lambda r: (r["images"], r["method"]))}

    for size in sizes:
        folder = write_folder(Path(args.data), size, val_per_class=args.val_per_class)
        for method in methods:
            runs = []
            for seed in seeds:
                run = Path(args.runs) / f"{method}-{size}-s{seed}"
                wall = None
                if not (run / "knn.json").exists():
                    start = time.perf_counter()
                    pretrain(method, {"data.root": str(folder), "trainer.seed": seed, "trainer.progress_bar": False,
                                      "output_dir": str(run.parent), "name": run.name, **extra})
                    wall = round(time.perf_counter() - start, 1)
                done = trained(run)
                top1, init = done.knn["pretrained"]["top1"], done.knn["random_init"]["top1"]
                runs.append({"seed": seed, "knn20_top1": round(top1, 2), "random_init": round(init, 2),
                             "gain": round(top1 - init, 2), "fit_s": round(done.facts.get("fit_seconds") or 0),
                             "steps": done.facts.get("global_step"), "wall_s": wall, "recipe": recipe_of(run)})
                print(method, size, json.dumps(runs[-1]), flush=True)
                rows[(method, size)] = row(method, size, runs)
                write_report(report(), args.out)  # after every run: a process stopped midway keeps what it did
            r = rows[(method, size)]
            print(f"{method} on {size} images: gain {r['gain_mean']:+.1f} {r['gain_interval']}", flush=True)
    write_report(report(), args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
