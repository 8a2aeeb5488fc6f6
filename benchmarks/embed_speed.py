"""selfsup embed's loop against a plain ``torch.no_grad()`` loop over the same decoded batches, and the whole command
(decode, forward, chunk files, the assembled Parquet file) in images/s.

    python -m benchmarks.embed_speed [--quick] [--backbone resnet18] [--size 64]   → benchmarks/results/embed_speed.json
"""

from __future__ import annotations

import argparse
import io
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from benchmarks.harness import RESULTS, default_device, machine_info, timed, write_report
from selfsup.data.decode import resize_center_crop
from selfsup.export import export_backbone
from selfsup.models.backbones import build_backbone
from selfsup.runs.embed import Embedder, embed

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def make_folder(root: Path, n: int, size: int) -> list[Path]:
    """``n`` PNGs of smooth random colour (as photos compress, unlike noise), 1.25 × ``size`` on the short side."""
    rng = np.random.default_rng(0)
    side = int(size * 1.25)
    files = []
    for i in range(n):
        low = rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)
        im = Image.fromarray(low).resize((side + i % 7, side), Image.BILINEAR)
        files.append(root / f"c{i % 10}" / f"{i:05d}.png")
        files[-1].parent.mkdir(parents=True, exist_ok=True)
        im.save(files[-1])
    return sorted(files)


def plain_loop(backbone, batches, device):
    """The reference: normalise and forward each batch under ``torch.no_grad()``."""
    mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1)
    std = torch.tensor(STD, device=device).view(1, 3, 1, 1)
    with torch.no_grad():
        return [backbone((b.to(device).float() / 255 - mean) / std).cpu() for b in batches]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="128 images, one repeat (smoke run)")
    parser.add_argument("--backbone", default="resnet18")
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--images", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    n, repeat = (128, 1) if args.quick else (args.images, args.repeat)
    device = default_device()
    kwargs = {"in_chans": 3, "image_size": args.size, **({"patch_size": 8} if args.backbone.startswith("vit") else {})}
    torch.manual_seed(0)
    backbone = build_backbone(args.backbone, **kwargs).eval().to(device)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        files = make_folder(root / "images", n, args.size)
        batches = [torch.stack([resize_center_crop(f, args.size) for f in files[i:i + args.batch]])
                   for i in range(0, n, args.batch)]
        embedder = Embedder(backbone, MEAN, STD).to(device)
        plain = timed(lambda: plain_loop(backbone, batches, device), repeat, warmup=1, device=device)
        ours = timed(lambda: [embedder(b) for b in batches], repeat, warmup=1, device=device)
        meta = {"backbone": args.backbone, "kwargs": kwargs, "image_size": args.size, "in_chans": 3,
                "mean": list(MEAN), "std": list(STD)}
        source = export_backbone(backbone.cpu(), root / "backbone.safetensors", meta)
        whole = [embed(source, root / "images", root / f"e{r}.parquet", chunk=args.batch, device=str(device),
                       stream=io.StringIO()) for r in range(repeat)]
    best_plain, best_ours = min(w for w, _ in plain), min(w for w, _ in ours)
    report = {"backbone": args.backbone, "image_size": args.size, "images": n, "batch": args.batch,
              "threads": torch.get_num_threads(), "machine": machine_info(device),
              "plain_no_grad_images_per_s": n / best_plain, "embed_loop_images_per_s": n / best_ours,
              "embed_loop_over_plain": best_plain / best_ours,
              "embed_command_images_per_s": max(w.images_per_s for w in whole),
              "note": "the loops time the forward over already decoded uint8 batches; the command also decodes "
                      "the PNGs, writes a chunk per batch and assembles the Parquet file"}
    for key in ("plain_no_grad_images_per_s", "embed_loop_images_per_s", "embed_loop_over_plain",
                "embed_command_images_per_s"):
        print(f"{key:<30} {report[key]:.2f}")
    print(f"wrote {write_report(report, RESULTS / 'embed_speed.json')}")


if __name__ == "__main__":
    main()
