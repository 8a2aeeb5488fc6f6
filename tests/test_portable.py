"""``selfsup export SOURCE --format onnx|torchscript`` (``selfsup.runs.portable``): every backbone family built offline
runs in onnxruntime within 1e-4 of the features' scale of eager PyTorch, at any batch size, with the normalisation in
the graph or out of it as its metadata says."""

from __future__ import annotations

import io
import json

import onnx
import onnxruntime
import pytest
import timm
import torch

from benchmarks.hub_layout import hub_layout

from selfsup.commands.main import main
from selfsup.errors import UserError
from selfsup.export import export_backbone
from selfsup.models.backbones import build_backbone
from selfsup.runs.portable import OPSET, TOLERANCE, export_portable
from selfsup.runs.source import load_source

# name, build_backbone kwargs, export image size (None: the model's): the ViT with registers and a learned table
# exported at another size runs its interpolated position table
FAMILIES = {
    "vit-registers-interpolated": ("vit_nano", dict(in_chans=3, image_size=16, patch_size=4, registers=2,
                                                    pos_embed="learned", init="trunc_normal"), 24),
    "resnet18": ("resnet18", dict(in_chans=3, image_size=32, small_stem=True), None),
    "bn_cnn": ("bn_cnn_tiny", dict(in_chans=1, image_size=16), None),
    "timm": ("timm:test_vit", dict(in_chans=3, image_size=32), None),
}


def source_file(tmp_path, family: str):
    name, kwargs, _ = FAMILIES[family]
    torch.manual_seed(0)
    backbone = build_backbone(name, **kwargs).eval()
    c = kwargs["in_chans"]
    meta = {"backbone": name, "kwargs": kwargs, "image_size": kwargs["image_size"], "in_chans": c,
            "mean": [0.45] * c, "std": [0.22] * c}
    return export_backbone(backbone, tmp_path / f"{name.replace(':', '_')}.safetensors", meta)


def eager(path, x, normalize=True):
    source = load_source(path)
    mean = torch.tensor(source.meta["mean"]).view(1, -1, 1, 1)
    std = torch.tensor(source.meta["std"]).view(1, -1, 1, 1)
    with torch.no_grad():
        return source.backbone.eval()((x - mean) / std if normalize else x)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_onnxruntime_matches_eager_pytorch_at_any_batch_size(tmp_path, family):
    path = source_file(tmp_path, family)
    size = FAMILIES[family][2]
    done = export_portable(path, tmp_path / "m.onnx", image_size=size)
    model = onnx.load(str(tmp_path / "m.onnx"))
    meta = json.loads({p.key: p.value for p in model.metadata_props}["selfsup"])
    assert meta["normalization"] == "in" and meta["opset"] == OPSET
    assert meta["image_size"] == (size or FAMILIES[family][1]["image_size"])
    assert any(o.domain in ("", "ai.onnx") and o.version == OPSET for o in model.opset_import)
    session = onnxruntime.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    c, s = meta["in_chans"], meta["image_size"]
    for batch in (1, 5):
        x = torch.rand(batch, c, s, s, generator=torch.Generator().manual_seed(batch))
        got = torch.from_numpy(session.run(["features"], {"images": x.numpy()})[0])
        want = eager(path, x)
        assert got.shape == want.shape
        assert (got - want).abs().max() < TOLERANCE * want.abs().max(), family
    assert done.max_rel_diff < TOLERANCE


def test_a_dinov2_hub_file_with_registers_exports_with_its_table_resampled_to_224(tmp_path):
    """A model.weights file (DINOv2's torch.hub layout, 4 registers, trained at 56 px): the source evaluation builds
    at 224 px in ImageNet's normalisation, its position table resampled from 4x4 to 16x16 patches."""
    torch.manual_seed(0)
    ref = timm.create_model("vit_small_patch14_reg4_dinov2", pretrained=False, num_classes=0, img_size=56)
    torch.save(hub_layout(ref.state_dict()), tmp_path / "dinov2_vits14_reg4_pretrain.pth")
    done = export_portable(tmp_path / "dinov2_vits14_reg4_pretrain.pth", tmp_path / "d.onnx")
    assert done.meta["image_size"] == 224 and done.meta["mean"] == pytest.approx([0.485, 0.456, 0.406])
    assert done.meta["kwargs"]["registers"] == 4 and done.max_rel_diff < TOLERANCE
    session = onnxruntime.InferenceSession(str(tmp_path / "d.onnx"), providers=["CPUExecutionProvider"])
    x = torch.rand(2, 3, 224, 224, generator=torch.Generator().manual_seed(2))
    got = torch.from_numpy(session.run(["features"], {"images": x.numpy()})[0])
    want = eager(tmp_path / "dinov2_vits14_reg4_pretrain.pth", x)
    assert (got - want).abs().max() < TOLERANCE * want.abs().max()


def test_normalisation_out_takes_normalised_inputs_and_torchscript_traces(tmp_path):
    path = source_file(tmp_path, "bn_cnn")
    export_portable(path, tmp_path / "m.onnx", normalize=False)
    session = onnxruntime.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    x = torch.randn(3, 1, 16, 16, generator=torch.Generator().manual_seed(0))
    got = torch.from_numpy(session.run(["features"], {"images": x.numpy()})[0])
    assert (got - eager(path, x, normalize=False)).abs().max() < TOLERANCE * got.abs().max()
    meta = json.loads(onnx.load(str(tmp_path / "m.onnx")).metadata_props[0].value)
    assert meta["normalization"] == "out" and meta["mean"] == [0.45]
    vit = source_file(tmp_path, "vit-registers-interpolated")
    export_portable(vit, tmp_path / "m.pt", "torchscript")
    files = {"selfsup.json": ""}
    traced = torch.jit.load(io.BytesIO((tmp_path / "m.pt").read_bytes()), _extra_files=files)
    assert json.loads(files["selfsup.json"])["normalization"] == "in"
    x = torch.rand(4, 3, 16, 16)
    with torch.no_grad():
        assert (traced(x) - eager(vit, x)).abs().max() < TOLERANCE * eager(vit, x).abs().max()


def test_the_command_writes_beside_the_source_and_refuses_in_one_line(tmp_path, capsys):
    path = source_file(tmp_path, "bn_cnn")
    assert main(["export", str(path)]) == 0
    assert path.with_suffix(".onnx").exists() and "batch dynamic" in capsys.readouterr().out
    assert main(["export", str(path), "--format", "torchscript", "--out", str(tmp_path / "x.pt")]) == 0
    assert (tmp_path / "x.pt").exists()
    vit = source_file(tmp_path, "vit-registers-interpolated")
    with pytest.raises(UserError, match="not a multiple of the ViT's patch size 4"):
        export_portable(vit, tmp_path / "v.onnx", image_size=18)
    assert main(["export", str(tmp_path / "nothing.safetensors")]) == 2
    assert "does not exist" in capsys.readouterr().err
