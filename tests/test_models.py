import math
from functools import partial

import pytest
import timm
import torch
import torchvision
from torch import nn

from selfsup.models import (
    BACKBONE_NAMES,
    DropPath,
    VIT_SIZES,
    VisionTransformer,
    build_2d_sincos_position_embedding,
    build_backbone,
    mlp,
    resnet,
)


def micro(**kw):
    args = dict(image_size=8, patch_size=2, in_chans=1, **VIT_SIZES["vit_micro"])
    args.update(kw)
    return VisionTransformer(**args)


def test_sincos_matches_hand_computation():
    pe = build_2d_sincos_position_embedding(2, 8)
    assert pe.shape == (1, 5, 8)
    omega = [1.0, 1.0 / 10000 ** 0.5]  # pos_dim = 2
    # meshgrid(w, h, indexing='ij') flattened: w = [0, 0, 1, 1], h = [0, 1, 0, 1]
    rows = [[0.0] * 8]
    for w, h in [(0, 0), (0, 1), (1, 0), (1, 1)]:
        rows.append(
            [math.sin(w * o) for o in omega] + [math.cos(w * o) for o in omega]
            + [math.sin(h * o) for o in omega] + [math.cos(h * o) for o in omega]
        )
    torch.testing.assert_close(pe[0], torch.tensor(rows), atol=1e-6, rtol=0)
    with pytest.raises(ValueError):
        build_2d_sincos_position_embedding(2, 6)


def test_vit_pos_embed_is_fixed_parameter():
    m = micro()
    assert isinstance(m.pos_embed, nn.Parameter) and not m.pos_embed.requires_grad
    torch.testing.assert_close(m.pos_embed.data, build_2d_sincos_position_embedding(4, 128))


def test_vit_init_statistics():
    torch.manual_seed(0)
    m = micro(in_chans=3)
    D, p = 128, 2
    assert 0.5e-6 < m.cls_token.std().item() < 1.5e-6
    qkv = m.blocks[0].attn.qkv.weight
    bound = math.sqrt(6 / (D + D))  # out/3 + in
    assert qkv.abs().max() <= bound and qkv.abs().max() > 0.95 * bound
    fc1 = m.blocks[0].mlp.fc1.weight
    xav = math.sqrt(6 / (D + 4 * D))
    assert fc1.abs().max() <= xav and fc1.abs().max() > 0.95 * xav
    conv = m.patch_embed.proj.weight
    cb = math.sqrt(6 / (3 * p * p + D))
    assert conv.abs().max() <= cb and conv.abs().max() > 0.9 * cb
    for name, prm in m.named_parameters():
        if name.endswith("bias"):
            assert torch.all(prm == 0), name
        elif "norm" in name:
            assert torch.all(prm == 1), name


def test_stop_grad_conv1_freezes_patch_embed():
    torch.manual_seed(0)
    m = micro(stop_grad_conv1=True)
    assert not m.patch_embed.proj.weight.requires_grad and not m.patch_embed.proj.bias.requires_grad
    before = {k: v.clone() for k, v in m.state_dict().items()}
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1)
    m(torch.randn(4, 1, 8, 8)).pow(2).sum().backward()
    opt.step()
    after = m.state_dict()
    for k in ("patch_embed.proj.weight", "patch_embed.proj.bias", "pos_embed"):
        assert torch.equal(before[k], after[k]), k
    assert not torch.equal(before["blocks.0.attn.qkv.weight"], after["blocks.0.attn.qkv.weight"])


@pytest.mark.parametrize("pool", ["cls", "avg"])
def test_vit_state_dict_loads_into_timm_with_same_features(pool):
    torch.manual_seed(0)
    ours = micro(pool=pool, drop_path_rate=0.1).eval()
    ref = timm.models.vision_transformer.VisionTransformer(
        img_size=8, patch_size=2, in_chans=1, embed_dim=128, depth=4, num_heads=4, mlp_ratio=4.0,
        qkv_bias=True, num_classes=0, global_pool="token" if pool == "cls" else "avg", fc_norm=False,
        norm_layer=partial(nn.LayerNorm, eps=1e-6),
    ).eval()
    ref.load_state_dict(ours.state_dict(), strict=True)
    x = torch.randn(3, 1, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ours.forward_features(x), ref.forward_features(x), atol=1e-5, rtol=1e-5)
    assert ours.num_features == ours.embed_dim == 128


def test_vit_bad_input_and_layer_id():
    m = micro()
    with pytest.raises(ValueError, match=r"ViT expects square \(1, S, S\) images"):
        m(torch.randn(2, 3, 8, 8))
    with pytest.raises(ValueError, match="divisible by the patch size 2"):
        m(torch.randn(2, 1, 9, 9))  # other crop sizes are taken (multi-crop) when the patch size divides them
    with pytest.raises(ValueError, match="square"):
        m(torch.randn(2, 1, 8, 6))
    assert m.layer_id("patch_embed.proj.weight") == 0
    assert m.layer_id("cls_token") == 0 and m.layer_id("pos_embed") == 0
    assert m.layer_id("blocks.2.attn.qkv.weight") == 3
    assert m.layer_id("norm.weight") == 5


def test_drop_path_train_vs_eval():
    torch.manual_seed(0)
    m = micro(drop_path_rate=0.5)
    x = torch.randn(8, 1, 8, 8)
    m.train()
    assert not torch.equal(m(x), m(x))
    m.eval()
    assert torch.equal(m(x), m(x))
    dp = DropPath(0.5).train()
    y = dp(torch.ones(1000, 3))
    zero_rows = (y == 0).all(dim=1)
    assert 0.35 < zero_rows.float().mean() < 0.65 and torch.all(y[~zero_rows] == 2.0)


def test_resnet18_small_stem_one_channel():
    torch.manual_seed(0)
    m = resnet("resnet18", in_chans=1, small_stem=True)
    assert m.num_features == 512
    m.eval()
    x = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        y = m(x)
    assert y.shape == (2, 512)
    ref = torchvision.models.resnet18(weights=None)
    ref.conv1 = nn.Conv2d(1, 64, 3, 1, 1, bias=False)
    ref.maxpool = nn.Identity()
    ref.fc = nn.Identity()
    ref.load_state_dict(m.state_dict(), strict=True)
    with torch.no_grad():
        torch.testing.assert_close(ref.eval()(x), y)
    assert resnet("resnet50").num_features == 2048


@pytest.mark.parametrize("name, last_bn", [("resnet18", "bn2"), ("resnet50", "bn3")])
def test_zero_init_residual_zeroes_each_blocks_last_bn_scale_and_still_trains(name, last_bn):
    from selfsup.config import resolve
    from selfsup.methods.base import backbone_kwargs, DataInfo

    cfg = resolve({"method": {"name": "byol"},
                   "model": {"backbone": name, "small_stem": True, "zero_init_residual": True}})
    m = build_backbone(name, **backbone_kwargs(cfg, DataInfo(1, 8, (0.5,), (0.25,))))
    blocks = [b for layer in (m.layer1, m.layer2, m.layer3, m.layer4) for b in layer]
    assert all(torch.count_nonzero(getattr(b, last_bn).weight) == 0 for b in blocks)
    assert all(torch.count_nonzero(b.bn1.weight) > 0 for b in blocks)  # only the last BN of each block
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    x = torch.randn(8, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    loss = m(x).pow(2).mean()
    loss.backward()
    opt.step()
    assert torch.isfinite(loss) and all(torch.count_nonzero(getattr(b, last_bn).weight) > 0 for b in blocks)
    plain = resnet(name, in_chans=1, small_stem=True)
    assert all(torch.count_nonzero(getattr(b, last_bn).weight) > 0 for layer in (plain.layer1,) for b in layer)


def test_every_paper_resnet_preset_zero_inits_its_residual_blocks():
    """The MoCo v3 / SimSiam / SimCLR / BYOL ImageNet recipes (their official codes all zero-init)."""
    from selfsup.config import load_run_config, preset_names

    resnets = [load_run_config(p, []) for p in preset_names() if p.endswith("-imagenet")]
    resnets = [c for c in resnets if c.model.backbone.startswith("resnet")]
    # SwAV's resnet50.py keeps zero_init_residual=False (:139); NNCLR has no official code (the default, off);
    # MoCo v2's main_moco.py builds torchvision's resnet50 with its defaults (off); TiCo has no official code
    # (lightly's benchmark: torchvision's defaults, off)
    own = [c for c in resnets if type(c.method).__name__ in ("SwAVConfig", "NNCLRConfig", "MoCoV2Config", "TiCoConfig")]
    assert len(own) == 4 and not any(c.model.zero_init_residual for c in own)
    resnets = [c for c in resnets if all(c is not o for o in own)]
    assert len(resnets) >= 4 and all(c.model.zero_init_residual for c in resnets)


def test_mlp_structures():
    proj = mlp(384, 4096, 256, 3, last_bn=True)  # MoCo v3 ViT projector
    kinds = [type(layer) for layer in proj]
    assert kinds == [nn.Linear, nn.BatchNorm1d, nn.ReLU] * 2 + [nn.Linear, nn.BatchNorm1d]
    assert all(layer.bias is None for layer in proj if isinstance(layer, nn.Linear))
    assert proj[-1].weight is None and proj[-1].bias is None
    assert proj[1].weight is not None

    byol = mlp(512, 4096, 256, 2, bias=True, last_bias=False)
    assert [type(layer) for layer in byol] == [nn.Linear, nn.BatchNorm1d, nn.ReLU, nn.Linear]
    assert byol[0].bias is not None and byol[-1].bias is None

    simsiam_pred = mlp(2048, 512, 2048, 2, last_bias=True)
    assert simsiam_pred[0].bias is None and simsiam_pred[-1].bias is not None

    one = mlp(16, 99, 8, 1)
    assert len(one) == 1 and isinstance(one[0], nn.Linear) and one[0].weight.shape == (8, 16)
    assert mlp(4, 8, 4, 2, hidden_bn=False)[1].__class__ is nn.ReLU

    assert proj.train()(torch.randn(4, 384)).shape == (4, 256)


def test_build_backbone_vit_resnet_timm():
    vit = build_backbone("vit_micro", in_chans=1, image_size=8, patch_size=2)
    assert vit.num_features == 128 and vit(torch.randn(2, 1, 8, 8)).shape == (2, 128)
    rn = build_backbone("resnet18", in_chans=1, image_size=28, small_stem=True)
    assert rn.num_features == 512 and isinstance(rn.maxpool, nn.Identity)

    t = build_backbone("timm:resnet10t", in_chans=1, image_size=32).eval()
    with torch.no_grad():
        assert t(torch.randn(2, 1, 32, 32)).shape == (2, t.num_features)
    tv = build_backbone("timm:test_vit", in_chans=1, image_size=32).eval()
    assert tuple(tv.patch_embed.img_size) == (32, 32)  # img_size passed through
    with torch.no_grad():
        assert tv(torch.randn(2, 1, 32, 32)).shape == (2, tv.num_features)


def test_build_backbone_unknown_name():
    with pytest.raises(ValueError, match="vit_small") as e:
        build_backbone("vit_smal", in_chans=3, image_size=224)
    assert "timm:" in str(e.value)
    with pytest.raises(ValueError, match="resnet10t"):
        build_backbone("timm:resnet10tt", in_chans=3, image_size=32)
    assert "vit_micro" in BACKBONE_NAMES and "resnet152" in BACKBONE_NAMES


def test_vit_nano_is_two_blocks_of_width_32():
    """The smallest size (the state-comparing tests' backbone): 2 blocks, width 32, 2 heads of 16."""
    net = build_backbone("vit_nano", in_chans=1, image_size=8, patch_size=2)
    assert (net.embed_dim, len(net.blocks), net.blocks[0].attn.num_heads) == (32, 2, 2)
    assert net(torch.zeros(3, 1, 8, 8)).shape == (3, 32)


def test_build_backbone_rebuilds_a_flow_encoder_by_name_and_refuses_unknown_keys():
    from selfsup.models.sit import FLOW_ENCODER, FlowEncoder

    sit = dict(input_size=8, in_channels=1, patch_size=2, hidden=32, depth=2, heads=2, num_classes=10)
    encoder = build_backbone(FLOW_ENCODER, sit=sit, block=2, t=0.1, fit="resize", seed=0)
    assert isinstance(encoder, FlowEncoder) and encoder.kwargs == dict(sit=encoder.model.kwargs, block=2, t=0.1,
                                                                       fit="resize", seed=0)
    assert encoder(torch.zeros(3, 1, 8, 8)).shape == (3, 32)
    with pytest.raises(TypeError, match="unexpected keyword arguments \\['depth'\\]"):
        build_backbone("resnet18", in_chans=1, image_size=8, depth=2)
