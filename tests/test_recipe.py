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
from selfsup.runs.recipe import BASES, MAX_EPOCHS, TARGET_STEPS, FolderFacts, folder_facts, resolve_recipe
from ssl_helpers import run_cli


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
    data, chosen = resolve_recipe(method, facts, {"data": {"root": str(tmp_path / "f")}, "output_dir": str(tmp_path)})
    cfg = resolve(data)
    assert cfg.data.image_size == values(chosen)["data.image_size"] and cfg.data.channels == 1
    torch.manual_seed(0)
    build_method(cfg, data_info(cfg, load_dataset(cfg.data, "train")))
