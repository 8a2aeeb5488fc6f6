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


def negative_cosine(p: Tensor, z: Tensor, stop_gradient: bool = True) -> Tensor:
    """SimSiam's D(p, z) = −mean cos(p, sg(z)): the stop-gradient is on ``z`` (``stop_gradient=False``: the
    gradient flows into ``z`` too, SimSiam §4.1's ablation)."""
    return -F.cosine_similarity(p, z.detach() if stop_gradient else z, dim=-1).mean()


def byol_regression(p: Tensor, z: Tensor, stop_gradient: bool = True) -> Tensor:
    """BYOL's ‖p̄ − z̄‖² = 2 − 2·cos(p, sg(z)), mean over the batch."""
    return 2 + 2 * negative_cosine(p, z, stop_gradient)


# --------------------------------------------------------------------------- redundancy reduction


def off_diagonal(m: Tensor) -> Tensor:
    """The n(n − 1) off-diagonal entries of a square matrix, flattened (row-major order)."""
    n = m.shape[0]
    return m.flatten()[:-1].view(n - 1, n + 1)[:, 1:].flatten()


def batch_standardize(z: Tensor, all_z: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """``(z − μ) / sqrt(σ² + ε)`` per dimension, μ and the biased σ² over ``all_z`` (the global batch,
    gathered with gradient; default ``z``): BatchNorm1d(affine=False) in training mode, synchronised
    across processes (Barlow Twins main.py:205, with SyncBN over the model, :89)."""
    all_z = z if all_z is None else all_z
    mean = all_z.mean(0)
    var = (all_z - mean).pow(2).mean(0)
    return (z - mean) * torch.rsqrt(var + eps)


def cross_correlation(z1: Tensor, z2: Tensor, *, all_z1: Tensor | None = None, all_z2: Tensor | None = None,
                      batch_size: int | None = None, eps: float = 1e-5) -> Tensor:
    """This process's share of Barlow Twins' cross-correlation ``C = bn(z1)ᵀ bn(z2) / N`` (main.py:212-216).

    ``z1``, ``z2`` (n, D) are the local projector outputs, each standardised with its view's statistics over
    ``all_z1`` / ``all_z2`` (the global batch); ``batch_size`` is the global N (default n). Summed over the
    processes it is C of the whole batch.
    """
    n = z1.shape[0] if batch_size is None else batch_size
    return batch_standardize(z1, all_z1, eps).T @ batch_standardize(z2, all_z2, eps) / n


def barlow_twins_terms(c: Tensor) -> tuple[Tensor, Tensor]:
    """Barlow Twins' invariance and redundancy-reduction terms of a cross-correlation ``c`` (D, D):
    ``Σᵢ (1 − Cᵢᵢ)²`` and ``Σᵢ Σ_{j≠i} Cᵢⱼ²`` (paper eq. 1; main.py:218-219)."""
    return (torch.diagonal(c) - 1).pow(2).sum(), off_diagonal(c).pow(2).sum()


def barlow_twins_loss(c: Tensor, lambd: float) -> Tensor:
    """``L_BT = Σᵢ (1 − Cᵢᵢ)² + λ Σᵢ Σ_{j≠i} Cᵢⱼ²`` (main.py:220; λ = 0.0051 official, :39)."""
    on_diag, off_diag = barlow_twins_terms(c)
    return on_diag + lambd * off_diag


def vicreg_terms(z1: Tensor, z2: Tensor, *, all_z1: Tensor | None = None, all_z2: Tensor | None = None,
                 eps: float = 1e-4) -> tuple[Tensor, Tensor, Tensor]:
    """VICReg's invariance, variance and covariance terms (main_vicreg.py:194-213).

    Invariance ``s = mean (z1 − z2)²`` over this process's batch (n × D). Variance and covariance are on the
    global batch ``all_z1`` / ``all_z2`` (N, D; gathered with gradient, default the local batch), centred per
    dimension: ``v = ½ mean_j relu(1 − sqrt(Var z_j + ε))`` per view, summed over the views (unbiased Var,
    ε = 1e-4; the ½ is the official code's, not the paper's), and ``c = Σ_{i≠j} Cov(z)ᵢⱼ² / D`` per view,
    summed, with ``Cov = zᵀz / (N − 1)``.
    """
    invariance = F.mse_loss(z1, z2)
    all_z1 = z1 if all_z1 is None else all_z1
    all_z2 = z2 if all_z2 is None else all_z2
    variance = z1.new_zeros(())
    covariance = z1.new_zeros(())
    for z in (all_z1, all_z2):
        n, d = z.shape
        z = z - z.mean(0)
        std = torch.sqrt(z.var(0) + eps)
        variance = variance + F.relu(1 - std).mean() / 2
        covariance = covariance + off_diagonal(z.T @ z / (n - 1)).pow(2).sum() / d
    return invariance, variance, covariance


def vicreg_loss(z1: Tensor, z2: Tensor, *, all_z1: Tensor | None = None, all_z2: Tensor | None = None,
                sim_coeff: float = 25.0, std_coeff: float = 25.0, cov_coeff: float = 1.0,
                eps: float = 1e-4) -> Tensor:
    """``λ s + μ v + ν c`` of ``vicreg_terms`` (official λ, μ, ν = 25, 25, 1; main_vicreg.py:58-63, :215-219)."""
    invariance, variance, covariance = vicreg_terms(z1, z2, all_z1=all_z1, all_z2=all_z2, eps=eps)
    return sim_coeff * invariance + std_coeff * variance + cov_coeff * covariance


def dino_teacher_probs(teacher_logits: Tensor, center: Tensor, teacher_temp: float | Tensor) -> Tensor:
    """DINO's teacher targets ``softmax((t − c) / τt)``, detached (centring and sharpening; main_dino.py:388-390)."""
    return F.softmax((teacher_logits.detach() - center) / teacher_temp, dim=-1)


def dino_loss(student_logits: Tensor, teacher_logits: Tensor, center: Tensor, student_temp: float,
              teacher_temp: float | Tensor, n_global: int = 2) -> Tensor:
    """DINO's multi-crop cross-entropy (facebookresearch/dino main_dino.py:380-402) with the centred, sharpened
    targets ``softmax((t − c) / τt)``: ``dino_cross_entropy`` of ``dino_teacher_probs``.

    ``student_logits`` (V·B, K) are all V crops crop-major (globals first), ``teacher_logits`` (n_global·B, K)
    the teacher's on the global crops."""
    return dino_cross_entropy(student_logits, dino_teacher_probs(teacher_logits, center, teacher_temp), student_temp,
                              n_global)


def dino_cross_entropy(student_logits: Tensor, teacher_probs: Tensor, student_temp: float, n_global: int = 2) -> Tensor:
    """The multi-crop cross-entropy of DINO (main_dino.py:392-402) and DINOv2 (dino_clstoken_loss.py ``forward``)
    given the teacher's targets ``teacher_probs`` (n_global·B, K), however they were centred (the EMA centre:
    ``dino_teacher_probs``; DINOv2's Sinkhorn-Knopp: ``sinkhorn_knopp(t, τt, 3)``). For every (teacher crop i,
    student crop v) pair with v ≠ i, the batch mean of ``−Σ_k q_i log softmax(s_v / τs)``; the mean over the
    ``n_global · V − n_global`` pairs (the official loop's sum of per-pair means over its count)."""
    n_crops = student_logits.shape[0] // (teacher_probs.shape[0] // n_global)
    log_p = torch.stack(F.log_softmax(student_logits / student_temp, dim=-1).chunk(n_crops))  # (V, B, K)
    q = torch.stack(teacher_probs.detach().to(log_p.dtype).chunk(n_global))  # (n_global, B, K)
    ce = -torch.einsum("ibk,vbk->iv", q, log_p) / q.shape[1]  # per-pair batch means
    pairs = ~torch.eye(n_global, n_crops, dtype=torch.bool, device=ce.device)  # v ≠ i
    return torch.where(pairs, ce, 0.0).sum() / (n_global * n_crops - n_global)  # (no data-dependent shape)


def koleo_loss(x: Tensor, eps: float = 1e-8) -> tuple[Tensor, Tensor]:
    """DINOv2's KoLeo regulariser (dinov2/loss/koleo_loss.py; Sablayrolles et al. 2018): the rows of ``x`` (B, D)
    L2-normalised (eps 1e-8), each row's nearest other row by inner product, ``−mean log(‖x_i − x_nn(i)‖ + eps)``
    (PairwiseDistance's eps 1e-8 added to the difference), in float32. Returns (the loss, the mean nearest-neighbour
    distance it acts on, detached)."""
    x = F.normalize(x.float(), eps=eps, p=2, dim=-1)
    dots = x @ x.t()
    dots = dots.masked_fill(torch.eye(x.shape[0], dtype=torch.bool, device=x.device), -1.0)  # not itself
    distances = (x - x[dots.argmax(dim=1)] + eps).norm(dim=-1)
    return -torch.log(distances + eps).mean(), distances.detach().mean()


def dino_center(center: Tensor, teacher_sum: Tensor, count: int, momentum: float) -> Tensor:
    """The next DINO centre ``m · c + (1 − m) · Σ t / count`` (main_dino.py:406-416): ``teacher_sum`` (1, K) the
    teacher outputs of the global crops summed over the global batch (all-reduced), ``count`` = 2 · B · world."""
    return center * momentum + teacher_sum / count * (1 - momentum)


def ibot_patch_loss(student_patch: Tensor, teacher_patch: Tensor, center2: Tensor, masks: Tensor,
                    student_temp: float, teacher_temp2: float | Tensor) -> Tensor:
    """iBOT's masked-image-modelling term (ibot main_ibot.py:530-548, the ``v == q`` pairs): for each global crop,
    the per-patch cross-entropy ``−Σ_k q log softmax(s / τs)`` with ``q = softmax((t − c2) / τt2)`` of the
    teacher on the same crop unmasked, summed over the crop's masked patches and divided by their count
    (at least 1), then the mean over the crops, unmasked crops counting 0 (the mean over images of each global
    crop, averaged over the global crops: the same number, each crop having B images).

    ``student_patch``, ``teacher_patch`` (n·B, N, K) the patch logits of the n global crops (crop-major),
    ``center2`` (1, 1, K), ``masks`` (n·B, N) bool (True = masked, the student's input)."""
    q = F.softmax((teacher_patch.detach() - center2) / teacher_temp2, dim=-1)
    return ibot_patch_cross_entropy(student_patch, q, masks, student_temp)


def ibot_patch_cross_entropy(student_patch: Tensor, teacher_probs: Tensor, masks: Tensor,
                             student_temp: float) -> Tensor:
    """``ibot_patch_loss`` with the teacher's targets given (``teacher_probs`` (n·B, N, K), e.g. Sinkhorn-Knopp
    codes): per crop the mean over its masked patches of ``−Σ_k q log softmax(s / τs)``, then the mean over the
    crops, unmasked crops counting 0."""
    ce = -(teacher_probs.detach() * F.log_softmax(student_patch / student_temp, dim=-1)).sum(-1)  # (n·B, N)
    m = masks.to(ce.dtype)
    return ((ce * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean()


def dinov2_patch_loss(student_patch: Tensor, teacher_probs: Tensor, weights: Tensor, n_crops: int,
                      student_temp: float) -> Tensor:
    """DINOv2's iBOT term on the masked patch tokens only (dinov2/loss/ibot_patch_loss.py ``forward_masked``):
    ``−Σ_u w_u Σ_k q_u log softmax(s_u / τs) / n_crops``, u over a flat buffer of patch tokens, ``w_u`` =
    1 / (the masked patches of u's crop) for a masked patch and 0 for padding (``masks_weight``), ``n_crops`` the
    global crops of the batch (``student_masks_flat.shape[0]``): the per-crop mean over masked patches, averaged
    over every crop, unmasked crops counting 0; equal to ``ibot_patch_loss`` with the same targets.

    ``student_patch`` (U, K) logits, ``teacher_probs`` (U, K) the teacher's centred targets, ``weights`` (U,)."""
    ce = (teacher_probs.detach().float() * F.log_softmax(student_patch.float() / student_temp, dim=-1)).sum(-1)
    return -(ce * weights).sum() / n_crops


def gram_loss(student_patches: Tensor, teacher_patches: Tensor, *, normalized: bool = True, img_level: bool = True,
              remove_neg: bool = False, remove_only_teacher_neg: bool = False) -> Tensor:
    """DINOv3's Gram anchoring (dinov3/loss/gram_loss.py:34-84): the MSE between the Gram matrices (patch-to-patch
    similarities) of the student's patch features and the Gram teacher's, ``mean((S Sᵀ − T Tᵀ)²)``. Features are
    L2-normalised first (``normalized``, gram_loss.py:54-55, 65-66), in float32 (:50-51); ``img_level``: one Gram
    matrix per image over its N patches, (B, N, D) → (B, N, N) (:46-47), else one over every patch of the local
    batch, (B·N, D) flattened (:57-59, 68-70; 2-D inputs are taken as already flat). ``remove_neg``: negative
    similarities set to 0 in both matrices (:75-77); ``remove_only_teacher_neg``: the teacher's negatives set to 0;
    the student's "where the teacher's are negative too" are tested after the teacher's were zeroed, so none is
    (:79-82, reproduced as written: the student's negatives stay). The teacher's side carries no gradient."""
    if remove_neg and remove_only_teacher_neg:
        raise ValueError("gram_loss: remove_neg and remove_only_teacher_neg exclude each other (gram_loss.py:31-32)")
    s, t = student_patches.float(), teacher_patches.detach().float()
    if normalized:
        s, t = F.normalize(s, dim=-1), F.normalize(t, dim=-1)
    if not img_level and s.ndim == 3:
        s, t = s.flatten(0, 1), t.flatten(0, 1)
    student_sim, target_sim = s @ s.transpose(-1, -2), t @ t.transpose(-1, -2)
    if remove_neg:
        target_sim, student_sim = target_sim.clamp(min=0.0), student_sim.clamp(min=0.0)
    elif remove_only_teacher_neg:  # the student's mask reads the zeroed teacher matrix: it selects nothing
        target_sim = target_sim.clamp(min=0.0)
    return F.mse_loss(student_sim, target_sim)


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


# --------------------------------------------------------------------------- clustering, whitening, nearest neighbour


@torch.no_grad()
def sinkhorn_knopp(scores: Tensor, epsilon: float = 0.05, iterations: int = 3, *, world_size: int = 1,
                   all_reduce=None, valid: Tensor | None = None) -> Tensor:
    """SwAV's codes (swav main_swav.py:353-376 ``distributed_sinkhorn``), no gradient, in float32.

    ``scores`` (B_loc, K) are this process's prototype scores (its queue rows included); ``all_reduce`` sums a
    tensor over the processes (None: one process), ``world_size`` the processes. Q = exp(scores / ε)ᵀ (no max
    subtraction, as the code), Q /= ΣQ (all-reduced); ``iterations`` times: each prototype's row sum,
    all-reduced, to 1/K; each sample's column (local) to 1/B, with B = B_loc · world_size; finally Q · B, so
    each sample's code sums to 1. Returns (B_loc, K).

    ``valid`` (B_loc,) 0/1: only those rows are samples (DINOv2's masked patch tokens in a static buffer,
    ibot_patch_loss.py ``sinkhorn_knopp_teacher``: B = the masked patches counted over the processes); the others
    get all-zero codes and weigh nothing."""
    reduce = all_reduce if all_reduce is not None else (lambda t: t)
    q = torch.exp(scores.float() / epsilon).t()  # (K, B_loc)
    k = q.shape[0]
    if valid is None:
        b = q.shape[1] * world_size
    else:
        q = q * valid.float()
        b = reduce(valid.float().sum())
    q = q / reduce(q.sum())
    for _ in range(iterations):
        q = q / reduce(q.sum(dim=1, keepdim=True)) / k  # prototypes: rows sum to 1/K over the global batch
        columns = q.sum(dim=0, keepdim=True)
        q = (q / (columns if valid is None else columns.clamp(min=torch.finfo(q.dtype).tiny))) / b  # samples: 1/B
    return (q * b).t()


def swav_loss(scores: list[Tensor], codes: list[Tensor], crops_for_assign: tuple[int, ...],
              temperature: float) -> Tensor:
    """SwAV's swapped prediction (main_swav.py:310-315): ``scores`` the V crops' prototype scores (each (B, K),
    crop order), ``codes`` the Sinkhorn codes of the crops ``crops_for_assign`` (each (B, K)). For each assigned
    crop s, the sum over every other crop v ≠ s of the batch mean of ``−Σ_k q_s log softmax(scores_v / τ)``,
    divided by V − 1; then the mean over the assigned crops."""
    log_p = [F.log_softmax(s / temperature, dim=1) for s in scores]
    loss = scores[0].new_zeros(())
    for s, q in zip(crops_for_assign, codes):
        sub = sum(-(q * log_p[v]).sum(dim=1).mean() for v in range(len(scores)) if v != s)
        loss = loss + sub / (len(scores) - 1)
    return loss / len(crops_for_assign)


def cholesky_whiten(x: Tensor, eps: float = 0.0) -> Tensor:
    """W-MSE's Whitening2d (htdt/self-supervised methods/whitening.py:6-61) of a sub-batch ``x`` (N, D), with
    gradient: ``W (x − m)`` with m the mean, Σ = (x − m)ᵀ(x − m) / (N − 1) (unbiased), Σ' = (1 − eps) Σ + eps I,
    L = cholesky(Σ') (lower) and W = L⁻¹ (a triangular solve): Cholesky whitening, not ZCA. In float32."""
    x = x.float()
    xc = x - x.mean(dim=0, keepdim=True)
    cov = xc.t() @ xc / (x.shape[0] - 1)
    eye = torch.eye(x.shape[1], device=x.device, dtype=x.dtype)
    chol = torch.linalg.cholesky((1 - eps) * cov + eps * eye)
    w = torch.linalg.solve_triangular(chol, eye, upper=False)
    return xc @ w.t()


def norm_mse(x0: Tensor, x1: Tensor) -> Tensor:
    """W-MSE's ``norm_mse`` (methods/norm_mse.py:4-7): ``2 − 2 · mean_n cos(x0_n, x1_n)``."""
    return 2 - 2 * (F.normalize(x0, dim=1) * F.normalize(x1, dim=1)).sum(dim=1).mean()


def wmse_loss(h: list[Tensor], perms: list[Tensor], w_size: int, eps: float = 0.0, normalize: bool = True) -> Tensor:
    """W-MSE (methods/w_mse.py:19-36): ``h`` the d views' embeddings (each (B, D)), ``perms`` one permutation of
    range(B) per whitening iteration. For each iteration, the permutation cut into chunks of ``w_size``; each
    view's rows of a chunk whitened on their own (``cholesky_whiten``; the same chunks in every view, views
    never whitened together); then ``norm_mse`` (``normalize``; else the plain MSE) of every pair of views
    i < j over the batch. The sum over iterations and pairs divided by ``len(perms) · d (d − 1) / 2``."""
    d, loss = len(h), h[0].new_zeros((), dtype=torch.float32)
    for perm in perms:
        z = [torch.empty_like(v, dtype=torch.float32) for v in h]
        for idx in perm.view(-1, w_size):
            for i in range(d):
                z[i][idx] = cholesky_whiten(h[i][idx], eps)
        for i in range(d - 1):
            for j in range(i + 1, d):
                loss = loss + (norm_mse(z[i], z[j]) if normalize else F.mse_loss(z[i], z[j]))
    return loss / (len(perms) * d * (d - 1) / 2)


def nearest_neighbour(z: Tensor, support: Tensor) -> tuple[Tensor, Tensor]:
    """NNCLR's NN(z, Q) (Dwibedi et al. 2021, eq. 2): for each row of ``z`` (N, D) the row of the support set
    ``support`` (M, D) of largest cosine similarity; no gradient. Returns (the neighbours (N, D), their indices)."""
    with torch.no_grad():
        idx = (F.normalize(z.detach(), dim=1) @ F.normalize(support, dim=1).t()).argmax(dim=1)
        return support[idx], idx


def nnclr_loss(nn_z: Tensor, p: Tensor, temperature: float, *, all_p: Tensor | None = None, rank: int = 0) -> Tensor:
    """One direction of NNCLR's loss (paper eq. 2; as solo-learn's ``nnclr_loss_func``): the batch mean of
    ``−log softmax_k(NN(z_i) · p_k⁺ / τ)`` at k = i, cosines, with the neighbours ``nn_z`` (N, D) of one view as
    anchors and the predictions of the other view as candidates: ``all_p`` (M, D), the global batch gathered
    with gradient in rank order (default ``p``), this process's rows at ``rank · N``. The neighbours carry no
    gradient."""
    all_p = p if all_p is None else all_p
    logits = F.normalize(nn_z.detach(), dim=1) @ F.normalize(all_p, dim=1).t() / temperature
    labels = torch.arange(nn_z.shape[0], device=nn_z.device) + nn_z.shape[0] * rank
    return F.cross_entropy(logits, labels)


def ijepa_loss(prediction: Tensor, target: Tensor) -> Tensor:
    """I-JEPA's loss (ijepa src/train.py:295-313): the smooth L1 (β = 1, mean over every element) between the
    predictor's outputs and the target encoder's features at the same patches, each target token normalised by
    ``F.layer_norm`` over its feature dimension, without affine parameters (:298). ``target`` holds the target
    encoder's raw tokens (the normalisation is per token, so it commutes with picking the target blocks)."""
    return F.smooth_l1_loss(prediction, F.layer_norm(target, (target.shape[-1],)))


def epps_pulley_grid(t_max: float = 3.0, knots: int = 17, device=None) -> tuple[Tensor, Tensor, Tensor]:
    """SIGReg's quadrature (lejepa univariate/epps_pulley.py:62-78; MINIMAL.md:58-67): the ``knots`` points
    ``t = linspace(0, t_max, knots)``, the standard normal's characteristic function ``φ(t) = exp(−t²/2)`` and
    the trapezoid weights over [0, t_max] doubled for the symmetric half [−t_max, 0] (``2 Δt``, ``Δt`` at both
    ends) times the weight function ``φ(t)``."""
    t = torch.linspace(0, t_max, knots, dtype=torch.float32, device=device)
    dt = t_max / (knots - 1)
    weights = torch.full((knots,), 2 * dt, dtype=torch.float32, device=device)
    weights[[0, -1]] = dt
    phi = t.square().mul(0.5).neg().exp()
    return t, phi, weights * phi


def sigreg(x: Tensor, slices: Tensor, *, t_max: float = 3.0, knots: int = 17, mean=None,
           world_size: int = 1) -> Tensor:
    """SIGReg, LeJEPA's sketched isotropic Gaussian regulariser: the Epps-Pulley statistic of each 1-D projection
    of the embeddings, averaged over the slices (and any leading dimensions: MINIMAL.md:69-75 applies it to the
    (V, N, K) projections of the V views at once).

    ``x`` (*, N, D) embeddings, ``slices`` (D, S) unit columns (``sigreg_slices``). Per slice, the empirical
    characteristic function at the grid ``t`` (``epps_pulley_grid``) is compared with ``φ(t)``:
    ``T = N · W · Σ_t w(t) [(mean cos(t x) − φ(t))² + mean sin(t x)²]`` (epps_pulley.py:80-99). ``mean``: the
    all-reduce of the batch means across processes, with gradient (the code's ``torch.distributed.nn``
    ``all_reduce(AVG)``, :91-93: ``distributed.all_reduce_mean_with_grad``); None in one process. ``world_size``
    W: the code multiplies by the number of processes, so the statistic is the global batch's (N · W samples)."""
    t, phi, weights = epps_pulley_grid(t_max, knots, x.device)
    x_t = (x @ slices.to(x.dtype)).unsqueeze(-1) * t  # (*, N, S, knots)
    cos_mean, sin_mean = x_t.cos().mean(-3), x_t.sin().mean(-3)  # (*, S, knots)
    if mean is not None:
        cos_mean, sin_mean = mean(cos_mean), mean(sin_mean)
    err = (cos_mean - phi).square() + sin_mean.square()
    return ((err @ weights) * x.shape[-2] * world_size).mean()


def sigreg_slices(dim: int, num_slices: int, generator: torch.Generator, device=None) -> Tensor:
    """(dim, num_slices) random directions: Gaussian columns normalised to unit length (lejepa
    multivariate/slicing.py:140-142), from ``generator`` (the code seeds a generator with a step counter shared by
    every process, :131-138, so each step has new slices, the same on every process)."""
    a = torch.randn(dim, num_slices, generator=generator, device=device)
    return a / a.norm(p=2, dim=0)


def lejepa_predictive(z: Tensor, n_global: int) -> Tensor:
    """LeJEPA's predictive term: the mean squared distance of every view's embedding to the mean of the global
    views' embeddings, ``mean_v,n,k (μ_n,k − z_v,n,k)²`` with μ the mean over the first ``n_global`` views
    (MINIMAL.md:172 ``(proj.mean(0) - proj).square().mean()`` where every view is global). ``z`` (V, N, K)."""
    return (z[:n_global].mean(0) - z).square().mean()


def lejepa_loss(predictive: Tensor, sigreg_value: Tensor, lamb: float) -> Tensor:
    """The single trade-off (MINIMAL.md:174): ``λ · SIGReg + (1 − λ) · predictive``."""
    return sigreg_value * lamb + predictive * (1 - lamb)


def global_distillation_loss(student: Tensor, teacher: Tensor, queue: Tensor, temperature: float) -> Tensor:
    """LightlyTrain's distillation v1 loss (lightly-train ``_methods/distillation/distillation_loss.py:51-74``), v3's
    global loss (``_methods/distillationv3/distillationv3_loss.py:61-84``, the same lines):
    KL(p_t ‖ p_s), averaged over the batch (``KLDivLoss(reduction="batchmean")``), with p_t = softmax(t Qᵀ / τ) and
    log p_s = log_softmax(s Qᵀ / τ): the student's L2-normalised projection ``student`` (B, D) and the teacher's
    L2-normalised embedding ``teacher`` (B, D) scored against the queue ``queue`` (Q, D) of teacher embeddings, the
    pseudo-class weights. The teacher side carries no gradient."""
    with torch.no_grad():
        p_t = F.softmax(teacher.float() @ queue.float().T / temperature, dim=-1)
    log_p_s = F.log_softmax(student.float() @ queue.float().T / temperature, dim=-1)
    return F.kl_div(log_p_s, p_t, reduction="batchmean", log_target=False)


def local_distillation_loss(student: Tensor, teacher: Tensor, temperature: float) -> Tensor:
    """LightlyTrain's distillation v3 local loss (``_methods/distillationv3/distillationv3_loss.py:86-115``): in each
    image, every patch scored against the image's own patches, ``softmax(f fᵀ / τ)`` over the patches, for the
    teacher's L2-normalised patch features ``teacher`` (B, N, D) and the student's ``student`` (B, N, D, projected,
    resized to the teacher's grid, L2-normalised); KL(p_t ‖ p_s) averaged over the B·N rows
    (``KLDivLoss(reduction="batchmean")`` on the rows flattened). The teacher side carries no gradient."""
    with torch.no_grad():
        t = teacher.float()
        p_t = F.softmax(t @ t.transpose(1, 2) / temperature, dim=-1).flatten(0, 1)
    s = student.float()
    log_p_s = F.log_softmax(s @ s.transpose(1, 2) / temperature, dim=-1).flatten(0, 1)
    return F.kl_div(log_p_s, p_t, reduction="batchmean", log_target=False)


def distillation_mse_loss(student: Tensor, teacher: Tensor) -> Tensor:
    """LightlyTrain's distillation v2 loss (``_methods/distillationv2/distillationv2_loss.py:27``, ``:43``):
    ``MSELoss()``, the mean over every element of the student's projected patch features ``student`` (B, N, D) and
    the teacher's ``teacher`` (B, N, D, its last blocks concatenated), neither normalised."""
    return F.mse_loss(student.float(), teacher.float().detach())


def moco_info_nce(q: Tensor, k: Tensor, queue: Tensor, temperature: float) -> Tensor:
    """MoCo's InfoNCE (He et al. 2020, eq. 1; facebookresearch/moco moco/builder.py:138-168 and main_moco.py:289,
    418): the batch mean of ``CE([q·k, q·queueᵀ] / τ, 0)``, the positive logit first. ``q`` (N, D) the queries and
    ``k`` (N, D) their keys, both L2-normalised here (builder.py:139, 149); ``queue`` (K, D) the negative keys (the
    code's (D, K) columns as rows), already unit, copied without gradient (builder.py:159 ``clone().detach()``)."""
    q = F.normalize(q, dim=1)
    k = F.normalize(k.detach(), dim=1)
    l_pos = (q * k).sum(dim=1, keepdim=True)
    l_neg = q @ queue.clone().detach().t()  # a copy: the caller enqueues into the queue after the loss
    logits = torch.cat([l_pos, l_neg], dim=1) / temperature
    return F.cross_entropy(logits, torch.zeros(q.shape[0], dtype=torch.long, device=q.device))


def tico_batch_covariance(z: Tensor) -> Tensor:
    """TiCo's B = zᵀz / N of the L2-normalised projections ``z`` (N, D) (sayannag/TiCo-pytorch TiCo/main.py:75;
    lightly loss/tico_loss.py:124): the batch's second moment, not centred."""
    return z.t() @ z / z.shape[0]


def tico_loss(z1: Tensor, z2: Tensor, covariance: Tensor, *, all_z1: Tensor | None = None, beta: float = 0.9,
              rho: float = 8.0, covariance_gradient: bool = True) -> tuple[Tensor, Tensor]:
    """TiCo's loss (Zhu et al. 2022; sayannag/TiCo-pytorch TiCo/main.py:72-78, cross-checked with lightly
    loss/tico_loss.py:119-140): with z1, z2 the L2-normalised online and momentum projections,

        C ← β C + (1 − β) B(z1),   loss = −mean_i(z1_i · z2_i) + ρ · mean_i(z1_i C z1_iᵀ)

    ``covariance`` the running C (D, D) before this step; ``all_z1`` the online projections of the global batch
    (default ``z1``) that B is computed from. ``covariance_gradient``: B keeps its gradient inside this step's C
    (main.py:75-77, C detached only after the step, main.py:125); false: B detached (lightly tico_loss.py:124).
    Returns (the loss, the updated C, detached). The invariance term omits lightly's constant 1 (no gradient)."""
    z1 = F.normalize(z1, dim=1)
    z2 = F.normalize(z2.detach(), dim=1)
    all_z1 = z1 if all_z1 is None else F.normalize(all_z1, dim=1)
    b = tico_batch_covariance(all_z1)
    c = beta * covariance.detach() + (1 - beta) * (b if covariance_gradient else b.detach())
    loss = -(z1 * z2).sum(dim=1).mean() + rho * ((z1 @ c) * z1).sum(dim=1).mean()
    return loss, c.detach()
