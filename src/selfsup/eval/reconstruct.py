"""What an MAE learned, as image rows: four rows over the same images (as the official demo's panels): the
originals, the masked inputs (removed patches grey), the reconstructions, and the reconstructions with the
visible patches pasted back; the mask is drawn from a seed. The model is a parameter (an MAE method in eval
mode); opening a run folder is ``runs.reconstruct``, the command ``selfsup eval reconstruct`` is
``commands.reconstruct``.
"""

from __future__ import annotations

from pathlib import Path

import torch
from PIL import Image
from torch import Tensor
from torchvision.utils import make_grid

from selfsup.data.views import EvalTransform
from selfsup.eval_configs import ReconstructConfig as ReconstructConfig  # the config, declared without torch
from selfsup.models.mae import unpatchify


def _to_unit(x: Tensor, mean, std) -> Tensor:
    """Normalised images back to [0, 1]."""
    m = torch.tensor(mean, dtype=x.dtype).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=x.dtype).view(1, -1, 1, 1)
    return (x * s + m).clamp(0, 1)


def reconstruction_rows(model, images: Tensor, seed: int) -> tuple[Tensor, float]:
    """uint8 (4·N, C, H, W): originals, masked inputs, reconstructions, reconstructions + visible patches;
    and the masked-patch loss of these images (the training objective)."""
    info = model.info
    x = EvalTransform(info.image_size, info.mean, info.std)(images)
    noise = torch.rand(len(x), model.num_patches, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        loss = float(model.forward_mae(x, noise)[0])
        recon, mask = model.reconstruct(x, noise)
    p, c = model.backbone.patch_size, x.shape[1]
    removed = unpatchify(mask[..., None].expand(-1, -1, p * p * c), p, c).bool()  # (N, C, H, W)
    original = _to_unit(x, info.mean, info.std)
    recon = _to_unit(recon, info.mean, info.std)
    rows = [original, torch.where(removed, 0.5, original), recon, torch.where(removed, recon, original)]
    return (torch.cat(rows) * 255).round().to(torch.uint8), loss


def save_rows(images: Tensor, per_row: int, path: Path, scale: int) -> Path:
    """A PNG of ``images`` in rows of ``per_row``, each image enlarged ``scale`` times (nearest)."""
    big = images.repeat_interleave(scale, dim=-2).repeat_interleave(scale, dim=-1)
    grid = make_grid(big, nrow=per_row, padding=2, pad_value=255).permute(1, 2, 0).numpy()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    Image.fromarray(grid[..., 0] if images.shape[1] == 1 else grid[..., :3]).save(tmp, format="PNG")
    tmp.replace(path)
    return path
