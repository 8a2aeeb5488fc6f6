"""Spectral measures of an embedding matrix: RankMe, effective rank (99% variance), norm statistics."""

from __future__ import annotations

import torch
from torch import Tensor

from selfsup.eval_configs import RANKME_SAMPLES
from selfsup.eval_configs import SpectrumConfig as SpectrumConfig  # the config, declared without torch


def subsample(embeddings: Tensor, max_samples: int = RANKME_SAMPLES, seed: int = 0) -> Tensor:
    """At most ``max_samples`` rows, a fixed random subset."""
    n = embeddings.shape[0]
    if n <= max_samples:
        return embeddings
    return embeddings[torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:max_samples]]


def rankme(embeddings: Tensor, eps: float = 1e-7) -> float:
    """RankMe = exp(−Σ p_k log p_k), p_k = σ_k / Σσ + ε, σ the singular values of the (uncentred) N×D matrix."""
    s = torch.linalg.svdvals(embeddings.double())
    p = s / s.sum() + eps
    return float(torch.exp(-(p * p.log()).sum()))


def effective_rank(embeddings: Tensor, variance: float = 0.99) -> int:
    """Fewest principal components of the centred data whose variances sum to ``variance`` of the total."""
    x = embeddings.double()
    s2 = torch.linalg.svdvals(x - x.mean(0, keepdim=True)) ** 2
    if float(s2.sum()) == 0.0:
        return 0
    cum = torch.cumsum(s2, 0) / s2.sum()
    return int((cum < variance - 1e-12).sum()) + 1


def norm_stats(embeddings: Tensor, percentiles=(5, 25, 50, 75, 95)) -> dict[str, float]:
    """Mean, std and percentiles of the per-sample L2 norms."""
    norms = embeddings.float().norm(dim=1)
    q = torch.quantile(norms.double(), torch.tensor([p / 100 for p in percentiles], dtype=torch.float64))
    return {"mean": float(norms.mean()), "std": float(norms.std()) if len(norms) > 1 else 0.0,
            **{f"p{p}": float(v) for p, v in zip(percentiles, q)}}
