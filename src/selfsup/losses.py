"""Losses as pure functions of tensors.

Distributed behaviour is explicit: a function never gathers. The caller passes the keys or
negatives of the global batch (gathered without gradient for MoCo v3's keys, with gradient for
SimCLR's negatives, see ``selfsup.distributed``) and this process's ``rank``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def info_nce(query: Tensor, key: Tensor, temperature: float, *, rank: int = 0) -> Tensor:
    """MoCo v3 contrastive loss of one direction, ``CE(q·kᵀ/τ, arange(N) + N·rank) · 2τ``.

    ``query`` (N, D) is this process's batch; ``key`` (M, D) may be the keys of all processes
    concatenated in rank order (M = N · world_size); both are L2-normalised here. The 2τ factor
    is the official code's (moco-v3 builder.py ``contrastive_loss``).
    """
    q = F.normalize(query, dim=1)
    k = F.normalize(key, dim=1)
    logits = q @ k.T / temperature
    labels = torch.arange(q.shape[0], device=q.device) + q.shape[0] * rank
    return F.cross_entropy(logits, labels) * (2 * temperature)


def nt_xent(
    z1: Tensor,
    z2: Tensor,
    temperature: float,
    *,
    all_z1: Tensor | None = None,
    all_z2: Tensor | None = None,
    rank: int = 0,
    decoupled: bool = False,
    positives: Tensor | None = None,
) -> Tensor:
    """SimCLR's NT-Xent: mean over the 2N anchors of −log softmax of the positive.

    Anchors are this process's ``z1``, ``z2`` (N, D); candidates are ``all_z1``, ``all_z2`` (the
    global batch, gathered *with* gradient; default: the local batch), without the anchor itself.
    ``decoupled=True`` drops the positive from the denominator (DCL, Yeh et al. 2022).
    ``positives`` (2N, D), row i the positive of anchor i (e.g. the other view through an EMA projector,
    Pham et al. 2022), replaces the online positive in the numerator and the denominator.
    """
    all_z1 = z1 if all_z1 is None else all_z1
    all_z2 = z2 if all_z2 is None else all_z2
    n, m = z1.shape[0], all_z1.shape[0]
    anchors = F.normalize(torch.cat([z1, z2]), dim=1)  # (2N, D)
    candidates = F.normalize(torch.cat([all_z1, all_z2]), dim=1)  # (2M, D)
    logits = anchors @ candidates.T / temperature  # (2N, 2M)
    local = torch.arange(n, device=z1.device) + n * rank  # this process's rows in the global batch
    self_idx = torch.cat([local, local + m])
    positive_idx = torch.cat([local + m, local])
    rows = torch.arange(2 * n, device=z1.device)
    if positives is not None:
        logits = logits.index_put((rows, positive_idx), (anchors * F.normalize(positives, dim=1)).sum(1) / temperature)
    positive = logits[rows, positive_idx]
    excluded = torch.zeros_like(logits, dtype=torch.bool)
    excluded[rows, self_idx] = True
    if decoupled:
        excluded[rows, positive_idx] = True
    denominator = torch.logsumexp(logits.masked_fill(excluded, float("-inf")), dim=1)
    return (denominator - positive).mean()


def negative_cosine(p: Tensor, z: Tensor) -> Tensor:
    """SimSiam's D(p, z) = −mean cos(p, sg(z)): the stop-gradient is on ``z``."""
    return -F.cosine_similarity(p, z.detach(), dim=-1).mean()


def byol_regression(p: Tensor, z: Tensor) -> Tensor:
    """BYOL's ‖p̄ − z̄‖² = 2 − 2·cos(p, sg(z)), mean over the batch."""
    return 2 + 2 * negative_cosine(p, z)


def normalized_pixel_target(patches: Tensor, eps: float = 1e-6) -> Tensor:
    """MAE's ``norm_pix_loss`` target: each patch (B, L, p²·C) as ``(x − mean) / sqrt(var + 1e-6)``, mean and the
    unbiased variance (torch.var) over its p²·C values (models_mae.py forward_loss)."""
    mean = patches.mean(dim=-1, keepdim=True)
    var = patches.var(dim=-1, keepdim=True)
    return (patches - mean) / (var + eps) ** 0.5


def masked_patch_mse(pred: Tensor, target: Tensor, mask: Tensor) -> Tensor:
    """MAE's loss: the per-patch mean squared error over the p²·C values, averaged over the removed patches only,
    ``Σ mask · mean_k (pred − target)² / Σ mask`` (``mask`` (B, L): 1 = removed; models_mae.py forward_loss)."""
    per_patch = (pred - target).pow(2).mean(dim=-1)
    return (per_patch * mask).sum() / mask.sum()
