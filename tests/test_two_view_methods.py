"""The four methods: outputs, momentum targets, heads, frozen ViT parts, stop-gradients."""

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from ssl_helpers import METHOD_NAMES, filled_tensors, random_views, tiny_config, tiny_method

EXPECTED_KEYS = {
    "moco_v3": {"loss", "embedding", "embedding2", "projection", "prediction", "target"},
    "byol": {"loss", "embedding", "embedding2", "projection", "prediction", "target"},
    "simsiam": {"loss", "embedding", "embedding2", "projection", "prediction", "target"},
    "simclr": {"loss", "embedding", "embedding2", "projection"},
}
TARGETS = {"moco_v3": ("momentum_backbone", "momentum_projector"), "byol": ("target_backbone", "target_projector")}


@pytest.fixture(scope="module")
def models():
    return {name: tiny_method(name) for name in METHOD_NAMES}


@pytest.mark.parametrize("name", METHOD_NAMES)
def test_forward_views_outputs(models, name):
    m = models[name]
    out = m.forward_views(random_views(8))
    filled = filled_tensors(out)
    assert set(filled) == EXPECTED_KEYS[name] and not out.scalars and not out.instruments
    loss = out.loss
    assert loss.ndim == 0 and torch.isfinite(loss) and loss.requires_grad
    assert out.embedding.shape == out.embedding2.shape == (8, m.backbone.num_features)
    for key in EXPECTED_KEYS[name] - {"loss", "embedding", "embedding2"}:
        assert filled[key].shape == (8, 32), key
    for key, value in filled.items():
        if key != "loss":
            assert not value.requires_grad, f"{key} must be detached"
            assert torch.isfinite(value).all()


@pytest.mark.parametrize("name", ["moco_v3", "byol"])
def test_momentum_update_is_ema(name):
    m = tiny_method(name)
    online = [getattr(m, t.replace("momentum_", "").replace("target_", "")) for t in TARGETS[name]]
    targets = [getattr(m, t) for t in TARGETS[name]]
    with torch.no_grad():  # make online ≠ target (they start equal)
        for module in online:
            for p in module.parameters():
                p.add_(torch.randn_like(p) * 0.1)
    before_t = [p.detach().clone() for t in targets for p in t.parameters()]
    before_o = [p.detach().clone() for o in online for p in o.parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(before_t, before_o))
    m.momentum = 0.9  # this step's momentum (on_train_batch_start sets it in fit)
    m.update_momentum_encoder()
    after_t = [p.detach() for t in targets for p in t.parameters()]
    assert len(after_t) == len(before_o) > 0
    for t0, o0, t1 in zip(before_t, before_o, after_t):
        torch.testing.assert_close(t1, 0.9 * t0 + 0.1 * o0)
    # online parameters are untouched by the update
    for o0, o1 in zip(before_o, [p for o in online for p in o.parameters()]):
        assert torch.equal(o0, o1.detach())


@pytest.mark.parametrize("name", ["moco_v3", "byol"])
def test_targets_are_frozen_and_get_no_grad(name):
    m = tiny_method(name)
    target_params = {id(p) for t in TARGETS[name] for p in getattr(m, t).parameters()}
    assert target_params
    for t in TARGETS[name]:
        assert all(not p.requires_grad for p in getattr(m, t).parameters())
    m.forward_views(random_views(8)).loss.backward()
    for n, p in m.named_parameters():
        if id(p) in target_params:
            assert p.grad is None, n
        elif p.requires_grad:
            assert p.grad is not None and torch.isfinite(p.grad).all(), f"online parameter {n} got no gradient"
    # the optimiser does not see the targets
    opt = m.configure_optimizers()
    assert not {id(p) for g in opt.param_groups for p in g["params"]} & target_params


@pytest.mark.parametrize("name", ["simsiam", "simclr"])
def test_every_trainable_parameter_gets_a_gradient(name):
    m = tiny_method(name)
    m.forward_views(random_views(8)).loss.backward()
    for n, p in m.named_parameters():
        if p.requires_grad:
            assert p.grad is not None and torch.isfinite(p.grad).all(), n


def _last_bn(seq):
    return [mod for mod in seq if isinstance(mod, nn.BatchNorm1d)][-1]


def test_moco_v3_heads_match_official_layout(models):
    m = models["moco_v3"]
    for head in (m.projector, m.predictor):  # ViT: both end in BN(affine=False)
        assert isinstance(head[-1], nn.BatchNorm1d)
        assert head[-1].weight is None and head[-1].bias is None
        assert all(lin.bias is None for lin in head if isinstance(lin, nn.Linear))
    assert sum(isinstance(mod, nn.Linear) for mod in m.projector) == 3
    assert sum(isinstance(mod, nn.Linear) for mod in m.predictor) == 2


def test_simsiam_and_byol_heads(models):
    s = models["simsiam"]
    assert s.projector[-1].weight is None  # BN(affine=False) after the last projector Linear
    assert isinstance(s.predictor[-1], nn.Linear) and s.predictor[-1].bias is not None
    b = models["byol"]
    assert isinstance(b.projector[-1], nn.Linear) and isinstance(b.predictor[-1], nn.Linear)
    for head in (b.projector, b.predictor):  # official haiku MLP: biased hidden Linear, bias-free output Linear
        assert head[0].bias is not None and head[-1].bias is None
    c = models["simclr"]
    assert _last_bn(c.projector) is c.projector[-1]
    # official SimCLR: the last BN has a scale but no shift (center=False)
    assert c.projector[-1].weight.requires_grad and not c.projector[-1].bias.requires_grad
    assert torch.count_nonzero(c.projector[-1].bias) == 0


@pytest.mark.train
def test_frozen_patch_projection_and_pos_embed_unchanged_after_training(tmp_path):
    from selfsup.engine import pretrain

    cfg = tiny_config("moco_v3", trainer={"limit_train_batches": 3, "log_every_n_steps": 1},
                      output_dir=str(tmp_path), name="run")
    init = tiny_method("moco_v3", trainer={"limit_train_batches": 3})  # the same seeded init as the run
    run_dir = pretrain(cfg, "test")
    before = load_file(str(run_dir / "backbone_init.safetensors"))
    after = load_file(str(run_dir / "backbone.safetensors"))
    for key in ("patch_embed.proj.weight", "patch_embed.proj.bias", "pos_embed"):
        assert torch.equal(before[key], after[key]), f"{key} changed during training"
        assert torch.equal(before[key], init.backbone.state_dict()[key])
    changed = [k for k in before if k.startswith("blocks.") and not torch.equal(before[k], after[k])]
    assert len(changed) > 0.9 * len([k for k in before if k.startswith("blocks.")])
    assert not torch.equal(before["cls_token"], after["cls_token"])
    state = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    own = init.state_dict()
    for head in ("projector", "predictor"):
        weights = [k for k in own if k.startswith(head + ".") and k.endswith("weight")]
        assert weights and all(not torch.equal(own[k], state[k]) for k in weights), head
    # the momentum encoder moved too (EMA of a changing online encoder), but is not the online one
    key = "momentum_backbone.blocks.0.attn.qkv.weight"
    assert not torch.equal(own[key], state[key])
    assert not torch.equal(state[key], state["backbone.blocks.0.attn.qkv.weight"])
    assert torch.equal(state["momentum_backbone.patch_embed.proj.weight"], own["backbone.patch_embed.proj.weight"])


def _cos(a, b):
    return F.cosine_similarity(a, b, dim=-1).mean()


def _grads(m):
    return {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}


def _close(g1, g2):
    return g1.keys() == g2.keys() and all(torch.allclose(g1[k], g2[k], rtol=1e-4, atol=1e-7) for k in g1)


def test_simsiam_stop_gradient():
    m = tiny_method("simsiam")
    x1, x2 = random_views(8, seed=3)
    m.forward_views([x1, x2]).loss.backward()
    got = _grads(m)

    def reference(detach):
        m.zero_grad(set_to_none=True)
        z1, z2 = m.projector(m.backbone(x1)), m.projector(m.backbone(x2))
        p1, p2 = m.predictor(z1), m.predictor(z2)
        t1, t2 = (z1.detach(), z2.detach()) if detach else (z1, z2)
        (-0.5 * (_cos(p1, t2) + _cos(p2, t1))).backward()
        return _grads(m)

    assert _close(got, reference(detach=True))
    assert not _close(got, reference(detach=False))  # the reference can tell the difference


def test_byol_stop_gradient():
    m = tiny_method("byol")
    x1, x2 = random_views(8, seed=4)
    with torch.no_grad():  # a target that differs from the online network
        for p in m.target_projector.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    m.momentum = 1.0  # forward_views' EMA step leaves the target as it is
    m.forward_views([x1, x2]).loss.backward()
    got = _grads(m)
    assert all(not n.startswith("target_") for n in got)
    m.zero_grad(set_to_none=True)
    with torch.no_grad():
        t1 = m.target_projector(m.target_backbone(x1))
        t2 = m.target_projector(m.target_backbone(x2))
    p1 = m.predictor(m.projector(m.backbone(x1)))
    p2 = m.predictor(m.projector(m.backbone(x2)))
    ((2 - 2 * _cos(p1, t2)) + (2 - 2 * _cos(p2, t1))).backward()
    assert _close(got, _grads(m))


def test_simclr_imagenet_preset_reproduces_the_official_reduction():
    """objective.py add_contrastive_loss: softmax CE of [z_a·z_bᵀ, z_a·z_aᵀ − LARGE·I]/τ, batch mean, + the
    other direction; written out by hand here (not through selfsup.losses)."""
    from selfsup.config import load_run_config
    from selfsup.methods import DataInfo
    from selfsup.methods.build import build_method

    cfg = load_run_config("simclr-r50-imagenet", ["model.backbone=resnet18", "model.small_stem=true",
                                                  "method.proj_hidden_dim=32", "method.dim=8"])
    assert cfg.method.loss_scale == 2.0
    model = build_method(cfg, DataInfo(3, 8, (0.5,) * 3, (0.25,) * 3))
    g = torch.Generator().manual_seed(0)
    views = [torch.randn(4, 3, 8, 8, generator=g), torch.randn(4, 3, 8, 8, generator=g)]
    with torch.no_grad():
        loss = model.forward_views(views).loss
        z = torch.nn.functional.normalize(model.projector(model.backbone(torch.cat(views))), dim=1)
    a, b = z.chunk(2)
    tau, n, large = cfg.method.temperature, a.shape[0], 1e9
    eye = torch.eye(n)

    def direction(x, y):
        logits = torch.cat([x @ y.T, x @ x.T - large * eye], dim=1) / tau
        return -(torch.log_softmax(logits.double(), dim=1)[torch.arange(n), torch.arange(n)]).mean()

    official = direction(a, b) + direction(b, a)
    assert loss.item() == pytest.approx(official.item(), rel=1e-5)
