"""The generated dense task of ``selfsup eval segment``: items of a bundled dataset placed on a larger black canvas
at random positions and sizes, with a per-pixel label map (0 the background, 1 + the item's class).

The task is fixed, the same for every method and machine (``CANVAS_TASKS``):

- ``digits-canvas``: scikit-learn's 8×8 digits (always there) on a 24×24 canvas, 2 items of side 8-12 px each;
- ``fmnist-canvas``: Fashion-MNIST's 28×28 items (Debian's IDX files, found as every Fashion-MNIST reader finds
  them: ``--root``, ``$SELFSUP_FASHION_MNIST_DIR``, ``/usr/share/datasets/fashion-mnist``) on a 56×56 canvas,
  2 items of side 20-32 px each;
- 1,000 training canvases made of the dataset's training items, 200 test canvases of its test items (no item is
  in both), drawn from a generator seeded by the task's seed and the split.

Each item: a uniform random item of the split, a uniform integer side in [min_side, max_side], a uniform position
with the whole item inside the canvas; resized (bilinear, antialiased) to its side, rounded to uint8. Its foreground
is its pixels >= ``threshold`` (16 of 255); only those are written, to the image (the item's value) and to the label
map (1 + its class). Overlap rule: items are drawn in order, a later item covers an earlier one where its foreground
lies, so a pixel's label is the class of the item whose value it shows, and every pixel no foreground covers is
black (0) and background (label 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from selfsup.data.datasets import ImageDataset, load_digits, load_fashion_mnist
from selfsup.data.dense import DenseSet

FASHION_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                   "Ankle boot")
ITEM_CLASSES = {"digits": tuple(str(d) for d in range(10)), "fashion-mnist": FASHION_CLASSES}


@dataclass(frozen=True)
class CanvasTask:
    """One generated task: the items' dataset, the canvas side, items per canvas and their side range (px), the
    foreground threshold (of 255), the canvases per split and the seed."""

    source: str
    size: int
    items: int
    min_side: int
    max_side: int
    threshold: int = 16
    train: int = 1000
    test: int = 200
    seed: int = 0


CANVAS_TASKS = {
    "digits-canvas": CanvasTask("digits", size=24, items=2, min_side=8, max_side=12),
    "fmnist-canvas": CanvasTask("fashion-mnist", size=56, items=2, min_side=20, max_side=32),
}


def resize_item(item: Tensor, side: int) -> Tensor:
    """A (C, h, w) uint8 item at ``side`` × ``side`` (bilinear, antialiased, rounded), uint8."""
    x = F.interpolate(item[None].float(), size=(side, side), mode="bilinear", align_corners=False, antialias=True)
    return x[0].round().clamp(0, 255).to(torch.uint8)


def place_item(image: Tensor, mask: Tensor, item: Tensor, label: int, top: int, left: int, threshold: int) -> None:
    """Write ``item`` (C, s, s) uint8 into ``image`` (C, S, S) and ``label`` into ``mask`` (S, S) at (top, left),
    where the item's foreground lies (any channel >= ``threshold``): in place."""
    s = item.shape[-1]
    fg = (item >= threshold).any(0)
    region = image[:, top:top + s, left:left + s]
    region[:, fg] = item[:, fg]
    mask[top:top + s, left:left + s][fg] = label


def make_canvases(items: ImageDataset, n: int, task: CanvasTask, seed: int) -> tuple[Tensor, Tensor]:
    """(images uint8 (n, C, S, S), masks uint8 (n, S, S)) of ``n`` canvases of ``items`` drawn with ``seed``."""
    g = torch.Generator().manual_seed(seed)
    k, S = task.items, task.size
    pick = torch.randint(len(items), (n, k), generator=g)
    sides = torch.randint(task.min_side, task.max_side + 1, (n, k), generator=g)
    where = torch.rand(n, k, 2, generator=g)  # the position: a share of the free span of the canvas
    images = torch.zeros(n, items.channels, S, S, dtype=torch.uint8)
    masks = torch.zeros(n, S, S, dtype=torch.uint8)
    for i in range(n):
        for j in range(k):
            side = int(sides[i, j])
            top, left = (where[i, j] * (S - side + 1)).floor().long().tolist()
            item = resize_item(items.images[pick[i, j]], side)
            place_item(images[i], masks[i], item, 1 + int(items.labels[pick[i, j]]), top, left, task.threshold)
    return images, masks


def canvas_task(name: str, split: str, root: str | None = None) -> DenseSet:
    """The ``split`` (train | test) of the generated task ``name`` (``CANVAS_TASKS``); ``root``: Fashion-MNIST's
    folder (fmnist-canvas)."""
    task = CANVAS_TASKS[name]
    items = load_digits(split) if task.source == "digits" else load_fashion_mnist(split, root)
    n = task.train if split == "train" else task.test
    images, masks = make_canvases(items, n, task, seed=2 * task.seed + (split == "test"))
    return DenseSet(name, images, masks, ("background", *ITEM_CLASSES[task.source]))
