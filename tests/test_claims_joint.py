"""Issue 18's DirectPred, MoCo v3 and cookbook claims (10-13, 16, 17): the options they need and each claim's
quick mode on tiny settings."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from selfsup.losses import byol_regression, negative_cosine
from selfsup.models.backbones import build_backbone
from ssl_helpers import quick_claim, random_views, raises_user_error, tiny_config, tiny_method

TINY = ["trainer.max_epochs=1", "trainer.limit_train_batches=2", "data.batch_size=32", "trainer.log_every_n_steps=1",
        "eval.knn_every_n_steps=0", "instruments.rank_samples=64"]


def quick(claim_id, tmp_path, extra=()):
    from idx_files import fashion_overrides

    return quick_claim(claim_id, tmp_path, [*TINY, *fashion_overrides(claim_id, tmp_path / "fmnist"), *extra])


def test_the_few_point_claims_train_and_score_on_fashion_mnist():
    """Issue 23 item 2: a claim whose effect is a few points scores on Fashion-MNIST's 10,000 test images, and
    trains there, for at least one epoch (item 3)."""
    from selfsup.claims import cookbook, directpred, moco_v3
    from selfsup.claims.registry import CLAIMS

    few = ["frozen-patch-projection", "moco-v3-momentum", "moco-v3-predictor", "moco-v3-position-embedding",
           "moco-v3-avg-pool-layernorm", "byol-no-ema-predictor-lr", "weight-decay-window"]
    assert all(CLAIMS[c].test_data == "fashion-mnist" for c in few)
    assert moco_v3.PRESET == "moco-v3-vit-fmnist" and moco_v3.EPOCHS[False] >= 1
    assert "byol-fmnist" in open(cookbook.__file__).read() and "byol-fmnist" in open(directpred.__file__).read()


@pytest.mark.train
def test_collapse_claim_quick(tmp_path):
    result = quick("predictor-and-stop-gradient-needed", tmp_path)
    assert set(result["series"]) == {f"{m} {v}" for m in ("simsiam", "byol")
                                     for v in ("base", "no predictor", "no stop gradient")}
    assert all(v[0] > 0 for v in result["metrics"].values())


# ---- the options the claims need ---------------------------------------------------------------------------------

def test_negative_cosine_without_stop_gradient_sends_the_gradient_into_z():
    g = torch.Generator().manual_seed(0)
    p, z = torch.randn(4, 6, generator=g, requires_grad=True), torch.randn(4, 6, generator=g, requires_grad=True)
    negative_cosine(p, z).backward()
    assert z.grad is None
    loss = negative_cosine(p, z, stop_gradient=False)
    by_hand = -((p * z).sum(1) / (p.norm(dim=1) * z.norm(dim=1))).mean()
    torch.testing.assert_close(loss, by_hand)
    (gz,) = torch.autograd.grad(loss, z)
    (gz_hand,) = torch.autograd.grad(by_hand, z)
    torch.testing.assert_close(gz, gz_hand)
    torch.testing.assert_close(byol_regression(p, z, stop_gradient=False), 2 + 2 * by_hand)


@pytest.mark.parametrize("method", ["byol", "simsiam", "moco_v3"])
def test_predictor_none_is_the_identity_with_no_parameters(method):
    m = tiny_method(method, {"predictor": "none"})
    assert isinstance(m.predictor, nn.Identity) and not list(m.predictor.parameters())
    out = m.forward_views(random_views(8))
    torch.testing.assert_close(out.prediction, out.projection)
    assert torch.isfinite(out.loss)


def _grads(m, views):
    m.zero_grad()
    out = m.forward_views(views)
    out.loss.backward()
    return out.loss.detach(), torch.cat([p.grad.flatten() for p in m.projector.parameters() if p.grad is not None])


@pytest.mark.parametrize("method, extra", [("simsiam", {}),
                                           ("byol", {"momentum": 0.0, "momentum_schedule": "constant"})])
def test_stop_gradient_false_keeps_the_loss_and_changes_the_gradient(method, extra):
    views = random_views(8)
    torch.manual_seed(0)
    with_sg = tiny_method(method, extra)
    torch.manual_seed(0)
    without = tiny_method(method, {**extra, "stop_gradient": False})
    without.load_state_dict(with_sg.state_dict())
    loss_sg, grad_sg = _grads(with_sg, views)
    loss_no, grad_no = _grads(without, views)
    torch.testing.assert_close(loss_sg, loss_no)  # m = 0: BYOL's target is the online network either way
    assert (grad_sg - grad_no).norm() > 1e-3 * grad_sg.norm()


def test_byol_without_stop_gradient_needs_m_zero():
    with raises_user_error("method.stop_gradient=false needs method.momentum=0"):
        tiny_config("byol", {"stop_gradient": False})


def _permute_patches(x: torch.Tensor, patch: int, perm: torch.Tensor) -> torch.Tensor:
    B, C, H, W = x.shape
    g = H // patch
    tiles = x.reshape(B, C, g, patch, g, patch).permute(0, 2, 4, 1, 3, 5).reshape(B, g * g, C, patch, patch)
    tiles = tiles[:, perm].reshape(B, g, g, C, patch, patch).permute(0, 3, 1, 4, 2, 5)
    return tiles.reshape(B, C, H, W)


def test_no_position_embedding_makes_average_pooling_blind_to_patch_order():
    x = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    perm = torch.randperm(16, generator=torch.Generator().manual_seed(1))
    outs = {}
    for pos in ("none", "sincos"):
        torch.manual_seed(0)
        m = build_backbone("vit_micro", in_chans=1, image_size=8, patch_size=2, pool="avg", pos_embed=pos).eval()
        outs[pos] = (m(x), m(_permute_patches(x, 2, perm)))
    torch.testing.assert_close(*outs["none"], atol=1e-5, rtol=1e-5)
    assert (outs["sincos"][0] - outs["sincos"][1]).abs().max() > 1e-3
    assert not m.pos_embed.requires_grad


def test_final_norm_false_pools_the_un_normalised_tokens_and_exports_to_timm():
    import timm

    from selfsup import export

    torch.manual_seed(0)
    m = build_backbone("vit_micro", in_chans=1, image_size=8, patch_size=2, pool="avg", final_norm=False).eval()
    assert isinstance(m.norm, nn.Identity) and not any(k.startswith("norm.") for k in m.state_dict())
    x = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        tokens = m.blocks(torch.cat([m.cls_token.expand(3, -1, -1), m.patch_embed(x)], 1) + m.pos_embed)
        torch.testing.assert_close(m(x), tokens[:, 1:].mean(1))
        normed = F.layer_norm(tokens, (128,), eps=1e-6)[:, 1:].mean(1)
        assert (m(x) - normed).abs().max() > 1e-2
    recipe = export.timm_recipe(export.architecture(m))
    t = timm.create_model(recipe["model"], pretrained=False, **recipe["kwargs"]).eval()
    t.load_state_dict(m.state_dict(), strict=True)
    torch.testing.assert_close(t(x), m(x))


@pytest.mark.parametrize("overrides, message", [({"pos_embed": "rope"}, "model.pos_embed='rope' is not known"),
                                                ({"backbone": "resnet18", "final_norm": False}, "model.final_norm")])
def test_bad_vit_options_are_one_line_errors(overrides, message):
    if "backbone" in overrides:
        with pytest.raises(ValueError, match=message):
            build_backbone("resnet18", in_chans=1, image_size=8, final_norm=False)
    else:
        with raises_user_error(message):
            tiny_config("moco_v3", model=overrides)


@pytest.mark.train
@pytest.mark.parametrize("claim_id", ["moco-v3-momentum", "moco-v3-predictor", "moco-v3-position-embedding",
                                      "moco-v3-avg-pool-layernorm"])
def test_moco_v3_ablation_claims_quick(claim_id, tmp_path):
    result = quick(claim_id, tmp_path)
    assert all(len(v) == 1 for v in result["metrics"].values())


@pytest.mark.train
@pytest.mark.parametrize("claim_id", ["symmetric-predictor-needs-ema", "weight-decay-window", "eigenspace-alignment",
                                      "sqrt-lr-scaling-small-batch", "directpred-comparable-to-mlp"])
def test_directpred_and_cookbook_claims_quick(claim_id, tmp_path):
    result = quick(claim_id, tmp_path, ["trainer.limit_train_batches=3"])
    assert all(len(v) == 1 for v in result["metrics"].values())
    if claim_id == "eigenspace-alignment":
        assert set(result["series"]) == {"‖[F, W_p]‖ / (‖F‖‖W_p‖)", "‖W_p − W_pᵀ‖ / ‖W_p‖"}
        assert 0 < result["metrics"]["commutator_first"][0] < 2
