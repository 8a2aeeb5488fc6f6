"""MAE: masking, the encoder on kept patches only, the pixel target and loss, MAE's tables and init, the
optimiser groups, an end-to-end run whose encoder timm loads, and ``selfsup eval reconstruct``."""

from __future__ import annotations

import contextlib
import io
import json
import math
from functools import partial

import numpy as np
import pytest
import torch
from torch import nn

from selfsup.errors import UserError
from selfsup.losses import masked_patch_mse, normalized_pixel_target
from selfsup.methods import DataInfo
from selfsup.models.mae import mae_sincos_position_embedding, num_kept, patchify, random_masking, unpatchify
from ssl_helpers import tiny_config, tiny_method

MAE_TINY = ["method.decoder_embed_dim=32", "method.decoder_depth=1", "method.decoder_num_heads=2",
            "data.batch_size=64", "trainer.max_epochs=1", "trainer.limit_train_batches=2",
            "trainer.progress_bar=false", "trainer.log_every_n_steps=1", "trainer.accelerator=cpu",
            "trainer.devices=1"]


def mae(**method):
    return tiny_method("mae", method)


# --------------------------------------------------------------------------- masking


def test_masking_hand_example():
    noise = torch.tensor([[0.9, 0.1, 0.5, 0.3]])
    ids_keep, mask, ids_restore = random_masking(noise, 2)
    assert ids_keep.tolist() == [[1, 3]]  # the two smallest noises, smallest first
    assert mask.tolist() == [[1.0, 0.0, 1.0, 0.0]]  # 1 = removed, in the original order
    assert ids_restore.tolist() == [[3, 0, 2, 1]]  # shuffle (1, 3, 2, 0) inverted


def test_masking_keeps_exactly_len_keep_per_sample_and_ids_restore_inverts_the_shuffle():
    assert num_kept(196, 0.75) == 49 and num_kept(16, 0.75) == 4 and num_kept(49, 0.75) == 12
    g = torch.Generator().manual_seed(0)
    b, length, keep = 6, 49, 12
    noise = torch.rand(b, length, generator=g)
    ids_keep, mask, ids_restore = random_masking(noise, keep)
    assert ids_keep.shape == (b, keep) and mask.shape == ids_restore.shape == (b, length)
    assert mask.sum(1).tolist() == [length - keep] * b
    assert all(len(set(row.tolist())) == keep for row in ids_keep)  # distinct patches
    assert mask.gather(1, ids_keep).sum() == 0  # every kept patch is marked kept
    assert len({tuple(r.tolist()) for r in ids_keep}) == b  # a mask of its own per sample
    # the decoder's unshuffle: kept tokens then the removed ones (in shuffle order), gathered by ids_restore
    x = torch.randn(b, length, 3, generator=g)
    removed = noise.argsort(1)[:, keep:]
    shuffled = torch.cat([x.gather(1, ids_keep[..., None].expand(-1, -1, 3)),
                          x.gather(1, removed[..., None].expand(-1, -1, 3))], dim=1)
    assert torch.equal(shuffled.gather(1, ids_restore[..., None].expand(-1, -1, 3)), x)


def test_method_masks_the_configured_share():
    m = mae(mask_ratio=0.5)
    _, _, _, mask = m.forward_mae(torch.randn(5, 1, 8, 8), m.mask_noise(5, "cpu"))
    assert m.num_patches == 16 and m.len_keep == 8
    assert mask.sum(1).tolist() == [8.0] * 5


# --------------------------------------------------------------------------- the encoder


def test_encoder_sees_only_the_kept_tokens():
    m = mae()
    seen = []
    m.backbone.blocks[0].register_forward_pre_hook(lambda mod, args: seen.append(args[0].shape))
    x = torch.randn(4, 1, 8, 8)
    noise = torch.rand(4, 16, generator=torch.Generator().manual_seed(1))
    out = m.forward_views([x], noise)
    assert seen == [torch.Size([4, 1 + 4, 128])]  # class token + 4 of 16 patches
    # nothing of a removed patch reaches the encoder: change those pixels, the encoder output stays
    mask = random_masking(noise, m.len_keep)[1]
    removed = unpatchify(mask[..., None].expand(-1, -1, 4), 2, 1).bool()
    x2 = torch.where(removed, torch.randn_like(x) * 10, x)
    ids_keep = random_masking(noise, 4)[0]
    torch.testing.assert_close(m.backbone.forward_visible(x2, ids_keep), m.backbone.forward_visible(x, ids_keep),
                               rtol=0, atol=0)
    assert torch.equal(m.forward_views([x2], noise).embedding, out.embedding)


def test_forward_visible_of_every_patch_is_forward_features():
    vit = mae().backbone.eval()
    x = torch.randn(3, 1, 8, 8)
    every = torch.arange(16).expand(3, -1)
    assert torch.equal(vit.forward_visible(x, every), vit.forward_features(x))


# --------------------------------------------------------------------------- target and loss


def test_patchify_layout_and_inverse():
    images = torch.arange(2 * 2 * 4 * 4, dtype=torch.float32).reshape(2, 2, 4, 4)
    patches = patchify(images, 2)
    assert patches.shape == (2, 4, 8)
    # patch 1 = row 0, column 1; values laid out (p, q, c): element (p=0, q=1, c=1) is index (0 * 2 + 1) * 2 + 1
    assert patches[1, 1, 3] == images[1, 1, 0, 3]
    assert patches[0, 2, 4] == images[0, 0, 3, 0]  # patch 2 = row 1, column 0; (p=1, q=0, c=0) -> index 4
    assert torch.equal(unpatchify(patches, 2, 2), images)


def test_normalized_pixel_target_by_hand():
    patches = torch.tensor([[[1.0, 2.0, 3.0, 4.0], [2.0, 2.0, 2.0, 2.0]]])
    out = normalized_pixel_target(patches)
    std = math.sqrt(5 / 3 + 1e-6)  # unbiased variance of 1..4: (2.25 + 0.25 + 0.25 + 2.25) / 3
    torch.testing.assert_close(out[0, 0], torch.tensor([-1.5, -0.5, 0.5, 1.5]) / std)
    assert torch.equal(out[0, 1], torch.zeros(4))  # a flat patch: 0 / sqrt(1e-6)


def test_loss_counts_the_removed_patches_only():
    target = torch.tensor([[[1.0, 1.0], [5.0, -5.0], [2.0, 0.0]]])
    pred = torch.zeros_like(target)
    mask = torch.tensor([[1.0, 0.0, 1.0]])
    assert masked_patch_mse(pred, target, mask) == pytest.approx((1.0 + 2.0) / 2)  # patch means 1 and 2
    wrong_kept = pred.clone()
    wrong_kept[0, 1] = 100.0  # a kept patch's prediction does not count
    assert masked_patch_mse(wrong_kept, target, mask) == masked_patch_mse(pred, target, mask)


def test_method_loss_is_the_masked_mse_of_the_normalised_pixels():
    m = mae()
    x = torch.randn(4, 1, 8, 8)
    noise = torch.rand(4, 16, generator=torch.Generator().manual_seed(2))
    loss, _, pred, mask = m.forward_mae(x, noise)
    patches = patchify(x, 2)
    target = (patches - patches.mean(-1, keepdim=True)) / (patches.var(-1, keepdim=True) + 1e-6).sqrt()
    expected = (((pred - target) ** 2).mean(-1) * mask).sum() / mask.sum()
    torch.testing.assert_close(loss, expected)
    raw = mae(norm_pix_loss=False)
    loss_raw, _, pred_raw, mask_raw = raw.forward_mae(x, noise)
    torch.testing.assert_close(loss_raw, (((pred_raw - patches) ** 2).mean(-1) * mask_raw).sum() / mask_raw.sum())


# --------------------------------------------------------------------------- tables, init, optimiser


def _mae_table_reference(grid: int, dim: int) -> np.ndarray:
    """MAE util/pos_embed.py, written out: per token (row i, column j), [sin jω, cos jω, sin iω, cos iω]."""
    omega = 1.0 / 10000 ** (np.arange(dim // 4) / (dim / 4))
    rows = [np.zeros(dim)]
    for i in range(grid):
        for j in range(grid):
            rows.append(np.concatenate([np.sin(j * omega), np.cos(j * omega), np.sin(i * omega), np.cos(i * omega)]))
    return np.stack(rows)[None]


def test_sincos_tables_are_maes():
    ref = _mae_table_reference(4, 32)
    np.testing.assert_allclose(mae_sincos_position_embedding(4, 32).numpy(), ref, atol=1e-6)
    m = mae()
    np.testing.assert_allclose(m.backbone.pos_embed.numpy(), _mae_table_reference(4, 128), atol=1e-6)
    np.testing.assert_allclose(m.decoder.pos_embed.numpy(), _mae_table_reference(4, 32), atol=1e-6)
    assert not m.backbone.pos_embed.requires_grad and not m.decoder.pos_embed.requires_grad


def test_mae_init():
    m = mae()
    d = 128
    qkv = m.backbone.blocks[0].attn.qkv.weight
    bound = math.sqrt(6 / (d + 3 * d))  # xavier over the whole (3D, D) matrix (MoCo v3's per-Q/K/V bound is sqrt(6/2D))
    assert 0.95 * bound < qkv.abs().max() <= bound
    assert m.backbone.blocks[0].attn.qkv.bias.abs().sum() == 0
    assert 0.01 < m.backbone.cls_token.std() < 0.03 and 0.01 < m.decoder.mask_token.std() < 0.04
    assert m.backbone.patch_embed.proj.bias.abs().sum() > 0  # torch's default conv bias, as official


def test_param_groups_follow_maes_add_weight_decay():
    from selfsup.config import load_run_config

    cfg = load_run_config("mae-digits", ["trainer.accelerator=cpu"])
    from selfsup.methods.build import build_method

    m = build_method(cfg, DataInfo(1, 8, (0.5,), (0.25,)))
    opt = m.configure_optimizers()
    assert opt.defaults["betas"] == (0.9, 0.95)
    names = {id(p): n for n, p in m.named_parameters()}
    decayed = {names[id(p)] for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    plain = {names[id(p)] for g in opt.param_groups if g["weight_decay"] == 0 for p in g["params"]}
    assert {g["weight_decay"] for g in opt.param_groups} == {0.0, 0.05}
    assert plain == {n for n, p in m.named_parameters() if p.ndim == 1}  # biases and norms
    assert {"backbone.cls_token", "decoder.mask_token", "backbone.patch_embed.proj.weight"} <= decayed
    assert "backbone.pos_embed" not in decayed | plain and "decoder.pos_embed" not in decayed | plain


@pytest.mark.parametrize("overrides, match", [
    ({"method": {"mask_ratio": 1.0}}, r"method.mask_ratio=1.0 must be in \(0, 1\)"),
    ({"method": {"decoder_embed_dim": 30}}, r"method.decoder_embed_dim=30 must divide by 4"),
    ({"model": {"backbone": "resnet18"}}, r"method mae needs a selfsup ViT backbone .*model.backbone='resnet18'"),
    ({"method": {"mask_ratio": 0.99}}, r"method.mask_ratio=0.99 keeps 0 of 16 patches"),
])
def test_bad_configs(overrides, match):
    from selfsup.methods.build import build_method

    overrides = dict(overrides)
    method = overrides.pop("method", {})
    with pytest.raises(UserError, match=match):
        build_method(tiny_config("mae", method, **overrides), DataInfo(1, 8, (0.5,), (0.25,)))


# --------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from selfsup.config import load_run_config
    from selfsup.engine import pretrain

    out = tmp_path_factory.mktemp("mae")
    return pretrain(load_run_config("mae-digits", MAE_TINY + [f"output_dir={out}", "name=run"]))


@pytest.mark.train
def test_exported_encoder_loads_into_timm_with_identical_features(run):
    import timm.models.vision_transformer as tv
    from safetensors.torch import load_file

    from selfsup.export import load_exported

    state = load_file(str(run / "backbone.safetensors"))
    assert not any(k.startswith(("decoder", "mask_token")) for k in state)  # the encoder only
    ref = tv.VisionTransformer(img_size=8, patch_size=2, in_chans=1, embed_dim=128, depth=4, num_heads=4,
                               mlp_ratio=4.0, qkv_bias=True, num_classes=0, global_pool="token", fc_norm=False,
                               norm_layer=partial(nn.LayerNorm, eps=1e-6)).eval()
    ref.load_state_dict(state, strict=True)
    ours, meta = load_exported(run / "backbone.safetensors")
    assert meta["method"] == "mae"
    x = torch.randn(5, 1, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(ref.forward_features(x), ours.eval().forward_features(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ref(x), ours(x), rtol=1e-5, atol=1e-5)
    init = load_file(str(run / "backbone_init.safetensors"))
    assert not torch.equal(init["blocks.0.attn.qkv.weight"], state["blocks.0.attn.qkv.weight"])  # it trained


def _cli(*argv):
    from selfsup.commands.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


@pytest.mark.train
def test_eval_reconstruct_writes_the_grid(run, tmp_path):
    from PIL import Image

    code, out, err = _cli("eval", "reconstruct", str(run), "--n", "3", "--out", str(tmp_path), "--scale", "2")
    assert code == 0, err
    record = json.loads((tmp_path / "reconstruct.json").read_text())
    assert record["images"] == 3 and record["mask_ratio"] == 0.75 and record["masked_patch_loss"] > 0
    png = Image.open(tmp_path / "reconstruct.png")
    # 4 rows x 3 images of 16 px (8 px x 2), 2-px padding around each
    assert png.size == (3 * 18 + 2, 4 * 18 + 2) and png.mode == "L"
    grid = np.asarray(png)

    def tile(r, c):
        return grid[2 + 18 * r: 18 + 18 * r, 2 + 18 * c: 18 + 18 * c]

    for c in range(3):
        original, masked, pasted = tile(0, c), tile(1, c), tile(3, c)
        grey = masked == 128
        assert 0 < grey.mean() < 1  # removed patches grey (a few visible pixels may be grey too)
        assert np.array_equal(pasted[~grey], original[~grey])  # visible patches pasted back unchanged
    assert f"{tmp_path / 'reconstruct.png'}" in out


def test_eval_reconstruct_refuses_a_run_without_a_decoder(tmp_path):
    import yaml

    from selfsup.config import load_run_config, to_dict

    (tmp_path / "r").mkdir()
    cfg = load_run_config("moco-v3-vit-digits", ["trainer.accelerator=cpu"])
    (tmp_path / "r" / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg)))
    code, _, err = _cli("eval", "reconstruct", str(tmp_path / "r"))
    assert code == 2 and "is not an MAE run (method MoCoV3Config); reconstruct needs method.name=mae" in err
