"""WebDataset tar shards written by the tests (data.name=webdataset)."""

from __future__ import annotations

import io
import tarfile

import numpy as np
from PIL import Image


def write_shards(folder, sizes, start=0, corrupt=()):
    """Shard j holds sizes[j] samples ``<id>.png`` (a random image, 12..20 px) + ``<id>.cls`` = the sample's id;
    ids run from ``start``; ids in ``corrupt`` get bytes that are no image."""
    folder.mkdir(parents=True, exist_ok=True)
    rng, sid = np.random.default_rng(start), start
    for j, n in enumerate(sizes):
        with tarfile.open(folder / f"shard-{j:06d}.tar", "w") as tar:
            for _ in range(n):
                h, w = rng.integers(12, 21, 2)
                buf = io.BytesIO()
                Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, format="PNG")
                members = {"png": b"\x89PNG garbage" if sid in corrupt else buf.getvalue(), "cls": str(sid).encode()}
                for ext, data in members.items():
                    info = tarfile.TarInfo(f"{sid:05d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                sid += 1
    return folder
