"""SwAV, W-MSE and NNCLR losses against hand computations and independent references written here
(float64 loops and numpy), not against the library's own code paths."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from selfsup.losses import (cholesky_whiten, nearest_neighbour, nnclr_loss, norm_mse, sinkhorn_knopp, swav_loss,
                            wmse_loss)


# --------------------------------------------------------------------------- SwAV
def _sinkhorn_numpy(scores, eps, iters):
    """distributed_sinkhorn (main_swav.py:353-376) of one process, written as the code's loop in float64."""
    q = np.exp(np.asarray(scores, dtype=np.float64) / eps).T
    k, b = q.shape
    q /= q.sum()
    for _ in range(iters):
        q /= q.sum(axis=1, keepdims=True)
        q /= k
        q /= q.sum(axis=0, keepdims=True)
        q /= b
    return (q * b).T


def test_sinkhorn_matches_the_code_loop_and_its_marginals():
    scores = torch.randn(12, 5, generator=torch.Generator().manual_seed(0)) * 0.3
    q = sinkhorn_knopp(scores, 0.05, 3)
    np.testing.assert_allclose(q.numpy(), _sinkhorn_numpy(scores.numpy(), 0.05, 3), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(q.sum(1), torch.ones(12))  # each sample's code sums to 1 exactly
    assert (q.sum(0) / 12 - 1 / 5).abs().max() > 1e-3  # after 3 iterations the prototypes are only roughly equal
    # more iterations converge to the equipartition
    assert (sinkhorn_knopp(scores, 0.05, 50).sum(0) / 12 - 1 / 5).abs().max() < 1e-4


def test_sinkhorn_by_hand_one_iteration():
    # 2 samples, 2 prototypes, eps 1: Q = exp(s)ᵀ, then rows, then columns
    s = torch.tensor([[0.0, math.log(3.0)], [0.0, 0.0]])
    # exp(s)ᵀ = [[1, 1], [3, 1]] (prototype rows); rows -> [[.5, .5], [.75, .25]] / 2; columns of
    # [[.25, .25], [.375, .125]] -> sample 0: (.25, .375) / .625 = (.4, .6); sample 1: (.25, .125) / .375 = (2/3, 1/3)
    q = sinkhorn_knopp(s, 1.0, 1)
    torch.testing.assert_close(q, torch.tensor([[0.4, 0.6], [2 / 3, 1 / 3]]))


def test_sinkhorn_all_reduce_gives_the_global_batch():
    """Two 'processes' (threads) whose all-reduce sums their operands equal one process on the concatenation;
    without the all-reduce (per-process Sinkhorn, lightly's default) the codes differ."""
    import threading

    s = torch.randn(10, 4, generator=torch.Generator().manual_seed(1)) * 0.2
    halves = s[:5], s[5:]
    barrier, slots, out = threading.Barrier(2), [None, None], [None, None]

    def reduce_for(rank):
        def reduce(t):
            slots[rank] = t
            barrier.wait()
            total = slots[0] + slots[1]
            barrier.wait()
            return total
        return reduce

    def worker(rank):
        out[rank] = sinkhorn_knopp(halves[rank], 0.05, 3, world_size=2, all_reduce=reduce_for(rank))

    threads = [threading.Thread(target=worker, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    whole = sinkhorn_knopp(s, 0.05, 3)
    torch.testing.assert_close(torch.cat(out), whole, rtol=1e-5, atol=1e-7)
    local = torch.cat([sinkhorn_knopp(h, 0.05, 3) for h in halves])
    assert (local - whole).abs().max() > 1e-3


def test_swav_loss_by_hand():
    """3 crops, codes of crops 0 and 1: each code predicts the 2 other crops, /(V - 1), mean over the codes."""
    g = torch.Generator().manual_seed(2)
    scores = [torch.randn(4, 6, generator=g) for _ in range(3)]
    codes = [torch.softmax(torch.randn(4, 6, generator=g), 1) for _ in range(2)]
    tau = 0.1

    def h(q, s):  # batch mean of the cross-entropy, as a float64 loop
        total = 0.0
        for b in range(4):
            logits = [float(x) / tau for x in s[b]]
            m = max(logits)
            lse = m + math.log(sum(math.exp(x - m) for x in logits))
            total += -sum(float(q[b, k]) * (logits[k] - lse) for k in range(6))
        return total / 4

    expected = ((h(codes[0], scores[1]) + h(codes[0], scores[2])) / 2
                + (h(codes[1], scores[0]) + h(codes[1], scores[2])) / 2) / 2
    assert swav_loss(scores, codes, (0, 1), tau).item() == pytest.approx(expected, rel=1e-5)


def test_swav_loss_is_log_k_for_uniform_scores_and_codes():
    scores = [torch.zeros(3, 8) for _ in range(4)]
    codes = [torch.full((3, 8), 1 / 8)] * 2
    assert swav_loss(scores, codes, (0, 1), 0.1).item() == pytest.approx(math.log(8))


# --------------------------------------------------------------------------- W-MSE
def test_cholesky_whitening_by_numpy():
    x = torch.randn(40, 5, generator=torch.Generator().manual_seed(3), dtype=torch.float64) @ torch.randn(
        5, 5, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    a = x.numpy()
    xc = a - a.mean(0)
    cov = xc.T @ xc / (len(a) - 1)
    w = np.linalg.inv(np.linalg.cholesky(cov))
    out = cholesky_whiten(x.float())
    np.testing.assert_allclose(out.numpy(), xc @ w.T, rtol=1e-3, atol=1e-4)
    # the whitened sub-batch has identity (unbiased) covariance and a lower-triangular W (not ZCA)
    o = out.double()
    torch.testing.assert_close(o.t() @ o / 39, torch.eye(5, dtype=torch.float64), atol=1e-4, rtol=0)
    assert np.allclose(np.triu(w, 1), 0)


def test_cholesky_whitening_shrinkage():
    x = torch.randn(20, 3, generator=torch.Generator().manual_seed(5))
    xc = x - x.mean(0)
    cov = xc.t() @ xc / 19
    shrunk = 0.5 * cov + 0.5 * torch.eye(3)
    w = torch.linalg.inv(torch.linalg.cholesky(shrunk))
    torch.testing.assert_close(cholesky_whiten(x, eps=0.5), xc @ w.t(), rtol=1e-4, atol=1e-5)


def test_norm_mse_by_hand():
    a = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    b = torch.tensor([[3.0, 0.0], [2.0, 0.0]])  # cosines 1 and 0
    assert norm_mse(a, b).item() == pytest.approx(2 - 2 * 0.5)


def test_wmse_loss_against_a_loop_reference():
    """The official loop (w_mse.py:19-36): per iteration, per chunk, per view; every pair i<j; / (iters · pairs)."""
    g = torch.Generator().manual_seed(6)
    h = [torch.randn(16, 3, generator=g) for _ in range(3)]
    perms = [torch.randperm(16, generator=g) for _ in range(2)]

    def whiten(x):
        a = x.double().numpy()
        xc = a - a.mean(0)
        w = np.linalg.inv(np.linalg.cholesky(xc.T @ xc / (len(a) - 1)))
        return xc @ w.T

    total = 0.0
    for perm in perms:
        z = [np.zeros((16, 3)) for _ in h]
        for idx in perm.view(-1, 8):
            for i in range(3):
                z[i][idx.numpy()] = whiten(h[i][idx])
        for i in range(2):
            for j in range(i + 1, 3):
                za = z[i] / np.linalg.norm(z[i], axis=1, keepdims=True)
                zb = z[j] / np.linalg.norm(z[j], axis=1, keepdims=True)
                total += 2 - 2 * (za * zb).sum(1).mean()
    expected = total / (2 * 3)
    assert wmse_loss(h, perms, 8).item() == pytest.approx(expected, rel=1e-4)


def test_wmse_gradient_flows_through_the_whitening():
    h = [torch.randn(8, 2, generator=torch.Generator().manual_seed(7), requires_grad=True) for _ in range(2)]
    wmse_loss(h, [torch.arange(8)], 8).backward()
    assert all(v.grad is not None and v.grad.abs().sum() > 0 for v in h)


# --------------------------------------------------------------------------- NNCLR
def test_nearest_neighbour_by_cosine():
    support = torch.tensor([[10.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    z = torch.tensor([[1.0, 0.1], [0.2, 1.0], [1.0, 0.9]])
    nn_z, idx = nearest_neighbour(z, support)
    assert idx.tolist() == [0, 1, 2]  # by cosine, not by dot product (row 0 has the largest norm)
    torch.testing.assert_close(nn_z, support[idx])


def test_nnclr_loss_by_hand():
    nn_z = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    p = torch.tensor([[0.6, 0.8], [0.0, 1.0]])
    tau = 0.5
    # anchors NN_i, candidates p_k: cos(NN0, p0) 0.6, cos(NN0, p1) 0; cos(NN1, p0) 0.8, cos(NN1, p1) 1
    l0 = -math.log(math.exp(0.6 / tau) / (math.exp(0.6 / tau) + math.exp(0)))
    l1 = -math.log(math.exp(1 / tau) / (math.exp(0.8 / tau) + math.exp(1 / tau)))
    assert nnclr_loss(nn_z, p, tau).item() == pytest.approx((l0 + l1) / 2, rel=1e-6)


def test_nnclr_loss_rank_offset_and_no_gradient_to_the_neighbours():
    g = torch.Generator().manual_seed(8)
    nn_all, p_all = torch.randn(6, 4, generator=g), torch.randn(6, 4, generator=g)
    whole = nnclr_loss(nn_all, p_all, 0.1)
    parts = [nnclr_loss(nn_all[3 * r:3 * r + 3], p_all[3 * r:3 * r + 3], 0.1, all_p=p_all, rank=r) for r in (0, 1)]
    torch.testing.assert_close(sum(parts) / 2, whole)
    nn_z = nn_all.clone().requires_grad_(True)
    p = p_all.clone().requires_grad_(True)
    nnclr_loss(nn_z, p, 0.1).backward()
    assert nn_z.grad is None and p.grad.abs().sum() > 0
    assert F.normalize(nn_all, dim=1).shape == (6, 4)
