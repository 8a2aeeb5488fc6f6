"""Feature cache: one extraction per (weights, dataset, split) in ``RUN/eval/cache/``, reused by every evaluation."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from torch import Tensor

from selfsup.data.datasets import ImageDataset
from selfsup.diskspace import atomic_write, tensor_bytes
from selfsup.eval.features import extract_features


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def cache_path(source, dataset: ImageDataset, split: str, data_key: str) -> Path:
    """``cache/features-<dataset>-<split>-<hash of weights fingerprint, data settings, size, transform>.pt``."""
    m = source.meta
    raw = json.dumps([source.fingerprint, data_key, split, len(dataset), m["image_size"], m["mean"], m["std"]])
    key = hashlib.sha1(raw.encode()).hexdigest()[:16]
    return source.out_dir / "cache" / f"features-{dataset.name}-{split}-{key}.pt"


def features(source, dataset: ImageDataset, split: str, data_key: str = "", batch_size: int = 512,
             device: torch.device | str | None = None, use_cache: bool = True) -> tuple[Tensor, Tensor]:
    """(features float32 N×D, labels N) of ``dataset`` through the frozen backbone, from the cache when present."""
    path = cache_path(source, dataset, split, data_key)
    if use_cache and path.exists():
        try:
            blob = torch.load(path, map_location="cpu", weights_only=True)
            return blob["features"], blob["labels"]
        except Exception:  # a truncated cache file is rebuilt
            pass
    m = source.meta
    feats, labels = extract_features(source.backbone, dataset, m["image_size"], m["mean"], m["std"], batch_size,
                                     device or default_device())
    if use_cache:
        blob = {"features": feats, "labels": labels}
        atomic_write(path, lambda f: torch.save(blob, f), "the feature cache", tensor_bytes(blob), fsync=False)
    return feats, labels
