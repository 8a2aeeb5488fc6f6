"""Batched, per-sample random augmentation of image tensors on the training device.

Replaces per-image PIL pipelines in worker processes: every op works on a whole
(B, C, H, W) float batch at once, each sample drawing its own parameters, and all
randomness comes from the ``torch.Generator`` passed in, so a given (generator
state, input) always produces the same views (used for exact resume).

Reproduced recipe (MoCo v3 / BYOL / SimSiam / SimCLR), in order: RandomResizedCrop
+ horizontal flip, ColorJitter (random op order), RandomGrayscale, GaussianBlur,
Solarize, Normalize. A view plan (``CropGroup``s) gives any number of crops in groups, each with its own
recipe, crop scale and output size (DINO's multi-crop: two global crops + N smaller local crops).
Known, deliberate differences from the PIL/torchvision pipeline:
crop and resize are one bilinear ``grid_sample`` without antialiasing; ColorJitter
uses one random op order per batch rather than per image; pixels stay float (no
8-bit rounding between ops).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from selfsup.errors import UserError

__all__ = [
    "AugmentConfig", "CropGroup", "recipe_branches", "local_recipe", "build_view_plan", "MultiViewAugment",
    "EvalTransform", "sample_crop_boxes", "resized_crop_flip", "adjust_brightness", "adjust_contrast",
    "adjust_saturation", "adjust_hue", "rgb_to_grayscale", "random_grayscale",
    "blur_kernel_size", "gaussian_blur", "solarize",
]

_LUMA = (0.299, 0.587, 0.114)  # ITU-R 601-2, as PIL's convert("L"); torchvision uses 0.2989 for R


@dataclass
class AugmentConfig:
    """One augmentation branch (the official MoCo v3 / BYOL augmentation, as parameters)."""
    crop_min: float = 0.08      # RandomResizedCrop scale=(crop_min, crop_max) of the area
    crop_max: float = 1.0
    hflip_p: float = 0.5
    jitter_p: float = 0.8       # ColorJitter(brightness, contrast, saturation, hue) applied with prob jitter_p
    brightness: float = 0.4
    contrast: float = 0.4
    saturation: float = 0.2
    hue: float = 0.1
    grayscale_p: float = 0.2
    blur_p: float = 1.0         # GaussianBlur with sigma ~ U(blur_sigma_min, blur_sigma_max), given for 224-px images
    blur_sigma_min: float = 0.1
    blur_sigma_max: float = 2.0
    solarize_p: float = 0.0     # PIL ImageOps.solarize(threshold=128): pixels >= 128/255 become 1 - x


_RECIPES = ("moco_v3", "moco_v2", "byol", "simsiam", "simclr", "dino", "mae", "ijepa", "lejepa", "distillation")


def recipe_branches(recipe: str) -> tuple[AugmentConfig, ...]:
    """The augmentation branches (global crops) of an official recipe (a preset may override fields): two; MAE's and
    distillation's one."""
    if recipe == "dino":  # DINO main_dino.py DataAugmentationDINO: global 1 blur 1.0; global 2 blur 0.1 + solarize 0.2
        base = AugmentConfig(crop_min=0.4, brightness=0.4, contrast=0.4, saturation=0.2, hue=0.1)
        return replace(base, blur_p=1.0, solarize_p=0.0), replace(base, blur_p=0.1, solarize_p=0.2)
    if recipe == "mae":  # main_pretrain.py:123-127: RandomResizedCrop scale (0.2, 1) + flip, nothing else
        return (AugmentConfig(crop_min=0.2, jitter_p=0.0, grayscale_p=0.0, blur_p=0.0, solarize_p=0.0),)
    if recipe == "ijepa":  # ijepa src/transforms.py:41-50 with the configs' use_*: false: the crop (0.3, 1), no more
        return (AugmentConfig(crop_min=0.3, hflip_p=0.0, jitter_p=0.0, grayscale_p=0.0, blur_p=0.0, solarize_p=0.0),)
    if recipe == "lejepa":  # lejepa README.md:53-66: two global views, flip, jitter (0.4, 0.4, 0.2, 0.1) p 0.8,
        # grayscale 0.2, blur 0.5, solarize 0.2, the crop (0.3, 1)
        base = AugmentConfig(crop_min=0.3, brightness=0.4, contrast=0.4, saturation=0.2, hue=0.1, blur_p=0.5,
                             solarize_p=0.2)
        return base, replace(base)
    if recipe == "distillation":  # LightlyTrain's distillation_transform.py:37-73: one view, crop scale (0.14, 1),
        # flip, jitter p 0.8 at strength 0.5 (0.8, 0.8, 0.4, 0.2 × 0.5), grayscale 0.2, no solarisation; its blur
        # (p 1, sigma in (0, 0.1), blur_limit 0) leaves the image as it is: none here
        return (AugmentConfig(crop_min=0.14, brightness=0.4, contrast=0.4, saturation=0.2, hue=0.1, jitter_p=0.8,
                              grayscale_p=0.2, blur_p=0.0, solarize_p=0.0),)
    if recipe in ("moco_v3", "byol"):
        base = AugmentConfig(crop_min=0.08, brightness=0.4, contrast=0.4, saturation=0.2, hue=0.1)
        return replace(base, blur_p=1.0, solarize_p=0.0), replace(base, blur_p=0.1, solarize_p=0.2)
    if recipe in ("simsiam", "moco_v2"):  # moco main_moco.py:326-338 (--aug-plus), SimSiam's the same: crop (0.2, 1),
        # jitter (0.4, 0.4, 0.4, 0.1) p 0.8, grayscale 0.2, blur sigma (0.1, 2) p 0.5, flip; both views alike
        base = AugmentConfig(crop_min=0.2, brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1, blur_p=0.5)
        return base, replace(base)
    if recipe == "simclr":  # colour-jitter strength s = 1.0 -> (0.8 s, 0.8 s, 0.8 s, 0.2 s)
        base = AugmentConfig(crop_min=0.08, brightness=0.8, contrast=0.8, saturation=0.8, hue=0.2, blur_p=0.5)
        return base, replace(base)
    raise ValueError(f"unknown augmentation recipe {recipe!r}; known recipes: {', '.join(_RECIPES)}")


def local_recipe(recipe: str) -> AugmentConfig:
    """The local crops' augmentation of a recipe: DINO's (scale (0.05, 0.4), blur p=0.5, no solarisation;
    main_dino.py:455-463); for the two-branch recipes (SwAV-style multi-crop, an option) their first branch
    with blur p=0.5 and no solarisation at the same small scale."""
    first = recipe_branches(recipe)[0]
    if recipe == "lejepa":  # README.md:56-63: the local views keep every transform of the global ones
        return replace(first, crop_min=0.05, crop_max=0.3)
    return replace(first, crop_min=0.05, crop_max=0.4, blur_p=0.5, solarize_p=0.0)


@dataclass(frozen=True)
class CropGroup:
    """``count`` crops of one augmentation recipe at one output size; a view plan is a sequence of them,
    crops in plan order (DINO: global crop 1, global crop 2, then the local crops)."""

    augment: AugmentConfig
    size: int
    count: int = 1


def build_view_plan(section, default_recipe: str, image_size: int) -> list[CropGroup]:
    """The view plan of a config's ``augment`` section (selfsup.config.AugmentSection): the recipe's two
    branches as global crops at the model size (``global_crops_scale``, the shared and the per-branch
    overrides applied), then ``local_crops_number`` local crops of ``local_crops_size`` (None: 96/224 of the
    model size, DINO's ratio) with ``local_crops_scale`` and the ``local`` overrides. Raises UserError."""
    a = section
    recipe = a.recipe or default_recipe
    try:
        branches = list(recipe_branches(recipe))
    except ValueError as e:
        raise UserError(f"augment.recipe: {e}") from None
    shared = {k: getattr(a, k) for k in ("crop_min", "hflip_p", "jitter_p", "grayscale_p", "blur_p", "solarize_p")
              if getattr(a, k) is not None}
    scale = getattr(a, "global_crops_scale", None)
    if scale is not None:
        if a.crop_min is not None and float(a.crop_min) != float(scale[0]):
            # both name the global crops' lower scale; neither may silently win
            raise UserError(f"augment.crop_min={a.crop_min} and augment.global_crops_scale={list(scale)} both set the "
                            f"global crops' scale; set one: augment.global_crops_scale=[{a.crop_min}, {scale[1]}]")
        shared.update(crop_min=float(scale[0]), crop_max=float(scale[1]))
    fields = set(AugmentConfig.__dataclass_fields__)

    def make(base: AugmentConfig, extra: dict, key: str, common: dict, scale_key: str | None = None) -> AugmentConfig:
        unknown = set(extra) - fields
        if unknown:
            raise UserError(f"unknown config key 'augment.{key}.{sorted(unknown)[0]}'; "
                            f"valid: {', '.join(sorted(fields))}")
        cfg = AugmentConfig(**{**base.__dict__, **common, **extra})
        if not 0 < cfg.crop_min <= cfg.crop_max <= 1:
            # the key the user typed: a per-branch override, else the section's scale, else crop_min
            typed = next((f"augment.{key}.{k}" for k in ("crop_min", "crop_max") if k in extra and key != "local"),
                         None) or scale_key or ("augment.crop_min" if a.crop_min is not None else f"augment.{key}")
            raise UserError(f"{typed}: crop scale ({cfg.crop_min}, {cfg.crop_max}) must satisfy "
                            "0 < min <= max <= 1, e.g. [0.4, 1.0] (min first)")
        return cfg

    global_key = f"augment.global_crops_scale={list(scale)}" if scale is not None else None
    plan = [CropGroup(make(b, extra, f"branch{i}", shared, global_key), int(image_size))
            for i, (b, extra) in enumerate(zip(branches, (a.branch1, a.branch2)), start=1)]
    n_local = getattr(a, "local_crops_number", 0)
    if n_local < 0:
        raise UserError(f"augment.local_crops_number={n_local} must be >= 0 (0: no local crops)")
    if n_local:
        size = a.local_crops_size or max(1, int(round(image_size * 96 / 224)))
        if not 1 <= size <= image_size:
            raise UserError(f"augment.local_crops_size={size} must be in [1, the model size {image_size}]")
        lo, hi = a.local_crops_scale
        local_shared = {k: v for k, v in shared.items() if k not in ("crop_min", "crop_max", "blur_p", "solarize_p")}
        local_key = ("augment.local" if {"crop_min", "crop_max"} & set(a.local)
                     else f"augment.local_crops_scale={list(a.local_crops_scale)}")
        local = make(local_recipe(recipe), {"crop_min": float(lo), "crop_max": float(hi), **a.local},
                     "local", local_shared, local_key)
        plan.append(CropGroup(local, int(size), int(n_local)))
    return plan


# ----------------------------------------------------------------------------- ops

def _per_sample(v: Tensor) -> Tensor:
    return v.view(-1, 1, 1, 1)


def _uniform(lo: float, hi: float, shape: tuple[int, ...], g: torch.Generator, device) -> Tensor:
    return torch.rand(shape, generator=g, device=device) * (hi - lo) + lo


def sample_crop_boxes(n: int, height: int, width: int, scale: tuple[float, float],
                      generator: torch.Generator, device=None,
                      ratio: tuple[float, float] = (3 / 4, 4 / 3), tries: int = 10
                      ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """torchvision RandomResizedCrop.get_params for n samples at once: (top, left, h, w) in whole pixels."""
    area = _uniform(scale[0], scale[1], (n, tries), generator, device) * (height * width)
    aspect = torch.exp(_uniform(math.log(ratio[0]), math.log(ratio[1]), (n, tries), generator, device))
    w = torch.round(torch.sqrt(area * aspect))
    h = torch.round(torch.sqrt(area / aspect))
    ok = (w >= 1) & (w <= width) & (h >= 1) & (h <= height)
    first = ok.to(torch.int32).argmax(dim=1, keepdim=True)  # first accepted try (argmax picks the first max)
    w, h = w.gather(1, first).squeeze(1), h.gather(1, first).squeeze(1)
    u = torch.rand((n, 2), generator=generator, device=device)
    top = torch.minimum(torch.floor(u[:, 0] * (height - h + 1)), height - h)
    left = torch.minimum(torch.floor(u[:, 1] * (width - w + 1)), width - w)
    # No try accepted: central crop with the aspect ratio clamped to the range.
    if width / height < min(ratio):
        fw, fh = width, round(width / min(ratio))
    elif width / height > max(ratio):
        fw, fh = round(height * max(ratio)), height
    else:
        fw, fh = width, height
    found = ok.any(dim=1)
    return (torch.where(found, top, float((height - fh) // 2)), torch.where(found, left, float((width - fw) // 2)),
            torch.where(found, h, float(fh)), torch.where(found, w, float(fw)))


def resized_crop_flip(x: Tensor, top: Tensor, left: Tensor, h: Tensor, w: Tensor, flip: Tensor,
                      size: int) -> Tensor:
    """RandomResizedCrop's crop + bilinear resize (no antialias) and RandomHorizontalFlip, one grid_sample."""
    b, c, height, width = x.shape
    theta = x.new_zeros(b, 2, 3)
    sx = (w / width).to(x.dtype)
    theta[:, 0, 0] = torch.where(flip, -sx, sx)   # flipping = reading the crop right to left
    theta[:, 0, 2] = (2 * left + w) / width - 1   # crop centre in normalised [-1, 1] coordinates
    theta[:, 1, 1] = h / height
    theta[:, 1, 2] = (2 * top + h) / height - 1
    grid = F.affine_grid(theta, [b, c, size, size], align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)


def rgb_to_grayscale(x: Tensor) -> Tensor:
    """Luma 0.299 R + 0.587 G + 0.114 B (PIL convert("L")), as (B, 1, H, W)."""
    return x[:, 0:1] * _LUMA[0] + x[:, 1:2] * _LUMA[1] + x[:, 2:3] * _LUMA[2]


def _blend(a: Tensor, b: Tensor, factor: Tensor) -> Tensor:
    f = _per_sample(factor)
    return (f * a + (1 - f) * b).clamp_(0, 1)


def adjust_brightness(x: Tensor, factor: Tensor) -> Tensor:
    """torchvision adjust_brightness: x * factor, clamped to [0, 1]; factor is per sample (B,)."""
    return (x * _per_sample(factor)).clamp_(0, 1)


def adjust_contrast(x: Tensor, factor: Tensor) -> Tensor:
    """torchvision adjust_contrast: blend with the per-image mean of its grayscale, clamped."""
    gray = rgb_to_grayscale(x) if x.shape[1] == 3 else x
    return _blend(x, gray.mean(dim=(1, 2, 3), keepdim=True), factor)


def adjust_saturation(x: Tensor, factor: Tensor) -> Tensor:
    """torchvision adjust_saturation: blend with the grayscale image, clamped (no-op for 1 channel)."""
    return _blend(x, rgb_to_grayscale(x), factor) if x.shape[1] == 3 else x


def adjust_hue(x: Tensor, shift: Tensor) -> Tensor:
    """torchvision adjust_hue: rotate the HSV hue by shift turns (per sample), keeping S and V."""
    if x.shape[1] != 3:
        return x
    minc, maxc = torch.aminmax(x, dim=1, keepdim=True)
    chroma = maxc - minc
    safe = torch.where(chroma > 0, chroma, torch.ones_like(chroma))
    r, g, b = x[:, 0:1], x[:, 1:2], x[:, 2:3]
    hue6 = torch.where(maxc == r, (g - b) / safe,  # hue in sixths of a turn (any branch agrees on ties)
                       torch.where(maxc == g, (b - r) / safe + 2, (r - g) / safe + 4))
    hue6 = hue6 + 6 * _per_sample(shift)
    # HSV -> RGB: channel n in (R, G, B) = (5, 3, 1) is V - C * clamp(min(k, 4 - k), 0, 1), k = (n + H6) mod 6.
    k = torch.remainder(x.new_tensor([5.0, 3.0, 1.0]).view(1, 3, 1, 1) + hue6, 6)
    return maxc - chroma * torch.minimum(k, 4 - k).clamp_(0, 1)


def random_grayscale(x: Tensor, apply: Tensor) -> Tensor:
    """RandomGrayscale: the luma replicated to 3 channels where apply (B,) is true."""
    if x.shape[1] != 3:
        return x
    return torch.where(_per_sample(apply), rgb_to_grayscale(x).expand_as(x), x)


def blur_kernel_size(image_size: int) -> int:
    """Odd Gaussian kernel about 10% of the image side (23 at 224 px, as BYOL / SimCLR), at least 3."""
    return max(3, 2 * round(0.05 * image_size) + 1)


def gaussian_blur(x: Tensor, sigma: Tensor, kernel_size: int) -> Tensor:
    """torchvision gaussian_blur (reflect padding) with per-sample sigma (B,); sigma 0 leaves a sample as is."""
    b, c, height, width = x.shape
    pad = kernel_size // 2
    t = torch.arange(kernel_size, device=x.device, dtype=x.dtype) - pad
    # A tiny sigma underflows every tap but the centre to exactly 0: the identity kernel.
    kern = torch.exp(-0.5 * (t / sigma.to(x.dtype).clamp_min(1e-3)[:, None]) ** 2)
    kern = (kern / kern.sum(dim=1, keepdim=True)).repeat_interleave(c, dim=0)  # (B*C, k)
    y = F.pad(x.reshape(1, b * c, height, width), (pad, pad, pad, pad), mode="reflect")
    y = F.conv2d(y, kern.view(b * c, 1, kernel_size, 1), groups=b * c)
    y = F.conv2d(y, kern.view(b * c, 1, 1, kernel_size), groups=b * c)
    return y.view(b, c, height, width)


def solarize(x: Tensor, apply: Tensor, threshold: float = 0.5) -> Tensor:
    """Solarize: x -> 1 - x where x >= threshold (on 8-bit values, PIL's threshold=128) and apply (B,)."""
    return torch.where(_per_sample(apply) & (x >= threshold), 1 - x, x)


# ------------------------------------------------------------------------ modules

def _to_float(images: Tensor) -> Tensor:
    if images.dtype == torch.uint8:
        return images.float().div_(255)
    if not images.is_floating_point():
        raise TypeError(f"images must be uint8 or floating point, got {images.dtype}")
    return images.float()


class _Normalizing(torch.nn.Module):
    def __init__(self, image_size: int, mean: Sequence[float], std: Sequence[float]):
        super().__init__()
        if len(mean) != len(std):
            raise ValueError(f"mean has {len(mean)} values but std has {len(std)}")
        self.image_size = int(image_size)
        self.register_buffer("mean", torch.tensor(list(mean), dtype=torch.float32).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(list(std), dtype=torch.float32).view(1, -1, 1, 1), persistent=False)

    def _check(self, images: Tensor) -> None:
        if images.dim() != 4:
            raise ValueError(f"images must be (B, C, H, W), got shape {tuple(images.shape)}")
        n, c = self.mean.shape[1], images.shape[1]
        if n != c:
            raise ValueError(f"normalisation statistics have {n} channels but the images have {c} channels; "
                             f"set the dataset's mean/std for {c} channels")

    def _normalize(self, x: Tensor) -> Tensor:
        return (x - self.mean.to(x.device)).div_(self.std.to(x.device))


class MultiViewAugment(_Normalizing):
    """Random views of a (B, C, H, W) batch: one per branch, or every crop of a view plan (``from_plan``);
    per-sample parameters, all randomness from ``generator``.

    ``branches`` are the views' recipes in order and ``sizes`` their output sizes (default: all ``image_size``,
    the model size). Consecutive views of one ``CropGroup`` are drawn together, as one batch of count × B
    samples (one draw of each parameter), so a plan of two one-crop branches draws exactly what the two-branch
    augmentation always drew. Blur sigma and kernel follow the model size for every crop, as the official
    recipes blur a 96-px local crop with the same radius range as a 224-px global one.

    ColorJitter applies brightness, contrast, saturation and hue in a random order, as torchvision, but the
    order is drawn ONCE PER GROUP (one permutation from the generator) instead of per image, which keeps the
    op vectorised; each sample still draws its own factors and whether it is jittered at all.
    """

    def __init__(self, branches: Sequence[AugmentConfig], image_size: int,
                 mean: Sequence[float], std: Sequence[float], sizes: Sequence[int] | None = None,
                 counts: Sequence[int] | None = None):
        super().__init__(image_size, mean, std)
        if not branches:
            raise ValueError("MultiViewAugment needs at least one branch")
        counts = list(counts) if counts is not None else [1] * len(branches)
        sizes = [int(s) for s in sizes] if sizes is not None else [self.image_size] * len(branches)
        if len(sizes) != len(branches) or len(counts) != len(branches):
            raise ValueError(f"{len(branches)} recipes for {len(sizes)} sizes and {len(counts)} counts")
        self.groups: tuple[tuple[AugmentConfig, int, int, int], ...] = ()  # (recipe, size, count, first view)
        first = 0
        for cfg, size, count in zip(branches, sizes, counts):
            self.groups += ((cfg, size, int(count), first),)
            first += int(count)
        self.branches = tuple(cfg for cfg, _, count, _ in self.groups for _ in range(count))  # per view
        self.sizes = tuple(size for _, size, count, _ in self.groups for _ in range(count))
        self.kernel_size = blur_kernel_size(self.image_size)

    @classmethod
    def from_plan(cls, plan: Sequence[CropGroup], image_size: int, mean: Sequence[float],
                  std: Sequence[float]) -> "MultiViewAugment":
        return cls([g.augment for g in plan], image_size, mean, std, sizes=[g.size for g in plan],
                   counts=[g.count for g in plan])

    @torch.no_grad()
    def forward(self, images, generator: torch.Generator) -> list[Tensor]:
        """``images`` (B, C, H, W): each view crops its own region; (B, V, C, S, S), or a sequence of such
        tensors, one per run of equal sizes: view v was already cropped at decode time
        (``data.decode.FolderCrops``) for view v of the plan, which then only flips it."""
        if isinstance(images, (list, tuple)) or images.dim() == 5:
            parts = list(images) if isinstance(images, (list, tuple)) else [images]
            decoded = [t[:, j] for t in parts for j in range(t.shape[1])]
            if len(decoded) != len(self.branches):
                raise ValueError(f"{len(decoded)} decoded views for {len(self.branches)} views of the plan")
            for v, size in zip(decoded, self.sizes):
                if tuple(v.shape[-2:]) != (size, size):
                    raise ValueError(f"a decoded view of shape {tuple(v.shape)} for a {size}-pixel crop")
            self._check(decoded[0])
            out = []
            for cfg, size, count, first in self.groups:
                # contiguous: the workers write views channels-last (data.decode.ViewBatch); the ops below then
                # run on the layout (and so the sums) of a stacked batch
                x = torch.cat([_to_float(v) for v in decoded[first:first + count]]).contiguous()
                out += self._view(x, cfg, generator, first, size, count, cropped=True)
            return out
        self._check(images)
        x = _to_float(images)
        out = []
        for cfg, size, count, first in self.groups:
            out += self._view(x, cfg, generator, first, size, count)
        return out

    def _view(self, x: Tensor, cfg: AugmentConfig, g: torch.Generator, branch: int, size: int, count: int = 1,
              cropped: bool = False) -> list[Tensor]:
        """``count`` views of the batch ``x`` (B samples; when ``cropped``, the count × B decoded crops)."""
        b = x.shape[0] // count if cropped else x.shape[0]
        n, height, width = b * count, x.shape[-2], x.shape[-1]
        dev = x.device
        # Every parameter is drawn whatever the probabilities, in a fixed order, so the generator's stream
        # is consumed the same way by every config; ops whose probability is 0 are then skipped.

        def coin(p: float) -> Tensor:
            return torch.rand(n, generator=g, device=dev) < p

        def factor(strength: float) -> Tensor:  # ColorJitter: U(max(0, 1 - s), 1 + s)
            return _uniform(max(0.0, 1 - strength), 1 + strength, (n,), g, dev)

        top, left, h, w = sample_crop_boxes(n, height, width, (cfg.crop_min, cfg.crop_max), g, dev)
        flip = coin(cfg.hflip_p)
        if cropped:  # the decode-time crop is the view: flip only, no second crop
            x = torch.where(flip.view(-1, 1, 1, 1), x.flip(-1), x)
        elif count == 1:
            x = resized_crop_flip(x, top, left, h, w, flip, size)
        else:  # the group's crops of the same images, one grid_sample each
            x = torch.cat([resized_crop_flip(x, *(t[j * b:(j + 1) * b] for t in (top, left, h, w, flip)), size)
                           for j in range(count)])

        jitter = coin(cfg.jitter_p)
        jitter_ops = (  # (op, strength, per-sample factor, neutral factor for samples without jitter)
            (adjust_brightness, cfg.brightness, factor(cfg.brightness), 1.0),
            (adjust_contrast, cfg.contrast, factor(cfg.contrast), 1.0),
            (adjust_saturation, cfg.saturation, factor(cfg.saturation), 1.0),
            (adjust_hue, cfg.hue, _uniform(-cfg.hue, cfg.hue, (n,), g, dev), 0.0),
        )
        # One op order for the group, drawn on the host from the generator's seed and the group's first view
        # index, so that no device→host copy (a GPU sync) is needed.
        seed = (g.initial_seed() * 8 + branch) % 2**63 if branch < 8 else hash((g.initial_seed(), branch)) % 2**63
        order = torch.randperm(4, generator=torch.Generator().manual_seed(seed)).tolist()
        if cfg.jitter_p > 0:
            for op, strength, value, neutral in (jitter_ops[i] for i in order):
                if strength > 0:  # torchvision skips an op whose strength is 0
                    x = op(x, torch.where(jitter, value, neutral))

        gray = coin(cfg.grayscale_p)
        if cfg.grayscale_p > 0:
            x = random_grayscale(x, gray)

        blur = coin(cfg.blur_p)
        sigma = _uniform(cfg.blur_sigma_min, cfg.blur_sigma_max, (n,), g, dev) * (self.image_size / 224)
        if cfg.blur_p > 0:  # reflect padding needs the kernel's half-width below the crop size
            x = gaussian_blur(x, torch.where(blur, sigma, 0.0), min(self.kernel_size, 2 * size - 1))

        sol = coin(cfg.solarize_p)
        if cfg.solarize_p > 0:
            x = solarize(x, sol)
        return list(self._normalize(x).split(b)) if count > 1 else [self._normalize(x)]


class EvalTransform(_Normalizing):
    """Deterministic evaluation transform: bilinear antialiased resize to image_size (if needed), normalise."""

    @torch.no_grad()
    def forward(self, images: Tensor) -> Tensor:
        self._check(images)
        x = _to_float(images)
        if tuple(x.shape[-2:]) != (self.image_size, self.image_size):
            x = F.interpolate(x, size=(self.image_size, self.image_size), mode="bilinear",
                              align_corners=False, antialias=True)
        return self._normalize(x)
