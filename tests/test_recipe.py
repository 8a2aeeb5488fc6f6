"""A recipe sized to the folder (issue 49): ``selfsup pretrain <method> data.root=FOLDER`` resolves the image size,
batch, epochs and warm-up, the sizes that scale with the data and the accelerator from the folder's measured facts,
prints them in one block, records them in config.yaml, and leaves every key the user sets as given."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from selfsup.errors import UserError
from selfsup.runs.recipe import (ADAPT_LR, BASES, MAX_EPOCHS, TARGET_STEPS, FolderFacts, folder_facts, queue_bucket,
                                 resolve_recipe, source_patch)
from ssl_helpers import dinov2_teacher_run, run_cli


def png_folder(root: Path, n: int = 48, labelled: bool = True, gray: bool = False) -> Path:
    g = np.random.default_rng(0)
    for i in range(n):
        folder = root / "train" / "ab"[i % 2] if labelled else root / ("nested/deeper" if i % 3 else "")
        folder.mkdir(parents=True, exist_ok=True)
        h, w = 30 + i % 11, 36 + i % 7  # shorter sides 30..40: median 35
        shape = (h, w) if gray else (h, w, 3)
        Image.fromarray(g.integers(0, 256, shape, dtype=np.uint8)).save(folder / f"{i:03d}.png")
        if labelled and i < 10:
            (root / "val" / "ab"[i % 2]).mkdir(parents=True, exist_ok=True)
            Image.fromarray(g.integers(0, 256, shape, dtype=np.uint8)).save(root / "val" / "ab"[i % 2] / f"{i}.png")
    return root


def values(chosen) -> dict:
    return {k: v for k, v, _ in chosen}


def test_the_recipe_follows_the_folders_facts(tmp_path):
    facts = folder_facts(png_folder(tmp_path / "f", n=48, labelled=False, gray=True))
    assert (facts.images, facts.labelled, facts.gray) == (48, False, 1.0) and len(facts.short_sides) == 48
    data, chosen = resolve_recipe("simclr", facts, {"data": {"root": str(facts.root)}})
    v = values(chosen)
    assert v["data.name"] == "images" and v["data.channels"] == 1 and v["eval.knn_every_n_steps"] == 0
    median = sorted(facts.short_sides)[24]
    assert v["model.patch_size"] == median // 4 and v["data.image_size"] == median // (median // 4) * (median // 4)
    assert v["data.batch_size"] == 8  # 48 images / 4 = 12: the power of two 8 (a 1,000-step run has 6 a epoch)
    assert v["trainer.max_epochs"] == min(MAX_EPOCHS, -(-TARGET_STEPS // 6))
    # the base's warm-up share (simclr-fmnist: 0.5 of 5 epochs), not its epochs: 10% of the run in steps too
    assert v["optim.warmup_epochs"] == pytest.approx(0.1 * v["trainer.max_epochs"])
    assert v["trainer.accelerator"] in ("cpu", "gpu") and "data.root" not in v  # the user's key: as given
    # a large folder on a GPU: larger images, prototypes by the bucket, the base's batch
    big = FolderFacts(Path("/data"), True, 200_000, [300] * 256, 0.0, 16, "NVIDIA H100")
    data, chosen = resolve_recipe("dino", big, {"data": {"root": "/data"}, "optim": {"warmup_epochs": 2}})
    v = values(chosen)
    assert v["data.name"] == "imagefolder" and v["trainer.accelerator"] == "gpu" and v["data.num_workers"] == 8
    assert v["data.image_size"] == 224 and v["model.patch_size"] == 28 and v["data.batch_size"] == 256
    assert v["method.out_dim"] == 1024 and "optim.warmup_epochs" not in v and data["optim"]["warmup_epochs"] == 2
    assert v["augment.local_crops_size"] % 28 == 0 and v["trainer.max_epochs"] == 5
    small = FolderFacts(Path("/d"), False, 300, [64] * 256, 0.0, 2, None)
    v = values(resolve_recipe("swav", small, {"data": {"root": "/d"}})[1])
    assert v["method.nmb_prototypes"] == 64 and v["data.batch_size"] == 64
    v = values(resolve_recipe("nnclr", small, {"data": {"root": "/d"}})[1])
    assert v["method.queue_size"] == 128  # at most half the images


@pytest.mark.spawn
def test_pretrain_a_method_on_a_folder_prints_and_records_its_recipe(tmp_path):
    root = png_folder(tmp_path / "photos")
    code, out, err = run_cli("pretrain", "simclr", f"data.root={root}", "trainer.max_epochs=1",
                             "trainer.limit_train_batches=2", "trainer.progress_bar=false", "method.proj_hidden_dim=64",
                             f"output_dir={tmp_path / 'runs'}", "name=r")
    assert code == 0, err
    lines = out[out.index("selfsup: a recipe for simclr"):].splitlines()
    end = next(i for i, line in enumerate(lines[1:], 1) if not line.startswith("  "))
    block = "\n".join(lines[:end])
    assert "48 images, labelled" in block and "data.name=imagefolder" in block and "trainer.max_epochs" not in block
    cfg = yaml.safe_load((tmp_path / "runs" / "r" / "config.yaml").read_text())
    resolved = dict(line.split()[0].split("=", 1) for line in block.splitlines()[1:])
    for key, value in resolved.items():
        section, name = key.split(".")
        assert str(cfg[section][name]).lower() == value.lower(), key  # recorded as printed
    assert cfg["trainer"]["max_epochs"] == 1 and cfg["method"]["proj_hidden_dim"] == 64  # the user's keys win
    assert (tmp_path / "runs" / "r" / "knn.json").exists()  # labelled: the end-of-run kNN ran


def test_a_method_without_a_folder_or_a_flow_method_is_one_line(tmp_path):
    code, _, err = run_cli("pretrain", "simclr", f"output_dir={tmp_path}")
    assert code == 2 and "needs data.root=FOLDER" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli("pretrain", "self_flow", f"data.root={tmp_path}")
    assert code == 2 and "a flow method trains from a preset" in err
    with pytest.raises(UserError, match="is not a folder"):
        folder_facts(tmp_path / "nope")


@pytest.mark.parametrize("method", sorted(BASES))
def test_every_methods_recipe_resolves_and_builds_on_a_folder(method, tmp_path):
    """Each method's base is a preset; its recipe on a small labelled folder resolves to a config whose method
    builds (the model and its heads at the resolved size, patch and prototype counts)."""
    import torch

    from selfsup.config import preset_names, resolve
    from selfsup.data.datasets import load_dataset
    from selfsup.methods.build import build_method, data_info

    assert BASES[method] in preset_names()
    facts = folder_facts(png_folder(tmp_path / "f", n=48, gray=True))
    teacher = {"distill": vit_export(tmp_path), "distill_dinov2": str(dinov2_teacher_run(tmp_path))}.get(method)
    extra = {"method": {"teacher": {"weights": teacher}}} if teacher else {}
    data, chosen = resolve_recipe(method, facts, {"data": {"root": str(tmp_path / "f")}, "output_dir": str(tmp_path),
                                                  **extra})
    cfg = resolve(data)
    assert cfg.data.image_size == values(chosen)["data.image_size"] and cfg.data.channels == 1
    torch.manual_seed(0)
    build_method(cfg, data_info(cfg, load_dataset(cfg.data, "train")))


# --------------------------------------------------------------------------- the patch grid, distillation, adaptation
def vit_export(tmp_path, patch: int = 4, name: str = "teacher.safetensors") -> str:
    """A selfsup export of a micro ViT (1 channel, 8 px, ``patch``) standing in for a trained network."""
    from selfsup.export import export_backbone
    from selfsup.models.backbones import build_backbone

    kwargs = {"in_chans": 1, "image_size": 8, "patch_size": patch}
    path = tmp_path / name
    export_backbone(build_backbone("vit_micro", **kwargs), path,
                    {"backbone": "vit_micro", "kwargs": kwargs, "image_size": 8, "in_chans": 1, "mean": [0.3],
                     "std": [0.3], "dataset": "digits", "method": "moco_v3"})
    return str(path)


def test_the_patch_is_read_from_the_source_without_building_it(tmp_path):
    import torch

    assert source_patch(vit_export(tmp_path, 4)) == 4
    assert source_patch("timm:vit_small_patch14_dinov2") == 14 and source_patch("timm:resnet18") is None
    hub = tmp_path / "dinov2_like.pth"
    torch.save({"teacher": {"backbone.patch_embed.proj.weight": torch.zeros(8, 3, 14, 14)}}, hub)
    assert source_patch(str(hub)) == 14 and source_patch(None) is None


def test_a_patch_the_user_gives_is_kept_and_every_resolved_size_is_a_multiple_of_it():
    """``model.patch_size=14`` with DINO's local crops: the size and the local crops are multiples of 14, and the
    config resolves (the recipe never resolves a value the model refuses)."""
    from selfsup.config import resolve

    facts = FolderFacts(Path("/d"), False, 300, [100] * 256, 0.0, 2, None)
    data, chosen = resolve_recipe("dino", facts, {"data": {"root": "/d"}, "model": {"patch_size": 14}})
    v = values(chosen)
    assert "model.patch_size" not in v and v["data.image_size"] == 56 and v["augment.local_crops_size"] % 14 == 0
    cfg = resolve(data)
    assert cfg.model.patch_size == 14 and cfg.data.image_size % 14 == 0
    data, chosen = resolve_recipe("simclr", facts, {"data": {"root": "/d"},
                                                    "model": {"backbone": "timm:vit_small_patch14_dinov2"}})
    v = values(chosen)
    assert v["model.patch_size"] == 14 and v["data.image_size"] == 56  # timm's patch 14, not the base's 7


def test_distillation_gets_the_folder_recipe_with_the_teachers_patch_and_lightlytrains_queue(tmp_path):
    facts = FolderFacts(Path("/d"), False, 300, [100] * 256, 0.0, 2, None)
    hub = tmp_path / "dinov2_like.pth"
    import torch

    torch.save({"patch_embed.proj.weight": torch.zeros(8, 3, 14, 14)}, hub)
    teacher = {"teacher": {"weights": str(hub)}}
    data, chosen = resolve_recipe("distill", facts, {"data": {"root": "/d"}, "method": teacher})
    v = values(chosen)
    assert v["data.image_size"] == 56 and 56 % v["model.patch_size"] == 0 and v["model.patch_size"] == 14
    assert v["method.queue_size"] == queue_bucket(300) == 128 and v["trainer.precision"] == "32-true"
    assert [queue_bucket(n) for n in (10, 49, 50, 999, 1000, 19_999, 20_000)] == [16, 16, 32, 256, 512, 4096, 8192]
    run = str(dinov2_teacher_run(tmp_path))  # patch 2: DINOv2's distillation pairs the patches
    v = values(resolve_recipe("distill_dinov2", facts, {"data": {"root": "/d"},
                                                        "method": {"teacher": {"weights": run}}})[1])
    assert v["model.patch_size"] == 2 and v["data.image_size"] % 2 == 0 and "method.out_dim" not in v
    code, _, err = run_cli("pretrain", "distill", f"data.root={tmp_path}")
    assert code == 2 and "needs method.teacher.weights=SOURCE" in err and len(err.strip().splitlines()) == 1


def test_model_weights_get_the_adaptation_recipe(tmp_path):
    """docs/pretrained.md: a quarter of the base's lr and a tenth of an epoch of warm-up, printed with why."""
    from selfsup.config import load_preset, resolve

    facts = FolderFacts(Path("/d"), False, 300, [100] * 256, 0.0, 2, None)
    start = vit_export(tmp_path, 4)
    data, chosen = resolve_recipe("simclr", facts, {"data": {"root": "/d"}, "model": {"weights": start}})
    v = values(chosen)
    base_lr = resolve(load_preset(BASES["simclr"])).optim.base_lr
    assert v["optim.base_lr"] == pytest.approx(ADAPT_LR * base_lr) and v["optim.warmup_epochs"] == 0.1
    assert v["model.patch_size"] == 4 and v["data.image_size"] % 4 == 0  # the weights' patch
    why = {k: w for k, _, w in chosen}
    assert "adaptation recipe" in why["optim.base_lr"]
    v = values(resolve_recipe("simclr", facts, {"data": {"root": "/d"}, "model": {"weights": start},
                                                "optim": {"base_lr": 0.1}})[1])
    assert "optim.base_lr" not in v  # the user's lr wins


@pytest.mark.spawn
def test_distill_on_a_folder_trains_from_the_cli(tmp_path):
    """The practitioner's command: ``selfsup pretrain distill data.root=F method.teacher.weights=SOURCE``."""
    root = png_folder(tmp_path / "photos", labelled=False, gray=True)  # the teacher's grey images
    teacher = vit_export(tmp_path)
    code, out, err = run_cli("pretrain", "distill", f"data.root={root}", f"method.teacher.weights={teacher}",
                             "trainer.max_steps=2", "trainer.progress_bar=false", f"output_dir={tmp_path / 'runs'}",
                             "name=d")
    assert code == 0, err
    assert "selfsup: a recipe for distill" in out and "method.queue_size=16" in out
    cfg = yaml.safe_load((tmp_path / "runs" / "d" / "config.yaml").read_text())
    assert cfg["method"]["queue_size"] == 16 and cfg["data"]["image_size"] % 4 == 0


@pytest.mark.train
def test_distill_on_a_folder_with_a_dinov3_teacher_trains_on_a_cpu(tmp_path):
    """``selfsup pretrain distill data.root=F method.teacher.weights=DINOv3_FILE`` (LightlyTrain v3's teacher): the
    recipe reads the file's patch 16 (its patch embedding's kernel), sizes the images to a multiple of it within the
    CPU's 64 px, the student's own patch to a 4 × 4 grid, a CPU batch, and trains v3 against the teacher's grid."""
    import json

    import torch
    from test_distill_versions import dinov3_hub_file

    root = png_folder(tmp_path / "photos", labelled=False)
    teacher = dinov3_hub_file(tmp_path)
    assert source_patch(teacher) == 16
    code, out, err = run_cli("pretrain", "distill", f"data.root={root}", f"method.teacher.weights={teacher}",
                             "method.version=v3", "data.num_workers=0", "trainer.max_steps=2",
                             "trainer.progress_bar=false", f"output_dir={tmp_path / 'runs'}", "name=d")
    assert code == 0, err
    assert "of the teacher's patch 16" in out and "trainer.accelerator=cpu" in out
    cfg = yaml.safe_load((tmp_path / "runs" / "d" / "config.yaml").read_text())
    size, patch = cfg["data"]["image_size"], cfg["model"]["patch_size"]
    assert size % 16 == 0 and 16 <= size <= 64 and size // patch == 4 and cfg["data"]["batch_size"] == 8
    facts = json.loads((tmp_path / "runs" / "d" / "run.json").read_text())
    assert facts["teacher"]["kind"] == "dinov3-hub" and cfg["method"]["version"] == "v3"
    assert torch.load(tmp_path / "runs" / "d" / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 2


def test_a_preset_given_a_folder_keeps_its_grid_of_patches(tmp_path, capsys):
    """``simclr-digits data.name=images data.root=PHOTOS``: the digits preset's 4 x 4 grid (8 px, patch 2) at the
    folder's size, not patch 2 at it (4,489 tokens an image on 134-px photos, killed by the kernel)."""
    from selfsup.config import load_run_config
    from selfsup.runs.recipe import keep_grid

    root = png_folder(tmp_path / "photos", labelled=False)  # shorter sides 30..40: median 35
    items = keep_grid("simclr-digits", ["data.name=images", f"data.root={root}"])
    assert items[-2:] == ["model.patch_size=8", "data.image_size=32"]
    assert "keeps its 4 x 4 grid" in capsys.readouterr().out
    cfg = load_run_config("simclr-digits", items)
    assert cfg.data.image_size // cfg.model.patch_size == 4
    given = ["data.name=images", f"data.root={root}", "model.patch_size=4"]
    assert keep_grid("simclr-digits", given) == given  # the user's patch wins
    assert keep_grid("simclr-cnn-digits", ["data.name=images", f"data.root={root}"])[-1].startswith("data.root")


# --------------------------------------------------------------------------- a torchvision ResNet file, a GPU preset
def test_a_torchvision_resnet_file_makes_the_student_its_resnet_and_the_weights_load(tmp_path, capsys):
    """Issue 62's bar ``selfsup pretrain byol data.root=F model.weights=R18.pth``: the base's ViT refused the
    ResNet-18 file ("the weights do not fit this backbone"); the architecture is read from the file's keys."""
    import torch
    import torchvision

    from selfsup.config import resolve
    from selfsup.data.datasets import load_dataset
    from selfsup.methods.build import build_method, data_info
    from selfsup.runs.recipe import folder_recipe, source_resnet

    torch.manual_seed(0)
    r18 = torchvision.models.resnet18()
    torch.save(r18.state_dict(), tmp_path / "R18.pth")

    def layout(blocks, convs, stem, prefix=""):  # torchvision's keys (tiny tensors): what source_resnet reads
        keys = {f"{prefix}conv1.weight": torch.zeros(64, 3, stem, stem), f"{prefix}fc.weight": torch.zeros(1)}
        keys.update({f"{prefix}layer{i}.{b}.conv{c}.weight": torch.zeros(1)
                     for i, n in enumerate(blocks, 1) for b in range(n) for c in range(1, convs + 1)})
        return keys

    torch.save({"state_dict": layout((3, 4, 6, 3), 3, 7, "module.")}, tmp_path / "r50.pth.tar")  # wrapped, prefixed
    torch.save(layout((3, 4, 6, 3), 2, 3), tmp_path / "r34.pth")  # BasicBlocks, a 3 x 3 stem
    torch.save(layout((2, 2, 3, 2), 2, 7), tmp_path / "odd.pth")  # no torchvision ResNet
    assert source_resnet(str(tmp_path / "R18.pth")) == ("resnet18", False)
    assert source_resnet(str(tmp_path / "r50.pth.tar")) == ("resnet50", False)
    assert source_resnet(str(tmp_path / "r34.pth")) == ("resnet34", True)
    assert source_resnet(str(tmp_path / "odd.pth")) is None and source_resnet(str(tmp_path / "absent.pth")) is None
    assert source_resnet(vit_export(tmp_path)) is None
    root = png_folder(tmp_path / "f", n=48)
    facts = folder_facts(root)
    data, chosen = resolve_recipe("byol", facts, {"data": {"root": str(root)},
                                                  "model": {"weights": str(tmp_path / "R18.pth")}})
    v = values(chosen)
    assert v["model.backbone"] == "resnet18" and "model.small_stem" not in v and "model.patch_size" not in v
    assert v["optim.warmup_epochs"] == 0.1  # the adaptation recipe still
    cfg = resolve(data)
    model = build_method(cfg, data_info(cfg, load_dataset(cfg.data, "train")))  # the file loads: no refusal
    assert torch.equal(model.backbone.conv1.weight, r18.conv1.weight)
    assert "model.backbone=resnet18" not in capsys.readouterr().out  # said once, in the block, not by student_moved
    v = values(resolve_recipe("byol", facts, {"data": {"root": str(root)},
                                              "model": {"weights": str(tmp_path / "r34.pth")}})[1])
    assert (v["model.backbone"], v["model.small_stem"]) == ("resnet34", True)
    given = {"data": {"root": str(root)}, "model": {"weights": str(tmp_path / "R18.pth"), "backbone": "resnet50"}}
    assert "model.backbone" not in values(resolve_recipe("byol", facts, given)[1])  # the user's backbone wins
    folder_recipe("byol", [f"data.root={root}", f"model.weights={tmp_path / 'R18.pth'}"])
    assert "model.backbone=resnet18" in capsys.readouterr().out


def _hub_patch_file(tmp_path, patch: int = 14) -> str:
    """A file whose patch embedding is ``patch`` px: what ``source_patch`` reads of a DINOv2 hub teacher."""
    import torch

    path = tmp_path / f"teacher{patch}.pth"
    torch.save({"patch_embed.proj.weight": torch.zeros(8, 3, patch, patch)}, path)
    return str(path)


def test_a_gpu_preset_given_a_folder_on_a_cpu_resolves_what_runs_here(tmp_path, capsys, monkeypatch):
    """Issue 62: ``distill-dinov2-vits14-r18-imagefolder data.root=F`` on a CPU kept 224 px, batch 256, bf16 and
    100 epochs (3 min 45 s a step on 2 cores). Each value below is worked out by hand for 48 images whose median
    shorter side is 34 px on this machine's cores."""
    import os

    import torch

    from selfsup.config import load_run_config
    from selfsup.runs.recipe import CPU_BATCH, gpu_preset_on_cpu

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    root = png_folder(tmp_path / "f", n=48)
    workers = min(8, max(0, (os.cpu_count() or 1) - 1))
    given = [f"data.root={root}", f"method.teacher.weights={_hub_patch_file(tmp_path)}"]
    items = gpu_preset_on_cpu("distill-dinov2-vits14-r18-imagefolder", given)
    # 34 px to a multiple of the teacher's 14: 28; batch: 48 / 4 = 12, the power of two 8 (<= CPU_BATCH, 256);
    # 6 steps an epoch: the preset's 100 epochs are 600 steps (kept); LightlyTrain's queue for 48 images: 16
    assert items[:2] == given and sorted(items[2:]) == sorted([
        "data.name=imagefolder", "data.image_size=28", "data.batch_size=8", "method.queue_size=16",
        "trainer.accelerator=cpu", "trainer.devices=1", "trainer.precision=32-true", f"data.num_workers={workers}"])
    out = capsys.readouterr().out
    assert "distill-dinov2-vits14-r18-imagefolder is a GPU preset" in out
    assert "data.image_size=28" in out and "the preset's 224" in out and "the preset's bf16-mixed" in out
    cfg = load_run_config("distill-dinov2-vits14-r18-imagefolder", items)
    assert (cfg.data.image_size, cfg.data.batch_size, cfg.trainer.precision, cfg.trainer.accelerator) == (
        28, 8, "32-true", "cpu") and CPU_BATCH >= 8
    # the ViT student's patch divides the teacher's size, a 4 x 4 grid (28 / 7); a key the user sets wins, unsaid
    items = gpu_preset_on_cpu("distill-dinov2-vits14-vits-imagefolder", [*given, "data.batch_size=16"])
    assert "model.patch_size=7" in items and not any(i.startswith("data.batch_size=8") for i in items)
    assert load_run_config("distill-dinov2-vits14-vits-imagefolder", items).data.batch_size == 16
    # a ViT preset without a teacher keeps its patch (ViT-S/14 stays /14) and its steps are cut to ~TARGET_STEPS
    items = gpu_preset_on_cpu("dinov2-vit-s14-imagenet", [f"data.root={root}"])
    cfg = load_run_config("dinov2-vit-s14-imagenet", items)
    assert (cfg.model.patch_size, cfg.data.image_size, cfg.augment.local_crops_size) == (14, 28, 14)
    assert cfg.trainer.max_steps == TARGET_STEPS and cfg.trainer.strategy == "auto" and cfg.data.load_size is None
    assert cfg.method.out_dim == 64  # 48 images / 8, at least 64 prototypes
    items = gpu_preset_on_cpu("dino-vit-s-imagenet", [f"data.root={root}"])
    cfg = load_run_config("dino-vit-s-imagenet", items)  # 6 steps an epoch: 167 epochs for ~1,000, not 300
    assert cfg.trainer.max_epochs == 167 and cfg.optim.warmup_epochs == pytest.approx(10 / 300 * 167, abs=1e-4)
    # not a GPU preset, or a GPU here: nothing changes
    capsys.readouterr()
    plain = [f"data.root={root}"]
    assert gpu_preset_on_cpu("simclr-fmnist", plain) is plain
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: "NVIDIA H100")
    assert gpu_preset_on_cpu("dino-vit-s-imagenet", plain) is plain
    cpu = gpu_preset_on_cpu("dino-vit-s-imagenet", [*plain, "trainer.accelerator=cpu"])  # asked for the CPU
    assert "data.image_size=32" in cpu and "data.batch_size=8" in cpu  # 34 px to the preset's patch 16
    assert "is a GPU preset and this machine trains on its" in capsys.readouterr().out


@pytest.mark.spawn
def test_a_gpu_preset_on_a_folder_trains_on_this_cpu_from_the_cli(tmp_path):
    """The user's command, with no key but the folder and a short length: the GPU preset runs here (before: exit 2,
    "trainer.accelerator=gpu but this machine has no CUDA GPU"; with that set, 224 px at batch 1024 in 16-mixed)."""
    root = png_folder(tmp_path / "photos")  # a ViT-Tiny for the preset's ViT-S: a shorter test
    code, out, err = run_cli("pretrain", "dino-vit-s-imagenet", f"data.root={root}", "trainer.max_steps=1",
                             "model.backbone=vit_tiny",
                             "trainer.progress_bar=false", f"output_dir={tmp_path / 'runs'}", "name=g")
    assert code == 0, err
    assert "dino-vit-s-imagenet is a GPU preset" in out and "data.image_size=32" in out
    cfg = yaml.safe_load((tmp_path / "runs" / "g" / "config.yaml").read_text())
    assert (cfg["data"]["image_size"], cfg["data"]["batch_size"], cfg["trainer"]["precision"]) == (32, 8, "32-true")
    assert cfg["trainer"]["accelerator"] == "cpu" and cfg["method"]["out_dim"] == 64
