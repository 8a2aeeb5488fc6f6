"""imagefolder decoding: images/s of one worker (one process, one thread) for two training views per image.

``--sizes realistic`` (issue 39) draws each image's size from an ImageNet-like distribution, a model of it, not a
measurement: the longer side 500 px for 70% of the images, else log-normal around 490 px (sd 0.35 in log) clipped to
200-1600, the aspect 4:3 (55%), 3:4 (25%), 1:1 (10%) or 16:9 (10%); and adds the prepared arms: the same images re-
encoded at a longer side of ``--max-side`` (320, ``selfsup data shards``' re-encoding, ``data.prepare.reencode``)
and decoded by the same crop-at-decode path, for two views and for DINOv2's multi-crop (2 x 224 at (0.32, 1) + 8 x
98 at (0.05, 0.32)), each against torchvision's per-image PIL pipeline on the same files (``speedup_*_same_files``:
the mean over the repeats of each repeat's ratio; ``*_vs_torchvision_original``: against torchvision on the
originals); and
``data.decode=device``'s two sides: a worker's CPU cost (``EncodedCrops``: bytes, header, seeded boxes) per CPU-
second beside the others, and the batch's decode and crops on ``--device`` (cuda: nvJPEG; cpu: the same code here)
in images per wall second. ``--sizes fixed`` (the default, the earlier figures) keeps one size:

Compares, on the same synthetic ImageNet-sized JPEGs (500x375, quality 90):
  * selfsup: ``FolderCrops`` (JPEG draft decode at the smallest DCT scale that keeps every crop
    >= 224 px, then one PIL resize per view from its crop box), and the same without draft;
  * torchvision: per-image PIL pipeline, full decode, then RandomResizedCrop(224, scale (0.08, 1)) +
    RandomHorizontalFlip + PILToTensor per view (what MoCo v3's TwoCropsTransform does before colour ops,
    which selfsup runs batched on the device instead);
  * the previous selfsup path (decode, resize the shorter side to 256, centre square), for reference.
Then the workers (and so cores) a host needs for 4,000 images/s at the measured per-worker rate.

    python -m benchmarks.decode [--quick] [--images 64] [--repeat 3]   → benchmarks/results/decode.json
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from pathlib import Path

import numpy as np
import torch

from benchmarks.harness import RESULTS, cpu_kind, timed, write_report


def realistic_sizes(n: int, rng) -> list[tuple[int, int]]:
    """(width, height) of n images from the ImageNet-like model of the module docstring."""
    out = []
    for _ in range(n):
        side = 500 if rng.random() < 0.7 else int(np.clip(np.exp(rng.normal(np.log(490), 0.35)), 200, 1600))
        aspect = rng.choice([4 / 3, 3 / 4, 1.0, 16 / 9], p=[0.55, 0.25, 0.1, 0.1])
        w, h = (side, round(side / aspect)) if aspect >= 1 else (round(side * aspect), side)
        out.append((int(w), int(h)))
    return out


def make_jpegs(folder: Path, n: int, width: int = 500, height: int = 375, sizes=None) -> list[Path]:
    """Smooth colour fields with noise and edges (JPEG-compressible like photos), quality 90; ``sizes`` one
    (width, height) per image (default: all ``width`` x ``height``)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    files = []
    for i in range(n):
        width, height = sizes[i] if sizes is not None else (width, height)
        yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
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
    times = timed(fn, repeat)
    return n / min(w for w, _ in times), n / min(c for _, c in times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16 images, 1 pass (smoke run)")
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--target", type=float, default=4000.0, help="images/s the host must feed (default 4000)")
    parser.add_argument("--cores", type=int, default=16, help="host cores to compare with (default 16)")
    parser.add_argument("--sizes", choices=("fixed", "realistic"), default="fixed",
                        help="fixed: every image 500x375 (the earlier figures); realistic: the ImageNet-like model, "
                             "plus the prepared (re-encoded) arms and DINOv2's multi-crop")
    parser.add_argument("--max-side", type=int, default=320, help="the prepared arms' longer side (default 320)")
    parser.add_argument("--device", default="cpu",
                        help="realistic: where data.decode=device's arms decode (cuda: nvJPEG; cpu: the same code on "
                             "this CPU, for reference)")
    parser.add_argument("--out", default=None, help="JSON path (default results/decode.json, realistic: "
                                                    "results/decode_realistic.json)")
    args = parser.parse_args()
    if args.sizes == "realistic":
        return realistic(args)
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
    path = RESULTS / "decode.json"
    write_report(out, path)
    print(f"wrote {path}")


def realistic(args) -> None:
    """The realistic-size run: every arm on the same images, interleaved per repeat (other jobs disturb both
    sides alike), images per CPU-second of this process."""
    n, repeat = (16, 1) if args.quick else (args.images, args.repeat)
    torch.set_num_threads(1)
    from PIL import Image
    from torchvision import transforms

    from selfsup.data.decode import FolderCrops
    from selfsup.data.device_decode import EncodedCrops, decode_batch
    from selfsup.data.prepare import reencode

    size, local = args.size, round(args.size * 98 / 224)  # DINOv2's local crops (98 px at 224: patch 14)
    two = [(0.08, 1.0), (0.08, 1.0)]
    multi_scales = [(0.32, 1.0)] * 2 + [(0.05, 0.32)] * 8
    multi_sizes = [size] * 2 + [local] * 8
    rng = np.random.default_rng(0)
    sizes = realistic_sizes(n, rng)
    with tempfile.TemporaryDirectory() as tmp:
        src, prep = Path(tmp) / "src", Path(tmp) / "prepared"
        src.mkdir()
        prep.mkdir()
        files = make_jpegs(src, n, sizes=sizes)
        prepared = []
        for f in files:
            data, _ = reencode(f, args.max_side, 90, 3, "jpg")
            (prep / f.name).write_bytes(data)
            prepared.append(prep / f.name)
        tv_two = transforms.Compose([transforms.RandomResizedCrop(size, scale=(0.08, 1.0)),
                                     transforms.RandomHorizontalFlip(), transforms.PILToTensor()])
        tv_global = transforms.Compose([transforms.RandomResizedCrop(size, scale=(0.32, 1.0)),
                                        transforms.RandomHorizontalFlip(), transforms.PILToTensor()])
        tv_local = transforms.Compose([transforms.RandomResizedCrop(local, scale=(0.05, 0.32)),
                                       transforms.RandomHorizontalFlip(), transforms.PILToTensor()])

        def torchvision(paths, multi: bool):
            def run():
                for f in paths:
                    with Image.open(f) as im:
                        im = im.convert("RGB")
                        if multi:
                            [tv_global(im) for _ in range(2)] + [tv_local(im) for _ in range(8)]
                        else:
                            torch.stack([tv_two(im), tv_two(im)])
            return run

        idx = torch.arange(n)
        arms = {
            "torchvision_two_views_original": torchvision(files, False),
            "selfsup_two_views_original": lambda: FolderCrops(files, size, two, seed=0).crops(idx, 0),
            "selfsup_two_views_prepared": lambda: FolderCrops(prepared, size, two, seed=0).crops(idx, 0),
            "torchvision_two_views_prepared": torchvision(prepared, False),
            "torchvision_multicrop_original": torchvision(files, True),
            "selfsup_multicrop_original": lambda: FolderCrops(files, size, multi_scales, seed=0,
                                                              sizes=multi_sizes).crops(idx, 0),
            "selfsup_multicrop_prepared": lambda: FolderCrops(prepared, size, multi_scales, seed=0,
                                                              sizes=multi_sizes).crops(idx, 0),
            "torchvision_multicrop_prepared": torchvision(prepared, True),
        }
        encoded = {"two_views": EncodedCrops(files, size, two, seed=0),
                   "multicrop": EncodedCrops(files, size, multi_scales, seed=0, sizes=multi_sizes)}
        for kind, enc in encoded.items():  # data.decode=device: what is left to a worker, bytes and boxes
            arms[f"selfsup_{kind}_device_worker"] = lambda enc=enc: enc.crops(idx, 0)
        batches = {kind: enc.crops(idx, 0) for kind, enc in encoded.items()}
        device = torch.device(args.device)

        def on_device(kind):  # the module's side: the batch decoded and cut on the device, by wall time
            def run():
                decode_batch(batches[kind], encoded[kind], device)
                if device.type == "cuda":
                    torch.cuda.synchronize()
            return run

        on_device("two_views")()  # warm-up: the codec and kernels load
        best = {k: 0.0 for k in arms}
        per_repeat = {k: [] for k in arms}  # images per CPU-second of each repeat: the ratios pair them
        device_rate = {k: 0.0 for k in encoded}
        for _ in range(repeat):  # interleaved: each repeat runs every arm once
            for name, fn in arms.items():
                per_repeat[name].append(rate(fn, n, 1)[1])
                best[name] = max(best[name], per_repeat[name][-1])
            for kind in encoded:
                device_rate[kind] = max(device_rate[kind], rate(on_device(kind), n, 1)[0])
        pixels = [w * h for w, h in sizes]
        prep_pixels = [np.prod(Image.open(p).size) for p in prepared]
    out = {"images": n, "size": size, "local_size": local, "max_side": args.max_side, "sizes": "realistic",
           "mean_pixels_original": float(np.mean(pixels)), "mean_pixels_prepared": float(np.mean(prep_pixels)),
           "longer_side_quantiles_original": [int(np.quantile([max(s) for s in sizes], q)) for q in (0.1, 0.5, 0.9)],
           "threads": 1, "repeats": repeat, "cpu_count_here": os.cpu_count(), "load_average_here": os.getloadavg()[0],
           "machine": cpu_kind(),
           **{f"{k}_images_per_cpu_s": round(v, 2) for k, v in best.items()},
           "device": args.device, **{f"device_decode_{k}_images_per_s": round(v, 1) for k, v in device_rate.items()}}
    for kind in ("two_views", "multicrop"):
        base = best[f"torchvision_{kind}_original"]
        for arm in ("original", "prepared", "device_worker"):
            rate_ = best[f"selfsup_{kind}_{arm}"]
            # against torchvision on the same files (the prepared arm: torchvision on the prepared files too), the
            # mean over the repeats of each repeat's ratio (the two sides measured side by side, alternating)
            files_ = "prepared" if arm == "prepared" else "original"
            ratios = [a / b for a, b in zip(per_repeat[f"selfsup_{kind}_{arm}"],
                                            per_repeat[f"torchvision_{kind}_{files_}"])]
            out[f"speedup_{kind}_{arm}_vs_torchvision_same_files"] = round(float(np.mean(ratios)), 2)
            out[f"speedup_{kind}_{arm}_vs_torchvision_same_files_per_repeat"] = [round(r, 2) for r in ratios]
            out[f"speedup_{kind}_{arm}_vs_torchvision_original"] = round(rate_ / base, 2)
            out[f"workers_for_target_{kind}_{arm}"] = math.ceil(args.target / rate_)
        out[f"torchvision_workers_for_target_{kind}"] = math.ceil(args.target / base)
    out["target_images_per_s"], out["host_cores"] = args.target, args.cores
    for key, value in out.items():
        print(f"{key:<48} {value:.4g}" if isinstance(value, float) else f"{key:<48} {value}")
    path = Path(args.out) if args.out else RESULTS / "decode_realistic.json"
    write_report(out, path)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
