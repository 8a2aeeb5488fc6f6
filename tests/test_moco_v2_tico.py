"""MoCo v2 and TiCo against references written here from the official code's facts (docs/contrastive.md):
MoCo's InfoNCE with the queue (moco builder.py:138-171), its FIFO queue, the key encoder's EMA before the keys,
the v2 head; TiCo's loss and running covariance (sayannag TiCo/main.py:72-78), lightly's detached B as the option;
three whole steps of each from the same state against a plain loop; the collapse signs; one-line config errors."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from selfsup.losses import moco_info_nce, tico_loss
from ssl_helpers import random_views, raises_user_error, tiny_method


def moco(**extra):
    return tiny_method("moco_v2", extra, data={"batch_size": 8}).train()


def tico(**extra):
    return tiny_method("tico", extra, data={"batch_size": 8}).train()


# --------------------------------------------------------------------------- MoCo v2
def test_moco_info_nce_is_the_cross_entropy_of_the_positive_among_the_queue_by_hand():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 3, generator=g), torch.randn(2, 3, generator=g)
    queue = F.normalize(torch.randn(4, 3, generator=g), dim=1)
    t = 0.2
    expected = 0.0
    for i in range(2):  # −log(exp(q·k/τ) / (exp(q·k/τ) + Σ_j exp(q·queue_j/τ))), unit q and k
        qi, ki = q[i] / q[i].norm(), k[i] / k[i].norm()
        pos = math.exp(float(qi @ ki) / t)
        neg = sum(math.exp(float(qi @ queue[j]) / t) for j in range(4))
        expected += -math.log(pos / (pos + neg)) / 2
    assert moco_info_nce(q, k, queue, t).item() == pytest.approx(expected, rel=1e-5)


def test_moco_head_is_v2s_mlp_and_the_queue_starts_unit_and_is_checkpointed():
    m = moco()
    kinds = [type(x) for x in m.projector]
    assert kinds == [nn.Linear, nn.ReLU, nn.Linear]  # builder.py:34-41: no BatchNorm, biases kept
    assert (m.projector[0].in_features, m.projector[0].out_features) == (m.backbone.num_features, 64)
    assert m.projector[2].out_features == 32
    assert m.projector[0].bias is not None and m.projector[2].bias is not None
    assert [type(x) for x in moco(mlp=False, proj_hidden_dim=0).projector] == [nn.Linear]  # v1's fc
    assert [type(x) for x in moco(hidden_bn=True).projector] == [nn.Linear, nn.BatchNorm1d, nn.ReLU, nn.Linear]
    assert moco(proj_hidden_dim=0).projector[0].out_features == m.backbone.num_features  # the code's dim_mlp
    torch.testing.assert_close(m.queue.norm(dim=1), torch.ones(48))
    assert {"queue", "queue_ptr"} <= set(m.state_dict())
    assert m.cfg.method.momentum == 0.999 and m.cfg.method.momentum_schedule == "constant"  # builder.py:16, 63


def test_moco_step_updates_the_key_encoder_before_the_keys_then_enqueues_them():
    m = moco()
    m.momentum = 0.9
    with torch.no_grad():  # move the online encoder away from the key encoder
        for p in m.backbone.parameters():
            p.add_(0.01 * torch.randn_like(p))
    online = copy.deepcopy(m.backbone), copy.deepcopy(m.projector)
    key = copy.deepcopy(m.momentum_backbone), copy.deepcopy(m.momentum_projector)
    queue = m.queue.clone()
    v = random_views(8)
    out = m.forward_views(v)
    with torch.no_grad():  # builder.py:60-63: θ_k ← 0.9 θ_k + 0.1 θ_q, then the keys of view 2
        for o, k in zip(online, key):
            for po, pk in zip(o.parameters(), k.parameters()):
                pk.mul_(0.9).add_(0.1 * po)
        q = online[1](online[0](v[0]))
        k = F.normalize(key[1](key[0](v[1])), dim=1)
    torch.testing.assert_close(out.loss.detach(), moco_info_nce(q, k, queue, 0.2))
    torch.testing.assert_close(m.queue[:8], k)  # enqueued after the loss, at ptr 0 (builder.py:76)
    torch.testing.assert_close(m.queue[8:], queue[8:])
    assert int(m.queue_ptr) == 8
    for pm, pk in zip(m.momentum_backbone.parameters(), key[0].parameters()):
        torch.testing.assert_close(pm, pk)
    assert out.instruments["moco_queue_similarity"].item() == pytest.approx((k @ queue.t()).mean().item(), abs=1e-6)


def test_moco_queue_ptr_wraps_after_k_over_b_steps():
    m = moco(queue_size=16)
    keys = []
    for step in range(3):  # rows 0-7, 8-15, then 0-7 again
        out = m.forward_views(random_views(8, seed=step))
        keys.append(out.target)
    assert int(m.queue_ptr) == 8
    torch.testing.assert_close(m.queue, torch.cat([keys[2], keys[1]]))


def test_three_moco_steps_are_the_official_loop():
    """Three SGD steps from one state: builder.py's forward (EMA, q, k, logits against the queue as (D, K) columns,
    CE, then the enqueue) and main_moco.py's SGD (lr, momentum 0.9, wd 1e-4) written as a plain loop."""
    torch.manual_seed(0)
    m = moco(temperature=0.2, momentum=0.99)
    m.momentum = 0.99
    enc_q = nn.Sequential(copy.deepcopy(m.backbone), copy.deepcopy(m.projector))
    enc_k = nn.Sequential(copy.deepcopy(m.momentum_backbone), copy.deepcopy(m.momentum_projector))
    queue, ptr = m.queue.t().clone(), 0  # the code's (dim, K)
    params = [p for mod in m.trainable().values() for p in mod.parameters()]
    opt = torch.optim.SGD(params, lr=0.03, momentum=0.9, weight_decay=1e-4)
    ref_opt = torch.optim.SGD(enc_q.parameters(), lr=0.03, momentum=0.9, weight_decay=1e-4)
    for step in range(3):
        v = random_views(8, seed=10 + step)
        opt.zero_grad()
        m.forward_views(v).loss.backward()
        opt.step()
        with torch.no_grad():
            for pq, pk in zip(enc_q.parameters(), enc_k.parameters()):
                pk.data = pk.data * 0.99 + pq.data * 0.01
        q = F.normalize(enc_q(v[0]), dim=1)
        with torch.no_grad():
            k = F.normalize(enc_k(v[1]), dim=1)
        logits = torch.cat([(q * k).sum(1, keepdim=True), q @ queue.clone().detach()], dim=1) / 0.2
        ref_opt.zero_grad()
        F.cross_entropy(logits, torch.zeros(8, dtype=torch.long)).backward()
        ref_opt.step()
        queue[:, ptr:ptr + 8] = k.T
        ptr = (ptr + 8) % 48
    for a, b in zip(params, enc_q.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(m.queue, queue.t(), rtol=1e-5, atol=1e-6)
    assert int(m.queue_ptr) == ptr == 24


# --------------------------------------------------------------------------- TiCo
def reference_tico(c_prev, x1, x2, beta, rho):
    """sayannag TiCo/main.py:72-78 written out: B, C, the loss; C returned with its graph (detached by the loop)."""
    z1, z2 = x1 / x1.norm(dim=1, keepdim=True), x2 / x2.norm(dim=1, keepdim=True)
    b = z1.T @ z1 / z1.shape[0]
    c = beta * c_prev + (1 - beta) * b
    loss = -(z1 * z2).sum(1).mean() + rho * torch.einsum("nd,de,ne->n", z1, c, z1).mean()
    return loss, c


def test_tico_loss_and_its_gradient_are_the_reference_codes():
    g = torch.Generator().manual_seed(1)
    x1 = torch.randn(6, 4, generator=g, requires_grad=True)
    x2, c_prev = torch.randn(6, 4, generator=g), torch.rand(4, 4, generator=g)
    loss, c = tico_loss(x1, x2, c_prev, beta=0.9, rho=8.0)
    x1r = x1.detach().clone().requires_grad_(True)
    ref, ref_c = reference_tico(c_prev, x1r, x2, 0.9, 8.0)
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(c, ref_c.detach())
    loss.backward(), ref.backward()
    torch.testing.assert_close(x1.grad, x1r.grad)  # B's gradient inside C, as main.py:75-77
    # lightly's option (tico_loss.py:124): B detached; the value is the same, the gradient is not
    x1d = x1.detach().clone().requires_grad_(True)
    loss_d, _ = tico_loss(x1d, x2, c_prev, beta=0.9, rho=8.0, covariance_gradient=False)
    loss_d.backward()
    torch.testing.assert_close(loss_d, ref)
    assert not torch.allclose(x1d.grad, x1r.grad)


def test_tico_head_and_covariance_buffer():
    m = tico()
    kinds = [type(x) for x in m.projector]
    assert kinds == [nn.Linear, nn.BatchNorm1d, nn.ReLU, nn.Linear]  # main.py:46-47
    assert m.projector[0].bias is None and m.projector[3].bias is not None
    assert m.covariance.shape == (32, 32) and not m.covariance.any()  # zeros at the start (main.py:110)
    assert "covariance" in m.state_dict()
    assert (m.cfg.method.beta, m.cfg.method.rho) == (0.9, 8.0)


def test_three_tico_steps_are_the_reference_loop():
    """Three steps from one state: main.py's loop (the EMA before the forward, C_prev carried detached, SGD)."""
    torch.manual_seed(0)
    m = tico(momentum=0.99)
    m.momentum = 0.99
    f = nn.Sequential(copy.deepcopy(m.backbone), copy.deepcopy(m.projector))
    fm = nn.Sequential(copy.deepcopy(m.momentum_backbone), copy.deepcopy(m.momentum_projector))
    params = [p for mod in m.trainable().values() for p in mod.parameters()]
    opt = torch.optim.SGD(params, lr=0.06)
    ref_opt = torch.optim.SGD(f.parameters(), lr=0.06)
    c_prev = torch.zeros(32, 32)
    for step in range(3):
        v = random_views(8, seed=20 + step)
        opt.zero_grad()
        out = m.forward_views(v)
        out.loss.backward()
        opt.step()
        with torch.no_grad():
            for p, pm in zip(f.parameters(), fm.parameters()):
                pm.mul_(0.99).add_(0.01 * p)
        ref, c = reference_tico(c_prev, f(v[0]), fm(v[1]).detach(), 0.9, 8.0)
        c_prev = c.detach()
        ref_opt.zero_grad()
        ref.backward()
        ref_opt.step()
        torch.testing.assert_close(out.loss.detach(), ref.detach(), rtol=1e-5, atol=1e-6)
    for a, b in zip(params, f.parameters()):  # float noise of another summation order, amplified by ρ = 8
        torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-5)
    torch.testing.assert_close(m.covariance, c_prev, rtol=1e-4, atol=1e-5)
    conc = out.instruments["tico_covariance_concentration"].item()
    assert conc == pytest.approx(float((c_prev ** 2).sum() / c_prev.trace() ** 2), rel=1e-5)
    assert 1 / 32 <= conc <= 1


def test_collapse_signs_are_in_the_alarm():
    from selfsup.instruments.collapse import SIGNS

    names = {s.name: s for s in SIGNS}
    assert names["moco_queue_similarity"].above and names["tico_covariance_concentration"].above


def test_config_errors_are_one_line():
    with raises_user_error("method.queue_size=20", "data.batch_size=8"):
        moco(queue_size=20)
    with raises_user_error("method.temperature"):
        moco(temperature=0.0)
    with raises_user_error("method.beta"):
        tico(beta=1.0)
    with raises_user_error("method.rho"):
        tico(rho=-1.0)
    with raises_user_error("augment.local_crops_number"):
        tiny_method("moco_v2", {}, data={"batch_size": 8}, augment={"local_crops_number": 2, "local_crops_size": 4})
