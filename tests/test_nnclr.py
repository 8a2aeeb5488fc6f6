"""NNCLR: the support set searched before its update, the paper's symmetric loss (eq. 2), the FIFO with its labels
and pointer, the neighbour's label agreement, and one-line config errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from selfsup.losses import nnclr_loss
from ssl_helpers import random_views, raises_user_error, tiny_method


def nnclr(**extra):
    return tiny_method("nnclr", extra, data={"batch_size": 8}).train()


def test_loss_is_the_symmetric_nn_infonce_searched_before_the_update():
    m = nnclr()
    support = m.support.clone()
    v = random_views(8)
    out = m.forward_views(v)
    with torch.no_grad():
        h = [m.backbone(x) for x in v]
        z = [m.projector(x) for x in h]
        p = [m.predictor(x) for x in z]
        nn_z = [support[(F.normalize(x, dim=1) @ support.t()).argmax(1)] for x in z]
        expected = 0.5 * (nnclr_loss(nn_z[0], p[1], 0.1) + nnclr_loss(nn_z[1], p[0], 0.1))
    torch.testing.assert_close(out.loss.detach(), expected)
    # the update came after the search: view 1's normalised z in the first 8 rows, the rest untouched
    torch.testing.assert_close(m.support[:8], F.normalize(z[0], dim=1))
    torch.testing.assert_close(m.support[8:], support[8:])
    assert int(m.support_ptr) == 8
    out.loss.backward()
    assert all(q.grad is not None for q in m.predictor.parameters())


def test_support_set_wraps_around_with_its_labels():
    m = nnclr(queue_size=20)
    for step in range(3):  # rows 0-7, 8-15, then 16-19 and 0-3
        m.forward_views(random_views(8, seed=step), labels=torch.full((8,), step))
    assert int(m.support_ptr) == 4
    assert m.support_labels.tolist() == [2] * 4 + [0] * 4 + [1] * 8 + [2] * 4


def test_neighbour_label_agreement():
    m = nnclr(queue_size=16)
    v = random_views(8)
    with torch.no_grad():
        z1 = m.projector(m.backbone(v[0]))
        m.support.copy_(torch.cat([F.normalize(z1, dim=1), -F.normalize(z1, dim=1)]))  # each row its own NN
    m.support_labels.copy_(torch.tensor([0, 1, 2, 3, -1, -1, 6, 7] + [9] * 8))
    labels = torch.tensor([0, 1, 9, 9, 4, 5, 6, 7])
    signs = m.forward_views(v, labels=labels).instruments
    assert signs["nnclr_nn_label_agreement"].item() == pytest.approx(4 / 6)  # rows 4, 5 have no known neighbour label
    assert signs["nnclr_nn_similarity"].item() > 0.99
    assert "nnclr_nn_label_agreement" not in nnclr().forward_views(v).instruments


def test_support_set_starts_as_random_unit_vectors_and_is_checkpointed():
    m = nnclr()
    torch.testing.assert_close(m.support.norm(dim=1), torch.ones(40))
    assert {"support", "support_labels", "support_ptr"} <= set(m.state_dict())


def test_config_errors_are_one_line():
    with raises_user_error("method.queue_size=4", "data.batch_size=8"):
        tiny_method("nnclr", {"queue_size": 4}, data={"batch_size": 8})
    with raises_user_error("method.temperature"):
        tiny_method("nnclr", {"temperature": 0.0})
