"""The instruments' measures as pure functions of tensors (no state, no logging).

Embedding norms (Draganov et al.: they grow and slow cosine-based learning), prediction/target
alignment, the collapse measures of an L2-normalised batch, and the eigenspace alignment of a linear predictor
with the correlation F of its inputs (DirectPred, Tian et al. 2021, Fig. 2 and Thm. 3).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

QUANTILES = (0.1, 0.5, 0.9)


def norm_summary(x: Tensor) -> Tensor:
    """(mean, q10, q50, q90) of the per-sample L2 norms of ``x`` (N, D), as one tensor (no host sync)."""
    norms = x.detach().float().norm(dim=1)
    q = torch.quantile(norms, torch.tensor(QUANTILES, device=norms.device))
    return torch.cat([norms.mean()[None], q])


def misalignment(prediction: Tensor, target: Tensor) -> Tensor:
    """Mean ``1 − cos(prediction_i, target_i)`` over the batch (0: aligned, 1: orthogonal, 2: opposite)."""
    return 1.0 - F.cosine_similarity(prediction.detach().float(), target.detach().float(), dim=-1).mean()


def per_dim_std(x: Tensor) -> float:
    """Mean over dimensions of the std of the L2-normalised rows: about 1/√D when spread out, 0 when collapsed
    (SimSiam §4.1)."""
    z = F.normalize(x.float(), dim=1)
    return float(z.std(dim=0).mean())


def batch_dim_std(x: Tensor) -> Tensor:
    """:func:`per_dim_std` as a 0-d tensor on ``x``'s device (no host read), for a step's batch."""
    return F.normalize(x.detach().float(), dim=1).std(dim=0).mean()


def batch_effective_rank(x: Tensor, variance: float = 0.99) -> Tensor:
    """The effective rank of a batch of features ``x`` (N, D) as a 0-d tensor on its device (no host read): the
    fewest principal components of the centred rows whose variances sum to ``variance`` of the total
    (``eval.spectrum.effective_rank``'s measure; 0 for a constant batch)."""
    x = x.detach().float()
    s2 = torch.linalg.svdvals(x - x.mean(0, keepdim=True)) ** 2
    total = s2.sum()
    cum = torch.cumsum(s2, 0) / total.clamp_min(torch.finfo(s2.dtype).tiny)
    return torch.where(total > 0, (cum < variance - 1e-6).sum() + 1, 0).float()


def predictor_alignment(weight: Tensor, correlation: Tensor, top_k: int = 3) -> dict[str, float]:
    """How a square linear predictor W relates to the correlation F of its inputs (DirectPred).

    ``asymmetry = ‖W − Wᵀ‖ / ‖W‖``, ``commutator = ‖FW − WF‖ / (‖F‖ ‖W‖)`` (Frobenius norms; 0 when
    W and F share eigenvectors), and ``cos_j = cos(W u_j, u_j)`` for the eigenvectors u_j of F with the
    ``top_k`` largest eigenvalues (±1 when u_j is an eigenvector of W).
    """
    w, f = weight.detach().double(), correlation.detach().double()
    if w.ndim != 2 or w.shape[0] != w.shape[1] or f.shape != w.shape:
        raise ValueError(f"need a square weight and a correlation of the same shape, got {tuple(w.shape)} "
                         f"and {tuple(f.shape)}")
    tiny = torch.finfo(torch.float64).tiny
    w_norm, f_norm = torch.linalg.norm(w), torch.linalg.norm(f)
    out = {"asymmetry": float(torch.linalg.norm(w - w.T) / w_norm.clamp_min(tiny)),
           "commutator": float(torch.linalg.norm(f @ w - w @ f) / (f_norm * w_norm).clamp_min(tiny))}
    _, vectors = torch.linalg.eigh(0.5 * (f + f.T))  # ascending eigenvalues
    top = vectors[:, -top_k:].flip(1)  # (D, k), largest first
    cos = F.cosine_similarity(w @ top, top, dim=0)
    for j, c in enumerate(cos.tolist(), start=1):
        out[f"eig_cos_{j}"] = c
    return out
