"""The validation split carved from a training set: where settings are chosen, so that the test split only
reports (the linear probe's grid point, the kNN of a sweep; issue 24: never tune on the test split)."""

from __future__ import annotations

import torch
from torch import Tensor


def val_split(n: int, fraction: float, seed: int) -> tuple[Tensor, Tensor]:
    """Indices (train, val) of a fixed random split of the training set; val empty when fraction is 0."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed + 1))
    n_val = int(round(n * fraction)) if fraction > 0 else 0
    return perm[n_val:].sort().values, perm[:n_val].sort().values
