"""A user's segmentation folder for ``selfsup eval segment --task folder --root DIR``: ``DIR/images/`` and
``DIR/masks/`` (or ``DIR/train/`` and ``DIR/val/`` | ``DIR/test/``, each with both), every image with a mask of the
same stem: a single-channel PNG label map (mode L or P) of class indices, 255 = ignore, of the image's size.

Everything is checked before anything is scored, each problem said in one line (``UserError``). Images are read as
the backbone's channels (PIL's L or RGB) and resized to ``size`` × ``size`` (bilinear), masks with the nearest label
(no new label is made up between two); the classes are 0..the largest label found. Without train/ and val/ the test
split is a seeded 20% of the images (at least one).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from selfsup.data.datasets import HELD_OUT, TEST_FOLDERS, image_files
from selfsup.data.dense import IGNORE, DenseSet
from selfsup.errors import UserError

LABEL_MODES = ("L", "P")  # single-channel 8-bit label maps
LAYOUT = "a folder with images/ and masks/ (PNG label maps of the same stems, 255 = ignore)"


def _pairs(folder: Path) -> list[tuple[Path, Path]]:
    """(image, mask) of every image of ``folder/images``, checked: both folders, at least one image, a mask each."""
    images, masks = folder / "images", folder / "masks"
    for need in (images, masks):
        if not need.is_dir():
            raise UserError(f"{folder} has no {need.name}/ folder; --task folder reads {LAYOUT}")
    files = image_files(images)
    if not files:
        raise UserError(f"{images} holds no image files; --task folder reads {LAYOUT}")
    pairs = [(f, masks / f.relative_to(images).with_suffix(".png")) for f in files]
    missing = [m for _, m in pairs if not m.is_file()]
    if missing:
        raise UserError(f"{missing[0]} is missing ({len(missing)} of {len(pairs)} images have no mask): each image "
                        "needs a PNG label map of the same stem in masks/")
    return pairs


def _mask(path: Path, image_size: tuple[int, int], size: int) -> np.ndarray:
    try:
        with Image.open(path) as m:
            m.load()
    except Exception as e:  # PIL's many errors of a file that is not an image
        raise UserError(f"{path} is not a readable PNG ({type(e).__name__}); replace it") from None
    if m.mode not in LABEL_MODES:
        raise UserError(f"{path} is a {m.mode} image; a mask is a single-channel PNG (mode L or P) of class "
                        f"indices, {IGNORE} = ignore")
    if m.size != image_size:
        raise UserError(f"{path} is {m.size[0]}x{m.size[1]} but its image is {image_size[0]}x{image_size[1]}; "
                        "a mask labels every pixel of its image")
    return np.asarray(m.resize((size, size), Image.NEAREST), dtype=np.uint8)


def _image(path: Path, channels: int, size: int) -> tuple[np.ndarray, tuple[int, int]]:
    try:
        with Image.open(path) as im:
            im = im.convert("L" if channels == 1 else "RGB")
    except Exception as e:
        raise UserError(f"{path} is not a readable image ({type(e).__name__}); replace or remove it") from None
    array = np.asarray(im.resize((size, size), Image.BILINEAR), dtype=np.uint8)
    return (array[None] if channels == 1 else array.transpose(2, 0, 1)), im.size


def _read(pairs, channels: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    images, masks = [], []
    for image_path, mask_path in pairs:
        image, original = _image(image_path, channels, size)
        images.append(image)
        masks.append(_mask(mask_path, original, size))
    return torch.from_numpy(np.stack(images)), torch.from_numpy(np.stack(masks))


def folder_task(root: str | None, channels: int, size: int, seed: int = 0) -> tuple[DenseSet, DenseSet]:
    """(train, test) of a segmentation folder (the module's layout), images of ``channels`` at ``size`` px."""
    if not root:
        raise UserError(f"--task folder needs --root DIR: {LAYOUT}")
    base = Path(root)
    if not base.is_dir():
        raise UserError(f"--root {root} is not a folder; --task folder reads {LAYOUT}")
    test_dir = next((base / n for n in TEST_FOLDERS if (base / n / "images").is_dir()), None)
    if (base / "train" / "images").is_dir() and test_dir is not None:
        train_pairs, test_pairs = _pairs(base / "train"), _pairs(test_dir)
    else:
        pairs = _pairs(base)
        if len(pairs) < 2:
            raise UserError(f"{base / 'images'} holds {len(pairs)} image: the test split needs one more")
        n_test = max(1, round(HELD_OUT * len(pairs)))
        test = set(torch.randperm(len(pairs), generator=torch.Generator().manual_seed(seed))[:n_test].tolist())
        train_pairs = [p for i, p in enumerate(pairs) if i not in test]
        test_pairs = [p for i, p in enumerate(pairs) if i in test]
    (xtr, mtr), (xte, mte) = _read(train_pairs, channels, size), _read(test_pairs, channels, size)
    labels = torch.cat([mtr.flatten(), mte.flatten()])
    labels = labels[labels != IGNORE]
    if not len(labels):
        raise UserError(f"every mask pixel under {base} is {IGNORE} (ignore): nothing to score")
    classes = tuple(str(c) for c in range(int(labels.max()) + 1))
    return DenseSet("folder", xtr, mtr, classes), DenseSet("folder", xte, mte, classes)
