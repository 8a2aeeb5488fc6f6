"""An evaluation session: what is evaluated (an :class:`~selfsup.runs.source.EvalSource`), on which device, on
which datasets (the run's own by default, checked against the backbone's channels and input size), with
the feature cache. ``selfsup eval`` and ``selfsup eval generation`` open one; the protocols take it.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import torch

from selfsup.config import DataConfig
from selfsup.data.datasets import DECODED, UNLABELLED, ImageDataset, load_dataset, needs_labels
from selfsup.errors import UserError, positive  # noqa: F401  (positive: runs.session.positive for callers)
from selfsup.eval.cache import features
from selfsup.eval.features import FEATURE_BATCH
from selfsup.runs.source import load_source, loss_embedding, with_flow_features, with_heads, with_last_blocks


def data_config(source, name: str | None = None, root: str | None = None) -> DataConfig:
    """The run's DataConfig (or one for the backbone's training dataset) with ``name`` / ``root`` overrides.
    Image files without ``data.image_size``: the run's own at the size it trained at (a run made before the size was
    recorded), a weights file's folder (no run: a DINOv2 hub file, a torchvision file) at the size its backbone
    takes, what its features are computed at (nothing inferred from the files or said), a run's other folder at
    its first images' size (``datasets.infer_image_size``)."""
    run_cfg = getattr(source, "run_cfg", None)
    base = copy.deepcopy(run_cfg.data) if run_cfg is not None else DataConfig(name=source.meta.get("dataset", "digits"))
    if base.name in DECODED and base.image_size is None and run_cfg is not None:
        base.image_size = source.meta.get("image_size")
    if name and name != base.name:
        base = DataConfig(name=name)  # another dataset: none of the run's root / layout settings apply
    if base.name in DECODED and base.image_size is None and run_cfg is None:
        base.image_size = source.meta.get("image_size")
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


def checked_device(name: str | None) -> torch.device:
    """The torch device ``name`` (cpu, cuda, cuda:N), refused when it does not exist; None: cuda when available."""
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise UserError(f"--device {name!r} is not a device name; use cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {name} asked for a GPU but none is available; use --device cpu")
    return dev


class EvalSession:
    """The source, device, datasets and cached features of one evaluation.

    ``location``: run folder, exported .safetensors or .ckpt; ``data`` / ``root``: another dataset (default
    the run's); ``resize``: accept images of another size; ``out``: results folder (default RUN/eval);
    ``train_limit``: a fixed random subset of train; ``embedding``: backbone | projector | predictor | loss (the one
    the method's loss normalises; the backbone, with a note, where the source has none); ``flow_t`` /
    ``flow_block``: a flow run's features at another level / block; ``last_blocks``: a ViT's last N blocks, each
    normalised and pooled, concatenated (I-JEPA's and DINO's linear evaluation; 1 or None: the backbone's feature).
    """

    def __init__(self, location, *, data: str | None = None, root: str | None = None, resize: bool = False,
                 device: str | None = None, batch_size: int = FEATURE_BATCH, out: str | None = None, cache: bool = True,
                 train_limit: int | None = None, embedding: str = "backbone", flow_t: float | None = None,
                 flow_block: int | None = None, last_blocks: int | None = None):
        self.device = checked_device(device)
        self.resize, self.batch_size, self.cache = resize, batch_size, cache
        self.train_limit = None if train_limit is None else positive(train_limit, "--train-limit")
        self.source = load_source(location)
        if embedding == "loss":
            embedding = loss_embedding(self.source)
            if embedding == "backbone":
                print(f"selfsup: {self.source.weights.name} has no loss-side embedding to score (no heads in a run "
                      "checkpoint, or a loss on unnormalised outputs): using the backbone feature", file=sys.stderr)
        if embedding in ("projector", "predictor"):
            self.source = with_heads(self.source, embedding)
        if flow_t is not None or flow_block is not None:
            self.source = with_flow_features(self.source, flow_t, flow_block)
        if last_blocks is not None:
            self.source = with_last_blocks(self.source, last_blocks)
        if out:
            self.source.out_dir = Path(out)
        self.data_cfg = data_config(self.source, data, root)
        self._splits: dict = {}

    @classmethod
    def from_args(cls, args) -> "EvalSession":
        """The session of a ``selfsup eval`` command line (the flags of ``commands.eval``'s common arguments)."""
        return cls(args.ckpt, data=args.data, root=args.root, resize=args.resize, device=args.device,
                   batch_size=args.batch_size, out=args.out, cache=not args.no_cache, train_limit=args.train_limit,
                   embedding=args.embedding, flow_t=args.flow_t, flow_block=args.flow_block,
                   last_blocks=args.last_blocks)

    @property
    def out_dir(self) -> Path:
        """The results folder (``--out``, default RUN/eval), made when first asked for: every writer finds it."""
        self.source.out_dir.mkdir(parents=True, exist_ok=True)
        return self.source.out_dir

    def data_key(self, cfg, limit: int | None = None) -> str:
        restricted = [sorted(cfg.exclude_classes), cfg.imbalance, cfg.imbalance_seed] if (
            cfg.exclude_classes or cfg.imbalance != 1) else []
        return json.dumps([cfg.name, cfg.root, cfg.image_size, cfg.load_size, limit, *restricted])

    def _limit(self, name: str, cfg, limit: int | None) -> int | None:
        if limit is None and name == "train" and cfg is self.data_cfg:
            return self.train_limit
        return limit

    def split(self, name: str, cfg=None, resize: bool | None = None, flag: str = "--resize", limit: int | None = None):
        """A dataset split checked against the backbone (``train_limit``: a fixed subset of train)."""
        cfg = cfg or self.data_cfg
        limit = self._limit(name, cfg, limit)
        key = (self.data_key(cfg, limit), name)
        if key not in self._splits:
            full = load_split(cfg, name, self.source.meta, self.resize if resize is None else resize, flag)
            self._splits[key] = full.subset(limit)
            self._splits[(self.data_key(cfg, limit), name)] = self._splits[key]  # an image size inferred on loading
        return self._splits[key]

    def features(self, name: str, cfg=None, resize: bool | None = None, flag: str = "--resize",
                 limit: int | None = None):
        """(features, labels) of a split, through the feature cache."""
        cfg = cfg or self.data_cfg
        limit = self._limit(name, cfg, limit)
        dataset = self.split(name, cfg, resize, flag, limit)
        return features(self.source, dataset, name, self.data_key(cfg, limit), self.batch_size, self.device,
                        self.cache)

    def header(self) -> dict:
        return {"source": str(self.source.weights), "backbone": self.source.meta["backbone"],
                "method": self.source.meta.get("method"), "dataset": self.data_cfg.name,
                "embedding": self.source.embedding, "weights": self.source.weights_label}

    def suffix(self) -> str:
        """File-name suffix of the results: ``-<embedding>`` other than the backbone's, ``.<tag>`` of weights other
        than the run's trained backbone (``runs.source.weights_identity``: ``.init``, ``.step<N>``)."""
        embedding = "" if self.source.embedding == "backbone" else f"-{self.source.embedding}"
        return embedding + (f".{self.source.weights_tag}" if self.source.weights_tag else "")

    def run_hflip(self, default: float = 0.5) -> float:
        """The run's flip probability (0 where flips change the class), else ``default``."""
        aug = getattr(self.source.run_cfg, "augment", None)
        return aug.hflip_p if aug is not None and aug.hflip_p is not None else default
