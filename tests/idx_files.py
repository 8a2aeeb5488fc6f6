"""Fashion-MNIST-layout IDX files written by the tests themselves (so no test needs Debian's files)."""

from __future__ import annotations

import gzip
import struct

import numpy as np


def write_idx(path, array, compress):
    array = np.asarray(array, dtype=np.uint8)
    data = (struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(">" + "I" * array.ndim, *array.shape)
            + array.tobytes())
    with (gzip.open if compress else open)(path, "wb") as f:
        f.write(data)


def fake_fashion(folder, compress=True, n_train=6, n_test=4, seed=0):
    """Random 28×28 images and labels in the four Fashion-MNIST file names; returns {split: (images, labels)}."""
    rng = np.random.default_rng(seed)
    out = {}
    for split, n, prefix in (("train", n_train, "train"), ("test", n_test, "t10k")):
        images, labels = rng.integers(0, 256, (n, 28, 28)), rng.integers(0, 10, n)
        suffix = ".gz" if compress else ""
        write_idx(folder / f"{prefix}-images-idx3-ubyte{suffix}", images, compress)
        write_idx(folder / f"{prefix}-labels-idx1-ubyte{suffix}", labels, compress)
        out[split] = (images, labels)
    return out


def fashion_overrides(claim_id: str, folder) -> list[str]:
    """``data.root=`` of fake Fashion-MNIST files for a claim that trains on Fashion-MNIST (none for the others), so
    that its quick test reads 64 + 16 images, not 70,000; the claim's runs must then be Fashion-MNIST runs."""
    from selfsup.claims.registry import CLAIMS

    if CLAIMS[claim_id].test_data != "fashion-mnist":
        return []
    folder.mkdir(parents=True, exist_ok=True)
    fake_fashion(folder, n_train=64, n_test=16)
    return [f"data.root={folder}"]
