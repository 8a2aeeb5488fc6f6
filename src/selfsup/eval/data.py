"""The evaluation datasets: the run's own by default, checked against the backbone's channels and input size."""

from __future__ import annotations

import copy

from selfsup.config import DataConfig
from selfsup.data.datasets import UNLABELLED, ImageDataset, load_dataset, needs_labels
from selfsup.errors import UserError


def data_config(source, name: str | None = None, root: str | None = None) -> DataConfig:
    """The run's DataConfig (or one for the backbone's training dataset) with ``name`` / ``root`` overrides."""
    run_cfg = getattr(source, "run_cfg", None)
    base = copy.deepcopy(run_cfg.data) if run_cfg is not None else DataConfig(name=source.meta.get("dataset", "digits"))
    if name and name != base.name:
        base = DataConfig(name=name)  # another dataset: none of the run's root / layout settings apply
    if base.name in UNLABELLED:
        raise needs_labels(base.name)
    if root:
        base.root = root
    base.unlabeled = False  # evaluation needs labels
    base.validate()
    return base


def check_fits(dataset: ImageDataset, meta: dict, resize: bool, flag: str = "--resize") -> None:
    """Channels must equal the backbone's (never expanded); another image size only when ``resize``."""
    channels, size = meta["in_chans"], meta["image_size"]
    if dataset.channels != channels:
        raise UserError(f"{dataset.name} images have {dataset.channels} channel(s) but the backbone takes {channels}; "
                        f"evaluate on a {channels}-channel dataset (channels are never converted)")
    if dataset.image_size != size and not resize:
        raise UserError(f"{dataset.name} images are {dataset.image_size}x{dataset.image_size} but the backbone takes "
                        f"{size}x{size}; pass {flag} to resize them, or use the dataset it was trained on")


def load_split(cfg: DataConfig, split: str, meta: dict, resize: bool, flag: str = "--resize") -> ImageDataset:
    """One split, checked against the backbone."""
    dataset = load_dataset(cfg, split)
    check_fits(dataset, meta, resize, flag)
    return dataset


def keep_classes(dataset: ImageDataset, classes, keep: bool) -> ImageDataset:
    """The samples whose label is (``keep``) or is not (not ``keep``) in ``classes``."""
    import torch

    mask = torch.isin(dataset.labels, torch.tensor(sorted(classes)))
    return dataset.select((mask if keep else ~mask).nonzero().squeeze(1))


def subset(dataset: ImageDataset, limit: int | None, seed: int = 0) -> ImageDataset:
    """A fixed random subset of at most ``limit`` samples (in their original order); None: all."""
    import torch

    if limit is None or limit >= len(dataset):
        return dataset
    return dataset.select(torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed))[:limit].sort().values)
