"""model.weights loads right or not at all (selfsup/weights.py, issue 62 part 6): a ViT's head count is read from
the source where it says it, a plain file's is the usual one of its width, and another count is one line; the
release checkpoints of the methods selfsup implements (MoCo v3, DINO, iBOT, MAE, I-JEPA, SwAV, DINOv2's training
checkpoint) load in their own layouts, each written here as a synthetic file of that layout (random values) and
checked to compute what its network computes; a checkpoint's tensors outside the prefix read are listed."""

from __future__ import annotations

import argparse

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from ssl_helpers import raises_user_error, tiny_method

from benchmarks.hub_layout import hub_layout

from selfsup.models.backbones import build_backbone
from selfsup.models.mae import mae_sincos_position_embedding
from selfsup.weights import load_weights

timm = pytest.importorskip("timm")


def _x(size=32, batch=2, seed=0):
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(seed))


def _vit(name, size=32, patch=16, **kw):
    return build_backbone(name, in_chans=3, image_size=size, patch_size=patch, **{"pos_embed": "learned", **kw}).eval()


def _timm_vit_s(size=32, seed=0, **kw):
    torch.manual_seed(seed)
    return timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=0, img_size=size, **kw).eval()


def _save(path, state):
    save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    return str(path)


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


# --------------------------------------------------------------------------- head counts


def test_a_timm_6_head_vit_s_file_computes_timm_s_function_or_is_one_line(tmp_path):
    """The defect: timm's ViT-S (6 heads) loaded into selfsup's vit_small (MoCo v3's, 12 heads) loaded silently and
    computed another function. A plain file cannot say its head count: it is taken at 6 (every released ViT-S),
    so vit_small refuses it in one line naming deit_small, and deit_small computes timm's function."""
    ref = _timm_vit_s()
    x = _x()
    for path in (_save(tmp_path / "vit_s.safetensors", ref.state_dict()), str(tmp_path / "vit_s.pth")):
        torch.save(ref.state_dict(), tmp_path / "vit_s.pth")
        twelve = _vit("vit_small")
        with raises_user_error("does not say its head count", "6 heads", "the backbone has 12",
                               "model.backbone=deit_small", "module.base_encoder"):
            load_weights(twelve, path)
        twelve.load_state_dict(ref.state_dict())  # what loading it would compute: another function
        assert _rel(twelve(x), ref(x)) > 0.01 and not torch.allclose(twelve(x), ref(x), atol=1e-3)
        six = _vit("deit_small")
        facts = load_weights(six, path)
        assert facts.heads.startswith("6 (the usual count at width 384")
        torch.testing.assert_close(six(x), ref(x), rtol=1e-5, atol=1e-5)


def test_a_timm_source_states_its_heads(monkeypatch):
    """``timm:<name>``: the timm model's own head count (no download here: timm builds it at random)."""
    create = timm.create_model
    monkeypatch.setattr(timm, "create_model", lambda name, pretrained=False, **kw: create(name, pretrained=False,
                                                                                          **kw))
    facts = load_weights(_vit("deit_small", 224), "timm:vit_small_patch16_224")
    assert facts.heads == "6 (timm's vit_small_patch16_224)" and facts.kind == "timm"
    with raises_user_error("with 6 heads", "timm's vit_small_patch16_224", "the backbone has 12",
                           "model.backbone=deit_small"):
        load_weights(_vit("vit_small", 224), "timm:vit_small_patch16_224")


def test_a_hub_file_s_heads_are_the_file_s_own_in_every_message(tmp_path):
    """A DINOv2 ViT-S/14 hub file has 6 heads: the message says 6 into vit_small, and into a narrower backbone it
    names the file's settings (it said "2 heads", from the backbone's width, before)."""
    hub = hub_layout(timm.create_model("vit_small_patch14_dinov2", pretrained=False, num_classes=0,
                                       img_size=56).state_dict())
    torch.save(hub, tmp_path / "dinov2_vits14_pretrain.pth")
    path = str(tmp_path / "dinov2_vits14_pretrain.pth")
    with raises_user_error("DINOv2 hub checkpoint with 6 heads", "the backbone has 12", "model.backbone=deit_small"):
        load_weights(_vit("vit_small", 56, 14, layer_scale=1e-5), path)
    with pytest.raises(Exception) as e:
        load_weights(_vit("vit_micro", 56, 14, layer_scale=1e-5), path)
    assert "2 heads" not in str(e.value) and "model.backbone=deit_small" in str(e.value)
    assert load_weights(_vit("deit_small", 56, 14, layer_scale=1e-5), path).heads == \
        "6 (DINOv2's 64 channels per head)"


def test_a_selfsup_export_states_its_heads(tmp_path):
    from selfsup.export import export_backbone

    twelve = _vit("vit_small")
    kwargs = {"in_chans": 3, "image_size": 32, "patch_size": 16, "pos_embed": "learned"}
    path = export_backbone(twelve, tmp_path / "backbone.safetensors",
                           {"backbone": "vit_small", "kwargs": kwargs, "in_chans": 3, "image_size": 32,
                            "mean": [0.5] * 3, "std": [0.5] * 3})
    assert load_weights(_vit("vit_small"), str(path)).heads == "12 (its selfsup metadata)"
    with raises_user_error("num_heads 6 (file: 12)"):
        load_weights(_vit("deit_small"), str(path))


# --------------------------------------------------------------------------- the methods' release checkpoints


def test_moco_v3_s_checkpoint_pth_tar_loads_its_base_encoder_with_12_heads(tmp_path):
    """MoCo v3 main_moco.py:310-316: ``checkpoint_%04d.pth.tar`` = {epoch, arch, state_dict, optimizer, scaler}, the
    DDP model's keys ``module.base_encoder.*`` (its ViT, vits.py:115-120: ViT-S of 12 heads, the projector as
    ``head``), ``module.momentum_encoder.*``, ``module.predictor.*`` (main_lincls.py:178-185 keeps the first)."""
    torch.manual_seed(0)
    source = _vit("vit_small", pos_embed="sincos")
    for p in source.parameters():
        if p.requires_grad:  # the fixed sin-cos table stays MoCo v3's
            p.data.normal_(0, 0.05)
    enc = source.state_dict()
    head = {"head.0.weight": torch.randn(64, 384), "head.1.weight": torch.ones(64)}
    state = {**{f"module.base_encoder.{k}": v for k, v in {**enc, **head}.items()},
             **{f"module.momentum_encoder.{k}": v.clone() for k, v in {**enc, **head}.items()},
             "module.predictor.0.weight": torch.randn(64, 64)}
    torch.save({"epoch": 300, "arch": "vit_small", "state_dict": state, "optimizer": {}, "scaler": {}},
               tmp_path / "vit-s-300ep.pth.tar")
    path = str(tmp_path / "vit-s-300ep.pth.tar")
    ours = _vit("vit_small", pos_embed="sincos")
    facts = load_weights(ours, path)
    assert (facts.wrapper, facts.prefix, facts.layout) == ("state_dict", "module.base_encoder.", "moco-v3")
    assert facts.heads == "12 (MoCo v3's vits.py:115-127)"
    assert facts.dropped == [f"module.momentum_encoder.* ({len(enc) + 2} tensors)", "module.predictor.* (1 tensors)",
                             "head.0.weight", "head.1.weight"]
    x = _x()
    assert torch.equal(ours(x), source(x))
    with raises_user_error("moco-v3 checkpoint with 12 heads", "the backbone has 6", "model.backbone=vit_small"):
        load_weights(_vit("deit_small", pos_embed="sincos"), path)


def _dino_head(prefix, dim=384, patch=False):
    head = {f"{prefix}mlp.0.weight": torch.randn(32, dim), f"{prefix}mlp.0.bias": torch.zeros(32),
            f"{prefix}last_layer.weight_g": torch.ones(64, 1), f"{prefix}last_layer.weight_v": torch.randn(64, 32)}
    if patch:
        head |= {f"{prefix}last_layer2.weight_g": torch.ones(64, 1), f"{prefix}last_layer2.weight_v":
                 torch.randn(64, 32)}
    return head


@pytest.mark.parametrize("method", ["dino", "ibot"])
def test_dino_s_and_ibot_s_checkpoint_loads_the_teacher_s_backbone(tmp_path, method):
    """DINO main_dino.py:278-288 / iBOT main_ibot.py:348-358: ``checkpoint.pth`` = {student, teacher, optimizer,
    epoch, args (an argparse Namespace), dino_loss}; the teacher a MultiCropWrapper (dino utils.py:594-608):
    ``backbone.*`` and ``head.*`` (iBOT's head adds ``last_layer2``, models/head.py:145-177), the student's under
    DDP's ``module.``. DINO's ViT-S is timm's layout with 6 heads."""
    ref = _timm_vit_s(seed=1)
    teacher = {**{f"backbone.{k}": v for k, v in ref.state_dict().items()}, **_dino_head("head.", patch=method ==
                                                                                            "ibot")}
    student = {f"module.{k}": v.clone() for k, v in teacher.items()}
    torch.save({"student": student, "teacher": teacher, "optimizer": {}, "epoch": 100,
                "args": argparse.Namespace(arch="vit_small", patch_size=16, out_dim=64), "dino_loss": {
                    "center": torch.zeros(1, 64)}}, tmp_path / "checkpoint.pth")
    ours = _vit("deit_small")
    facts = load_weights(ours, str(tmp_path / "checkpoint.pth"))
    groups = 6 if method == "ibot" else 4
    assert (facts.wrapper, facts.prefix, facts.layout) == ("teacher", "backbone.", method)
    assert facts.dropped == [f"head.* ({groups} tensors)"] and facts.heads == f"6 ({method}'s released sizes)"
    x = _x()
    torch.testing.assert_close(ours(x), ref(x), rtol=1e-5, atol=1e-5)
    with raises_user_error(f"{method} checkpoint with 6 heads", "the backbone has 12"):
        load_weights(_vit("vit_small"), str(tmp_path / "checkpoint.pth"))


def test_mae_s_checkpoint_loads_its_encoder_and_drops_its_decoder(tmp_path):
    """MAE util/misc.py:301-309: ``checkpoint-<epoch>.pth`` = {model, optimizer, epoch, scaler, args}; the model's
    keys (models_mae.py:36-57): the encoder's in timm's names with a fixed sin-cos ``pos_embed`` of MAE's layout
    (class row zero), ``mask_token`` and ``decoder_*``. A learned table takes MAE's table as it is."""
    ref = _timm_vit_s(seed=2)
    enc = dict(ref.state_dict())
    enc["pos_embed"] = mae_sincos_position_embedding(2, 384)
    ref.load_state_dict(enc)
    decoder = {"mask_token": torch.zeros(1, 1, 64), "decoder_embed.weight": torch.randn(64, 384),
               "decoder_pos_embed": torch.zeros(1, 5, 64), "decoder_blocks.0.norm1.weight": torch.ones(64),
               "decoder_norm.weight": torch.ones(64), "decoder_pred.weight": torch.randn(768, 64)}
    torch.save({"model": {**enc, **decoder}, "optimizer": {}, "epoch": 799, "scaler": {},
                "args": argparse.Namespace(model="mae_vit_small")}, tmp_path / "checkpoint-799.pth")
    ours = _vit("deit_small")
    facts = load_weights(ours, str(tmp_path / "checkpoint-799.pth"))
    assert (facts.wrapper, facts.layout) == ("model", "mae") and facts.dropped == sorted(decoder)
    x = _x()
    torch.testing.assert_close(ours(x), ref(x), rtol=1e-5, atol=1e-5)


def test_ijepa_s_pth_tar_loads_its_target_encoder(tmp_path):
    """I-JEPA src/train.py:146-147, :248-259: ``<tag>-latest.pth.tar`` = {encoder, predictor, target_encoder, opt,
    scaler, epoch, loss, batch_size, world_size, lr}, each a DDP state dict (``module.*``); the encoder
    (vision_transformer.py:329-425) has no class token and a fixed sin-cos table (1, N, D). The target encoder is
    read (what I-JEPA evaluates); it was refused for its suffix, then as holding no state dict."""
    torch.manual_seed(3)
    source = _vit("deit_small", class_token=False, pool="avg")
    for p in source.parameters():
        p.data.normal_(0, 0.05)
    enc = {f"module.{k}": v for k, v in source.state_dict().items()}
    assert "module.cls_token" not in enc and enc["module.pos_embed"].shape == (1, 4, 384)
    other = {k: torch.zeros_like(v) for k, v in enc.items()}
    torch.save({"encoder": other, "predictor": {"module.predictor_embed.weight": torch.zeros(8, 384)},
                "target_encoder": enc, "opt": {}, "scaler": None, "epoch": 300, "loss": 0.1, "batch_size": 128,
                "world_size": 16, "lr": 1e-3}, tmp_path / "IN1K-vit.s.16-latest.pth.tar")
    ours = _vit("deit_small", class_token=False, pool="avg")
    facts = load_weights(ours, str(tmp_path / "IN1K-vit.s.16-latest.pth.tar"))
    assert (facts.wrapper, facts.prefix, facts.layout) == ("target_encoder", "module.", "ijepa")
    x = _x()
    assert torch.equal(ours(x), source(x))
    with raises_user_error("ijepa checkpoint with 6 heads", "the backbone has 12", "model.backbone=deit_small"):
        load_weights(_vit("vit_small", class_token=False, pool="avg"), str(tmp_path / "IN1K-vit.s.16-latest.pth.tar"))


@pytest.mark.parametrize("form", ["release", "training"])
def test_swav_s_files_load_their_resnet_and_drop_the_projection_and_prototypes(tmp_path, form):
    """SwAV: the released ``swav_800ep_pretrain.pth.tar`` is the DDP state dict (hubconf.py:27-32 strips
    ``module.``); its training ``checkpoint.pth.tar`` wraps it: {epoch, state_dict, optimizer} (main_swav.py:
    239-248); the ResNet (src/resnet50.py) has torchvision's names, with ``projection_head`` and ``prototypes``
    (:201-217). A ResNet-18 of that layout here (the names are the layout's; SwAV trains a ResNet-50)."""
    import torchvision

    torch.manual_seed(4)
    tv = torchvision.models.resnet18(weights=None).eval()
    state = {f"module.{k}": v for k, v in tv.state_dict().items() if not k.startswith("fc.")}
    state |= {"module.projection_head.0.weight": torch.randn(32, 512), "module.prototypes.weight":
              torch.randn(30, 32)}
    obj = state if form == "release" else {"epoch": 800, "state_dict": state, "optimizer": {}}
    torch.save(obj, tmp_path / "swav.pth.tar")
    ours = build_backbone("resnet18", in_chans=3, image_size=64).eval()
    facts = load_weights(ours, str(tmp_path / "swav.pth.tar"))
    assert facts.layout == "swav" and facts.prefix == "module."
    assert facts.dropped == ["projection_head.0.weight", "prototypes.weight"]
    tv.fc = torch.nn.Identity()
    x = _x(64)
    assert torch.equal(ours(x), tv(x))


def _dinov2_teacher(ref, chunks):
    """DINOv2's train.py:122-131 ``teacher_checkpoint.pth`` = {"teacher": the teacher's state dict}: ``backbone.*``
    (the hub layout, its blocks in ``block_chunks`` chunks: ``blocks.<chunk>.<i>``), ``dino_head.*``,
    ``ibot_head.*`` (ssl_meta_arch.py:41-109)."""
    hub = hub_layout(ref.state_dict())
    depth, size = len(ref.blocks), len(ref.blocks) // chunks
    backbone = {}
    for k, v in hub.items():
        if k.startswith("blocks."):
            i = int(k.split(".")[1])
            k = f"blocks.{i // size}.{i}." + k.split(".", 2)[2]
        backbone[f"backbone.{k}"] = v
    assert depth == 12 and f"backbone.blocks.{chunks - 1}.11.norm1.weight" in backbone
    return {"teacher": {**backbone, **_dino_head("dino_head."), **_dino_head("ibot_head.")}}


def test_a_dinov2_training_checkpoint_with_block_chunks_computes_its_teacher(tmp_path):
    torch.manual_seed(5)
    ref = timm.create_model("vit_small_patch14_dinov2", pretrained=False, num_classes=0, img_size=56).eval()
    for block in ref.blocks:
        block.ls1.gamma.data.uniform_(0.5, 1.5), block.ls2.gamma.data.uniform_(0.5, 1.5)
    torch.save(_dinov2_teacher(ref, chunks=4), tmp_path / "teacher_checkpoint.pth")
    ours = _vit("deit_small", 56, 14, layer_scale=1e-5)
    facts = load_weights(ours, str(tmp_path / "teacher_checkpoint.pth"))
    assert (facts.wrapper, facts.prefix, facts.layout) == ("teacher", "backbone.", "dinov2")
    assert facts.dropped == ["dino_head.* (4 tensors)", "ibot_head.* (4 tensors)", "mask_token"]
    assert facts.heads == "6 (DINOv2's 64 channels per head)"
    x = _x(56)
    torch.testing.assert_close(ours(x), ref(x), rtol=1e-4, atol=1e-4)
    with raises_user_error("dinov2 checkpoint with 6 heads", "the backbone has 12"):
        load_weights(_vit("vit_small", 56, 14, layer_scale=1e-5), str(tmp_path / "teacher_checkpoint.pth"))


def test_a_checkpoint_s_heads_outside_the_prefix_are_listed_in_run_json_s_weights(tmp_path):
    """The docs promise every dropped head in run.json (``model.start_weights``, written as ``weights``): a
    DINOv2-style teacher checkpoint's ``dino_head.*`` was dropped unlisted with the prefix ``backbone.``."""
    donor = tiny_method("dino").backbone
    teacher = {**{f"backbone.{k}": v for k, v in donor.state_dict().items()}, **_dino_head("dino_head.", 128)}
    torch.save({"teacher": teacher}, tmp_path / "teacher_checkpoint.pth")
    model = tiny_method("dino", model={"weights": str(tmp_path / "teacher_checkpoint.pth")})
    assert model.start_weights["dropped"] == ["dino_head.* (4 tensors)"]
    assert model.start_weights["prefix"] == "backbone." and model.start_weights["layout"] == "dinov2"


# --------------------------------------------------------------------------- selfsup eval of every model.weights source


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """A labelled image folder: 2 classes, 4 train and 2 val images each."""
    from PIL import Image

    root = tmp_path_factory.mktemp("images")
    g = torch.Generator().manual_seed(0)
    for split, n in (("train", 4), ("val", 2)):
        for label in ("a", "b"):
            (root / split / label).mkdir(parents=True)
            for i in range(n):
                pixels = (torch.rand(32, 32, 3, generator=g) * 255).to(torch.uint8).numpy()
                Image.fromarray(pixels).save(root / split / label / f"{i}.png")
    return root


def _knn(images, source, *flags):
    from ssl_helpers import run_cli

    return run_cli("eval", "knn", source, *flags, "--data", "imagefolder", "--root", images, "--resize",
                   "--train-limit", "8")


def _knn_result(path, stem):
    import json

    return json.loads((path.parent / f"{stem}-eval" / "knn.json").read_text())


def test_selfsup_eval_takes_a_torchvision_and_a_timm_state_dict_with_their_backbone_named(tmp_path, images):
    """``selfsup eval`` took a selfsup run and a DINOv2 hub file only; now any model.weights file, with --backbone
    where the file cannot say its architecture (a ViT's settings from its shapes, its head count checked)."""
    import torchvision
    from ssl_helpers import assert_user_error

    torch.save(torchvision.models.resnet18(weights=None).state_dict(), tmp_path / "r18.pth")
    code, _, err = _knn(images, tmp_path / "r18.pth")
    assert_user_error(code, err, "does not say its architecture", "--backbone", "model.weights")
    code, _, err = _knn(images, tmp_path / "r18.pth", "--backbone", "resnet18")
    assert code == 0, err
    assert _knn_result(tmp_path / "r18.pth", "r18")["test_size"] == 4
    vit = _save(tmp_path / "vit_s.safetensors", _timm_vit_s(224).state_dict())
    code, _, err = _knn(images, vit, "--backbone", "vit_small")
    assert_user_error(code, err, "does not say its head count", "model.backbone=deit_small")
    code, _, err = _knn(images, vit, "--backbone", "deit_small")
    assert code == 0, err
    assert _knn_result(tmp_path / "vit_s.safetensors", "vit_s")["train_size"] == 8


def test_selfsup_eval_takes_a_dinov2_training_checkpoint_and_an_ijepa_pth_tar(tmp_path, images):
    ref = timm.create_model("vit_small_patch14_dinov2", pretrained=False, num_classes=0, img_size=56)
    torch.save(_dinov2_teacher(ref, chunks=2), tmp_path / "teacher_checkpoint.pth")
    code, _, err = _knn(images, tmp_path / "teacher_checkpoint.pth")  # its architecture from its shapes
    assert code == 0, err
    assert _knn_result(tmp_path / "teacher_checkpoint.pth", "teacher_checkpoint")["test_size"] == 4
    source = _vit("deit_small", 224, class_token=False, pool="avg")
    torch.save({"target_encoder": {f"module.{k}": v for k, v in source.state_dict().items()}, "epoch": 1},
               tmp_path / "ijepa-latest.pth.tar")
    code, _, err = _knn(images, tmp_path / "ijepa-latest.pth.tar", "--backbone", "deit_small")
    assert code == 0, err
    assert _knn_result(tmp_path / "ijepa-latest.pth.tar", "ijepa-latest.pth")["test_size"] == 4


def test_selfsup_eval_takes_a_timm_name(tmp_path, images, monkeypatch):
    """``timm:<name>``: timm's pretrained weights (built at random here: no download), its results in
    ``timm-<name>-eval/`` of the working folder."""
    create = timm.create_model
    monkeypatch.setattr(timm, "create_model", lambda name, pretrained=False, **kw: create(name, pretrained=False,
                                                                                          **kw))
    monkeypatch.chdir(tmp_path)
    code, _, err = _knn(images, "timm:resnet18")
    assert code == 0, err
    assert _knn_result(tmp_path / "x", "timm-resnet18")["test_size"] == 4


def test_a_torch_file_of_the_legacy_format_is_read_and_a_bare_tar_is_refused(tmp_path):
    """Files saved before torch 1.6 (SwAV's and MoCo's era) cannot be mapped: they are read whole."""
    import torchvision

    tv = torchvision.models.resnet18(weights=None).eval()
    torch.save({"state_dict": tv.state_dict()}, tmp_path / "old.pth.tar", _use_new_zipfile_serialization=False)
    ours = build_backbone("resnet18", in_chans=3, image_size=64).eval()
    assert load_weights(ours, str(tmp_path / "old.pth.tar")).dropped == ["fc.bias", "fc.weight"]
    tv.fc = torch.nn.Identity()
    assert torch.equal(ours(_x(64)), tv(_x(64)))
    (tmp_path / "weights.tar").write_bytes(b"")
    with raises_user_error("not a weights file", ".pth.tar"):
        load_weights(ours, str(tmp_path / "weights.tar"))


def test_nested_blocks_that_restart_their_index_are_not_read_as_dinov2_s_chunks(tmp_path):
    """timm's EfficientNet nests ``blocks.<stage>.<i>`` with i from 0 in each stage: not DINOv2's chunks."""
    torch.manual_seed(6)
    ref = timm.create_model("efficientnet_b0", pretrained=False, num_classes=0).eval()
    assert "blocks.1.0.conv_dw.weight" in ref.state_dict()
    ours = build_backbone("timm:efficientnet_b0", in_chans=3, image_size=64).eval()
    load_weights(ours, _save(tmp_path / "effnet.safetensors", ref.state_dict()))
    torch.save(ref.state_dict(), tmp_path / "effnet.pth")
    load_weights(ours, str(tmp_path / "effnet.pth"))
    assert torch.equal(ours(_x(64)), ref(_x(64)))


def test_a_mae_table_is_resampled_as_mae_s_fine_tuning_does(tmp_path):
    """MAE util/pos_embed.py:75-93 resamples a checkpoint's table to size g × g, bicubic, align_corners off, no
    antialias (timm's antialias would differ on a smaller grid); the class row as it is."""
    torch.manual_seed(7)
    pos = torch.randn(1, 1 + 16, 384)
    enc = {**_timm_vit_s(64).state_dict(), "pos_embed": pos}
    torch.save({"model": {**enc, "decoder_embed.weight": torch.zeros(8, 384)}}, tmp_path / "mae.pth")
    ours = _vit("deit_small", 32)
    assert load_weights(ours, str(tmp_path / "mae.pth")).resampled == "4x4 -> 2x2 (mae)"
    grid = F.interpolate(pos[:, 1:].reshape(1, 4, 4, 384).permute(0, 3, 1, 2), size=(2, 2), mode="bicubic",
                         align_corners=False)
    expect = torch.cat([pos[:, :1], grid.permute(0, 2, 3, 1).reshape(1, 4, 384)], dim=1)
    assert torch.equal(ours.pos_embed.detach(), expect)
    timm_way = F.interpolate(pos[:, 1:].reshape(1, 4, 4, 384).permute(0, 3, 1, 2), size=(2, 2), mode="bicubic",
                             antialias=True)
    assert not torch.allclose(grid, timm_way)
