"""A dense (segmentation) task's data: images and their per-pixel label maps, one split, in memory.

Made by ``data.canvas`` (the generated canvases of digits or Fashion-MNIST items) and ``data.seg_folder`` (a user's
``images/`` + ``masks/``); read by ``selfsup eval segment`` (``runs.evaluate.run_segment``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

IGNORE = 255  # a label map's pixel that is not scored (mmsegmentation's ignore_index, DINOv2's heads)


@dataclass
class DenseSet:
    """``images`` uint8 (N, C, S, S), ``masks`` uint8 (N, S, S) of class indices (``IGNORE``: not scored),
    ``classes`` the names of the classes 0..K-1 (a canvas: 0 the background)."""

    name: str
    images: Tensor
    masks: Tensor
    classes: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.masks)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def channels(self) -> int:
        return self.images.shape[1]

    @property
    def image_size(self) -> int:
        return self.images.shape[-1]

    def subset(self, n: int | None, seed: int = 0) -> "DenseSet":
        """A fixed random subset of at most ``n`` images, drawn once with ``seed``, in their order (None: all)."""
        if n is None or n >= len(self):
            return self
        pick = torch.randperm(len(self), generator=torch.Generator().manual_seed(seed))[:n].sort().values
        return DenseSet(self.name, self.images[pick], self.masks[pick], self.classes)
