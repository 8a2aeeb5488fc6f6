"""Images checked at the door: what a user's own DataLoader hands a method (``selfsup.method``), checked on the first
batch only, so that a wrong input is one line naming the fix instead of a silent run on garbage or a traceback.

- ``collate_batch``: a batch that is a list of images (PIL images or (C, H, W) tensors, alone or in
  ``(image, label)`` pairs) is stacked into one uint8 / float tensor; images of different sizes are one line. A
  DataLoader left on torch's ``default_collate`` (which refuses PIL images) gets ``pil_collate`` (``adopt_pil_collate``,
  at the start of training).
- ``check_images``: a (B, ``channels``, H, W) tensor of uint8, or float in [0, 1]. A float batch in 0-255 (a
  ``PILToTensor()`` then ``.float()``) or one already normalised (below 0: ``transforms.Normalize``) is refused in one
  line, as is a channel count other than ``channels``. One host read of the float batch's min and max, first batch
  only.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, default_collate

from selfsup.errors import UserError

# a float batch may pass 1 (or 0) by this much (resampling overshoot of a bicubic resize, rounding)
RANGE_SLACK = 1e-3


def _is_pil(x: Any) -> bool:
    return type(x).__module__.startswith("PIL.")


def _image_tensor(x: Any) -> Tensor:
    """One image as a (C, H, W) tensor: a PIL image's uint8 pixels (its own mode's channels), a tensor as it is."""
    if _is_pil(x):
        a = np.asarray(x)
        if a.dtype != np.uint8:
            raise UserError(f"a PIL image of mode {x.mode} is not 8-bit; convert it (img.convert('RGB')) in your "
                            "dataset")
        return torch.from_numpy(a.copy()).unsqueeze(0) if a.ndim == 2 else torch.from_numpy(a.copy()).permute(2, 0, 1)
    if isinstance(x, Tensor):
        return x
    raise UserError(f"a batch holds {type(x).__name__} images; give tensors (transforms.PILToTensor() or ToTensor()) "
                    "or PIL images")


def _stack(images: list) -> Tensor:
    tensors = [_image_tensor(x) for x in images]
    shapes = {tuple(t.shape) for t in tensors}
    if len(shapes) > 1:
        raise UserError(f"the batch's images have different shapes ({', '.join(map(str, sorted(shapes)[:3]))}); "
                        "resize them to one size in your dataset (transforms.Resize((S, S)) or RandomResizedCrop)")
    return torch.stack(tensors)


def collate_batch(batch: Any) -> Any:
    """``batch`` with a list of images stacked into one tensor (labels into a tensor); any other batch as it is.
    Cheap: reads the types of the first element only, unless the batch is such a list."""
    if not isinstance(batch, (list, tuple)) or not batch:
        return batch
    first = batch[0]
    if _is_image(first) and all(_is_image(b) for b in batch):
        return _stack(list(batch))  # images alone
    if isinstance(first, (list, tuple)) and len(first) == 2 and _is_image(first[0]):
        images, labels = zip(*batch)  # (image, label) pairs, not collated
        return _stack(list(images)), torch.as_tensor(labels)
    if isinstance(first, (list, tuple)) and first and _is_image(first[0]):
        return (_stack(list(first)), *batch[1:])  # (list of images, labels)
    return batch  # a collated batch (the pipeline's decode-time views: 5-D runs of crops, not images)


def _is_image(x: Any) -> bool:
    """One image: a PIL image or a (C, H, W) tensor."""
    return _is_pil(x) or (isinstance(x, Tensor) and x.dim() == 3)


def pil_collate(batch: list) -> Any:
    """A DataLoader's collate for a dataset of PIL images (or ``(image, label)`` pairs): stacked by
    ``collate_batch``; any other batch by torch's ``default_collate``."""
    first = batch[0] if batch else None
    if _is_pil(first) or (isinstance(first, (list, tuple)) and first and _is_pil(first[0])):
        return collate_batch(batch)
    return default_collate(batch)


def adopt_pil_collate(loaders: Any) -> None:
    """Each ``DataLoader`` of ``loaders`` (one, or a list / dict of them) that collates with torch's
    ``default_collate``, which refuses PIL images, collates with ``pil_collate`` instead (set before its iterator
    starts, so its workers get it)."""
    items = loaders.values() if isinstance(loaders, dict) else loaders
    items = items if isinstance(items, (list, tuple, type({}.values()))) else [items]
    for loader in items:
        if isinstance(loader, DataLoader) and loader.collate_fn is default_collate:
            loader.collate_fn = pil_collate


def check_images(images: Any, channels: int) -> None:
    """One line naming the fix unless ``images`` is a (B, ``channels``, H, W) uint8 tensor or float in [0, 1]."""
    if not isinstance(images, Tensor):
        raise UserError(f"the batch's images are a {type(images).__name__}; give a tensor (B, {channels}, H, W) of "
                        "uint8 or float in [0, 1]")
    if images.dim() not in (4, 5):  # 5: (B, V, C, S, S), the views selfsup's own loaders crop at decode time
        raise UserError(f"images of shape {tuple(images.shape)}: a batch must be (B, {channels}, H, W)"
                        + ("; add the channel axis (images.unsqueeze(1))" if images.dim() == 3 else ""))
    c = images.shape[-3]
    if c != channels:
        if images.shape[-1] == channels and c not in (1, 3, 4):
            raise UserError(f"images of shape {tuple(images.shape)} are channels-last; give (B, C, H, W) "
                            "(images.permute(0, 3, 1, 2), or transforms.PILToTensor())")
        fix = (f"convert them to RGB in your dataset (img.convert('RGB')) or pass channels={c}" if channels == 3
               else f"pass channels={c}")
        raise UserError(f"images have {c} channel(s) and channels={channels}; {fix}")
    if images.dtype == torch.uint8:
        return
    if not images.is_floating_point():
        raise UserError(f"images are {images.dtype}; give uint8 (0-255) or float in [0, 1]")
    lo, hi = (float(v) for v in torch.aminmax(images.detach().float()))  # the one host read, first batch only
    if lo < -RANGE_SLACK:
        raise UserError(f"images are float in [{lo:.2f}, {hi:.2f}]: selfsup normalises itself; pass uint8 or float in "
                        "[0, 1] (drop transforms.Normalize)")
    if hi > 1 + RANGE_SLACK:
        raise UserError(f"images are float in [{lo:.2f}, {hi:.2f}], not [0, 1]; pass uint8 (drop the .float() after "
                        "PILToTensor) or divide by 255 (transforms.ToTensor() does)")
