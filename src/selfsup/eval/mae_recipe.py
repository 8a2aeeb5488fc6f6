"""The MAE fine-tuning recipe's data side (main_finetune.py), built from timm's own implementations.

Per image, in DataLoader workers: RandomResizedCrop scale (0.08, 1) (bicubic) from the whole image,
horizontal flip, RandAugment ``rand-m9-mstd0.5-inc1``, normalise, random erasing (p 0.25, per-pixel
noise). Per batch: Mixup (α 0.8) / CutMix (α 1.0), switching with probability 0.5, with label
smoothing 0.1 folded into the soft targets, and SoftTargetCrossEntropy. With mixup and cutmix off,
plain cross-entropy with label smoothing. Each option can be turned off (0 or ``none``).
"""

from __future__ import annotations

import torch
from PIL import Image, ImageOps
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from selfsup.data.datasets import FolderImages, ImageDataset
from selfsup.eval_configs import MAERecipe


def _posterize(img, bits_to_keep, **_):
    """timm's posterize, but 0 bits gives a black image (what PIL < 12 did) instead of PIL's ValueError."""
    if bits_to_keep >= 8:
        return img
    if bits_to_keep <= 0:
        return Image.new(img.mode, img.size)
    return ImageOps.posterize(img, bits_to_keep)


def train_transform(size: int, mean, std, recipe: MAERecipe):
    """timm ``create_transform`` with MAE's arguments; one PIL image → normalised (C, size, size) tensor."""
    from timm.data import create_transform  # lazy: timm takes 1.5 s to import

    t = create_transform(input_size=size, is_training=True, auto_augment=recipe.rand_augment,
                         interpolation="bicubic", re_prob=recipe.reprob, re_mode="pixel", re_count=1,
                         mean=tuple(mean), std=tuple(std))
    for op in getattr(t.transforms[2], "ops", []) if recipe.rand_augment else []:
        if op.name.startswith("Posterize"):
            op.aug_fn = _posterize  # RandAugment m9 ± noise reaches level 10 = 0 bits, which PIL >= 12 rejects
    return t


def to_pil(image: Tensor) -> Image.Image:
    """A uint8 (C, H, W) tensor as a PIL image (L or RGB)."""
    array = image.permute(1, 2, 0).numpy()
    return Image.fromarray(array[..., 0] if array.shape[2] == 1 else array, "L" if array.shape[2] == 1 else "RGB")


class RecipeImages(Dataset):
    """Sample i of ``dataset`` through ``transform``: a folder's file is decoded whole (the crop sees the
    full image); an in-memory image goes through PIL as it is."""

    def __init__(self, dataset: ImageDataset, transform):
        self.dataset, self.transform = dataset, transform

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> tuple[Tensor, int]:
        images = self.dataset.images
        if isinstance(images, FolderImages):
            image = images.open(i)
        else:
            image = to_pil(images[i])
        return self.transform(image), int(self.dataset.labels[i])


def train_loader(dataset: ImageDataset, size: int, mean, std, recipe: MAERecipe, batch_size: int,
                 num_workers: int, seed: int):
    """Shuffled, drop-last batches of (normalised images, labels); workers seeded from ``seed``."""
    return DataLoader(RecipeImages(dataset, train_transform(size, mean, std, recipe)), batch_size=batch_size,
                      shuffle=True, drop_last=True, num_workers=num_workers,
                      generator=torch.Generator().manual_seed(seed), persistent_workers=num_workers > 0)


def mixup_fn(recipe: MAERecipe, num_classes: int):
    """timm's Mixup with MAE's settings (batch mode, prob 1), or None when mixup and cutmix are off."""
    if not recipe.mixes:
        return None
    from timm.data import Mixup  # lazy: timm takes 1.5 s to import

    return Mixup(mixup_alpha=recipe.mixup, cutmix_alpha=recipe.cutmix, prob=1.0,
                 switch_prob=recipe.mixup_switch_prob, mode="batch", label_smoothing=recipe.smoothing,
                 num_classes=num_classes)


def soft_target_loss(logits: Tensor, target: Tensor) -> Tensor:
    """timm's SoftTargetCrossEntropy: mean over the batch of −Σ target · log softmax."""
    from timm.loss import SoftTargetCrossEntropy  # lazy: timm takes 1.5 s to import

    return SoftTargetCrossEntropy()(logits, target)
