"""Decoding image files in DataLoader workers: random resized crops for training, resize + centre crop for evaluation.

Training (``FolderCrops``): each view of each image is its own RandomResizedCrop (the recipe's scale
per view, ratio (3/4, 4/3), torchvision's sampling rule) taken from the whole decoded image and
resized (PIL, antialiased bilinear) straight to its view's output size, so a batch is a fixed-size
``uint8 (B, V, C, S, S)`` tensor (a multi-crop plan with several sizes: one such tensor per run of views of
equal size) that the batched on-device augmentation takes without cropping again.
The crop boxes come from a generator seeded by (seed, epoch, image index): the same on every worker
count and after a resume. A JPEG is decoded at the smallest DCT scale that still leaves every crop
at least the output size (``PIL.Image.draft``), which is most of the saving over a full decode.

Evaluation (``resize_center_crop``): resize the shorter side to ``resize`` (default size / 0.875:
256 for 224), then the central ``size`` square, exactly as torchvision's Resize + CenterCrop on PIL.

Images are decoded to RGB, or to one grayscale channel (``channels=1``, ``data.channels``: PIL's ``L``, ITU-R
601-2 luma), before any crop.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from selfsup.data.badfiles import bad_file_cap, say_skipped, too_many_bad_files  # noqa: F401  (re-exported)
from selfsup.data.views import sample_crop_boxes
from selfsup.diskspace import writing
from selfsup.errors import UserError

EVAL_CROP = 0.875  # Resize(256) + CenterCrop(224)


def eval_resize(size: int) -> int:
    """The shorter side before the centre crop: size / 0.875, rounded (224 → 256)."""
    return int(round(size / EVAL_CROP))


def _open(path: Path):
    try:
        return Image.open(path)
    except (OSError, SyntaxError, ValueError) as e:
        raise UserError(f"corrupt or unreadable image file {path} ({type(e).__name__}); remove or replace it") from None


MODES = {1: "L", 3: "RGB"}  # data.channels → the PIL mode images are decoded to


def _decoded(im, path: Path, channels: int = 3):
    try:
        return im.convert(MODES[channels])
    except (OSError, SyntaxError, ValueError) as e:
        raise UserError(f"corrupt or unreadable image file {path} ({type(e).__name__}); remove or replace it") from None


def _to_tensor(im) -> Tensor:
    """A PIL image as uint8 (C, H, W): RGB 3 channels, L one."""
    a = np.asarray(im, dtype=np.uint8).copy()
    return torch.from_numpy(a[..., None] if a.ndim == 2 else a).permute(2, 0, 1)


def resize_center_crop(path: Path, size: int, resize: int | None = None, channels: int = 3) -> Tensor:
    """torchvision ``Resize(resize)`` (shorter side, PIL bilinear) + ``CenterCrop(size)`` as uint8 (C, size, size)."""
    resize = resize or eval_resize(size)
    with _open(path) as f:
        im = _decoded(f, path, channels)
    w, h = im.size
    short, long = (w, h) if w <= h else (h, w)
    new_short, new_long = resize, int(resize * long / short)
    new_w, new_h = (new_short, new_long) if w <= h else (new_long, new_short)
    if (new_w, new_h) != (w, h):
        im = im.resize((new_w, new_h), Image.BILINEAR)
    if new_w < size or new_h < size:
        raise UserError(f"data.load_size={resize} is smaller than the {size}-pixel centre crop; raise it")
    top, left = int(round((new_h - size) / 2.0)), int(round((new_w - size) / 2.0))
    return _to_tensor(im.crop((left, top, left + size, top + size)))


def crop_boxes(seed: int, epoch: int, index: int, height: int, width: int, scales, ratio=(3 / 4, 4 / 3)):
    """One (top, left, h, w) per view, torchvision's RandomResizedCrop rule, from a generator seeded by
    (seed, epoch, index): independent of the worker that decodes the image."""
    state = np.random.SeedSequence([seed, epoch, index]).generate_state(2, np.uint32)
    g = torch.Generator().manual_seed(int(state[0]) << 31 ^ int(state[1]))
    boxes = []
    for scale in scales:
        top, left, h, w = sample_crop_boxes(1, height, width, scale, g, ratio=ratio)
        boxes.append((int(top), int(left), int(h), int(w)))
    return boxes


def decode_crops(path: Path, boxes_of, size, draft: bool = True, channels: int = 3) -> Tensor | list[Tensor]:
    """The views of one file as uint8 (V, C, size, size); ``boxes_of(height, width)`` gives the crop boxes
    in full-resolution pixels (the header's size, read before decoding). ``size`` may be one output size per
    view: the views then come as a list of uint8 (3, s, s)."""
    sizes = None if isinstance(size, int) else [int(s) for s in size]

    with _open(path) as f:
        width, height = f.size
        boxes = boxes_of(height, width)
        out_sizes = sizes or [size] * len(boxes)
        sx = sy = 1.0
        if draft and f.format == "JPEG":
            # the largest DCT reduction that keeps every crop at least its output size on each side
            r = max(max(s / h, s / w) for (_, _, h, w), s in zip(boxes, out_sizes))
            if r < 1:
                f.draft(MODES[channels], (math.ceil(width * r), math.ceil(height * r)))
                sx, sy = f.size[0] / width, f.size[1] / height
        im = _decoded(f, path, channels)
    views = []
    for (top, left, h, w), s in zip(boxes, out_sizes):
        box = (left * sx, top * sy, (left + w) * sx, (top + h) * sy)
        views.append(_to_tensor(im.resize((s, s), Image.BILINEAR, box=box)))
    return views if sizes else torch.stack(views)


def first_readable(read, i: int, files: list, max_fraction: float | None, bad: dict, log: Path | None = None):
    """``read(i)``; under ``data.on_bad_file=skip`` (``max_fraction`` not None) an unreadable file's place is taken by
    the first readable one after it (cyclically): which one depends on the files alone, so a resumed run and any
    worker take the same. Each unreadable file is noted once (``record_bad_file``)."""
    n = len(files)
    for k in range(n if max_fraction is not None else 1):
        j = (i + k) % n
        try:
            return read(j)
        except UserError as e:
            if max_fraction is None:
                raise
            record_bad_file(bad, j, str(files[j]), str(e), len(files), max_fraction, log)
    raise UserError(f"none of the {n} images can be read (the first: {files[0]})")


def record_bad_file(bad: dict, key, path: str, reason: str, total: int, max_fraction: float, log: Path | None,
                    stands_in: str = "the next readable file stands in") -> None:
    """Note unreadable file ``key`` (``path``) in ``bad`` (once): one line on stderr and a JSON line in ``log``, unless
    another process of the run logged it (``badfiles.say_skipped``); past ``bad_file_cap`` the run stops in one
    line (``data.on_bad_file=skip``)."""
    if key in bad:
        return
    bad[key] = path
    if say_skipped(path, reason, stands_in, len(bad), total, max_fraction, log) and log is not None:
        with writing(log, "the skipped-file log"), open(log, "a") as f:
            f.write(json.dumps({"index": key, "path": path, "reason": reason}) + "\n")
    if len(bad) > bad_file_cap(total, max_fraction):
        raise UserError(too_many_bad_files(list(bad.values()), total, max_fraction))


class FolderCrops:
    """Training views of image files, decoded and cropped per (epoch, index): ``crops(indices, epoch)`` →
    uint8 (B, V, C, size, size), view v a RandomResizedCrop with ``scales[v]``; with ``sizes`` (one output
    size per view, a multi-crop plan) a tuple of uint8 (B, V_r, C, s_r, s_r), one per run of equal sizes."""

    def __init__(self, files: list[Path], size: int, scales, seed: int, ratio=(3 / 4, 4 / 3), draft: bool = True,
                 sizes=None, channels: int = 3):
        self.files, self.size, self.scales, self.channels = files, size, [tuple(s) for s in scales], channels
        self.seed, self.ratio, self.draft = seed, tuple(ratio), draft
        sizes = [int(s) for s in sizes] if sizes is not None else None
        if sizes is not None and len(sizes) != len(self.scales):
            raise ValueError(f"{len(sizes)} crop sizes for {len(self.scales)} crop scales")
        self.sizes = None if sizes is None or all(s == size for s in sizes) else sizes
        self.max_bad_fraction: float | None = None  # None: data.on_bad_file=error
        self.bad_log: Path | None = None
        self.bad: dict[int, str] = {}  # the unreadable files this process met: index -> path

    def skip_bad_files(self, max_fraction: float, log: Path | None = None) -> "FolderCrops":
        """``data.on_bad_file=skip``: an unreadable file is replaced by the next readable one (``first_readable``),
        logged (one line, and a JSON line in ``log``); more than ``max(1, max_fraction · n)`` of them stop the run."""
        self.max_bad_fraction, self.bad_log = max_fraction, log
        return self

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (len(self.files), self.channels, self.size, self.size)

    def __len__(self) -> int:
        return len(self.files)

    def crop(self, i: int, epoch: int):
        """The views of file ``i``; under ``skip`` those of the first readable file from ``i`` on (cyclically), with
        that file's own seeded boxes: which file stands in depends on the files alone, so a resumed run (and any
        worker) takes the same one."""
        def read(j: int):
            return decode_crops(self.files[j], lambda h, w: crop_boxes(self.seed, epoch, j, h, w, self.scales,
                                                                      self.ratio),
                                self.sizes or self.size, self.draft, self.channels)
        return first_readable(read, i, self.files, self.max_bad_fraction, self.bad, self.bad_log)

    def crops(self, index: Tensor, epoch: int):
        per_image = [self.crop(i, epoch) for i in index.tolist()]
        return torch.stack(per_image) if self.sizes is None else stack_runs(per_image, self.sizes)


def size_runs(sizes: list[int]) -> list[tuple[int, int]]:
    """(first, end) of each run of consecutive views of equal size in a multi-crop plan's ``sizes``."""
    runs, first = [], 0
    for v in range(1, len(sizes) + 1):
        if v == len(sizes) or sizes[v] != sizes[first]:
            runs.append((first, v))
            first = v
    return runs


def stack_runs(per_image: list[list[Tensor]], sizes: list[int]) -> tuple[Tensor, ...]:
    """Each image's views (a list of uint8 (C, s_v, s_v)) as one uint8 (B, V_r, C, s, s) per run of equal sizes."""
    return tuple(torch.stack([torch.stack(views[a:b]) for views in per_image]) for a, b in size_runs(sizes))
