"""The linear flow-matching path (SiT / Self-Flow convention): ``x_t = (1 − t)·x_0 + t·ε``, t = 1 is noise.

The velocity target is ``dx_t/dt = ε − x_0``. Timesteps are drawn uniform on [0, 1] or logit-normal
(``sigmoid(N(m, s²))``, SD3's choice); both are pure functions of a generator.
"""

from __future__ import annotations

import torch
from torch import Tensor

T_SAMPLINGS = ("uniform", "logit_normal")


def sample_t(n: int, sampling: str = "uniform", mean: float = 0.0, std: float = 1.0, *,
             device=None, generator: torch.Generator | None = None) -> Tensor:
    """``n`` timesteps in [0, 1]: uniform, or ``sigmoid(mean + std·N(0, 1))`` (logit-normal)."""
    if sampling == "uniform":
        return torch.rand(n, device=device, generator=generator)
    if sampling == "logit_normal":
        return torch.sigmoid(mean + std * torch.randn(n, device=device, generator=generator))
    raise ValueError(f"timestep sampling {sampling!r} is not known; use one of {', '.join(T_SAMPLINGS)}")


def expand_levels(t: Tensor, x: Tensor, patch_size: int) -> Tensor:
    """Noise levels broadcastable to ``x`` (B, C, H, W): (B,) → (B, 1, 1, 1); per token (B, N) → (B, 1, H, W)
    with each token's level on its p×p patch (tokens in row-major grid order)."""
    if t.ndim == 1:
        return t.view(-1, 1, 1, 1)
    B, g = t.shape[0], x.shape[-1] // patch_size
    return (t.view(B, 1, g, 1, g, 1).expand(B, 1, g, patch_size, g, patch_size)
            .reshape(B, 1, g * patch_size, g * patch_size))


def interpolate(x0: Tensor, noise: Tensor, t: Tensor, patch_size: int = 1) -> Tensor:
    """``x_t = (1 − t)·x_0 + t·ε`` with t per sample (B,) or per token (B, N)."""
    t = expand_levels(t, x0, patch_size).to(x0.dtype)
    return x0 + t * (noise - x0)


def velocity_target(x0: Tensor, noise: Tensor) -> Tensor:
    """The linear path's velocity ``ε − x_0`` (the same at every t)."""
    return noise - x0
