"""MAE judged as MAE is: the fine-tuning pool (mean of the patch tokens + fc_norm) and the linear probe
(BatchNorm1d(affine=False) + LARS at base lr 0.1 with warm-up), both on by default for MAE runs."""

from __future__ import annotations

import json
import math

import pytest
import torch
import yaml

from selfsup.eval.finetune import load_pretrained
from selfsup.eval.linear import (MAE_BASE_LR, LarsHeads, ProbeConfig, mae_lr, mae_probe_config, probe_features,
                                 train_lars)
from selfsup.models.vit import VisionTransformer
from selfsup.optim import LARS
from ssl_helpers import assert_user_error, run_cli

MICRO = dict(image_size=8, patch_size=2, in_chans=1, embed_dim=32, depth=2, num_heads=2)


# --------------------------------------------------------------------------- the fine-tuning pool


def test_global_pool_is_the_fc_norm_of_the_mean_patch_token_by_hand():
    torch.manual_seed(0)
    vit = VisionTransformer(pool="global", **MICRO).eval()
    assert isinstance(vit.norm, torch.nn.Identity) and vit.fc_norm.eps == 1e-6
    with torch.no_grad():
        vit.fc_norm.weight.uniform_(0.5, 1.5)
        vit.fc_norm.bias.normal_()
    x = torch.randn(3, 1, 8, 8)
    with torch.no_grad():
        tokens = vit.patch_embed.proj(x).flatten(2).transpose(1, 2)  # (3, 16, 32)
        tokens = torch.cat([vit.cls_token.expand(3, -1, -1), tokens], 1) + vit.pos_embed
        for block in vit.blocks:
            tokens = block(tokens)
        mean = tokens[:, 1:].sum(1) / 16  # the class token left out
        mu, var = mean.mean(-1, keepdim=True), ((mean - mean.mean(-1, keepdim=True)) ** 2).mean(-1, keepdim=True)
        want = (mean - mu) / torch.sqrt(var + 1e-6) * vit.fc_norm.weight + vit.fc_norm.bias
        torch.testing.assert_close(vit(x), want, rtol=1e-5, atol=1e-5)
        cls = VisionTransformer(pool="cls", **MICRO).eval()
        load_pretrained(cls, vit.state_dict())
        assert not torch.allclose(cls(x), want, atol=1e-3)  # the class-token feature is another one


def test_pretrained_final_norm_is_dropped_and_fc_norm_starts_fresh():
    torch.manual_seed(0)
    pretrained = VisionTransformer(**MICRO)
    with torch.no_grad():
        pretrained.norm.weight.fill_(3.0)
    rebuilt = VisionTransformer(pool="global", **MICRO)
    load_pretrained(rebuilt, pretrained.state_dict())
    for name, value in pretrained.state_dict().items():
        if not name.startswith("norm."):
            assert torch.equal(rebuilt.state_dict()[name], value), name
    assert torch.equal(rebuilt.fc_norm.weight, torch.ones(32)) and torch.equal(rebuilt.fc_norm.bias, torch.zeros(32))
    with pytest.raises(ValueError, match="do not fit the rebuilt backbone"):
        load_pretrained(VisionTransformer(**{**MICRO, "depth": 1}), pretrained.state_dict())


def test_global_pool_backbone_exports_to_timm_with_identical_features(tmp_path):
    from selfsup.export import export_backbone, load_timm

    torch.manual_seed(0)
    vit = VisionTransformer(pool="global", **MICRO).eval()
    with torch.no_grad():
        vit.fc_norm.bias.normal_()
    meta = {"backbone": "vit_micro", "kwargs": dict(vit.kwargs), "image_size": 8, "in_chans": 1,
            "mean": [0.5], "std": [0.5]}
    export_backbone(vit, tmp_path / "b.safetensors", meta)
    model = load_timm(tmp_path / "b.safetensors")
    assert model.global_pool == "avg" and isinstance(model.norm, torch.nn.Identity)
    x = torch.randn(4, 1, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(model(x), vit(x), rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- the linear probe


def test_mae_probe_head_is_a_non_affine_batchnorm_and_a_trunc_normal_linear():
    torch.manual_seed(0)
    heads = LarsHeads(256, 10, 3)
    assert isinstance(heads.norm, torch.nn.BatchNorm1d) and not heads.norm.affine and heads.norm.eps == 1e-6
    assert [n for n, _ in heads.named_parameters()] == [f"heads.{i}.{k}" for i in range(3) for k in ("weight", "bias")]
    w = torch.cat([h.weight.detach().flatten() for h in heads.heads])
    assert abs(float(w.std()) - 0.01) < 5e-4 and float(w.abs().max()) < 0.06
    assert all(torch.equal(h.bias, torch.zeros(10)) for h in heads.heads)
    cfg = mae_probe_config()
    assert (cfg.protocol, cfg.lr_grid, cfg.weight_decay, cfg.warmup_epochs, cfg.epochs, cfg.val_fraction) == \
        ("mae", (0.1,), 0.0, 10.0, 90, 0.0)


def test_mae_lr_is_lr_sched_warmup_then_half_cycle_cosine():
    cfg = mae_probe_config(epochs=90, min_lr=0.0)
    assert mae_lr(6.4, 0.0, cfg) == 0.0 and mae_lr(6.4, 5.0, cfg) == pytest.approx(3.2)
    assert mae_lr(6.4, 10.0, cfg) == pytest.approx(6.4)
    assert mae_lr(6.4, 50.0, cfg) == pytest.approx(6.4 * 0.5 * (1 + math.cos(math.pi * 40 / 80)))
    assert mae_lr(6.4, 90.0, cfg) == pytest.approx(0.0, abs=1e-12)


def test_lars_probe_steps_at_the_scheduled_lr_and_each_head_is_an_independent_lars(monkeypatch):
    """Two heads at two lrs train exactly like two single heads, each with optim.LARS at lr(t) by hand."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(3, 2, 24, 8, generator=g), torch.randint(0, 4, (3, 2, 24), generator=g)
    cfg = mae_probe_config(epochs=3, warmup_epochs=1.0, batch_size=24)
    points = [(0.1, 0.4, 0.0), (0.3, 2.0, 0.01)]
    seen = []
    step = LARS.step

    def spy(self, closure=None):
        seen.append([group["lr"] for group in self.param_groups])
        return step(self, closure)

    monkeypatch.setattr(LARS, "step", spy)
    torch.manual_seed(1)
    fc, _ = train_lars(8, 4, points, cfg, lambda e: zip(x[e], y[e]), "cpu", steps_per_epoch=2)
    want = [[mae_lr(lr, e + i / 2, cfg) for _, lr, _ in points] for e in range(3) for i in range(2)]
    assert len(seen) == 6 and sum(seen, []) == pytest.approx(sum(want, []))
    assert want[0] == [0.0, 0.0] and want[2] == pytest.approx([0.4, 2.0])  # 0 at the start, the peak after warm-up
    monkeypatch.setattr(LARS, "step", step)
    torch.manual_seed(1)
    init = LarsHeads(8, 4, 2)
    for k, (_, lr, wd) in enumerate(points):
        ref = torch.nn.Sequential(torch.nn.BatchNorm1d(8, affine=False, eps=1e-6), torch.nn.Linear(8, 4))
        ref[1].load_state_dict(init.heads[k].state_dict())
        opt = LARS(ref.parameters(), lr=0.0, weight_decay=wd, momentum=0.9)
        for e in range(3):
            for i in range(2):
                for group in opt.param_groups:
                    group["lr"] = mae_lr(lr, e + i / 2, cfg)
                loss = torch.nn.functional.cross_entropy(ref(x[e, i]), y[e, i])
                opt.zero_grad()
                loss.backward()
                opt.step()
        torch.testing.assert_close(fc.heads[k].weight, ref[1].weight, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(fc.heads[k].bias, ref[1].bias, rtol=1e-5, atol=1e-6)


def test_mae_probe_learns_separable_features():
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 4, (400,), generator=g)
    x = torch.randn(400, 16, generator=g) * 0.3 + 5 * torch.nn.functional.one_hot(y, 16).float() + 100.0
    # LARS moves a weight by lr · 0.001 · ‖w‖ a step: 90 epochs of 5 steps need a larger lr than the official 0.1
    res = probe_features(x[:300], y[:300], x[300:], y[300:], 4,
                         mae_probe_config(epochs=90, batch_size=64, lr_grid=(10.0,)), base_lr=MAE_BASE_LR)
    assert res["test"]["top1"] == 100.0 and res["val_size"] == 0 and len(res["grid"]) == 1
    assert res["chosen"]["lr"] == pytest.approx(10.0 * 64 / 256)
    with pytest.raises(ValueError, match="protocol must be one of"):
        ProbeConfig(protocol="dino")


# --------------------------------------------------------------------------- a tiny MAE run, from the command line


def _run_folder(root, preset, name, overrides=()):
    from selfsup.config import load_run_config, to_dict
    from selfsup.data.datasets import load_dataset
    from selfsup.export import export_backbone
    from selfsup.methods.build import backbone_meta, build_method, data_info

    run_dir = root / name
    run_dir.mkdir(parents=True)
    cfg = load_run_config(preset, [f"output_dir={root}", f"name={name}", *overrides])
    info = data_info(cfg, load_dataset(cfg.data, "train"))
    model = build_method(cfg, info)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    export_backbone(model.backbone, run_dir / "backbone.safetensors", backbone_meta(cfg, info))
    return run_dir


@pytest.fixture(scope="module")
def mae_run(tmp_path_factory):
    """A digits MAE run folder (random-init encoder: the protocols, not the accuracy, are under test)."""
    return _run_folder(tmp_path_factory.mktemp("runs"), "mae-digits", "mae")


def test_mae_run_fine_tunes_with_the_global_pool_and_a_trained_position_table(mae_run, tmp_path):
    from safetensors.torch import load_file

    code, out, err = run_cli("eval", "finetune", mae_run, "--epochs", "1", "--ft-batch", "64", "--train-limit", "128",
                             "--out", tmp_path / "ft")
    assert code == 0, err
    ft = json.loads((tmp_path / "ft" / "finetune.json").read_text())
    assert ft["pool"] == "global" and ft["train_pos_embed"] and ft["steps"] == 2 and "pool global" in out
    before, after = load_file(str(mae_run / "backbone.safetensors")), \
        load_file(str(tmp_path / "ft" / "finetuned_backbone.safetensors"))
    assert "fc_norm.weight" in after and "norm.weight" not in after and "norm.weight" in before
    assert not torch.equal(before["pos_embed"], after["pos_embed"])  # MAE trains the position table
    code, _, err = run_cli("eval", "finetune", mae_run, "--epochs", "1", "--ft-batch", "64", "--train-limit", "128",
                           "--pool", "cls", "--no-train-pos-embed", "--out", tmp_path / "cls")
    assert code == 0, err
    ft = json.loads((tmp_path / "cls" / "finetune.json").read_text())
    assert ft["pool"] == "cls" and not ft["train_pos_embed"]
    after = load_file(str(tmp_path / "cls" / "finetuned_backbone.safetensors"))
    assert "norm.weight" in after and torch.equal(before["pos_embed"], after["pos_embed"])


def test_mae_run_probes_with_lars_at_the_official_lr_exactly(mae_run, tmp_path):
    from selfsup.runs.session import EvalSession

    code, out, err = run_cli("eval", "linear", mae_run, "--epochs", "9", "--out", tmp_path)
    assert code == 0, err
    lin = json.loads((tmp_path / "linear.json").read_text())
    assert (lin["protocol"], lin["optimizer"], lin["feature_bn"], lin["val_size"]) == ("mae", "lars", True, 0)
    assert lin["lr"] == pytest.approx(0.1 * 256 / 256) and lin["warmup_epochs"] == pytest.approx(1.0)
    assert len(lin["grid"]) == 1 and "mae protocol" in out
    session = EvalSession(mae_run, device="cpu", out=str(tmp_path))
    (ftr, ytr), (fte, yte) = session.features("train"), session.features("test")
    res = probe_features(ftr, ytr, fte, yte, 10, mae_probe_config(epochs=9, warmup_epochs=1.0), MAE_BASE_LR)
    assert res["test"] == lin["test"]  # the command line is the documented protocol, bit for bit
    code, _, err = run_cli("eval", "linear", mae_run, "--epochs", "1", "--mode", "augmented", "--out", tmp_path / "a")
    assert code == 0, err
    aug = json.loads((tmp_path / "a" / "linear.json").read_text())
    assert aug["protocol"] == "mae" and aug["mode"] == "augmented" and 0 <= aug["test"]["top1"] <= 100
    code, _, err = run_cli("eval", "linear", mae_run, "--epochs", "2", "--protocol", "moco_v3", "--out", tmp_path / "m")
    assert code == 0, err
    moco = json.loads((tmp_path / "m" / "linear.json").read_text())
    assert moco["protocol"] == "moco_v3" and moco["optimizer"] == "sgd" and len(moco["grid"]) == 7


def test_user_errors_are_one_line_exit_2(mae_run, tmp_path):
    code, _, err = run_cli("eval", "linear", mae_run, "--epochs", "4", "--warmup-epochs", "4")
    assert_user_error(code, err, "--warmup-epochs 4")
    resnet = _run_folder(tmp_path, "moco-v3-vit-digits", "resnet", ["model.backbone=resnet18", "model.small_stem=true"])
    code, _, err = run_cli("eval", "finetune", resnet, "--pool", "global", "--epochs", "1")
    assert_user_error(code, err, "--pool global", "resnet18")
