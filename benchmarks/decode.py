"""imagefolder decoding: images/s of one worker (one process, one thread) for two training views per image.

Compares, on the same synthetic ImageNet-sized JPEGs (500x375, quality 90):
  * selfsup: ``FolderCrops`` (JPEG draft decode at the smallest DCT scale that keeps every crop
    >= 224 px, then one PIL resize per view from its crop box), and the same without draft;
  * torchvision: per-image PIL pipeline, full decode, then RandomResizedCrop(224, scale (0.08, 1)) +
    RandomHorizontalFlip + PILToTensor per view (what MoCo v3's TwoCropsTransform does before colour ops,
    which selfsup runs batched on the device instead);
  * the previous selfsup path (decode, resize the shorter side to 256, centre square), for reference.
Then the workers (and so cores) a host needs for 4,000 images/s at the measured per-worker rate.

    python benchmarks/decode.py [--quick] [--images 64] [--repeat 3]   → benchmarks/results/decode.json
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from throughput import write_report  # noqa: E402  (the benchmarks' JSON writer)


def make_jpegs(folder: Path, n: int, width: int = 500, height: int = 375) -> list[Path]:
    """Smooth colour fields with noise and edges (JPEG-compressible like photos), quality 90."""
    from PIL import Image

    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    files = []
    for i in range(n):
        a, b, c = rng.uniform(0.005, 0.03, 3)
        img = np.stack([128 + 100 * np.sin(a * xx + i), 128 + 100 * np.cos(b * yy),
                        128 + 80 * np.sin(c * (xx + yy))], -1)
        img += rng.normal(0, 12, img.shape)
        img[int(rng.integers(0, height)):, : int(rng.integers(0, width))] *= 0.6  # an edge
        f = folder / f"{i:04d}.jpg"
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(f, quality=90)
        files.append(f)
    return files


def rate(fn, n: int, repeat: int) -> tuple[float, float]:
    """Best images/s over ``repeat`` passes of ``fn`` over n images: by wall time, and by this process's CPU
    time (images per CPU-second: what sets the cores a host needs, and less disturbed on a shared machine)."""
    wall = cpu = float("inf")
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        fn()
        wall, cpu = min(wall, time.perf_counter() - t), min(cpu, time.process_time() - c)
    return n / wall, n / cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16 images, 1 pass (smoke run)")
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--target", type=float, default=4000.0, help="images/s the host must feed (default 4000)")
    parser.add_argument("--cores", type=int, default=16, help="host cores to compare with (default 16)")
    args = parser.parse_args()
    n, repeat = (16, 1) if args.quick else (args.images, args.repeat)
    torch.set_num_threads(1)
    from PIL import Image
    from torchvision import transforms

    from selfsup.data.datasets import FolderImages
    from selfsup.data.decode import FolderCrops

    scales = [(0.08, 1.0), (0.08, 1.0)]
    with tempfile.TemporaryDirectory() as tmp:
        files = make_jpegs(Path(tmp), n)
        draft = FolderCrops(files, args.size, scales, seed=0, draft=True)
        full = FolderCrops(files, args.size, scales, seed=0, draft=False)
        old = FolderImages(files, 256, resize=256)  # the previous path's centre 256 square (crops came later)
        tv_view = transforms.Compose([transforms.RandomResizedCrop(args.size, scale=(0.08, 1.0)),
                                      transforms.RandomHorizontalFlip(), transforms.PILToTensor()])

        def torchvision_two_views():
            for f in files:
                with Image.open(f) as im:
                    im = im.convert("RGB")
                    torch.stack([tv_view(im), tv_view(im)])

        idx = torch.arange(n)
        out = {"images": n, "size": args.size, "jpeg": "500x375 q90", "views_per_image": 2, "threads": 1,
               "cpu_count_here": os.cpu_count(), "load_average_here": os.getloadavg()[0]}
        out["selfsup_draft_images_per_s"], out["selfsup_draft_images_per_cpu_s"] = rate(
            lambda: draft.crops(idx, 0), n, repeat)
        out["selfsup_full_decode_images_per_s"], out["selfsup_full_decode_images_per_cpu_s"] = rate(
            lambda: full.crops(idx, 0), n, repeat)
        out["torchvision_pil_images_per_s"], out["torchvision_pil_images_per_cpu_s"] = rate(
            torchvision_two_views, n, repeat)
        out["previous_centre_square_images_per_s"], out["previous_centre_square_images_per_cpu_s"] = rate(
            lambda: old[idx], n, repeat)
    best = out["selfsup_draft_images_per_cpu_s"]  # per CPU-second: one worker on an idle core
    out["speedup_vs_torchvision_cpu"] = best / out["torchvision_pil_images_per_cpu_s"]
    out["workers_for_target"] = math.ceil(args.target / best)
    out["torchvision_workers_for_target"] = math.ceil(args.target / out["torchvision_pil_images_per_cpu_s"])
    out["target_images_per_s"] = args.target
    out["host_cores"] = args.cores
    out["fits_host"] = out["workers_for_target"] + 1 <= args.cores  # one core for the training process
    for key, value in out.items():
        print(f"{key:<40} {value:.4g}" if isinstance(value, float) else f"{key:<40} {value}")
    path = Path(__file__).parent / "results" / "decode.json"
    write_report(out, path)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
