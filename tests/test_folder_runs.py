"""A practitioner's own image folder (issue 62): one without val/ trains to the end and scores its kNN on a seeded
held-out share of train/; a folder with no readable image is refused in one line when it is read, and the recipe
refuses one under ``MIN_TRAIN_IMAGES`` readable images before training."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from ssl_helpers import TINY, assert_user_error, run_cli

PRESET = "byol-digits"


def photos(folder, n: int, seed: int = 0) -> None:
    """``n`` random 10×10 RGB PNGs in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, (10, 10, 3), dtype=np.uint8)).save(folder / f"{i:02d}.png")


def folder_run(root, tmp_path, *extra) -> tuple[int, str, str]:
    return run_cli("pretrain", PRESET, *TINY, "data.name=imagefolder", f"data.root={root}", "data.image_size=8",
                   "data.batch_size=8", "data.num_workers=0", *extra, f"output_dir={tmp_path / 'runs'}", "name=r")


@pytest.mark.train
def test_a_folder_with_train_and_no_val_trains_to_the_end_and_scores_a_held_out_share(tmp_path):
    # issue 62: train/ without val/ trained to the end, then exited 2 at the kNN ("no val or test/ folder")
    root = tmp_path / "photos"
    for c, cls in enumerate(("cat", "dog")):
        photos(root / "train" / cls, 12, seed=c)
    code, out, err = folder_run(root, tmp_path)
    assert code == 0, err
    run = tmp_path / "runs" / "r"
    facts = json.loads((run / "run.json").read_text())
    assert facts["status"] == "finished"
    # the first step's measured peak beside the estimate made before it (runs.memory.FirstStepMemory)
    step = facts["step_memory"]
    assert (step["step"], step["device"], step["batch"]) == (1, "cpu", 8)
    assert step["estimate_bytes"] > 0 and step["measured_bytes"] > 0
    knn = json.loads((run / "knn.json").read_text())
    assert knn["scored_on"] == "held_out_train" and knn["held_out"] == {"fraction": 0.2, "seed": 0, "images": 5}
    assert (knn["train_size"], knn["test_size"], knn["k"]) == (19, 5, 19)  # k=20 lowered to the 19 it is fit on
    line = next(line for line in out.splitlines() if line.startswith("kNN"))
    assert f"on 5 images held out of {root}/train/ (20%, seed 0: no val/ or test/ folder), fit on the other 19" in line
    assert "eval.knn_k=20 lowered to the 19 training images" in line


def test_the_recipe_says_at_the_start_where_a_folder_without_val_is_scored(tmp_path, capsys):
    from selfsup.runs.recipe import folder_recipe

    root = tmp_path / "photos"
    for c, cls in enumerate(("cat", "dog")):
        photos(root / "train" / cls, 12, seed=c)
    folder_recipe("simclr", [f"data.root={root}"])
    assert "no val/ or test/ folder: the end-of-run kNN scores a seeded 20% of train/" in capsys.readouterr().out
    photos(root / "val" / "cat", 2)
    folder_recipe("simclr", [f"data.root={root}"])
    assert "no val/ or test/ folder" not in capsys.readouterr().out


def junk(folder, n: int) -> None:
    """``n`` files of random bytes named .jpg in ``folder``: unreadable images."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    for i in range(n):
        (folder / f"{i}.jpg").write_bytes(rng.integers(0, 256, 300, dtype=np.uint8).tobytes())


def test_a_folder_of_only_unreadable_files_says_no_image_is_readable(tmp_path):
    # issue 62: it said "data.batch_size=3 is larger than the 1 training images; lower it"
    root = tmp_path / "photos"
    junk(root / "train" / "cat", 3)
    photos(root / "val" / "cat", 2)
    code, _, err = folder_run(root, tmp_path, "data.batch_size=3")
    assert_user_error(code, err, f"no image in {root / 'train'} is readable", "all 3 image files fail to open",
                      "selfsup data check")
    flat = tmp_path / "flat"
    junk(flat, 3)
    code, _, err = run_cli("pretrain", PRESET, *TINY, "data.name=images", f"data.root={flat}", "data.image_size=8",
                           "data.batch_size=3", "eval.knn_every_n_steps=0", "eval.online_probe=false",
                           f"output_dir={tmp_path / 'runs'}", "name=f")
    assert_user_error(code, err, f"no image in {flat} is readable", "all 3 image files fail to open")  # no skip lines
    code, _, err = run_cli("pretrain", "simclr", f"data.root={flat}", f"output_dir={tmp_path / 'runs'}")  # the recipe
    assert_user_error(code, err, f"no image in {flat} is readable", "all 3 image files fail to open")
    assert not (tmp_path / "runs" / "r").exists() and not (tmp_path / "runs" / "f").exists()


def test_the_recipe_refuses_a_folder_under_the_minimum_before_training(tmp_path):
    # issue 62: a one-image folder trained at batch 1 with raw torch warnings
    one = tmp_path / "one"
    photos(one, 1)
    code, _, err = run_cli("pretrain", "simclr", f"data.root={one}", f"output_dir={tmp_path / 'runs'}", "name=r")
    assert_user_error(code, err, str(one), "holds 1 readable training image(s), fewer than the 8 a run needs")
    labelled = tmp_path / "labelled"
    photos(labelled / "train" / "cat", 4)
    photos(labelled / "train" / "dog", 3, seed=1)
    junk(labelled / "train" / "dog", 2)  # listed, but not readable: 7 readable of 9
    code, _, err = run_cli("pretrain", "simclr", f"data.root={labelled}", f"output_dir={tmp_path / 'runs'}", "name=r")
    assert_user_error(code, err, str(labelled / "train"), "holds 7 readable training image(s)")
    assert not (tmp_path / "runs" / "r").exists()


def test_the_recipe_keeps_two_batches_an_epoch_on_a_folder_at_the_minimum(tmp_path):
    from selfsup.data.datasets import MIN_TRAIN_IMAGES
    from selfsup.runs.recipe import folder_facts, resolve_recipe

    photos(tmp_path / "eight", MIN_TRAIN_IMAGES)
    _, chosen = resolve_recipe("simclr", folder_facts(tmp_path / "eight"), {"data": {"root": str(tmp_path)}})
    assert dict((k, v) for k, v, _ in chosen)["data.batch_size"] == MIN_TRAIN_IMAGES // 2 == 4


@pytest.mark.train
def test_a_presets_workers_are_capped_at_the_machines_cores_less_one(tmp_path, monkeypatch):
    """A GPU preset's data.num_workers=8 on a 1-core machine: one line says so and the loaders use 0 workers
    (no worker process starts: tests/tiers.py would see one); the run trains to the end."""
    import os

    root = tmp_path / "photos"
    for split in ("train", "val"):
        for c, cls in enumerate(("cat", "dog")):
            photos(root / split / cls, 8, seed=c)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    code, out, err = folder_run(root, tmp_path, "data.num_workers=8", "eval.knn_at_end=false")
    assert code == 0, err
    lines = [line for line in out.splitlines() if "data.num_workers=8" in line]
    assert len(lines) == 1 and "1 CPU core less one" in lines[0] and "using 0" in lines[0], out
    assert json.loads((tmp_path / "runs" / "r" / "run.json").read_text())["status"] == "finished"
