"""The training objectives as pure functions: flow matching, Self-Flow's masking and alignment, REPA.

Self-Flow (release thread / METHODS.md): draw t and s independently per sample; a random token mask
with exactly ``round(R_M·N)`` tokens gives those tokens level s and the rest level t (either set may be
the cleaner one); the student predicts every token's velocity at its own level; the EMA teacher sees
the whole image at ``min(t, s)`` with the same noise; ``loss = flow + 0.8 · mean(1 − cos(h(student_l),
sg(teacher_k))))`` with h = SimpleHead. REPA (Yu et al.): ``loss = flow + 0.5 · mean(−cos(mlp(student_l),
encoder(x_0)))`` with a 3-layer SiLU MLP and a frozen encoder's clean-image patch tokens.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def per_token_flow_loss(velocity: Tensor, target: Tensor, patch_size: int) -> Tensor:
    """(B, N): the squared velocity error averaged over each token's p×p×C values."""
    B, C, H, W = velocity.shape
    p = patch_size
    err = (velocity.float() - target.float()).square()
    return err.reshape(B, C, H // p, p, W // p, p).mean(dim=(1, 3, 5)).flatten(1)


def token_mask(batch: int, tokens: int, ratio: float, *, device=None,
               generator: torch.Generator | None = None) -> Tensor:
    """(B, N) bool: exactly ``round(ratio · N)`` tokens per sample are True (masked), chosen uniformly."""
    n_masked = int(round(ratio * tokens))
    ranks = torch.rand(batch, tokens, device=device, generator=generator).argsort(dim=1).argsort(dim=1)
    return ranks < n_masked


def self_flow_levels(t: Tensor, s: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """(student per-token levels (B, N): s on masked tokens, t elsewhere; teacher level min(t, s) (B,))."""
    return torch.where(mask, s[:, None], t[:, None]), torch.minimum(t, s)


def alignment_loss(prediction: Tensor, target: Tensor) -> Tensor:
    """Self-Flow's representation loss ``mean(1 − cos(prediction, sg(target)))`` over tokens."""
    return (1 - F.cosine_similarity(prediction.float(), target.detach().float(), dim=-1)).mean()


def repa_loss(prediction: Tensor, target: Tensor) -> Tensor:
    """REPA's projection loss ``mean(−cos(prediction, sg(target)))`` over tokens (official code)."""
    return -F.cosine_similarity(prediction.float(), target.detach().float(), dim=-1).mean()


def noise_level_buckets(per_token: Tensor, levels: Tensor, buckets: int = 4) -> tuple[Tensor, Tensor]:
    """(mean loss, count) per noise-level bucket [i/b, (i+1)/b) (NaN when empty): ``levels`` (B,) or (B, N)."""
    levels = levels[:, None].expand_as(per_token) if levels.ndim == 1 else levels
    idx = (levels.detach() * buckets).long().clamp_(0, buckets - 1).flatten()
    sums = torch.zeros(buckets, device=per_token.device).index_add_(0, idx, per_token.detach().float().flatten())
    counts = torch.bincount(idx, minlength=buckets).float()
    return torch.where(counts > 0, sums / counts.clamp(min=1), torch.nan), counts


class SimpleHead(nn.Module):
    """Self-Flow's student projector h: Linear(D → 2D), SiLU, Linear(2D → D) (xavier, zero bias)."""

    def __init__(self, dim: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, 2 * dim), nn.SiLU(), nn.Linear(2 * dim, dim))
        for m in self.net:
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class RepaProjector(nn.Module):
    """REPA's projector: Linear(D, h), SiLU, Linear(h, h), SiLU, Linear(h, z) (official build_mlp,
    ``models/sit.py:16-23``), xavier-uniform weights and zero biases (the SiT's ``self.apply(_basic_init)`` reaches
    the projectors too, ``models/sit.py:206-219``)."""

    def __init__(self, dim: int, hidden: int, out_dim: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(),
                                 nn.Linear(hidden, out_dim))
        for m in self.net:
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)
