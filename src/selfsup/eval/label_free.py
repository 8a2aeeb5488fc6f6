"""Label-free measures of an embedding, on the features of two augmented views of the same images (row i of each
is image i): alignment and uniformity (Wang & Isola 2020, on L2-normalised features) and the nearest-neighbour
agreement of the two views. Pure: features in, numbers out."""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

AGREEMENT_CHUNK = 1024  # rows of the similarity matrix at a time (10,000 images: 40 MB, not 400)


def alignment(z1: Tensor, z2: Tensor, alpha: float = 2) -> float:
    """E‖f(x) − f(x⁺)‖^α over the positive pairs (row i of ``z1`` and of ``z2``), features L2-normalised
    (SsnL/align_uniform align_uniform/__init__.py:4-5 ``align_loss``, alpha 2): 0 when the views agree exactly, 4
    at most."""
    a, b = F.normalize(z1.double(), dim=1), F.normalize(z2.double(), dim=1)
    return float((a - b).norm(p=2, dim=1).pow(alpha).mean())


def uniformity(z: Tensor, t: float = 2) -> float:
    """log E exp(−t‖f(x) − f(y)‖²) over the distinct pairs of rows of ``z``, L2-normalised (align_uniform
    __init__.py:8-9 ``uniform_loss``, t 2): 0 when every row is the same point (collapse), lower when they
    spread over the sphere."""
    return float(torch.pdist(F.normalize(z.double(), dim=1), p=2).pow(2).mul(-t).exp().mean().log())


def view_uniformity(z1: Tensor, z2: Tensor, t: float = 2) -> float:
    """The mean uniformity of the two views' features, as align_uniform's STL-10 example takes it
    (examples/stl10/main.py:107)."""
    return (uniformity(z1, t) + uniformity(z2, t)) / 2


def nn_agreement(z1: Tensor, z2: Tensor) -> float:
    """The fraction of the N images whose view-1 feature's nearest neighbour (cosine) among the N view-2 features
    is its own view 2, strictly: the retrieval top-1 of view 2 from view 1. A tie with another image counts as a
    miss, so features that are all equal (collapse) score 0; chance is 1/N."""
    a, b = F.normalize(z1.double(), dim=1), F.normalize(z2.double(), dim=1)
    hits = 0
    for start in range(0, len(a), AGREEMENT_CHUNK):
        sim = a[start:start + AGREEMENT_CHUNK] @ b.T  # (rows, N)
        rows = torch.arange(len(sim))
        own = sim[rows, rows + start].clone()
        sim[rows, rows + start] = -torch.inf
        hits += int((own > sim.max(dim=1).values).sum())
    return hits / max(len(a), 1)
