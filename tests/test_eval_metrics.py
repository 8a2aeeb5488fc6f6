import math

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from selfsup.eval import auroc, effective_rank, norm_stats, rankme


def orthonormal(n, d, seed, centred=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    if centred:
        x = x - x.mean(0)
    return torch.linalg.qr(x).Q


def test_rankme_known_singular_values():
    s = torch.tensor([10.0, 5.0, 2.0, 1.0, 0.5, 0.0], dtype=torch.float64)
    x = orthonormal(200, 6, 0) @ torch.diag(s) @ orthonormal(6, 6, 1).T
    p = s / s.sum() + 1e-7
    expected = math.exp(-float((p * p.log()).sum()))
    assert rankme(x.float()) == pytest.approx(expected, rel=1e-4)
    assert 1 < expected < 5


def test_rankme_of_isotropic_and_rank_one():
    assert rankme(orthonormal(100, 8, 2)) == pytest.approx(8.0, rel=1e-4)
    assert rankme(torch.ones(50, 8)) == pytest.approx(1.0, abs=1e-3)


def test_effective_rank_known_variance_spectrum():
    variances = torch.tensor([60.0, 25.0, 10.0, 3.5, 1.0, 0.5], dtype=torch.float64)  # sums to 100
    n = 500
    q = orthonormal(n, 6, 3, centred=True)  # zero-mean orthonormal columns
    x = q @ torch.diag((variances * (n - 1)).sqrt()) @ orthonormal(6, 6, 4).T
    x = x + 50.0  # a large mean: the effective rank is of the centred data
    assert effective_rank(x) == 5  # 98.5% after 4 components, 99.5% after 5
    assert effective_rank(x, variance=0.9) == 3
    assert effective_rank(x, variance=0.5) == 1


def test_norm_stats():
    x = torch.tensor([[3.0, 4.0], [0.0, 1.0], [6.0, 8.0]])
    st = norm_stats(x)
    assert st["mean"] == pytest.approx(16 / 3)
    assert st["p50"] == pytest.approx(5.0)


@pytest.mark.parametrize("ties", [False, True])
def test_auroc_matches_sklearn(ties):
    g = torch.Generator().manual_seed(5)
    pos, neg = torch.randn(300, generator=g) + 0.7, torch.randn(200, generator=g)
    if ties:
        pos, neg = pos.round(), neg.round()
    labels = np.r_[np.ones(300), np.zeros(200)]
    expected = roc_auc_score(labels, torch.cat([pos, neg]).numpy())
    assert auroc(pos, neg) == pytest.approx(expected, abs=1e-12)
    assert auroc(neg, pos) == pytest.approx(1 - expected, abs=1e-12)
