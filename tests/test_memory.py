"""runs/memory.py: the step's memory estimated before the first step (issue "The practitioner's path", part 2), and
a step that would not fit refused in one line naming the keys that shrink it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from selfsup.errors import UserError
from selfsup.runs import memory
from selfsup.runs.memory import check_step_memory, saved_bytes, step_estimate
from ssl_helpers import tiny_config, tiny_method


def test_saved_bytes_counts_what_autograd_keeps_and_not_the_weights():
    """Linear keeps its input (8 floats), ReLU its output (16 floats); the weight is not an activation."""
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
    assert saved_bytes(net, torch.zeros(1, 8)) == (8 + 16) * 4


def test_the_estimate_grows_with_the_tokens_and_the_batch_and_leaves_no_trace():
    m = tiny_method("simclr")  # micro ViT, 8 px, patch 2
    before = {k: v.clone() for k, v in m.state_dict().items()}
    rng = torch.get_rng_state()
    small = step_estimate(m, 16)
    assert torch.equal(rng, torch.get_rng_state())  # a seeded run draws as without the probe
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())
    assert small.sizes == (8, 8) and small.per_image > 0 and small.total == small.per_image * 16 + small.state
    from selfsup.methods import DataInfo
    from selfsup.methods.build import build_method

    big = build_method(tiny_config("simclr", data={"image_size": 32}), DataInfo(1, 32, (0.5,), (0.25,)))
    assert step_estimate(big, 16).sizes == (32, 32)
    assert step_estimate(big, 16).per_image > 8 * small.per_image  # 256 tokens an image, not 16
    assert step_estimate(tiny_method("dino", {"out_dim": 64}), 16).sizes[:2] == (8, 8)


def test_a_step_that_would_not_fit_is_one_line_naming_the_keys(monkeypatch):
    m = tiny_method("simclr")
    cfg = tiny_config("simclr")
    est = step_estimate(m, cfg.data.batch_size)
    monkeypatch.setattr(memory, "free_memory", lambda device: est.total * 100)
    assert check_step_memory(m, cfg, torch.device("cpu")).total == est.total  # fits: runs
    monkeypatch.setattr(memory, "free_memory", lambda device: (est.state + est.per_image * 3.5) / memory.FIT_SHARE)
    with pytest.raises(UserError) as e:
        check_step_memory(m, cfg, torch.device("cpu"))
    line = str(e.value)
    assert "\n" not in line and "data.batch_size=3 or lower" in line and "model.patch_size" in line
    assert "16 tokens an image at model.patch_size=2" in line


def test_the_flow_family_is_not_estimated():
    assert step_estimate(nn.Linear(2, 2), 4) is None
