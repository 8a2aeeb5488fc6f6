"""k-nearest-neighbour classification of frozen features (DINO eval_knn.py), in bounded-memory blocks.

Features are L2-normalised; the similarity is the cosine. Each of the k most similar training
samples votes ``exp(sim / T)`` for its class (DINO, T = 0.07) or 1 (majority voting, T = None).
The top-k search runs on blocks of the test × train similarity matrix (``topk`` per block, merged),
so memory stays at about ``block_elements`` floats whatever the sizes.
"""

from __future__ import annotations

from typing import Iterable

import torch
import torch.nn.functional as F
from torch import Tensor

from selfsup.errors import UserError
from selfsup.eval_configs import DEFAULT_KS
from selfsup.eval_configs import KnnConfig as KnnConfig  # the config, declared without torch

BLOCK_ELEMENTS = 1 << 26  # similarity entries per block (256 MB of float32; fastest of 2^24..2^27 on 2 CPU cores)


def _check_k(k: int, n_train: int) -> None:
    if k < 1:
        raise UserError(f"k={k} must be >= 1")
    if k > n_train:
        raise UserError(f"k={k} is larger than the {n_train} training samples; choose k <= {n_train}")


def resolve_ks(ks: Iterable[int], n_train: int) -> list[int]:
    """The sorted, checked neighbour counts; none given: ``DEFAULT_KS`` up to ``n_train`` (else just ``n_train``)."""
    ks = sorted(set(int(k) for k in ks))
    if not ks:
        return [k for k in DEFAULT_KS if k <= n_train] or [n_train]
    for k in ks:
        _check_k(k, n_train)
    return ks


@torch.no_grad()
def knn_search(train_features: Tensor, test_features: Tensor, k: int,
               block_elements: int = BLOCK_ELEMENTS) -> tuple[Tensor, Tensor]:
    """(cosine similarities, train indices), each N_test × k, most similar first."""
    _check_k(k, train_features.shape[0])
    train = F.normalize(train_features.float(), dim=1)
    test = F.normalize(test_features.float().to(train.device), dim=1)
    n_test, n_train = test.shape[0], train.shape[0]
    cols = n_train if n_train * 64 <= block_elements else max(k, block_elements // 64)
    rows = max(1, block_elements // cols)
    sims = torch.empty(n_test, k, device=train.device)
    idx = torch.empty(n_test, k, dtype=torch.long, device=train.device)
    for r in range(0, n_test, rows):
        query = test[r : r + rows]
        best_s = best_i = None
        for c in range(0, n_train, cols):
            block = query @ train[c : c + cols].T
            s, i = block.topk(min(k, block.shape[1]), dim=1)
            i += c
            if best_s is not None:  # merge with the running top-k
                s, j = torch.cat([best_s, s], 1).topk(min(k, best_s.shape[1] + s.shape[1]), dim=1)
                i = torch.cat([best_i, i], 1).gather(1, j)
            best_s, best_i = s, i
        sims[r : r + rows], idx[r : r + rows] = best_s, best_i
    return sims, idx


def vote(sims: Tensor, neighbour_labels: Tensor, num_classes: int, temperature: float | None) -> Tensor:
    """Class scores N × C: Σ over neighbours of exp(sim / T) (DINO) or of 1 (majority, ``temperature=None``)."""
    weights = torch.ones_like(sims) if temperature is None else (sims / temperature).exp()
    scores = torch.zeros(sims.shape[0], num_classes, device=sims.device)
    scores.scatter_add_(1, neighbour_labels, weights)
    if temperature is None:  # equal vote counts: the lowest class index wins (scikit-learn's mode)
        scores -= torch.arange(num_classes, device=sims.device) * (0.5 / num_classes)
    return scores


def topk_accuracy(scores: Tensor, labels: Tensor) -> dict[str, float]:
    """Top-1 and top-5 accuracy in percent (top-5 = top-C when there are fewer than 5 classes)."""
    top = scores.topk(min(5, scores.shape[1]), dim=1).indices
    hit = top == labels.to(top.device).view(-1, 1)
    return {"top1": 100.0 * hit[:, 0].double().mean().item(), "top5": 100.0 * hit.any(1).double().mean().item()}


def _num_classes(train_labels: Tensor, test_labels: Tensor | None = None) -> int:
    n = int(train_labels.max()) + 1
    return max(n, int(test_labels.max()) + 1) if test_labels is not None and len(test_labels) else n


@torch.no_grad()
def knn_predict_scores(train_features: Tensor, train_labels: Tensor, test_features: Tensor, k: int = 20,
                       temperature: float | None = 0.07, num_classes: int | None = None,
                       block_elements: int = BLOCK_ELEMENTS) -> Tensor:
    """Class scores (N_test × C) of weighted (DINO) or majority-vote kNN."""
    sims, idx = knn_search(train_features, test_features, k, block_elements)
    labels = train_labels.to(idx.device)
    return vote(sims, labels[idx], num_classes or _num_classes(labels), temperature)


def knn_accuracy(train_features: Tensor, train_labels: Tensor, test_features: Tensor, test_labels: Tensor,
                 k: int = 20, temperature: float | None = 0.07) -> dict[str, float]:
    """Top-1 / top-5 accuracy (%) of weighted kNN (DINO: cosine, top-k, votes exp(sim/T)); T=None: majority."""
    scores = knn_predict_scores(train_features, train_labels, test_features, k, temperature,
                                _num_classes(train_labels, test_labels))
    return topk_accuracy(scores, test_labels)


@torch.no_grad()
def knn_sweep(train_features: Tensor, train_labels: Tensor, test_features: Tensor, test_labels: Tensor,
              ks: Iterable[int] = DEFAULT_KS, temperatures: Iterable[float | None] = (0.07, None),
              block_elements: int = BLOCK_ELEMENTS) -> dict[str, dict[str, dict[str, float]]]:
    """Accuracy for every (T, k) from one top-max(k) search: {"T=0.07"|"majority": {"k=20": {top1, top5}}}."""
    ks = resolve_ks(ks, train_features.shape[0])
    sims, idx = knn_search(train_features, test_features, ks[-1], block_elements)
    labels = train_labels.to(idx.device)[idx]
    c = _num_classes(train_labels, test_labels)
    out: dict = {}
    for t in temperatures:
        out["majority" if t is None else f"T={t:g}"] = {
            f"k={k}": topk_accuracy(vote(sims[:, :k], labels[:, :k], c, t), test_labels) for k in ks}
    return out
