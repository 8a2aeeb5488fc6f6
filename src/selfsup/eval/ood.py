"""Embedding-norm OOD scoring: score = ‖f(x)‖ / mean training norm (small → likely OOD), AUROC, histogram."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from selfsup.eval_configs import OodConfig as OodConfig  # the config, declared without torch


def norm_scores(features: Tensor, train_mean_norm: float) -> Tensor:
    """Each sample's embedding norm divided by the training set's mean norm."""
    return features.float().norm(dim=1) / train_mean_norm


def auroc(positive: Tensor, negative: Tensor) -> float:
    """Area under the ROC curve, positives scoring higher = 1 (Mann–Whitney U with average ranks for ties)."""
    scores = torch.cat([positive.double().flatten(), negative.double().flatten()])
    n_pos, n_neg = positive.numel(), negative.numel()
    if n_pos == 0 or n_neg == 0:
        raise ValueError("AUROC needs at least one positive and one negative score")
    values, inverse, counts = torch.unique(scores, sorted=True, return_inverse=True, return_counts=True)
    end = torch.cumsum(counts, 0).double()  # 1-based rank of each distinct value's last occurrence
    mean_rank = end - (counts.double() - 1) / 2
    rank_sum = mean_rank[inverse[:n_pos]].sum()
    return float((rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def histogram(in_scores: Tensor, ood_scores: Tensor, path: Path, title: str) -> Path:
    """PNG histogram of the two score distributions (matplotlib, Agg backend)."""
    import matplotlib  # lazy: the Agg backend is chosen before pyplot, on the one path that draws

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    lo = float(min(in_scores.min(), ood_scores.min()))
    hi = float(max(in_scores.max(), ood_scores.max()))
    pad = 0.01 * max(abs(lo), 1e-3) if hi - lo < 1e-6 * max(abs(hi), 1.0) else 0.0  # all scores equal
    bins = torch.linspace(lo - pad, hi + pad, 51).tolist()
    ax.hist(in_scores.numpy(), bins=bins, alpha=0.6, density=True, label="in-distribution (test)")
    ax.hist(ood_scores.numpy(), bins=bins, alpha=0.6, density=True, label="OOD")
    ax.set_xlabel("embedding norm / mean training norm")
    ax.set_ylabel("density")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
