"""Where a worker's CPU time goes in ``FolderCrops.crops`` (issue 52): cProfile over the realistic-size images of
``benchmarks/decode.py`` (originals and the prepared re-encodes, two views and DINOv2's multi-crop), each function
of the data path put in one part (decode, resize, crop-box draws, stacking / batch writes, tensor conversion,
file open + header) and each part's share of the profiled time.

    python -m benchmarks.decode_profile [--images 64] [--repeat 3] [--out results/decode_profile.json]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.decode import make_jpegs, realistic_sizes
from benchmarks.harness import RESULTS, write_report

# (part, substrings of "file:function" of the profiled functions, matched against their own time)
PARTS = [
    ("decode", ("ImageFile.py:load", "Image.py:load", "decode_jpeg", "_decode_file", "Image.py:convert",
                "ImagingDecoder", "_pixels", "draft")),
    ("resize", ("resize", "interpolate", "_upsample_bilinear2d_aa", "reduce")),
    ("crop_box_draws", ("crop_boxes", "sample_crop_boxes", "_uniform", "SeedSequence", "generate_state",
                        "manual_seed", "Generator", "torch.rand", "method 'exp'", "method 'round'", "sqrt",
                        "gather", "argmax", "where", "minimum", "floor", "uniform_", "built-in method any",
                        "method 'any'", "box_uniforms", "crop_box_batch", "_mix64", "rsub", "method 'to' of",
                        "torch.exp", "torch.log", "take_along_axis", "method 'astype'")),
    ("stack_and_batch_writes", ("stack", "stack_runs", "copy_", "empty", "zeros", "ViewBatch", "slots",
                                "method 'permute'", "method 'unsqueeze'")),
    ("to_tensor", ("_to_tensor", "asarray", "from_numpy", "method 'copy'", "__array_interface__", "tobytes",
                   "ImagingEncoder", "Image.py:copy", "_imaging.new", "frombuffer")),
    ("open_and_header", ("Image.py:open", "_open", "JpegImagePlugin", "fromfile", "read_bytes", "io.open",
                         "_getheader", "header", "Opened", "_safe_read", "_binary.py", "BufferedReader",
                         "pathlib.py")),
]


def shares(prof: cProfile.Profile) -> dict:
    """Each part's share of the total own time (tottime), the rest under ``other``."""
    stats = pstats.Stats(prof).stats
    total = sum(v[2] for v in stats.values())
    parts = {name: 0.0 for name, _ in PARTS} | {"other": 0.0}
    for (file, _, func), v in stats.items():
        key = f"{Path(file).name}:{func}"
        for name, needles in PARTS:
            if any(n in key for n in needles):
                parts[name] += v[2]
                break
        else:
            parts["other"] += v[2]
    return {"total_s": round(total, 4), **{k: round(v / total, 3) for k, v in parts.items()}}


def top(prof: cProfile.Profile, k: int = 12) -> list:
    stats = pstats.Stats(prof).stats
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:k]
    return [(f"{Path(f).name}:{line}:{fn}", v[1], round(v[2], 4)) for (f, line, fn), v in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--max-side", type=int, default=320)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from selfsup.data.decode import FolderCrops
    from selfsup.data.prepare import reencode

    size, local = args.size, round(args.size * 98 / 224)
    plans = {"two_views": dict(scales=[(0.08, 1.0)] * 2),
             "multicrop": dict(scales=[(0.32, 1.0)] * 2 + [(0.05, 0.32)] * 8, sizes=[size] * 2 + [local] * 8)}
    out = {"images": args.images, "repeat": args.repeat, "size": size, "local_size": local}
    with tempfile.TemporaryDirectory() as tmp:
        src, prep = Path(tmp) / "src", Path(tmp) / "prepared"
        src.mkdir()
        prep.mkdir()
        files = make_jpegs(src, args.images, sizes=realistic_sizes(args.images, np.random.default_rng(0)))
        prepared = []
        for f in files:
            (prep / f.name).write_bytes(reencode(f, args.max_side, 90, 3, "jpg")[0])
            prepared.append(prep / f.name)
        idx = torch.arange(args.images)
        for kind, plan in plans.items():
            for arm, paths in (("original", files), ("prepared", prepared)):
                crops = FolderCrops(paths, size, seed=0, **plan)
                crops.crops(idx, 0)  # warm-up
                prof = cProfile.Profile(time.process_time)  # CPU time: other jobs on the cores do not count
                prof.enable()
                for epoch in range(args.repeat):
                    crops.crops(idx, epoch)
                prof.disable()
                out[f"{kind}_{arm}"] = shares(prof) | {"top": top(prof)}
                print(kind, arm, {k: v for k, v in out[f"{kind}_{arm}"].items() if k != "top"})
    path = Path(args.out) if args.out else RESULTS / "decode_profile.json"
    write_report(out, path)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
