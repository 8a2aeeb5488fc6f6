"""A practitioner's own image folder (issue 62): one without val/ trains to the end and scores its kNN on a seeded
held-out share of train/; a folder too small, or with no readable image, is refused in one line before training."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from ssl_helpers import TINY, run_cli

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
    assert json.loads((run / "run.json").read_text())["status"] == "finished"
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
