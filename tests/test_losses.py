"""Losses against hand computations and loop-based references (selfsup.losses)."""

import math

import pytest
import torch

from selfsup.losses import byol_regression, info_nce, negative_cosine, nt_xent


def _unit(v):
    n = math.sqrt(sum(x * x for x in v))
    return [x / n for x in v]


def _dot(a, b):
    return sum(x * y for x, y in zip(a, b))


# --------------------------------------------------------------------------- info_nce


def test_info_nce_2x2_by_hand():
    # q already unit; k scaled by 3 and 0.5: normalisation must undo the scale.
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    k = torch.tensor([[3.0, 0.0], [0.5 * 0.6, 0.5 * 0.8]])
    tau = 0.5
    # cosines: q0·k0 = 1, q0·k1 = 0.6, q1·k0 = 0, q1·k1 = 0.8 ; labels (0, 1)
    ce0 = -math.log(math.exp(1 / tau) / (math.exp(1 / tau) + math.exp(0.6 / tau)))
    ce1 = -math.log(math.exp(0.8 / tau) / (math.exp(0 / tau) + math.exp(0.8 / tau)))
    expected = (ce0 + ce1) / 2 * 2 * tau
    got = info_nce(q, k, tau)
    assert got.ndim == 0
    assert got.item() == pytest.approx(expected, rel=1e-6)


def test_info_nce_2tau_factor_is_applied():
    q = torch.tensor([[1.0, 2.0], [-1.0, 0.5]])
    k = torch.tensor([[0.5, 1.0], [1.0, 1.0]])
    for tau in (0.1, 1.0, 2.0):
        qn = [_unit(r) for r in q.tolist()]
        kn = [_unit(r) for r in k.tolist()]
        ce = []
        for i in range(2):
            logits = [_dot(qn[i], kn[j]) / tau for j in range(2)]
            ce.append(-logits[i] + math.log(sum(math.exp(x) for x in logits)))
        expected = sum(ce) / 2 * 2 * tau
        assert info_nce(q, k, tau).item() == pytest.approx(expected, rel=1e-6)


def test_info_nce_rank_offset_with_global_keys():
    # 2 local queries, 6 keys = 3 processes × 2; on rank 1 the positives are keys 2 and 3.
    q = torch.tensor([[1.0, 0.0], [0.6, 0.8]])
    angles = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0]
    k = torch.tensor([[math.cos(a), math.sin(a)] for a in angles]) * 2.0
    tau = 0.2
    qn = [_unit(r) for r in q.tolist()]
    kn = [_unit(r) for r in k.tolist()]

    def expected(rank):
        total = 0.0
        for i in range(2):
            logits = [_dot(qn[i], kn[j]) / tau for j in range(6)]
            total += -logits[i + 2 * rank] + math.log(sum(math.exp(x) for x in logits))
        return total / 2 * 2 * tau

    values = [info_nce(q, k, tau, rank=r).item() for r in range(3)]
    for r in range(3):
        assert values[r] == pytest.approx(expected(r), rel=1e-6)
    assert len({round(v, 6) for v in values}) == 3  # the rank really changes the labels


def test_info_nce_3x2_by_hand():
    # 3 queries of dimension 2
    q = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    k = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    tau = 1.0
    s = 1 / math.sqrt(2)
    cos = [[1, 0, -1], [0, 1, 0], [s, s, -s]]
    ce = [-cos[i][i] + math.log(sum(math.exp(c) for c in cos[i])) for i in range(3)]
    assert info_nce(q, k, tau).item() == pytest.approx(sum(ce) / 3 * 2, rel=1e-6)


# --------------------------------------------------------------------------- nt_xent


def nt_xent_reference(z1, z2, tau, all_z1=None, all_z2=None, rank=0, decoupled=False):
    """Loop over the 2N local anchors; candidates = all 2M global vectors except the anchor itself."""
    z1, z2 = z1.tolist(), z2.tolist()
    all_z1 = z1 if all_z1 is None else all_z1.tolist()
    all_z2 = z2 if all_z2 is None else all_z2.tolist()
    n, m = len(z1), len(all_z1)
    cands = [_unit(v) for v in all_z1 + all_z2]
    total = 0.0
    for view, zs in enumerate((z1, z2)):
        for i in range(n):
            a = _unit(zs[i])
            g = rank * n + i  # global index inside its view
            self_j = g + view * m
            pos_j = g + (1 - view) * m
            pos = math.exp(_dot(a, cands[pos_j]) / tau)
            den = 0.0
            for j, c in enumerate(cands):
                if j == self_j or (decoupled and j == pos_j):
                    continue
                den += math.exp(_dot(a, c) / tau)
            total += -math.log(pos / den)
    return total / (2 * n)


def test_nt_xent_tiny_by_hand():
    # N = 1: anchors z1, z2; each has the other as only candidate → loss 0 (softmax over one item)
    z1 = torch.tensor([[1.0, 0.0]])
    z2 = torch.tensor([[0.0, 1.0]])
    assert nt_xent(z1, z2, 0.5).item() == pytest.approx(0.0, abs=1e-6)
    # N = 2, orthogonal-ish vectors, τ = 1: anchor z1[0]=e1 sees z1[1]=e2 (cos 0), z2[0]=e1 (pos, cos 1),
    # z2[1]=-e1 (cos -1)
    z1 = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    z2 = torch.tensor([[1.0, 0.0], [-1.0, 0.0]])
    e = math.e
    l_a0 = -math.log(e / (1 + e + 1 / e))  # z1[0]: pos z2[0] (1), others z1[1] (0), z2[1] (-1)
    l_a1 = -math.log(1 / (1 + 1 + 1))  # z1[1]=e2: pos z2[1] (0), others z1[0] (0), z2[0] (0)
    l_b0 = -math.log(e / (e + 1 + 1 / e))  # z2[0]=e1: pos z1[0] (1), others z1[1] (0), z2[1] (-1)
    l_b1 = -math.log(1 / (1 / e + 1 + 1 / e))  # z2[1]=-e1: pos z1[1] (0), others z1[0] (-1), z2[0] (-1)
    assert nt_xent(z1, z2, 1.0).item() == pytest.approx((l_a0 + l_a1 + l_b0 + l_b1) / 4, rel=1e-6)


@pytest.mark.parametrize("decoupled", [False, True])
@pytest.mark.parametrize("tau", [0.1, 0.5])
def test_nt_xent_matches_loop_reference(decoupled, tau):
    g = torch.Generator().manual_seed(0)
    z1 = torch.randn(5, 4, generator=g, dtype=torch.float64)
    z2 = torch.randn(5, 4, generator=g, dtype=torch.float64)
    got = nt_xent(z1, z2, tau, decoupled=decoupled)
    assert got.item() == pytest.approx(nt_xent_reference(z1, z2, tau, decoupled=decoupled), rel=1e-9)


def test_nt_xent_decoupled_differs_and_is_lower():
    g = torch.Generator().manual_seed(1)
    z1, z2 = torch.randn(4, 3, generator=g), torch.randn(4, 3, generator=g)
    full, dec = nt_xent(z1, z2, 0.5).item(), nt_xent(z1, z2, 0.5, decoupled=True).item()
    assert dec < full  # removing a positive term from the denominator lowers every anchor's loss


@pytest.mark.parametrize("rank", [0, 1, 2])
@pytest.mark.parametrize("decoupled", [False, True])
def test_nt_xent_global_candidates_with_rank(rank, decoupled):
    # 3 processes × 2 samples; this process holds slice `rank` of the global batch.
    g = torch.Generator().manual_seed(2)
    all_z1 = torch.randn(6, 4, generator=g, dtype=torch.float64)
    all_z2 = torch.randn(6, 4, generator=g, dtype=torch.float64)
    z1, z2 = all_z1[2 * rank:2 * rank + 2], all_z2[2 * rank:2 * rank + 2]
    got = nt_xent(z1, z2, 0.2, all_z1=all_z1, all_z2=all_z2, rank=rank, decoupled=decoupled)
    ref = nt_xent_reference(z1, z2, 0.2, all_z1, all_z2, rank=rank, decoupled=decoupled)
    assert got.item() == pytest.approx(ref, rel=1e-9)


def test_nt_xent_global_mean_over_ranks_equals_whole_batch():
    g = torch.Generator().manual_seed(3)
    all_z1 = torch.randn(6, 4, generator=g, dtype=torch.float64)
    all_z2 = torch.randn(6, 4, generator=g, dtype=torch.float64)
    per_rank = [nt_xent(all_z1[2 * r:2 * r + 2], all_z2[2 * r:2 * r + 2], 0.3, all_z1=all_z1, all_z2=all_z2, rank=r)
                for r in range(3)]
    whole = nt_xent(all_z1, all_z2, 0.3)
    assert (sum(per_rank) / 3).item() == pytest.approx(whole.item(), rel=1e-12)


# --------------------------------------------------------------------------- negative cosine / BYOL


def test_negative_cosine_value():
    p = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 3.0]])
    z = torch.tensor([[2.0, 0.0], [-1.0, 0.0], [1.0, 0.0]])
    # cosines: 1, -1/√2, 0
    expected = -(1 - 1 / math.sqrt(2) + 0) / 3
    assert negative_cosine(p, z).item() == pytest.approx(expected, rel=1e-6)


def test_negative_cosine_stops_gradient_into_z():
    p = torch.tensor([[1.0, 2.0], [0.5, -1.0]], requires_grad=True)
    z = torch.tensor([[0.3, 1.0], [2.0, 1.0]], requires_grad=True)
    negative_cosine(p, z).backward()
    assert z.grad is None
    assert p.grad is not None and p.grad.abs().sum() > 0
    # the gradient of −mean cos(p, z) w.r.t. p_i: −(ẑ_i − cos_i p̂_i)/(N‖p_i‖)
    for i in range(2):
        pi, zi = p[i].detach(), z[i].detach()
        ph, zh = pi / pi.norm(), zi / zi.norm()
        cos = (ph * zh).sum()
        torch.testing.assert_close(p.grad[i], -(zh - cos * ph) / (2 * pi.norm()))


def test_negative_cosine_grad_does_not_flow_through_shared_parameter():
    # p and z both depend on w; only the p path may contribute.
    w = torch.tensor([[1.0, 0.5], [-0.2, 1.0]], requires_grad=True)
    x = torch.tensor([[1.0, 2.0], [0.3, -1.0]])
    y = torch.tensor([[0.5, 0.5], [2.0, 1.0]])
    negative_cosine(x @ w, y @ w).backward()
    g_full = w.grad.clone()
    w.grad = None
    negative_cosine(x @ w, (y @ w).detach()).backward()
    torch.testing.assert_close(g_full, w.grad)


def test_byol_regression_is_two_minus_two_cos():
    p = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 3.0]])
    z = torch.tensor([[2.0, 0.0], [-1.0, 0.0], [1.0, 0.0]])
    cos = [1.0, -1 / math.sqrt(2), 0.0]
    expected = sum(2 - 2 * c for c in cos) / 3
    assert byol_regression(p, z).item() == pytest.approx(expected, rel=1e-6)
    # equals the mean squared distance of the normalised vectors
    pn = torch.nn.functional.normalize(p, dim=1)
    zn = torch.nn.functional.normalize(z, dim=1)
    assert byol_regression(p, z).item() == pytest.approx(((pn - zn) ** 2).sum(1).mean().item(), rel=1e-6)


def test_byol_regression_stops_gradient_into_z():
    p = torch.tensor([[1.0, 2.0]], requires_grad=True)
    z = torch.tensor([[0.3, 1.0]], requires_grad=True)
    byol_regression(p, z).backward()
    assert z.grad is None and p.grad.abs().sum() > 0
