"""Weighted k-nearest-neighbour classification (DINO eval_knn.py), chunked over test samples."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


@torch.no_grad()
def knn_predict_scores(train_features: Tensor, train_labels: Tensor, test_features: Tensor, k: int = 20,
                       temperature: float | None = 0.07, num_classes: int | None = None,
                       chunk_size: int = 1024) -> Tensor:
    """Class scores (N_test × C): each of the k most cosine-similar training samples votes
    ``exp(sim / T)`` for its class (``temperature=None``: one vote each, majority voting)."""
    num_classes = int(num_classes or int(train_labels.max()) + 1)
    k = min(k, train_features.shape[0])
    train = F.normalize(train_features.float(), dim=1)
    test = F.normalize(test_features.float(), dim=1)
    scores = torch.empty(test.shape[0], num_classes, device=test.device)
    for start in range(0, test.shape[0], chunk_size):
        sim = test[start : start + chunk_size] @ train.T
        top_sim, top_idx = sim.topk(k, dim=1)
        votes = torch.ones_like(top_sim) if temperature is None else (top_sim / temperature).exp()
        chunk = torch.zeros(top_sim.shape[0], num_classes, device=test.device)
        chunk.scatter_add_(1, train_labels[top_idx], votes)
        scores[start : start + chunk_size] = chunk
    return scores


def knn_accuracy(train_features: Tensor, train_labels: Tensor, test_features: Tensor, test_labels: Tensor,
                 k: int = 20, temperature: float | None = 0.07) -> dict[str, float]:
    """Top-1 and top-5 accuracy (%) of weighted kNN (DINO: cosine, top-k, votes exp(sim/T))."""
    num_classes = int(max(train_labels.max(), test_labels.max())) + 1
    scores = knn_predict_scores(train_features, train_labels, test_features, k, temperature, num_classes)
    top = scores.topk(min(5, num_classes), dim=1).indices
    correct = top == test_labels.view(-1, 1)
    return {"top1": 100.0 * correct[:, 0].float().mean().item(), "top5": 100.0 * correct.any(1).float().mean().item()}
