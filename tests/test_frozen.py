"""methods/frozen.py: the one object that holds a network that does not train (a distillation teacher, REPA's
encoder): frozen in eval mode whatever the method's mode, in no state dict, its facts in run.json, its sha256 in
each checkpoint and checked on resume; the input map (a grey run feeding a 3-channel network)."""

from __future__ import annotations

import copy

import pytest
import torch

from selfsup.errors import UserError
from selfsup.methods.frozen import FrozenNetwork, Renormalise
from selfsup.weights import StartFacts, state_sha256
from ssl_helpers import tiny_method


def held(model):
    network = copy.deepcopy(model.backbone)
    facts = StartFacts(source="a-teacher", kind="selfsup", sha256=state_sha256(network.state_dict()))
    net = FrozenNetwork(network, facts, Renormalise((0.5,), (0.25,), ((0.3,), (0.3,))), "teacher",
                        "method.teacher.weights", "distill_teacher_sha256")
    model.teacher = net
    model.frozen_networks.append(net)
    return net


def test_a_frozen_network_stays_frozen_and_outside_the_method():
    """Eval mode after the whole method is set to train (Lightning at the start of fit), no gradient, not a momentum
    target, not a child (no state-dict key, not in ``step_modules``), untouched by the EMA step."""
    model = tiny_method("dino")
    net = held(model)
    model.train()
    assert not net.network.training and all(not m.training for m in net.network.modules())
    assert model.teacher_backbone.training and model.backbone.training
    assert not any(p.requires_grad for p in net.parameters())
    assert all(t is not net.network for _, t in model.momentum_pairs)
    assert not any(k.startswith("teacher.") for k in model.state_dict())
    assert all(m is not net.network for m in model.step_modules().values())
    before = [p.clone() for p in net.parameters()]
    model.ema_step(0.5)
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters()))


def test_its_call_is_the_network_on_its_own_input_without_gradient():
    model = tiny_method("dino")
    net = held(model)
    x = torch.randn(4, 1, 8, 8, requires_grad=True)
    out = net(x)
    assert not out.requires_grad
    torch.testing.assert_close(out, net.network(((x * 0.25 + 0.5) - 0.3) / 0.3), rtol=1e-5, atol=1e-6)


def test_its_facts_and_sha256_go_to_run_json_and_each_checkpoint_and_are_checked_on_resume():
    model = tiny_method("dino")
    net = held(model)
    assert model.run_facts["teacher"]["source"] == "a-teacher"
    checkpoint = {}
    model.on_save_checkpoint(checkpoint)
    assert checkpoint["distill_teacher_sha256"] == net.sha256 and len(net.sha256) == 64
    model.on_load_checkpoint(checkpoint)  # the same network: resumes
    checkpoint["distill_teacher_sha256"] = "0" * 64
    with pytest.raises(UserError, match="method.teacher.weights=a-teacher is not the teacher this run trained with"):
        model.on_load_checkpoint(checkpoint)
    model.on_load_checkpoint({})  # a checkpoint written before the network was checked: nothing to compare


def test_a_grey_run_feeds_a_3_channel_network_its_channel_normalised_per_channel():
    """A 1-channel run's image repeated to 3 channels, each in the network's own statistics (not their mean, not a
    summed stem)."""
    norm = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    x = torch.rand(2, 1, 4, 4)
    out = Renormalise((0.5,), (0.25,), norm, 3)(x)
    pixels = x * 0.25 + 0.5
    for c in range(3):
        torch.testing.assert_close(out[:, c], ((pixels - norm[0][c]) / norm[1][c])[:, 0])
    same = Renormalise((0.5,), (0.25,), ((0.3,), (0.3,)), 1)(x)
    assert same.shape == x.shape
    torch.testing.assert_close(same, (pixels - 0.3) / 0.3)
    with pytest.raises(UserError, match="the frozen network takes 3-channel images, the data has 2"):
        Renormalise((0.5, 0.5), (0.25, 0.25), norm, 3)


def test_its_sha256_is_the_sources_whatever_the_runs_image_size(tmp_path):
    """The resume check compares the source's tensors as read: a teacher whose learned positions are resampled to
    another image size (the folder recipe may pick another size under another precision or machine) is the same
    teacher; what was loaded (``facts.sha256``) differs."""
    from selfsup.export import export_backbone
    from selfsup.methods import DataInfo
    from selfsup.methods.frozen import load_teacher
    from selfsup.models.backbones import build_backbone

    kwargs = {"in_chans": 1, "image_size": 8, "patch_size": 4, "pos_embed": "learned"}
    path = tmp_path / "teacher.safetensors"
    export_backbone(build_backbone("vit_micro", **kwargs), path,
                    {"backbone": "vit_micro", "kwargs": kwargs, "image_size": 8, "in_chans": 1, "mean": [0.3],
                     "std": [0.3], "dataset": "digits", "method": "moco_v3"})
    at8, at16 = (load_teacher(str(path), "auto", {}, DataInfo(1, size, (0.5,), (0.25,))) for size in (8, 16))
    assert at8.facts["sha256"] != at16.facts["sha256"] and at16.facts["resampled"]
    assert at8.sha256 == at16.sha256 and len(at8.sha256) == 64
