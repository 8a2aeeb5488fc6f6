"""Issue 62's bars, walked as a user would: on a generated folder of 300 mixed images, each command of ``--runs``
in a new process (``python -m selfsup ...``, OMP's defaults, every core), its wall seconds, return code, peak
resident memory (the child's ``ru_maxrss``), the recipe's block and the verdict lines printed at the end.

The folder (``write_photos``): 3 classes of seeded synthetic pictures (stripes, discs, checks: a colour, a phase and
noise of their own), 240 as ``train/<c>/`` and 60 as ``val/<c>/``, each 100..220 px a side (not square), a third
grayscale, half JPEG and half PNG. ``R18.pth``: a torchvision ResNet-18's state dict saved from its random init
(seed 0; no network). The distillation's teacher ``RUN``: a short selfsup run on the same folder (``teacher``:
``byol`` with ``trainer.max_steps=20`` and nothing else set).

    python -m benchmarks.practitioner_path --runs byol,distill --out benchmarks/results/practitioner_path.json
    python -m benchmarks.practitioner_path --set trainer.max_steps=30 --out /tmp/short.json   # a shortened run
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.harness import child_env, cpu_kind, read_report, write_report

CLASSES = ("stripes", "discs", "checks")
TRAIN_PER_CLASS, VAL_PER_CLASS = 80, 20
BAR_S = 15 * 60


def picture(kind: str, rng: np.random.Generator) -> np.ndarray:
    """One ``kind`` picture, 100..220 px a side, RGB uint8: the pattern in a random colour over noise."""
    h, w = (int(v) for v in rng.integers(100, 221, 2))
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    period, phase = rng.uniform(8, 24), rng.uniform(0, 2 * np.pi)
    if kind == "stripes":
        wave = np.sin(2 * np.pi * y / period + phase)
    elif kind == "discs":
        wave = np.sin(2 * np.pi * np.hypot(y - h * rng.uniform(0.3, 0.7), x - w * rng.uniform(0.3, 0.7)) / period)
    else:
        wave = np.sign(np.sin(2 * np.pi * y / period + phase) * np.sin(2 * np.pi * x / period))
    colour = rng.uniform(0.2, 1.0, 3)
    img = 0.5 + 0.4 * wave[..., None] * colour + rng.normal(0, 0.08, (h, w, 3))
    return (np.clip(img, 0, 1) * 255).astype(np.uint8)


def write_photos(root: Path, seed: int = 0) -> Path:
    """The 300-image folder under ``root`` (written once: a ``done`` marker)."""
    from PIL import Image

    folder = root / "photos300"
    if (folder / "done").exists():
        return folder
    rng = np.random.default_rng(seed)
    i = 0
    for split, n in (("train", TRAIN_PER_CLASS), ("val", VAL_PER_CLASS)):
        for c in CLASSES:
            (folder / split / c).mkdir(parents=True, exist_ok=True)
            for _ in range(n):
                im = Image.fromarray(picture(c, rng))
                im = im.convert("L") if i % 3 == 0 else im
                im.save(folder / split / c / (f"{i:03d}.jpg" if i % 2 else f"{i:03d}.png"))
                i += 1
    (folder / "done").write_text("")
    return folder


def write_r18(path: Path) -> Path:
    """A torchvision ResNet-18's state dict from its seeded random init, saved with ``torch.save``."""
    import torch
    import torchvision

    if not path.exists():
        torch.manual_seed(0)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(torchvision.models.resnet18().state_dict(), path)
    return path


def cli(args: list[str], log: Path) -> dict:
    """``python -m selfsup ARGS`` in a new process, its output in ``log``: rc, wall seconds, the CPU seconds of it
    and its loader workers (user + system: less disturbed by other work on the cores), peak RSS (GiB)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    before, cpu = usage.ru_maxrss, usage.ru_utime + usage.ru_stime
    start = time.perf_counter()
    with log.open("w") as out:
        rc = subprocess.run([sys.executable, "-m", "selfsup", *args], env=child_env(), stdout=out,
                            stderr=subprocess.STDOUT).returncode
    wall = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    peak = usage.ru_maxrss
    text = log.read_text()
    return {"command": "selfsup " + " ".join(args), "rc": rc, "wall_s": round(wall, 1),
            "cpu_s": round(usage.ru_utime + usage.ru_stime - cpu, 1), "load_average_after": os.getloadavg(),
            "peak_rss_gib": round(peak / 2**20, 2) if peak > before else None,  # the largest child so far
            "recipe": [line for line in text.splitlines() if line.startswith(("selfsup: a recipe", "  "))][:40],
            "verdict": [line for line in text.splitlines()
                        if line.startswith(("kNN", "selfsup: the run", "learned", "not learning", "verdict"))
                        or "start (weights" in line],
            "under_bar": rc == 0 and wall < BAR_S, "log": str(log)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", default="byol,distill", help="byol (from R18.pth), distill (teacher: a short run)")
    p.add_argument("--work", default="runs/practitioner_path")
    p.add_argument("--out", default="benchmarks/results/practitioner_path.json")
    p.add_argument("--merge", action="store_true", help="keep the other runs of --out")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="an override added to the timed commands (e.g. trainer.max_steps=30: a shortened run)")
    args = p.parse_args(argv)
    work = Path(args.work).resolve()
    folder, r18 = write_photos(work), write_r18(work / "R18.pth")
    report = read_report(args.out) if args.merge else {}
    rows = report.get("runs", {})
    out = ["output_dir=" + str(work / "runs")]
    for name in [r for r in args.runs.split(",") if r]:
        if name == "byol":
            argv_ = ["pretrain", "byol", f"data.root={folder}", f"model.weights={r18}", *out, "name=byol-r18"]
        elif name == "distill":
            teacher = work / "runs" / "teacher"
            if not (teacher / "backbone.safetensors").exists():
                rows["teacher"] = cli(["pretrain", "byol", f"data.root={folder}", "trainer.max_steps=20", *out,
                                       "name=teacher"], work / "teacher.log")
            argv_ = ["pretrain", "distill", f"data.root={folder}", f"method.teacher.weights={teacher}", *out,
                     "name=distill"]
        else:
            print(f"error: --runs {name}: one of byol, distill", file=sys.stderr)
            return 2
        rows[name] = cli([*argv_, *args.set], work / f"{name}.log")
        print(name, rows[name]["rc"], f"{rows[name]['wall_s']} s", *rows[name]["verdict"], sep="\n  ", flush=True)
        report = {"note": "300 generated mixed images (train/<c>/ 240, val/<c>/ 60), each command in a new process "
                          "with OMP's defaults on this machine's cores, shared with other work",
                  "overrides": args.set,
                  "machine": cpu_kind(), "folder": str(folder), "bar_s": BAR_S, "runs": rows}
        write_report(report, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
