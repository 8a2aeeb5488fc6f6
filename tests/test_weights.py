"""model.weights (selfsup/weights.py): torchvision, timm and DINOv2-hub state dicts load into selfsup's backbones with
no missing or unexpected key and compute what the same network built by torchvision / timm computes; position tables
are resampled as their source model does; every other mismatch is one line; a run says what it started from."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from ssl_helpers import TINY, assert_user_error, raises_user_error, run_cli, tiny_method

from benchmarks.hub_layout import hub_layout

from selfsup.models.backbones import build_backbone
from selfsup.weights import load_weights, read_weights, resample_position_table, state_sha256

timm = pytest.importorskip("timm")
from timm.models.vision_transformer import checkpoint_filter_fn  # noqa: E402


def _x(channels=3, size=32, batch=2, seed=0):
    return torch.randn(batch, channels, size, size, generator=torch.Generator().manual_seed(seed))


def _vit(size, patch, **kw):
    return build_backbone("deit_small", in_chans=3, image_size=size, patch_size=patch, pos_embed="learned",
                          **{"init": "trunc_normal", **kw}).eval()


# --------------------------------------------------------------------------- the three bars


def test_a_torchvision_resnet18_state_dict_loads_and_computes_torchvision_s_features(tmp_path):
    import torchvision

    torch.manual_seed(0)
    tv = torchvision.models.resnet18(weights=None)
    for m in tv.modules():  # BN statistics away from 0 / 1, so a skipped buffer would show
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5), m.running_var.uniform_(0.5, 2.0), m.bias.data.uniform_(-0.1, 0.1)
    torch.save(tv.state_dict(), tmp_path / "r18.pth")
    ours = build_backbone("resnet18", in_chans=3, image_size=64)
    facts = load_weights(ours, str(tmp_path / "r18.pth"))
    assert facts.dropped == ["fc.bias", "fc.weight"] and facts.kind == "file" and facts.prefix == ""
    tv.fc = torch.nn.Identity()
    x = _x(size=64)
    assert torch.equal(ours.eval()(x), tv.eval()(x))
    assert facts.sha256 == state_sha256(ours.state_dict()) and len(facts.sha256) == 64


def test_a_3_channel_first_convolution_is_summed_into_a_1_channel_backbone(tmp_path):
    import torchvision

    tv = torchvision.models.resnet18(weights=None).eval()
    ours = build_backbone("resnet18", in_chans=1, image_size=64)
    facts = load_weights(ours, _save(tmp_path / "r18.safetensors", tv.state_dict()))
    assert facts.adapted.startswith("conv1.weight")
    tv.fc = torch.nn.Identity()
    x = _x(channels=1, size=64)
    torch.testing.assert_close(ours.eval()(x), tv(x.expand(-1, 3, -1, -1)), rtol=1e-5, atol=1e-5)


def _save(path, state):
    save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    return str(path)


def test_a_timm_vit_state_dict_loads_and_computes_timm_s_features(tmp_path):
    torch.manual_seed(0)
    ref = timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=0, img_size=32).eval()
    ours = _vit(32, 16)
    facts = load_weights(ours, _save(tmp_path / "vit.safetensors", ref.state_dict()))
    assert facts.dropped == [] and facts.resampled is None
    x = _x()
    torch.testing.assert_close(ours(x), ref(x), rtol=1e-5, atol=1e-5)
    # the same weights with a classifier, under a checkpoint's wrapper and DDP's prefix: the head dropped, listed
    with_head = timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=10, img_size=32)
    with_head.load_state_dict({**ref.state_dict(), "head.weight": torch.zeros(10, 384), "head.bias": torch.zeros(10)})
    torch.save({"epoch": 3, "model": {f"module.{k}": v for k, v in with_head.state_dict().items()}},
               tmp_path / "ckpt.pth")
    again = _vit(32, 16)
    facts = load_weights(again, str(tmp_path / "ckpt.pth"))
    assert (facts.wrapper, facts.prefix, facts.dropped) == ("model", "module.", ["head.bias", "head.weight"])
    torch.testing.assert_close(again(x), ref(x), rtol=1e-5, atol=1e-5)


def test_a_dinov2_hub_checkpoint_loads_into_the_selfsup_vit_and_computes_timm_s_dinov2(tmp_path):
    """timm's ``vit_small_patch14_dinov2`` (random init, no download) → the hub layout (its inverse, checked by
    timm's own filter turning it back) → ``dinov2_vits14_pretrain.pth`` → the selfsup ViT: no missing or unexpected
    key (the mask token is the hub's pretraining head, dropped by name) and timm's features at 518 px."""
    torch.manual_seed(0)
    ref = timm.create_model("vit_small_patch14_dinov2", pretrained=False, num_classes=0).eval()
    for block in ref.blocks:  # LayerScale away from its 1e-5 init, so a dropped gamma would show
        block.ls1.gamma.data.uniform_(0.5, 1.5), block.ls2.gamma.data.uniform_(0.5, 1.5)
    hub = hub_layout(ref.state_dict())
    back = checkpoint_filter_fn(dict(hub), ref)  # timm's filter undoes the inverse exactly
    assert set(back) == set(ref.state_dict()) and all(torch.equal(back[k], v) for k, v in ref.state_dict().items())
    torch.save(hub, tmp_path / "dinov2_vits14_pretrain.pth")
    ours = _vit(518, 14, layer_scale=1e-5, init="dinov2")
    facts = load_weights(ours, str(tmp_path / "dinov2_vits14_pretrain.pth"))
    assert (facts.kind, facts.dropped, facts.resampled) == ("dinov2-hub", ["mask_token"], None)
    x = _x(size=518, batch=1)
    torch.testing.assert_close(ours(x), ref(x), rtol=1e-4, atol=1e-4)


def test_a_dinov2_hub_checkpoint_with_registers_computes_timm_s_reg4_model(tmp_path):
    torch.manual_seed(1)
    ref = timm.create_model("vit_small_patch14_reg4_dinov2", pretrained=False, num_classes=0, img_size=56).eval()
    hub = hub_layout(ref.state_dict())
    back = checkpoint_filter_fn(dict(hub), ref)
    torch.testing.assert_close(back["cls_token"], ref.state_dict()["cls_token"])
    torch.save(hub, tmp_path / "dinov2_vits14_reg4_pretrain.pth")
    ours = _vit(56, 14, layer_scale=1e-5, registers=4)
    load_weights(ours, str(tmp_path / "dinov2_vits14_reg4_pretrain.pth"))
    x = _x(size=56)
    torch.testing.assert_close(ours(x), ref(x), rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------- position tables


def test_a_hub_table_is_resampled_as_dinov2_computes_it_at_the_run_s_size(tmp_path):
    """DINOv2's hub ViT at 224 px interpolates its 37×37 table per forward: scale (16 + 0.1) / 37, bicubic, no
    antialias (dinov2 models/vision_transformer.py:180-212, offset 0.1 and antialias off: hub/backbones.py:27-28);
    loaded at 224 px the selfsup ViT holds that table (written out here from those facts)."""
    torch.manual_seed(2)
    ref = timm.create_model("vit_small_patch14_dinov2", pretrained=False, num_classes=0).eval()
    hub = hub_layout(ref.state_dict())
    torch.save(hub, tmp_path / "dinov2_vits14_pretrain.pth")
    ours = _vit(224, 14, layer_scale=1e-5)
    facts = load_weights(ours, str(tmp_path / "dinov2_vits14_pretrain.pth"))
    assert facts.resampled == "37x37 -> 16x16 (dino)"
    pos = hub["pos_embed"]
    grid = F.interpolate(pos[:, 1:].reshape(1, 37, 37, 384).permute(0, 3, 1, 2), mode="bicubic",
                         scale_factor=((16 + 0.1) / 37, (16 + 0.1) / 37), antialias=False)
    expect = torch.cat([pos[:, :1], grid.permute(0, 2, 3, 1).reshape(1, 256, 384)], dim=1)
    assert torch.equal(ours.pos_embed.detach(), expect)


def test_a_timm_table_is_resampled_as_timm_loads_it(tmp_path):
    """A timm-layout file at another size: timm's ``resample_abs_pos_embed`` (size, bicubic, antialias): the selfsup
    ViT computes what timm computes after loading the same file through its own filter."""
    torch.manual_seed(3)
    big = timm.create_model("vit_small_patch14_dinov2", pretrained=False, num_classes=0)
    path = _save(tmp_path / "timm_dinov2.safetensors", big.state_dict())
    ref = timm.create_model("vit_small_patch14_dinov2", pretrained=False, num_classes=0, img_size=224).eval()
    ref.load_state_dict(checkpoint_filter_fn(load_file(path), ref))
    ours = _vit(224, 14, layer_scale=1e-5)
    assert load_weights(ours, path).resampled == "37x37 -> 16x16 (timm)"
    x = _x(size=224, batch=1)
    torch.testing.assert_close(ours(x), ref(x), rtol=1e-4, atol=1e-4)
    table = big.state_dict()["pos_embed"]
    assert torch.equal(resample_position_table(table, 16, 1, "timm"),
                       timm.layers.resample_abs_pos_embed(table, (16, 16), num_prefix_tokens=1))


# --------------------------------------------------------------------------- one line for every other mismatch


def test_every_other_mismatch_is_one_line(tmp_path):
    ref = timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=0, img_size=32)
    path = _save(tmp_path / "vit.safetensors", ref.state_dict())
    with raises_user_error("do not fit", "missing", "blocks.0.ls1.gamma", "prefix ''",
                           "model.backbone=deit_small model.patch_size=16", "model.layer_scale=0"):
        load_weights(_vit(32, 16, layer_scale=0.1), path)
    with raises_user_error("position table is learned", "model.pos_embed=learned"):
        load_weights(build_backbone("deit_small", in_chans=3, image_size=32, patch_size=16), path)
    with raises_user_error("do not fit", "unexpected", "shapes"):
        load_weights(build_backbone("vit_micro", in_chans=3, image_size=32, patch_size=16, pos_embed="learned"), path)
    hub = hub_layout(timm.create_model("vit_small_patch14_dinov2", pretrained=False, num_classes=0).state_dict())
    torch.save(hub, tmp_path / "dinov2_vits14_pretrain.pth")
    with raises_user_error("DINOv2 hub checkpoint with 6 heads", "model.backbone=deit_small", "model.patch_size=14",
                           "model.layer_scale=1e-5"):
        load_weights(build_backbone("vit_small", in_chans=3, image_size=56, patch_size=14, pos_embed="learned",
                                    layer_scale=1e-5), str(tmp_path / "dinov2_vits14_pretrain.pth"))
    (tmp_path / "notes.pth").write_text("not weights")
    with raises_user_error("cannot be read as weights", "notes.pth"):
        read_weights(str(tmp_path / "notes.pth"))
    with raises_user_error("does not exist"):
        read_weights(str(tmp_path / "absent.pth"))
    (tmp_path / "vit.txt").write_text("")
    with raises_user_error("not a weights file"):
        read_weights(str(tmp_path / "vit.txt"))


# --------------------------------------------------------------------------- a run from weights, from the CLI


@pytest.mark.train
def test_a_run_starts_from_another_run_and_says_so(tmp_path):
    code, _, err = run_cli("pretrain", "byol-digits", *TINY, f"output_dir={tmp_path}", "name=first")
    assert code == 0, err
    first = tmp_path / "first"
    code, out, err = run_cli("pretrain", "byol-digits", *TINY, f"output_dir={tmp_path}", "name=second",
                             f"model.weights={first}")
    assert code == 0, err
    second = tmp_path / "second"
    facts = json.loads((second / "run.json").read_text())["weights"]
    source = load_file(str(first / "backbone.safetensors"))
    init = load_file(str(second / "backbone_init.safetensors"))
    assert facts["kind"] == "selfsup" and facts["source"] == str(first) and f"weights: {first}" in out
    assert set(init) == set(source) and all(torch.equal(init[k], source[k]) for k in source)  # the kNN floor
    assert facts["sha256"] == state_sha256(source)
    # issue 62: its kNN floor is its start, not a random init, in the printed lines, knn.json and the report
    knn = json.loads((second / "knn.json").read_text())
    assert knn["labels"]["random_init"] == f"start (weights: {first})"
    row = next(line for line in out.splitlines() if "top-1" in line and "pretrained" not in line)
    assert row.strip().startswith(f"start (weights: {first})") and "random_init" not in out
    code, _, err = run_cli("report", second)
    assert code == 0, err
    report = (second / "report" / "report.md").read_text()
    assert f"| start | weights: {first} (sha256 {facts['sha256'][:12]}) |" in report
    assert f"| kNN top-1, start (weights: {first}) (floor) |" in report and "random init" not in report
    from selfsup.runs.source import weights_identity  # selfsup eval of its backbone_init names it so too

    assert weights_identity(second / "backbone_init.safetensors", second) == ("init", f"start (weights: {first})")
    assert weights_identity(first / "backbone_init.safetensors", first) == ("init", "random init")


def test_the_dino_teacher_and_the_momentum_targets_start_as_the_loaded_student(tmp_path):
    donor = tiny_method("simclr").backbone
    for p in donor.parameters():
        if p.requires_grad:  # the fixed sin-cos table and the frozen patch projection stay the backbone's own
            p.data.normal_()
    path = _save(tmp_path / "donor.safetensors", donor.state_dict())
    for method in ("dino", "byol", "mae", "ibot"):
        model = tiny_method(method, model={"weights": path})
        state = model.backbone.state_dict()  # a fixed position table is the backbone's own (MAE's sin-cos layout)
        assert all(torch.equal(state[k], v) for k, v in donor.state_dict().items() if k != "pos_embed"), method
        for online, target in model.momentum_pairs:
            if online is model.backbone:
                assert all(torch.equal(state[k], v) for k, v in target.state_dict().items()), method
        assert model.start_weights["source"] == path


@pytest.mark.train
def test_a_wrong_file_a_wrong_architecture_and_an_offline_timm_request_are_one_line(tmp_path, monkeypatch):
    (tmp_path / "w.pth").write_bytes(b"\x00not a torch file")
    code, _, err = run_cli("pretrain", "byol-digits", *TINY, f"output_dir={tmp_path}",
                           f"model.weights={tmp_path}/w.pth")
    assert_user_error(code, err, "model.weights=", "w.pth", "cannot be read as weights")
    code, _, err = run_cli("pretrain", "byol-digits", *TINY, f"output_dir={tmp_path}", "name=micro")
    assert code == 0, err
    code, _, err = run_cli("pretrain", "byol-digits", *TINY, f"output_dir={tmp_path}", "model.backbone=bn_cnn_micro",
                           f"model.weights={tmp_path / 'micro'}")
    assert_user_error(code, err, "do not fit", "missing", "unexpected")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    import huggingface_hub.constants as hf

    monkeypatch.setattr(hf, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setattr(hf, "HF_HUB_OFFLINE", True)
    code, _, err = run_cli("pretrain", "byol-digits", *TINY, f"output_dir={tmp_path}", "model.backbone=timm:resnet18",
                           "model.weights=timm")
    assert_user_error(code, err, "timm:resnet18", str(tmp_path / "hf" / "hub"), "model.weights=/path/to/resnet18")


def test_timm_weights_without_network_or_cache_fail_at_once_in_one_line(tmp_path, monkeypatch):
    """No network (the Hub's host refuses: here a closed local port) and nothing cached: one line naming the
    missing network and the cache within seconds, not timm's minute of retried requests (54 s before)."""
    import time

    import huggingface_hub.constants as hf

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setattr(hf, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setattr(hf, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(hf, "HF_HUB_OFFLINE", False)
    start = time.perf_counter()
    code, _, err = run_cli("pretrain", "byol-digits", *TINY, f"output_dir={tmp_path}", "model.backbone=timm:resnet18",
                           "model.weights=timm:resnet18.a1_in1k")
    assert time.perf_counter() - start < 20
    assert_user_error(code, err, "timm:resnet18.a1_in1k", "127.0.0.1 does not answer", "no network",
                      str(tmp_path / "hf" / "hub"), "model.weights=/path/to/resnet18")
    assert hf.HF_HUB_OFFLINE is False  # the switch is put back


def test_a_user_s_own_network_starts_from_weights_through_selfsup_method(tmp_path):
    import torchvision

    import selfsup

    tv = torchvision.models.resnet18(weights=None)
    path = _save(tmp_path / "r18.safetensors", tv.state_dict())
    mine = torchvision.models.resnet18(weights=None)
    mine.fc = torch.nn.Identity()
    model = selfsup.method("byol", mine, num_features=512, image_size=32, batch_size=8, model={"weights": path})
    assert model.backbone is mine and model.start_weights["dropped"] == ["fc.bias", "fc.weight"]
    assert all(torch.equal(mine.state_dict()[k], v) for k, v in tv.state_dict().items() if not k.startswith("fc."))
    assert all(torch.equal(model.target_backbone.state_dict()[k], v) for k, v in mine.state_dict().items())


def test_selfsup_eval_knn_evaluates_a_dinov2_hub_checkpoint_on_an_image_folder(tmp_path):
    """The third use (evaluate a checkpoint): the hub file's architecture read from its shapes, at 224 px in
    ImageNet's normalisation, on a labelled folder; a plain state dict that names no architecture is one line."""
    from PIL import Image

    g = torch.Generator().manual_seed(0)
    for split, n in (("train", 4), ("val", 2)):
        for label in ("a", "b"):
            folder = tmp_path / "images" / split / label
            folder.mkdir(parents=True)
            for i in range(n):
                pixels = (torch.rand(32, 32, 3, generator=g) * 255).to(torch.uint8).numpy()
                Image.fromarray(pixels).save(folder / f"{i}.png")
    torch.manual_seed(0)
    ref = timm.create_model("vit_small_patch14_dinov2", pretrained=False, num_classes=0, img_size=56)
    torch.save(hub_layout(ref.state_dict()), tmp_path / "dinov2_vits14_pretrain.pth")
    code, out, err = run_cli("eval", "knn", tmp_path / "dinov2_vits14_pretrain.pth", "--data", "imagefolder",
                             "--root", tmp_path / "images", "--resize")
    assert code == 0, err
    # issue 62: it printed "data.image_size unset: using 32 px", a size the 224-px evaluation never used; the files
    # are decoded at the size the hub file's backbone takes
    assert "data.image_size" not in out + err
    result = json.loads((tmp_path / "dinov2_vits14_pretrain-eval" / "knn.json").read_text())
    assert result["test_size"] == 4 and result["train_size"] == 8
    torch.save(timm.create_model("resnet18", pretrained=False).state_dict(), tmp_path / "r18.pth")
    code, _, err = run_cli("eval", "knn", tmp_path / "r18.pth", "--data", "imagefolder", "--root", tmp_path / "images",
                           "--resize")
    assert_user_error(code, err, "does not say its architecture", "model.weights")


@pytest.mark.train
def test_a_resumed_run_reads_its_checkpoint_not_the_weights_again(tmp_path):
    """The weights are loaded once, at the start: a resume takes the checkpoint, even with the source gone."""
    code, _, err = run_cli("pretrain", "byol-digits", *TINY, f"output_dir={tmp_path}", "name=src")
    assert code == 0, err
    code, _, err = run_cli("pretrain", "byol-digits", *TINY, f"output_dir={tmp_path}", "name=adapted",
                           f"model.weights={tmp_path / 'src'}")
    assert code == 0, err
    (tmp_path / "src").rename(tmp_path / "moved")
    code, _, err = run_cli("pretrain", "--resume", tmp_path / "adapted", "trainer.max_epochs=2")
    assert code == 0, err
    facts = json.loads((tmp_path / "adapted" / "run.json").read_text())
    assert facts["weights"]["source"] == str(tmp_path / "src") and facts["sessions"] == 2


def test_the_settings_of_a_dinov2_giant_hub_file_are_read_from_its_shapes():
    """ViT-g/14 (1536 wide, 40 blocks, 24 heads, SwiGLU, 4 registers): read from the keys and shapes alone."""
    from selfsup.weights import vit_settings

    state = {"cls_token": torch.zeros(1, 1, 1536), "patch_embed.proj.weight": torch.zeros(1536, 3, 14, 14),
             "register_tokens": torch.zeros(1, 4, 1536), "mask_token": torch.zeros(1, 1536)}
    for i in range(40):
        state |= {f"blocks.{i}.ls1.gamma": torch.zeros(1), f"blocks.{i}.mlp.w12.weight": torch.zeros(1)}
    assert vit_settings(state, hub=True) == ("model.backbone=vit_giant2 model.patch_size=14 model.pos_embed=learned "
                                             "model.layer_scale=1e-5 model.registers=4 model.ffn=swiglu")


def test_a_frozen_network_takes_the_file_s_tensors_themselves_one_copy_in_memory(tmp_path):
    """Issue 62: a network built from a ``.pth`` (a teacher, an evaluated hub file) held its own parameters and the
    file's mapped pages, 2.1x the file resident; now its parameters are the mapped file's tensors (assign)."""
    import torchvision

    from selfsup.weights import build_from_weights, copy_into

    net, src = torch.nn.Linear(4, 3), {"weight": torch.randn(3, 4), "bias": torch.randn(3, dtype=torch.float64)}
    copy_into(net, src, assign=True)
    assert net.weight.data_ptr() == src["weight"].data_ptr()  # the same memory: no copy
    assert isinstance(net.weight, torch.nn.Parameter) and net.weight.requires_grad  # the module's own flag
    assert net.bias.dtype == torch.float32 and torch.equal(net.bias, src["bias"].float())  # another dtype: converted
    copied = torch.nn.Linear(4, 3)
    copy_into(copied, src)  # a trained backbone copies (its tensors are its own, to train and export)
    assert copied.weight.data_ptr() != src["weight"].data_ptr() and torch.equal(copied.weight, src["weight"])
    torch.save(torchvision.models.resnet18().state_dict(), tmp_path / "r18.pth")
    module, facts, _ = build_from_weights(str(tmp_path / "r18.pth"), "resnet18", {}, 3, 32, "method.teacher.weights")
    maps = [line.split()[0].split("-") for line in open("/proc/self/maps") if str(tmp_path / "r18.pth") in line]
    inside = [lo <= p.data_ptr() < hi for p in module.parameters() for lo, hi in
              [(int(a, 16), int(b, 16)) for a, b in maps]]
    assert sum(inside) == len(list(module.parameters()))  # every parameter lies in the file's mapping
    assert facts.source_sha256 and facts.sha256 == state_sha256(module.state_dict())
