"""LARS against hand computations; parameter groups (selfsup.optim)."""

import math

import pytest
import torch
from torch import nn

from selfsup.optim import LARS, OptimConfig, build_optimizer, param_groups


def _norm(values):
    return math.sqrt(sum(v * v for v in values))


def test_lars_one_step_by_hand():
    w = nn.Parameter(torch.tensor([[3.0, 4.0], [0.0, 0.0]]))  # ‖w‖ = 5
    b = nn.Parameter(torch.tensor([1.0, -2.0]))
    w.grad = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    b.grad = torch.tensor([0.5, 0.25])
    lr, wd, eta = 0.1, 0.5, 0.01
    opt = LARS([w, b], lr=lr, weight_decay=wd, momentum=0.9, trust_coefficient=eta)
    opt.step()
    # weight: dp = g + wd·w = [[2.5, 2.0], [0, 2]]; q = η·5/‖dp‖; p −= lr·q·dp
    dp = [1.0 + 0.5 * 3, 0.0 + 0.5 * 4, 0.0, 2.0]
    q = eta * 5.0 / _norm(dp)
    expected_w = [v - lr * q * d for v, d in zip([3.0, 4.0, 0.0, 0.0], dp)]
    torch.testing.assert_close(w.detach().flatten(), torch.tensor(expected_w))
    # bias (1-D): neither decay nor adaptation: p −= lr·g
    torch.testing.assert_close(b.detach(), torch.tensor([1.0 - 0.1 * 0.5, -2.0 - 0.1 * 0.25]))


def test_lars_zero_norm_gives_trust_one():
    w = nn.Parameter(torch.zeros(2, 2))  # ‖p‖ = 0 → q = 1 (and wd adds nothing)
    w.grad = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    opt = LARS([w], lr=0.5, weight_decay=0.1, momentum=0.9, trust_coefficient=0.001)
    opt.step()
    torch.testing.assert_close(w.detach(), -0.5 * torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    # zero update norm: ‖dp‖ = 0 → q = 1 and the parameter does not move
    v = nn.Parameter(torch.tensor([[1.0, 1.0]]))
    v.grad = torch.tensor([[-0.5, -0.5]])  # g + wd·p = 0 with wd = 0.5
    opt = LARS([v], lr=1.0, weight_decay=0.5, momentum=0.9)
    opt.step()
    assert torch.isfinite(v).all()
    torch.testing.assert_close(v.detach(), torch.tensor([[1.0, 1.0]]))


def test_lars_momentum_over_two_steps():
    w = nn.Parameter(torch.tensor([[1.0, 2.0], [2.0, 0.0]]))  # ‖w‖ = 3
    b = nn.Parameter(torch.tensor([0.5]))
    lr, wd, m, eta = 0.2, 0.1, 0.9, 0.02
    opt = LARS([w, b], lr=lr, weight_decay=wd, momentum=m, trust_coefficient=eta)
    grads_w = [[1.0, 0.0, 0.0, 1.0], [0.5, -1.0, 2.0, 0.0]]
    grads_b = [1.0, -3.0]
    pw, pb = [1.0, 2.0, 2.0, 0.0], 0.5
    mu_w, mu_b = [0.0] * 4, 0.0
    for gw, gb in zip(grads_w, grads_b):
        w.grad = torch.tensor(gw).view(2, 2)
        b.grad = torch.tensor([gb])
        opt.step()
        dp = [g + wd * p for g, p in zip(gw, pw)]
        q = eta * _norm(pw) / _norm(dp)
        mu_w = [m * u + q * d for u, d in zip(mu_w, dp)]
        pw = [p - lr * u for p, u in zip(pw, mu_w)]
        mu_b = m * mu_b + gb
        pb = pb - lr * mu_b
        torch.testing.assert_close(w.detach().flatten(), torch.tensor(pw))
        torch.testing.assert_close(b.detach(), torch.tensor([pb]))


def test_lars_uses_group_weight_decay_and_skips_params_without_grad():
    a = nn.Parameter(torch.tensor([[1.0, 0.0]]))
    c = nn.Parameter(torch.tensor([[0.0, 1.0]]))
    frozen = nn.Parameter(torch.tensor([[5.0, 5.0]]))
    a.grad = torch.tensor([[0.0, 1.0]])
    c.grad = torch.tensor([[0.0, 1.0]])
    opt = LARS([dict(params=[a, frozen], weight_decay=1.0), dict(params=[c], weight_decay=0.0)],
               lr=1.0, momentum=0.0, trust_coefficient=1.0)
    opt.step()
    # a: dp = [1, 1], q = 1/√2 → a − dp/√2 ; c: dp = [0, 1], q = 1 → [0, 0]
    torch.testing.assert_close(a.detach(), torch.tensor([[1 - 1 / math.sqrt(2), -1 / math.sqrt(2)]]))
    torch.testing.assert_close(c.detach(), torch.tensor([[0.0, 0.0]]))
    torch.testing.assert_close(frozen.detach(), torch.tensor([[5.0, 5.0]]))


# --------------------------------------------------------------------------- parameter groups


def _modules():
    backbone = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4))
    backbone[0].weight.requires_grad_(False)  # frozen: must be left out
    projector = nn.Sequential(nn.Linear(4, 4, bias=False), nn.BatchNorm1d(4))
    predictor = nn.Sequential(nn.Linear(4, 5), nn.Linear(5, 4))
    return {"backbone": backbone, "projector": projector, "predictor": predictor}


def _ids(params):
    return {id(p) for p in params}


def test_param_groups_predictor_settings_and_frozen_left_out():
    mods = _modules()
    cfg = OptimConfig(name="adamw", weight_decay=0.1, predictor_lr_mult=10.0, predictor_weight_decay=0.0,
                      fix_predictor_lr=True, decay_1d=True)
    groups = param_groups(mods, cfg)
    pred = [g for g in groups if g["name"] == "predictor"]
    other = [g for g in groups if g["name"] != "predictor"]
    assert pred and other
    for g in pred:
        assert g["lr_scale"] == 10.0 and g["weight_decay"] == 0.0 and g["fixed_lr"] is True
    for g in other:
        assert g["lr_scale"] == 1.0 and g["weight_decay"] == 0.1 and g["fixed_lr"] is False
    assert _ids(p for g in pred for p in g["params"]) == _ids(mods["predictor"].parameters())
    all_ids = [id(p) for g in groups for p in g["params"]]
    assert len(all_ids) == len(set(all_ids))  # each parameter once
    trainable = [p for m in mods.values() for p in m.parameters() if p.requires_grad]
    assert set(all_ids) == _ids(trainable)
    assert id(mods["backbone"][0].weight) not in set(all_ids)


def test_param_groups_predictor_wd_defaults_to_weight_decay_and_lr_not_fixed():
    cfg = OptimConfig(name="sgd", weight_decay=1e-4, predictor_lr_mult=2.0)
    groups = param_groups(_modules(), cfg)
    for g in groups:
        assert g["weight_decay"] == 1e-4
        assert g["fixed_lr"] is False
        assert g["lr_scale"] == (2.0 if g["name"] == "predictor" else 1.0)


def test_param_groups_decay_1d_false_splits_biases():
    mods = _modules()
    cfg = OptimConfig(name="adamw", weight_decay=0.05, decay_1d=False, predictor_weight_decay=0.01)
    groups = param_groups(mods, cfg)
    one_d = _ids(p for m in mods.values() for p in m.parameters() if p.requires_grad and p.ndim <= 1)
    multi_d = _ids(p for m in mods.values() for p in m.parameters() if p.requires_grad and p.ndim > 1)
    for g in groups:
        ids = _ids(g["params"])
        if g["weight_decay"] == 0.0:
            assert ids <= one_d
        else:
            assert ids <= multi_d
            assert g["weight_decay"] == (0.01 if g["name"] == "predictor" else 0.05)
    zero = _ids(p for g in groups if g["weight_decay"] == 0.0 for p in g["params"])
    assert zero == one_d
    # predictor biases keep the predictor's lr multiplier in their wd-0 group
    pred_zero = [g for g in groups if g["name"] == "predictor" and g["weight_decay"] == 0.0]
    assert len(pred_zero) == 1 and _ids(pred_zero[0]["params"]) == _ids(
        [mods["predictor"][0].bias, mods["predictor"][1].bias])


def test_param_groups_decay_1d_true_keeps_one_group_per_module():
    groups = param_groups(_modules(), OptimConfig(name="adamw", decay_1d=True))
    assert sorted(g["name"] for g in groups) == ["backbone", "predictor", "projector"]


@pytest.mark.parametrize("name,cls", [("lars", LARS), ("sgd", torch.optim.SGD), ("adamw", torch.optim.AdamW)])
def test_build_optimizer_keeps_group_keys(name, cls):
    cfg = OptimConfig(name=name, momentum=0.8, trust_coefficient=0.002)
    opt = build_optimizer(param_groups(_modules(), cfg), cfg)
    assert isinstance(opt, cls)
    for g in opt.param_groups:
        assert {"lr_scale", "fixed_lr", "weight_decay"} <= set(g)
    if name == "lars":
        assert all(g["momentum"] == 0.8 and g["trust_coefficient"] == 0.002 for g in opt.param_groups)


# --------------------------------------------------------------------------- LARS's exempt group (LightlyTrain's)


class _TinyViT(nn.Module):
    """A ViT's parameter kinds under their selfsup / timm names: tokens, a position table, a linear layer, a norm,
    LayerScale."""

    def __init__(self):
        super().__init__()
        from selfsup.models.vit import LayerScale
        self.cls_token = nn.Parameter(torch.tensor([[[3.0, 4.0]]]))  # (1, 1, 2), ‖·‖ = 5
        self.pos_embed = nn.Parameter(torch.tensor([[[1.0, 0.0], [0.0, 2.0]]]))  # (1, 2, 2)
        self.proj = nn.Linear(2, 2)
        self.norm = nn.LayerNorm(2)
        self.ls1 = LayerScale(2, 0.1)
        with torch.no_grad():
            self.proj.weight.copy_(torch.tensor([[3.0, 0.0], [0.0, 4.0]]))  # ‖W‖ = 5
            self.proj.bias.copy_(torch.tensor([1.0, -1.0]))


def test_lars_exempt_group_gets_plain_sgd_by_hand():
    """LightlyTrain's no-decay group (optimizer_helpers.py:83-207) under lightly's LARS (lars.py:124-145): tokens,
    position table, LayerScale, norm, bias move by lr·g; only the linear weight is decayed and trust-scaled."""
    model = _TinyViT()
    lr, wd, eta = 0.1, 0.5, 0.01
    cfg = OptimConfig(name="lars", weight_decay=wd, trust_coefficient=eta, momentum=0.9)
    groups = param_groups({"backbone": model}, cfg)
    assert [(len(g["params"]), g["weight_decay"], g.get("exclude", False)) for g in groups] == [
        (5, wd, False), (2, 0.0, True)]  # the 1-D ones stay in the decayed group: LARS exempts them by shape
    opt = build_optimizer(groups, cfg)
    for g in opt.param_groups:
        g["lr"] = lr
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for n, p in model.named_parameters():
        p.grad = torch.full_like(p, 0.5) if n != "proj.weight" else torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    opt.step()
    for n, p in model.named_parameters():
        if n == "proj.weight":
            continue
        torch.testing.assert_close(p.detach(), before[n] - lr * 0.5, msg=n)  # no decay, no trust ratio
    dp = torch.tensor([[1.0 + wd * 3.0, 0.0], [0.0, 2.0 + wd * 4.0]])
    q = eta * 5.0 / dp.norm()
    torch.testing.assert_close(model.proj.weight.detach(), before["proj.weight"] - lr * q * dp)


def test_lars_exempt_matches_lightlytrain_kinds_on_a_selfsup_vit_and_shape_on_a_resnet():
    from selfsup.models.backbones import build_backbone
    from selfsup.optim import lars_exempt
    vit = build_backbone("vit_micro", in_chans=1, image_size=8, patch_size=2, layer_scale=0.1, registers=2,
                         pos_embed="learned", init="trunc_normal")
    exempt = lars_exempt(vit)
    assert {n for n, p in vit.named_parameters() if id(p) in exempt and p.ndim > 1} == {
        "cls_token", "pos_embed", "register_tokens"}
    assert all(id(p) in exempt for n, p in vit.named_parameters() if n.endswith(("gamma", "bias")) or "norm" in n)
    assert all(n.endswith(".weight") and "norm" not in n for n, p in vit.named_parameters() if id(p) not in exempt)
    # a ResNet and its head: exactly the ndim <= 1 parameters (BYOL / SimCLR / Barlow Twins / VICReg / MoCo v3),
    # and the groups of a LARS run stay one per module
    resnet = build_backbone("resnet18", in_chans=3, image_size=32)
    head = nn.Sequential(nn.Linear(512, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 4))
    for m in (resnet, head):
        assert lars_exempt(m) == {id(p) for p in m.parameters() if p.ndim <= 1}
    groups = param_groups({"backbone": resnet, "projector": head}, OptimConfig(name="lars"))
    assert [g["name"] for g in groups] == ["backbone", "projector"]


def test_lars_lr_1d_mult_moves_the_whole_exempt_group():
    model = _TinyViT()
    groups = param_groups({"backbone": model}, OptimConfig(name="lars", weight_decay=1e-6, lr_1d_mult=0.024))
    exempt = [g for g in groups if g.get("exclude")]
    assert len(exempt) == 1 and exempt[0]["lr_scale"] == 0.024 and exempt[0]["weight_decay"] == 0.0
    assert _ids(exempt[0]["params"]) == _ids(p for n, p in model.named_parameters() if n != "proj.weight")


def test_lars_group_from_an_older_checkpoint_without_the_exclude_key_steps():
    w = nn.Parameter(torch.tensor([[3.0, 4.0]]))
    w.grad = torch.tensor([[1.0, 0.0]])
    opt = LARS([w], lr=1.0, momentum=0.0, trust_coefficient=1.0)
    del opt.param_groups[0]["exclude"]
    opt.step()  # the per-shape rule alone: trust-scaled
    torch.testing.assert_close(w.detach(), torch.tensor([[3.0 - 5.0, 4.0]]))
