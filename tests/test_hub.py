"""``selfsup export RUN --format hf`` (``selfsup.runs.hub``): a folder in timm's hub layout that plain timm loads
offline, in a process where selfsup cannot be imported, both by its architecture with the file given and by
``local-dir:``, and computes selfsup's features (a ViT, a ViT with registers and a learned table, a SwiGLU ViT with
registers, a ResNet-18, a timm:<name> backbone); the model card's facts; a backbone timm cannot build refused in
one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from selfsup.commands.main import main
from selfsup.config import load_run_config, to_dict
from selfsup.errors import UserError
from selfsup.export import export_backbone
from selfsup.models.backbones import build_backbone
from selfsup.runs.hub import DINOV2_LICENCE, PROJECT_LICENCE, export_hub
from selfsup.runs.portable import TOLERANCE
from test_export import CHILD as NO_SELFSUP, trained_like

CASES = {  # name -> (backbone, build_backbone kwargs)
    "vit": ("vit_micro", dict(in_chans=3, image_size=16, patch_size=4, pool="cls")),
    "vit_registers": ("vit_nano", dict(in_chans=1, image_size=16, patch_size=4, pool="avg", registers=2,
                                       pos_embed="learned", init="trunc_normal")),
    "vit_swiglu_registers": ("vit_nano", dict(in_chans=3, image_size=16, patch_size=4, registers=4, ffn="swiglu",
                                              layer_scale=0.1)),
    "resnet18": ("resnet18", dict(in_chans=3, image_size=32)),
    "timm": ("timm:test_vit", dict(in_chans=3, image_size=32)),
}
KNN = {"k": 20, "temperature": 0.07, "train_size": 1438, "test_size": 359, "scored_on": "test",
       "labels": {"pretrained": "pretrained", "random_init": "random init"},
       "pretrained": {"top1": 81.62, "top5": 99.4}, "random_init": {"top1": 58.5, "top5": 91.6}}


def fake_run(root: Path, case: str, weights: dict | None = None, seed: int = 0) -> tuple[Path, torch.nn.Module]:
    """A finished run folder (config, run.json, knn.json, backbone.safetensors) of ``case``'s backbone, its weights
    moved off their init."""
    name, kwargs = CASES[case]
    run = root / case
    run.mkdir(parents=True)
    cfg = load_run_config("moco-v3-vit-digits", [f"output_dir={root}", f"name={case}"])
    (run / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    (run / "run.json").write_text(json.dumps({"global_step": 450, "epochs": 5,
                                              **({"weights": weights} if weights else {})}))
    (run / "knn.json").write_text(json.dumps(KNN))
    torch.manual_seed(seed)
    backbone = trained_like(build_backbone(name, **kwargs), seed)
    c = kwargs["in_chans"]
    meta = {"backbone": name, "kwargs": kwargs, "image_size": kwargs["image_size"], "in_chans": c,
            "mean": [0.45] * c, "std": [0.22] * c, "method": "moco_v3", "dataset": "digits"}
    export_backbone(backbone, run / "backbone.safetensors", meta)
    return run, backbone.eval()


LOAD = r'''
import json
cases = json.loads((work / "cases.json").read_text())
for case, folder in cases.items():
    folder = Path(folder)
    cfg = json.loads((folder / "config.json").read_text())
    overlay = dict(cfg["pretrained_cfg"], file=str(folder / "model.safetensors"))
    by_name = timm.create_model(cfg["architecture"], pretrained=True, **cfg["model_args"],
                                pretrained_cfg_overlay=overlay)
    local = timm.create_model(f"local-dir:{folder}", pretrained=True)
    for how, model in (("by_name", by_name), ("local_dir", local)):
        assert model.pretrained_cfg["mean"] == cfg["pretrained_cfg"]["mean"], how
        features[f"{case}.{how}"] = model.eval()(inputs[case]).contiguous()
save_file(features, str(work / "features.safetensors"))
'''


@pytest.mark.spawn
def test_the_folder_loads_offline_in_plain_timm_without_selfsup_with_selfsups_features(tmp_path):
    runs = {case: fake_run(tmp_path / "runs", case, seed=i) for i, case in enumerate(CASES)}
    inputs, want = {}, {}
    for case, (run, backbone) in runs.items():
        done = export_hub(run, run / "hf")
        assert done.max_rel_diff < TOLERANCE and sorted(p.name for p in done.path.iterdir()) == [
            "README.md", "config.json", "model.safetensors"]
        kwargs = CASES[case][1]
        inputs[case] = torch.randn(3, kwargs["in_chans"], kwargs["image_size"], kwargs["image_size"],
                                   generator=torch.Generator().manual_seed(7))
        with torch.no_grad():
            want[case] = backbone(inputs[case])
    work = tmp_path / "work"
    work.mkdir()
    (work / "snippet.py").write_text("import timm\n")
    (work / "cases.json").write_text(json.dumps({case: str(run / "hf") for case, (run, _) in runs.items()}))
    save_file(inputs, str(work / "inputs.safetensors"))
    (work / "child.py").write_text(
        NO_SELFSUP.split("features = {}")[0] + "features = {}\nwith torch.no_grad():\n"
        + "".join(f"    {line}\n" for line in LOAD.strip().splitlines())
        + "assert not [m for m in sys.modules if m.split('.')[0] == 'selfsup']\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")} | {
        "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}  # offline: the hub is never asked
    proc = subprocess.run([sys.executable, "-I", str(work / "child.py"), str(work)], env=env, capture_output=True,
                          text=True, timeout=240, cwd=work)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = load_file(str(work / "features.safetensors"))
    for case in CASES:
        for how in ("by_name", "local_dir"):
            diff = (got[f"{case}.{how}"] - want[case]).abs().max().item()
            assert diff <= 1e-5 * want[case].abs().max().item(), (case, how, diff)


def test_config_and_model_card_state_the_run(tmp_path):
    run, backbone = fake_run(tmp_path, "vit_registers")
    done = export_hub(run, tmp_path / "out")
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["num_classes"] == 0 and cfg["num_features"] == backbone.num_features == 32
    assert cfg["global_pool"] == "avg" and cfg["architecture"].startswith("vit_")
    args = cfg["model_args"]
    assert (args["reg_tokens"], args["no_embed_class"], args["num_heads"], args["in_chans"]) == (2, True, 2, 1)
    pre = cfg["pretrained_cfg"]
    assert pre["input_size"] == [1, 16, 16] and pre["mean"] == [0.45] and pre["std"] == [0.22]
    assert (pre["interpolation"], pre["crop_pct"], pre["license"]) == ("bilinear", 0.875, PROJECT_LICENCE[0])
    state = load_file(str(tmp_path / "out" / "model.safetensors"))
    # timm's register layout: no register or class row in the table, the class position folded into the token
    own = backbone.state_dict()
    assert "register_tokens" not in state and torch.equal(state["reg_token"], own["register_tokens"])
    assert state["pos_embed"].shape[1] == 16 and torch.equal(state["pos_embed"], own["pos_embed"][:, 1:])
    assert torch.equal(state["cls_token"], own["cls_token"] + own["pos_embed"][:, :1])
    card = (tmp_path / "out" / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: timm\nlicense: other\n") and "- moco_v3" in card
    assert "| method | moco_v3 (selfsup) |" in card and "| data | digits |" in card
    assert "| steps | 450 (5 epochs) |" in card and "81.62% trained, 58.50% at its random init" in card
    assert "declares no licence" in card and done.config == cfg


def test_the_cards_licence_is_the_starts(tmp_path):
    dinov2 = {"source": "dinov2_vits14_pretrain.pth", "kind": "dinov2-hub", "layout": "dinov2"}
    run, _ = fake_run(tmp_path / "a", "vit", weights=dinov2)
    export_hub(run, run / "hf")
    card = (run / "hf" / "README.md").read_text()
    assert f"license: {DINOV2_LICENCE[0]}" in card and "| start | dinov2_vits14_pretrain.pth |" in card
    timm_start = {"source": "timm", "kind": "timm", "path": "timm:resnet18.a1_in1k"}
    run, _ = fake_run(tmp_path / "b", "resnet18", weights=timm_start)
    export_hub(run, run / "hf", check=False)
    assert "license: apache-2.0" in (run / "hf" / "README.md").read_text()  # timm's pretrained_cfg for it
    other = {"source": "/data/mine.pth", "kind": "file", "layout": None}
    run, _ = fake_run(tmp_path / "c", "vit", weights=other)
    export_hub(run, run / "hf", check=False, license="mit")
    text = (run / "hf" / "README.md").read_text()
    assert "license: mit" in text and "set by --license" in text
    export_hub(run, run / "hf2", check=False)
    assert "unknown: the start's weights (/data/mine.pth)" in (run / "hf2" / "README.md").read_text()


def test_a_backbone_timm_cannot_build_is_refused_in_one_line(tmp_path, capsys):
    for name, kwargs, why in (("bn_cnn_tiny", dict(in_chans=1, image_size=16), "timm has no ConvNet"),
                              ("resnet18", dict(in_chans=3, image_size=32, small_stem=True), "small stem")):
        backbone = build_backbone(name, **kwargs).eval()
        path = export_backbone(backbone, tmp_path / f"{name}.safetensors",
                               {"backbone": name, "kwargs": kwargs, "image_size": kwargs["image_size"],
                                "in_chans": kwargs["in_chans"], "mean": [0.5] * kwargs["in_chans"],
                                "std": [0.2] * kwargs["in_chans"]})
        with pytest.raises(UserError, match=f"{why}.*use --format onnx, or its selfsup .safetensors"):
            export_hub(path, tmp_path / "hf")
        assert main(["export", str(path), "--format", "hf"]) == 2
        err = capsys.readouterr().err
        assert "--format onnx" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "hf").exists()
    run, _ = fake_run(tmp_path / "runs", "vit")
    assert main(["export", str(run), "--format", "hf", "--opset", "19"]) == 2
    assert "--opset applies to --format onnx|torchscript" in capsys.readouterr().err
    assert main(["export", str(run), "--license", "mit"]) == 2
    assert "--license applies to --format hf" in capsys.readouterr().err and not (run / "backbone.onnx").exists()
    assert main(["export", str(run), "--format", "hf"]) == 0
    assert (run / "hf" / "config.json").exists() and "timm vit_" in capsys.readouterr().out
