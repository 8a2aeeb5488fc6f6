"""A joint-embedding method's batch path on the device, from the loader's batch to the step's views: the
``data.decode=device`` decode (one batch ahead), a user's batch collated, the first batch checked and the seeded
augmentation. ``SSLMethod``'s two batch-transfer hooks hand their batch to it; the data module (``runs.data``)
reads its crops and gives it the encoded crops to decode."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from selfsup.data.device_decode import DecodePrefetcher, EncodedBatch, EncodedCrops, decode_batch, upcoming_batch
from selfsup.data.inputs import check_images, collate_batch
from selfsup.data.views import CropGroup, MultiViewAugment
from selfsup.errors import UserError
from selfsup.memory_format import images_in


def check_local_crops(plan: Sequence[CropGroup], patch, default_size: bool) -> None:
    """Every local crop's size divides by the ViT patch ``patch`` (the global ones are at the model size, checked by
    the backbone); ``default_size``: the size is ``augment.local_crops_size``'s default."""
    for group in plan[2:]:
        if isinstance(patch, int) and group.size % patch:
            default = " (its default, 96/224 of the model size)" if default_size else ""
            raise UserError(f"augment.local_crops_size={group.size}{default} is not divisible by the ViT patch "
                            f"model.patch_size={patch}; use a multiple of {patch}, "
                            f"e.g. {max(patch, group.size // patch * patch)}")


class DeviceViews:
    """The views of a view ``plan`` for data of ``info`` (a ``DataInfo``): ``augment`` (the method's
    ``MultiViewAugment``), and the encoded crops to decode (``use_encoded``; None: the batches come decoded)."""

    def __init__(self, plan: Sequence[CropGroup], info):
        self.augment = MultiViewAugment.from_plan(plan, info.image_size, info.mean, info.std)
        self.channels = info.channels
        self.encoded: EncodedCrops | None = None  # data.decode=device: the data module's, to decode each batch
        self.checked = False  # the first training batch is checked (data/inputs.py), no other
        self._prefetch: tuple[EncodedCrops, DecodePrefetcher] | None = None

    def crops(self) -> tuple[list[tuple[float, float]], tuple[int, ...]]:
        """The crops the data pipeline makes at decode time from a whole image (folders, shards): every view of the
        plan, its crop scale range and output size."""
        return [(b.crop_min, b.crop_max) for b in self.augment.branches], self.augment.sizes

    def use_encoded(self, crops: EncodedCrops | None) -> None:
        """``data.decode=device``: the batches are ``crops``' bytes and boxes, decoded by ``decode``; None: not."""
        self.encoded = crops

    def decode(self, batch, trainer, device):
        """An ``EncodedBatch`` decoded and cropped on ``device`` (batch k+1, where the loader holds it, decoded
        ahead on a side stream during step k: ``DecodePrefetcher``); any other batch collated
        (``data.inputs.collate_batch``: a user's list of PIL images or tensors stacked)."""
        if not (isinstance(batch, (tuple, list)) and isinstance(batch[0], EncodedBatch) and self.encoded is not None):
            return collate_batch(batch)
        prefetch = self.prefetcher(device)
        views = prefetch.take(batch[0])
        upcoming = upcoming_batch(trainer)
        if upcoming is not None:
            prefetch.start(upcoming)
        return views, batch[1]

    def prefetcher(self, device) -> DecodePrefetcher:
        """The one-batch-ahead decode of ``encoded`` on ``device`` (made anew when either changes)."""
        crops = self.encoded
        if self._prefetch is None or self._prefetch[0] is not crops or self._prefetch[1].device != torch.device(device):
            self._prefetch = (crops, DecodePrefetcher(lambda b: decode_batch(b, crops, device), device))
        return self._prefetch[1]

    def check(self, images) -> None:
        """The first batch of images checked (dtype, range, channels: ``data.inputs.check_images``), no other."""
        if not self.checked and isinstance(images, Tensor):
            check_images(images, self.channels)
            self.checked = True

    def views(self, batch, generator: Callable[[torch.device], torch.Generator],
              memory_format: torch.memory_format) -> tuple[list[Tensor], Tensor | None]:
        """``(views, labels)`` of a transferred ``batch`` (images, or images and labels): the images checked, then
        augmented with ``generator(device)`` (the step's, seeded) and laid out in ``memory_format``."""
        images, labels = (batch, None) if isinstance(batch, Tensor) else batch
        self.check(images)
        device = (images[0] if isinstance(images, (list, tuple)) else images).device  # decoded runs of sizes
        views = self.augment(images, generator(device))
        if memory_format != torch.contiguous_format:
            views = [images_in(v, memory_format) for v in views]
        return views, labels
