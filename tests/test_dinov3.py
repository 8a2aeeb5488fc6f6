"""DINOv3 as a start and a teacher (issue 64, parts 1 and 2): its ViT and ConvNeXt (models/dinov3.py) compute the
official forward; the official hub layout and the Hugging Face transformers layouts of DINOv2 and DINOv3 load
(selfsup/layouts.py, weights.py) with no missing or unexpected key and give transformers' outputs at the native size
and at another. The references: transformers' modules (random tiny configs), their tensors written in DINOv3's hub
names by this file's own mapping (facebookresearch/dinov3 @6876159: vision_transformer.py:104-180, attention.py:30-63,
ffn_layers.py:24-77, convnext.py:42-252); RoPE, the untied norms, the masked k bias and the subset drop path pinned
to the official formulas written out here."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from ssl_helpers import raises_user_error, random_views, tiny_method

from selfsup.layouts import dinov3_arch
from selfsup.models.backbones import build_backbone
from selfsup.models.dinov3 import Block, DINOv3ViT, RopePositionEmbedding, rope_rotate
from selfsup.weights import build_from_weights, load_weights

transformers = pytest.importorskip("transformers")


def _random(module, std=0.2, seed=0):
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0, std)
    return module.eval()


def _x(size, batch=2, seed=1):
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(seed))


def _close(a, b, tol=1e-5):
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


# --------------------------------------------------------------------------- RoPE, by hand

def test_rope_periods_coordinates_and_rotation_are_the_official_ones():
    """rope_position_encoding.py:57-121: periods base^(2i / (d/2)), i < d/4; patch centres (i + 0.5) / n mapped to
    [-1, 1] per axis ("separate"); angles 2π·c / period, [h periods, w periods] tiled twice; attention.py:16-27:
    x·cos + [-x2, x1]·sin."""
    rope = RopePositionEmbedding(16, base=100.0).eval()
    periods = torch.tensor([1.0, 100 ** 0.25, 10.0, 100 ** 0.75])
    _close(rope.periods, periods)
    sin, cos = rope(H=2, W=3)
    assert sin.shape == cos.shape == (6, 16)
    h, w = -0.5, 2 / 3  # token (0, 2): h centre 0.25 → -0.5, w centre 5/6 → 2/3
    angles = torch.cat([2 * math.pi * h / periods, 2 * math.pi * w / periods]).repeat(2)
    _close(sin[2], angles.sin()), _close(cos[2], angles.cos())
    _close(RopePositionEmbedding(16, normalize="max").eval().coords(2, 4)[1], torch.tensor([0.5 / 4 * 2 - 1,
                                                                                             1.5 / 4 * 2 - 1]))
    _close(RopePositionEmbedding(16, normalize="min").eval().coords(2, 4)[7], torch.tensor([1.5 / 2 * 2 - 1,
                                                                                             3.5 / 2 * 2 - 1]))
    lo_hi = RopePositionEmbedding(16, base=None, min_period=0.5, max_period=8.0).periods
    _close(lo_hi, torch.tensor([0.5, 1.0, 2.0, 4.0]) * (16 ** (1 / 3)) ** torch.arange(4.0) / 2 ** torch.arange(4.0))
    x = torch.arange(4.0)
    _close(rope_rotate(x, torch.ones(4), torch.zeros(4)), torch.tensor([-2.0, -3.0, 0.0, 1.0]))


def test_rope_s_train_time_rescale_jitter_and_shift_are_drawn_only_in_training():
    """:80-97: in training, c + U(-shift, shift) per axis, × exp(U(±log jitter)) per axis, × exp(U(±log rescale))
    for both; in eval the plain centres."""
    rope = RopePositionEmbedding(16, rescale=2.0)
    plain = rope.eval().coords(4, 4)
    rope.train()
    torch.manual_seed(0)
    scaled = rope.coords(4, 4)
    factor = scaled / plain
    assert torch.allclose(factor, factor[0, 0]) and 0.5 <= factor[0, 0] <= 2.0 and factor[0, 0] != 1
    jitter = RopePositionEmbedding(16, rescale=None, jitter=3.0, shift=0.1).train()
    torch.manual_seed(0)
    c = jitter.coords(4, 4)
    torch.manual_seed(0)
    shift = torch.empty(2).uniform_(-0.1, 0.1)
    scale = torch.empty(2).uniform_(-math.log(3.0), math.log(3.0)).exp()
    _close(c, (plain + shift) * scale)


# --------------------------------------------------------------------------- the blocks' official details

def test_the_k_bias_is_masked_the_norms_untied_and_drop_path_drops_a_subset():
    """attention.py:30-40 (the k third of the qkv bias × 0); vision_transformer.py:237-251 (cls_norm on [CLS] and the
    storage tokens; local_cls_norm in training on the local crops; the patches through norm); block.py:84-119
    (the residual of a random subset of ⌊b(1 − p)⌋ samples, scaled by b / subset)."""
    vit = _random(DINOv3ViT(image_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, storage_tokens=2,
                            untie_cls_norm=True, untie_local_cls_norm=True, rope_rescale=None))
    qkv, t = vit.blocks[0].attn.qkv, torch.randn(3, 32)
    bias = qkv.bias.detach().clone()
    bias[32:64] = 0
    _close(qkv(t), F.linear(t, qkv.weight, bias))
    x = _x(32)
    out = vit.forward_dict(x)
    pre = out["x_prenorm"]
    _close(out["x_norm_clstoken"], F.layer_norm(pre[:, 0], (32,), vit.cls_norm.weight, vit.cls_norm.bias, 1e-5))
    _close(out["x_norm_patchtokens"], F.layer_norm(pre[:, 3:], (32,), vit.norm.weight, vit.norm.bias, 1e-5))
    assert out["x_storage_tokens"].shape == (2, 2, 32) and vit(x).shape == (2, 32)
    vit.train()
    local = vit.forward_dict(_x(16))
    _close(local["x_norm_clstoken"], F.layer_norm(local["x_prenorm"][:, 0], (32,), vit.local_cls_norm.weight,
                                                  vit.local_cls_norm.bias, 1e-5))
    block = Block(8, 2, 16, "mlp", 8, False, True, True, 1e-5, "layernorm", drop_path=0.5).train()
    torch.manual_seed(0)
    y = block._residual(torch.zeros(5, 3, 8), lambda t, r: torch.ones_like(t))
    rows = y[:, 0, 0]
    assert sorted(rows.tolist()) == [0.0, 0.0, 0.0, 2.5, 2.5]  # max(⌊5 · 0.5⌋, 1) = 2 samples, × 5 / 2


# --------------------------------------------------------------------------- the official hub layout


def hub_vit(hf, config) -> dict:
    """transformers' DINOv3ViTModel's tensors in DINOv3's hub names (the official module's state dict: cls_token,
    storage_tokens, mask_token (1, D), patch_embed.proj, rope_embed.periods, blocks.<i>.{norm1, attn.qkv (+ its
    bias_mask), attn.proj, ls1.gamma, norm2, mlp.fc1/fc2 | mlp.w1/w2/w3, ls2.gamma}, norm)."""
    s, D = {k.removeprefix("model."): v for k, v in hf.state_dict().items()}, config.hidden_size
    d = D // config.num_attention_heads
    out = {"cls_token": s["embeddings.cls_token"], "mask_token": s["embeddings.mask_token"].reshape(1, D),
           "patch_embed.proj.weight": s["embeddings.patch_embeddings.weight"],
           "patch_embed.proj.bias": s["embeddings.patch_embeddings.bias"],
           "rope_embed.periods": config.rope_theta ** (2 * torch.arange(d // 4) / (d // 2)),
           "norm.weight": s["norm.weight"], "norm.bias": s["norm.bias"]}
    if config.num_register_tokens:
        out["storage_tokens"] = s["embeddings.register_tokens"]
    for i in range(config.num_hidden_layers):
        h, b = f"layer.{i}.", f"blocks.{i}."
        out[b + "attn.qkv.weight"] = torch.cat([s[h + f"attention.{n}_proj.weight"] for n in "qkv"])
        out[b + "attn.qkv.bias"] = torch.cat([s[h + "attention.q_proj.bias"], torch.zeros(D),
                                              s[h + "attention.v_proj.bias"]])
        out[b + "attn.qkv.bias_mask"] = torch.cat([torch.ones(D), torch.zeros(D), torch.ones(D)])
        for ours, theirs in (("attn.proj", "attention.o_proj"), ("norm1", "norm1"), ("norm2", "norm2")) + (
                (("mlp.w1", "mlp.gate_proj"), ("mlp.w2", "mlp.up_proj"), ("mlp.w3", "mlp.down_proj"))
                if config.use_gated_mlp else (("mlp.fc1", "mlp.up_proj"), ("mlp.fc2", "mlp.down_proj"))):
            out[b + ours + ".weight"], out[b + ours + ".bias"] = s[h + theirs + ".weight"], s[h + theirs + ".bias"]
        out[b + "ls1.gamma"], out[b + "ls2.gamma"] = s[h + "layer_scale1.lambda1"], s[h + "layer_scale2.lambda1"]
    return out


def _hf_vit(seed=0, **kw):
    config = transformers.DINOv3ViTConfig(**{"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                                             "num_attention_heads": 2, "image_size": 32, "patch_size": 16,
                                             "num_register_tokens": 4, **kw})
    return _random(transformers.DINOv3ViTModel(config), seed=seed), config


def _same_tokens(net, hf, size, tol=1e-5):
    """CLS and patch tokens of selfsup's module and transformers' at ``size``."""
    x = _x(size)
    with torch.no_grad():
        ref, ours = hf(pixel_values=x), net.forward_dict(x)
    _close(ours["x_norm_clstoken"], ref.pooler_output.flatten(1), tol)
    _close(ours["x_norm_patchtokens"], ref.last_hidden_state[:, -ours["x_norm_patchtokens"].shape[1]:], tol)
    _close(net(x), ref.pooler_output.flatten(1), tol)


@pytest.mark.parametrize("kind", ["vitb16-like", "vitsplus16-like"])
def test_a_dinov3_hub_file_loads_every_key_and_computes_the_official_forward(tmp_path, kind):
    """A ViT of the hub layout with 4 storage tokens (the releases' ViT-B/16's kind: GELU MLP; S+'s: SwiGLU) read
    with its architecture from its tensors (selfsup eval's and a teacher's ``auto``) and into a named model: every
    key, the mask token dropped where no method adds one, the outputs transformers' at 32 px and at 48 px."""
    gated = kind.startswith("vitsplus")
    hf, config = _hf_vit(use_gated_mlp=gated, hidden_act="silu" if gated else "gelu",
                         intermediate_size=96 if gated else 64)
    torch.save(hub_vit(hf, config), tmp_path / "dinov3_tiny_pretrain.pth")
    for size in (32, 48):
        net, facts, norm = build_from_weights(str(tmp_path / "dinov3_tiny_pretrain.pth"), "auto", {}, 3, size, "w")
        assert (facts.kind, facts.dropped, facts.kept) == ("dinov3-hub", ["mask_token"], [])
        assert facts.heads.startswith("2 (DINOv3's rope_embed.periods") and norm == ((0.485, 0.456, 0.406),
                                                                                      (0.229, 0.224, 0.225))
        assert net.kwargs["ffn"] == ("swiglu" if gated else "mlp") and net.kwargs["storage_tokens"] == 4
        _same_tokens(net, hf, size)
    student = DINOv3ViT(image_size=32, patch_size=16, embed_dim=32, depth=2, num_heads=2, ffn_hidden=96 if gated
                        else 64, ffn="swiglu" if gated else "mlp")
    student.add_mask_token()  # iBOT's / DINOv2's student: the file's mask token is read into it
    facts = load_weights(student, str(tmp_path / "dinov3_tiny_pretrain.pth"))
    assert facts.dropped == [] and torch.equal(student.masked_embed, hub_vit(hf, config)["mask_token"])
    with raises_user_error("a DINOv3 hub file with 2 heads", "the backbone has 4", "model.backbone=dinov3_vit"):
        load_weights(DINOv3ViT(image_size=32, patch_size=16, embed_dim=32, depth=2, num_heads=4),
                     str(tmp_path / "dinov3_tiny_pretrain.pth"))
    with raises_user_error("do not fit this backbone", "missing", "the file fits model.backbone=dinov3_vit"):
        load_weights(build_backbone("vit_nano", in_chans=3, image_size=32, pos_embed="learned"),
                     str(tmp_path / "dinov3_tiny_pretrain.pth"))


def test_a_dinov3_vit_s16_hub_file_is_named_and_the_7b_s_parts_are_read(tmp_path):
    """The released ViT-S/16's keys and shapes (hub/backbones.py:199-235: 384 wide, 12 blocks of 6 heads, MLP ×4,
    4 storage tokens, LayerScale, the k bias masked) name ``dinov3_vits16`` (its tensors on the meta device: no
    memory); a file with the 7B's parts (no qkv bias, SwiGLU aligned to 64, a local class norm: :450-492) builds
    them back from its tensors."""
    with torch.device("meta"):
        vits = build_backbone("dinov3_vits16", in_chans=3, image_size=224)
    hf, config = _hf_vit(num_hidden_layers=12)
    assert vits.state_dict().keys() == hub_vit(hf, config).keys() - {"mask_token"}
    name, kwargs = dinov3_arch(vits.state_dict())
    assert name == "dinov3_vits16" and kwargs == {"patch_size": 16, "arch": dict(
        embed_dim=384, depth=12, num_heads=6, ffn="mlp", ffn_hidden=1536, qkv_bias=True, mask_k_bias=True,
        layer_scale=1e-5, norm="layernormbf16", storage_tokens=4, untie_cls_norm=False, untie_local_cls_norm=False)}
    seven = _random(DINOv3ViT(image_size=32, embed_dim=64, depth=2, num_heads=2, ffn="swiglu", ffn_ratio=3.0,
                              ffn_align=64, qkv_bias=False, untie_local_cls_norm=True), std=0.05)
    assert seven.blocks[0].mlp.w1.out_features == 128 and seven.blocks[0].attn.qkv.bias is None
    torch.save(seven.state_dict(), tmp_path / "seven.pth")
    again, facts, _ = build_from_weights(str(tmp_path / "seven.pth"), "auto", {}, 3, 48, "w")
    assert again.local_cls_norm is not None and again.kwargs["qkv_bias"] is False and facts.dropped == []
    _close(again(_x(48)), seven(_x(48)))


def test_a_dinov3_convnext_hub_file_and_its_transformers_folder_compute_the_official_forward(tmp_path):
    """The ConvNeXt's hub names (convnext.py:121-252: downsample_layers.<i>.{0,1}, stages.<i>.<j>.{dwconv, norm,
    pwconv1, pwconv2, gamma}, norm) and transformers' DINOv3ConvNextModel (stages.<i>.downsample_layers /
    layers.<j>, layer_norm): [CLS] = norm(mean), the patches norm(each position), at 64 and 96 px."""
    config = transformers.DINOv3ConvNextConfig(hidden_sizes=[8, 16, 24, 32], depths=[1, 1, 2, 1])
    hf = _random(transformers.DINOv3ConvNextModel(config), std=0.1)
    hf.save_pretrained(tmp_path / "hf")
    names = {"depthwise_conv": "dwconv", "layer_norm": "norm", "pointwise_conv1": "pwconv1",
             "pointwise_conv2": "pwconv2", "gamma": "gamma"}
    hub = {}
    for k, v in hf.state_dict().items():
        k = k.removeprefix("model.")
        parts = k.split(".")
        if k.startswith("layer_norm."):
            hub["norm." + parts[-1]] = v
        elif parts[2] == "downsample_layers":
            hub[f"downsample_layers.{parts[1]}.{parts[3]}.{parts[4]}"] = v
        else:
            hub[".".join(["stages", parts[1], parts[3], names[parts[4]]] + parts[5:])] = v
    torch.save(hub, tmp_path / "convnext.pth")
    for source in (tmp_path / "convnext.pth", tmp_path / "hf"):
        for size in (64, 96):
            net, facts, _ = build_from_weights(str(source), "auto", {}, 3, size, "w")
            assert facts.dropped == [] and facts.tensors == len(hub)
            x = _x(size)
            with torch.no_grad():
                ref, ours = hf(pixel_values=x), net.forward_dict(x)
            _close(net(x), ref.pooler_output)
            _close(ours["x_norm_patchtokens"], ref.last_hidden_state[:, 1:])


# --------------------------------------------------------------------------- the transformers layouts


def _dinov2(**kw):
    config = transformers.Dinov2Config(**{"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
                                          "image_size": 28, "patch_size": 14, **kw})
    return _random(transformers.Dinov2Model(config))


@pytest.mark.parametrize("kind", ["dinov2", "dinov2-swiglu", "dinov2-registers", "dinov3", "dinov3-swiglu"])
def test_a_transformers_folder_loads_every_key_and_computes_its_forward(tmp_path, kind):
    """``model.safetensors`` + ``config.json`` as ``save_pretrained`` writes them: Dinov2Model (learned positions
    resampled as its interpolate_pos_encoding does: size g × g, bicubic, no antialias) and DINOv3ViTModel (q, k, v
    joined, the absent k bias masked), CLS and patch tokens at the native size and another; Dinov2WithRegistersModel
    (its registers after the class token, its positions resampled with antialias)."""
    swiglu = kind.endswith("swiglu")
    if kind == "dinov2-registers":  # Dinov2WithRegistersModel: its positions resampled with antialias
        config = transformers.Dinov2WithRegistersConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                                        image_size=28, patch_size=14, num_register_tokens=4)
        hf, sizes = _random(transformers.Dinov2WithRegistersModel(config)), (28, 42)
    elif kind.startswith("dinov2"):
        hf, sizes = _dinov2(use_swiglu_ffn=swiglu), (28, 42)
    else:
        hf, sizes = _hf_vit(use_gated_mlp=swiglu, hidden_act="silu" if swiglu else "gelu", hidden_size=64,
                            num_attention_heads=4, patch_size=8)[0], (32, 48)
    hf.save_pretrained(tmp_path / kind)
    for size in sizes:
        net, facts, _ = build_from_weights(str(tmp_path / kind), "auto", {}, 3, size, "w")
        assert facts.kind == f"hf-{hf.config.model_type}" and facts.dropped == ["mask_token"] and facts.kept == []
        assert facts.heads == f"{hf.config.num_attention_heads} (its config.json)"
        x = _x(size)
        with torch.no_grad():
            ref = hf(pixel_values=x)
            tokens = net(x, return_all_tokens=True)
        _close(tokens[:, 0], ref.pooler_output)
        _close(tokens[:, 1:], ref.last_hidden_state[:, -tokens.shape[1] + 1:])
    if kind.startswith("dinov3"):  # RoPE takes H ≠ W: nothing is interpolated
        x = torch.randn(2, 3, 32, 56, generator=torch.Generator().manual_seed(2))
        with torch.no_grad():
            _close(net.forward_dict(x)["x_norm_patchtokens"], hf(pixel_values=x).last_hidden_state[:, -28:])
    file = tmp_path / kind / "model.safetensors"  # the file beside its config.json reads as the folder
    assert build_from_weights(str(file), "auto", {}, 3, sizes[0], "w")[1].kind == f"hf-{hf.config.model_type}"


def test_a_transformers_config_selfsup_does_not_compute_is_one_line(tmp_path):
    _dinov2(layer_norm_eps=1e-5).save_pretrained(tmp_path / "eps")
    with raises_user_error("layer_norm_eps=1e-05", "selfsup's: 1e-06"):
        build_from_weights(str(tmp_path / "eps"), "auto", {}, 3, 28, "model.weights")
    _dinov2().save_pretrained(tmp_path / "ok")
    (tmp_path / "ok" / "model.safetensors").unlink()
    with raises_user_error("model.safetensors is missing"):
        build_from_weights(str(tmp_path / "ok"), "auto", {}, 3, 28, "model.weights")


# --------------------------------------------------------------------------- a backbone for the methods


def test_dinov2_trains_a_dinov3_vit_from_its_tokens():
    """The DINOv2 objective reads the ViT's [CLS] and masked patch tokens, (B, 1 + N, D), storage tokens dropped;
    a DINOv3 ViT serves as the student and the teacher with the method's mask token, and a ConvNeXt as the
    backbone of a CLS method."""
    model = tiny_method("dinov2", model={"backbone": "dinov3_vits16", "patch_size": 2})
    assert hasattr(model.backbone, "masked_embed") and not hasattr(model.teacher_backbone, "masked_embed")
    views = random_views(4)
    out = model.forward_views(views, **model.step_draws(views))
    out.loss.backward()
    assert torch.isfinite(out.loss) and model.backbone.cls_token.grad is not None
    assert model.backbone(views[0], return_all_tokens=True).shape == (4, 1 + 16, 384)


def test_a_vit_preset_on_a_dinov3_vit_takes_its_release_s_architecture(capsys):
    """A ViT preset given a DINOv3 ViT: the selfsup ViT's keys back to their defaults (its patch 16: the release's),
    the pooling and DINOv2's patch term kept, in one printed line; I-JEPA (no class token) refuses it."""
    from selfsup.config import load_run_config

    cfg = load_run_config("dinov2-vit-s14-imagenet", ["model.backbone=dinov3_vitb16"])
    assert (cfg.model.patch_size, cfg.model.layer_scale, cfg.model.pos_embed, cfg.model.pool) == (16, 0.0, "sincos",
                                                                                                 "cls")
    assert cfg.method.ibot_loss_weight == 1.0
    assert "is a DINOv3 ViT, its release's architecture" in capsys.readouterr().out
    with raises_user_error("method ijepa trains a selfsup ViT"):
        load_run_config("ijepa-digits", ["model.backbone=dinov3_vits16"])


def test_selfsup_eval_and_the_folder_recipe_read_a_transformers_folder(tmp_path):
    """``selfsup eval knn FOLDER`` builds a transformers folder by itself (results in ``FOLDER-eval/``), and the folder
    recipe reads a teacher's patch from its ``config.json``."""
    import json

    from PIL import Image
    from ssl_helpers import run_cli

    from selfsup.runs.recipe import source_patch

    _hf_vit(patch_size=16)[0].save_pretrained(tmp_path / "dinov3-tiny")
    assert source_patch(str(tmp_path / "dinov3-tiny")) == 16
    g = torch.Generator().manual_seed(0)
    for split, n in (("train", 4), ("val", 2)):
        for label in ("a", "b"):
            (tmp_path / "images" / split / label).mkdir(parents=True)
            for i in range(n):
                pixels = (torch.rand(32, 32, 3, generator=g) * 255).to(torch.uint8).numpy()
                Image.fromarray(pixels).save(tmp_path / "images" / split / label / f"{i}.png")
    code, _, err = run_cli("eval", "knn", str(tmp_path / "dinov3-tiny"), "--data", "imagefolder", "--root",
                           str(tmp_path / "images"), "--resize", "--train-limit", "8")
    assert code == 0, err
    result = json.loads((tmp_path / "dinov3-tiny-eval" / "knn.json").read_text())
    assert result["test_size"] == 4 and result["train_size"] == 8
