"""The exported backbone file: its metadata holds the whole architecture and the timm / torchvision recipe;
docs/export.md's ``rebuild`` (run without selfsup importable) gives selfsup's features; ``load_timm`` refuses a
timm name whose architecture is not the file's."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from selfsup.errors import UserError
from selfsup.export import TIMM_VIT_PATCHES, export_backbone, load_timm, read_meta
from selfsup.models.backbones import build_backbone
from selfsup.models.resnet import resnet
from selfsup.models.vit import VisionTransformer

DOC = Path(__file__).resolve().parents[1] / "docs" / "export.md"

CASES = {  # name -> (backbone, build_backbone kwargs)
    "vit_cls": ("vit_micro", dict(in_chans=1, image_size=8, patch_size=2, pool="cls")),
    "vit_avg": ("vit_micro", dict(in_chans=1, image_size=8, patch_size=2, pool="avg")),
    "vit_layer_scale": ("vit_micro", dict(in_chans=3, image_size=16, patch_size=4, layer_scale=0.1)),
    "resnet_small_stem": ("resnet18", dict(in_chans=1, image_size=8, small_stem=True, zero_init_residual=True)),
    "resnet_imagenet_stem": ("resnet18", dict(in_chans=3, image_size=32)),
}


def trained_like(backbone: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Move every weight and BN statistic off its init (LayerScale γ, zero-init BN scales, running stats), so a
    rebuild that drops or misplaces any of them gives other features."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in backbone.state_dict().items():
            if not t.is_floating_point() or name.endswith("pos_embed"):
                continue
            if name.endswith("running_var"):
                t.copy_(torch.rand(t.shape, generator=g) + 0.5)
            elif t.ndim >= 2 and not name.endswith("cls_token"):  # weights: ±10% each, so activations keep their scale
                t.mul_(1 + 0.1 * torch.randn(t.shape, generator=g))
            else:  # biases, norm / BN scales (zero-init ones too), LayerScale γ, class token, running means
                t.add_(0.1 * torch.randn(t.shape, generator=g))
    return backbone.eval()


def readme_rebuild_snippet() -> str:
    """docs/export.md's python block that defines ``rebuild``."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    found = [b for b in blocks if "def rebuild(" in b]
    assert len(found) == 1, "docs/export.md must hold exactly one python block defining rebuild()"
    assert not re.search(r"^\s*(import|from)\s+selfsup", found[0], flags=re.M)
    return found[0]


CHILD = r'''
import importlib.abc, importlib.util, sys
from pathlib import Path
# selfsup out of reach: no path entry that holds a selfsup package (the source tree, main's editable install)
sys.path = [p for p in sys.path if not (Path(p or ".") / "selfsup").exists()]
assert importlib.util.find_spec("selfsup") is None, "selfsup is still importable"

class NoSelfsup(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "selfsup":
            raise ModuleNotFoundError(f"selfsup is not importable here ({name})")

sys.meta_path.insert(0, NoSelfsup())
work = Path(sys.argv[1])
exec(compile((work / "snippet.py").read_text(), "docs/export.md", "exec"))
import torch
from safetensors.torch import load_file, save_file
inputs = load_file(str(work / "inputs.safetensors"))
features = {}
with torch.no_grad():
    for case, x in inputs.items():
        model, meta = rebuild(str(work / f"{case}.safetensors"))
        features[case] = model(x).contiguous()
save_file(features, str(work / "features.safetensors"))
assert not [m for m in sys.modules if m.split(".")[0] == "selfsup"]
print("imported:", "timm" in sys.modules, "torchvision" in sys.modules)
'''


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Each case exported, and the page's rebuild run on all of them in one selfsup-free subprocess."""
    work = tmp_path_factory.mktemp("export")
    models, inputs = {}, {}
    for i, (case, (name, kwargs)) in enumerate(CASES.items()):
        torch.manual_seed(i)
        models[case] = trained_like(build_backbone(name, **kwargs), seed=i)
        export_backbone(models[case], work / f"{case}.safetensors", {"backbone": name, "kwargs": kwargs})
        s = kwargs["image_size"]
        inputs[case] = torch.randn(6, kwargs["in_chans"], s, s, generator=torch.Generator().manual_seed(100 + i))
    save_file(inputs, str(work / "inputs.safetensors"))
    (work / "snippet.py").write_text(readme_rebuild_snippet())
    (work / "child.py").write_text(CHILD)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")} | {"OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-I", str(work / "child.py"), str(work)], capture_output=True, text=True,
                          env=env, cwd=work, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "imported: True True" in done.stdout
    return work, models, inputs, load_file(str(work / "features.safetensors"))


@pytest.mark.spawn
@pytest.mark.parametrize("case", list(CASES))
def test_readme_rebuild_without_selfsup_gives_selfsups_features(exported, case):
    work, models, inputs, features = exported
    with torch.no_grad():
        ours = models[case](inputs[case])
    assert features[case].shape == ours.shape == (6, models[case].num_features)
    torch.testing.assert_close(features[case], ours, atol=1e-5, rtol=1e-5)  # float32, same ops: measured 0
    meta = read_meta(work / f"{case}.safetensors")
    assert ("timm" in meta) == case.startswith("vit") and ("torchvision" in meta) == case.startswith("resnet")


@pytest.mark.spawn
def test_the_metadata_holds_every_constructor_argument(exported):
    work = exported[0]
    vit = read_meta(work / "vit_layer_scale.safetensors")["architecture"]
    assert set(vit["kwargs"]) == set(inspect.signature(VisionTransformer.build).parameters) - {"self"}
    assert vit["kwargs"] | {"drop_path_rate": None} == dict(
        image_size=16, patch_size=4, in_chans=3, embed_dim=128, depth=4, num_heads=4, mlp_ratio=4.0, qkv_bias=True,
        drop_path_rate=None, pool="cls", stop_grad_conv1=False, layer_scale=0.1, pos_embed="sincos", init="moco_v3",
        final_norm=True, registers=0, ffn="mlp", drop_path_uniform=False, class_token=True)
    assert (vit["class_token"], vit["pos_embed"], vit["norm_layer"], vit["norm_eps"], vit["mlp_hidden"]) == (
        True, "sincos_2d", "LayerNorm", 1e-6, 512)
    r18 = read_meta(work / "resnet_small_stem.safetensors")["architecture"]
    assert set(r18["kwargs"]) == set(inspect.signature(resnet).parameters)
    assert r18["kwargs"] == dict(name="resnet18", in_chans=1, small_stem=True, zero_init_residual=True)
    assert (r18["block"], r18["layers"], r18["width_per_group"], r18["maxpool"], r18["num_features"]) == (
        "BasicBlock", [2, 2, 2, 2], 64, False, 512)
    assert r18["conv1"] == dict(in_channels=1, out_channels=64, kernel_size=3, stride=1, padding=1, bias=False)
    plain = read_meta(work / "resnet_imagenet_stem.safetensors")["torchvision"]
    assert plain["conv1"] == dict(in_channels=3, out_channels=64, kernel_size=7, stride=2, padding=3, bias=False)
    assert plain["maxpool"] is True and plain["kwargs"] == {"weights": None, "zero_init_residual": False}
    avg = read_meta(work / "vit_avg.safetensors")["timm"]["kwargs"]
    assert (avg["global_pool"], avg["fc_norm"], avg["init_values"]) == ("avg", False, None)


def test_every_timm_name_the_recipe_can_choose_is_registered():
    import timm

    names = [f"vit_{size}_patch{p}_224" for size, patches in TIMM_VIT_PATCHES.items() for p in patches]
    assert [n for n in names if not timm.is_model(n)] == []


@pytest.fixture(scope="module")
def vit_small(tmp_path_factory):
    """selfsup's vit_small (MoCo v3's ViT-S: 12 heads) at 32 px, exported."""
    path = tmp_path_factory.mktemp("vit_small") / "vit_small.safetensors"
    kwargs = dict(in_chans=3, image_size=32, patch_size=16)
    model = trained_like(build_backbone("vit_small", **kwargs), seed=7)
    export_backbone(model, path, {"backbone": "vit_small", "kwargs": kwargs})
    return path, model


def test_a_timm_name_of_another_shape_is_refused_in_one_line(vit_small):
    import timm

    path, model = vit_small
    bare = timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=0, img_size=32)
    bare.load_state_dict(load_file(str(path)), strict=True)  # the hazard: 6 heads load the 12-head weights silently
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert (bare.eval()(x) - model(x)).abs().max() > 1e-2
    with pytest.raises(UserError, match=r"timm's vit_small_patch16_224 is not the file's vit_small: num_heads 6 "
                                        r"\(file: 12\); call selfsup.export.load_timm\(path\) without a name") as e:
        load_timm(path, "vit_small_patch16_224", img_size=32)
    assert "\n" not in str(e.value)
    with pytest.raises(UserError, match=r"pool avg \(file: cls\), fc_norm True \(file: False\)"):
        load_timm(path, "vit_small_patch16_224", img_size=32, num_heads=12, global_pool="avg")
    with pytest.raises(UserError, match=r"image_size \(224, 224\) \(file: \(32, 32\)\)"):
        load_timm(path, "vit_small_patch16_224", num_heads=12)
    ok = load_timm(path, "vit_small_patch16_224", img_size=32, num_heads=12)  # the name with the right kwargs
    with torch.no_grad():
        torch.testing.assert_close(ok(x), model(x), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(load_timm(path)(x), model(x), atol=1e-5, rtol=1e-5)  # the file's own recipe


def test_a_shape_the_architecture_check_cannot_see_is_refused_by_the_strict_load(tmp_path):
    path = tmp_path / "timm.safetensors"
    kwargs = dict(in_chans=3, image_size=32)
    export_backbone(build_backbone("timm:resnet18", **kwargs), path, {"backbone": "timm:resnet18", "kwargs": kwargs})
    assert read_meta(path)["timm"] == {"model": "resnet18", "kwargs": {"num_classes": 0, "in_chans": 3}}
    assert load_timm(path).num_features == 512
    with pytest.raises(UserError, match=r"weights do not fit timm's resnet34 \(.*\); call selfsup.export.load_timm"):
        load_timm(path, "resnet34")


@pytest.mark.spawn
def test_load_timm_names_the_torchvision_recipe_for_a_resnet(exported):
    with pytest.raises(UserError, match=r"holds a resnet18, which has no timm equivalent \(its torchvision recipe"):
        load_timm(exported[0] / "resnet_small_stem.safetensors")
    with pytest.raises(UserError, match=r"'vit_smal' is not a timm model; the file's own is 'vit_tiny_patch16_224'"):
        load_timm(exported[0] / "vit_cls.safetensors", "vit_smal")
