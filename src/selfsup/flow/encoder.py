"""A flow model as a frozen feature extractor: the (EMA) model's block-k tokens at a small t, average-pooled.

This is what ``selfsup eval knn|linear|rankme`` sees of a flow run (and what the run exports as its
``backbone.safetensors``): images normalised to [−1, 1] (mean = std = 0.5) at the dataset's size are
fitted to the model's input size (resize or pad), noised to level ``t`` with a fixed-seed noise draw
(t = 0: clean), passed with the null class through blocks 1..k, and the tokens averaged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from selfsup.models.sit import SiT

FLOW_ENCODER = "flow_encoder"
FITS = ("resize", "pad")


def fit_images(x: Tensor, size: int, mode: str = "resize", fill: float = -1.0) -> Tensor:
    """(B, C, h, w) → (B, C, size, size): bilinear antialiased resize, or centred padding with ``fill``."""
    h, w = x.shape[-2:]
    if (h, w) == (size, size):
        return x
    if mode == "pad":
        if h > size or w > size:
            raise ValueError(f"cannot pad {h}x{w} images to {size}x{size}; use method.fit=resize")
        top, left = (size - h) // 2, (size - w) // 2
        return F.pad(x, (left, size - w - left, top, size - h - top), value=fill)
    return F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=True)


class FlowEncoder(nn.Module):
    """(B, C, S, S) in [−1, 1] → (B, D): mean of block-``block`` tokens of ``model`` at level ``t``."""

    def __init__(self, model: SiT, block: int, t: float = 0.1, fit: str = "resize", seed: int = 0):
        super().__init__()
        if not 1 <= block <= model.depth:
            raise ValueError(f"feature block {block} is outside the model's depth 1..{model.depth}")
        if not 0 <= t <= 1:
            raise ValueError(f"feature level t={t} must be in [0, 1]")
        self.model, self.block, self.t, self.fit, self.seed = model, block, t, fit, seed
        self.num_features = model.hidden

    @classmethod
    def build(cls, sit: dict, block: int, t: float = 0.1, fit: str = "resize", seed: int = 0) -> "FlowEncoder":
        return cls(SiT(**sit), block, t, fit, seed)

    @property
    def kwargs(self) -> dict:
        return dict(sit=self.model.kwargs, block=self.block, t=self.t, fit=self.fit, seed=self.seed)

    def forward(self, x: Tensor) -> Tensor:
        x = fit_images(x, self.model.input_size, self.fit)
        B = x.shape[0]
        t = torch.full((B,), float(self.t), device=x.device)
        if self.t > 0:  # the same noise for the same batch position, so features are deterministic
            g = torch.Generator(device=x.device).manual_seed(self.seed)
            noise = torch.randn(x.shape, device=x.device, generator=g, dtype=x.dtype)
            x = x + self.t * (noise - x)
        y = torch.full((B,), self.model.num_classes, device=x.device, dtype=torch.long)
        return self.model.block_tokens(x, t, y, self.block).mean(dim=1)
