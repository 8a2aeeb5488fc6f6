"""``selfsup embed`` (``selfsup.runs.embed``): one row per image with its path and label, in Parquet, safetensors and
.npy; tar shards; a run stopped after k chunks and rerun ends with the same file; unreadable images skipped and
named."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image
from safetensors import safe_open
from safetensors.torch import load_file

import selfsup
from shard_files import write_shards
from selfsup.commands.main import main
from selfsup.data.decode import resize_center_crop
from selfsup.errors import UserError
from selfsup.export import export_backbone, load_exported
from selfsup.models.backbones import build_backbone
from selfsup.runs.embed import STOP_ENV, Progress, class_folder, embed, list_images


def make_images(root: Path, n: int, classes: tuple[str, ...] = ("ant", "bee", "cat"), split: str | None = "train",
                seed: int = 0) -> list[str]:
    """``n`` small PNGs of varied sizes spread over ``classes`` (under ``split``/, or flat without classes)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        folder = root if not classes else (root / split if split else root) / classes[i % len(classes)]
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"img{i:04d}.png"
        Image.fromarray(rng.integers(0, 256, (12 + i % 5, 14, 3), dtype=np.uint8)).save(path)
        out.append(path.relative_to(root).as_posix())
    return out


def exported(tmp_path: Path, name: str = "bn_cnn_tiny", **kwargs) -> Path:
    kwargs = {"in_chans": 3, "image_size": 12, **kwargs}
    torch.manual_seed(0)
    backbone = build_backbone(name, **kwargs)
    meta = {"backbone": name, "kwargs": kwargs, "image_size": kwargs["image_size"], "in_chans": 3,
            "mean": [0.5, 0.4, 0.3], "std": [0.2, 0.25, 0.3]}
    return export_backbone(backbone.eval(), tmp_path / f"{name}.safetensors", meta)


@pytest.fixture(scope="module")
def folder300(tmp_path_factory):
    root = tmp_path_factory.mktemp("images300")
    return root, make_images(root, 300)


def test_class_folders_are_read_as_the_data_module_reads_them(tmp_path):
    assert class_folder("train/cat/x.png") == "cat" and class_folder("cat/a/x.png") == "cat"
    assert class_folder("x.png") is None and class_folder("val/x.png") is None
    make_images(tmp_path / "flat", 4, classes=())
    assert list_images(tmp_path / "flat").labels is None
    make_images(tmp_path / "lab", 6, split=None)
    listing = list_images(tmp_path / "lab")
    assert listing.classes == ["ant", "bee", "cat"] and listing.labels == [0, 0, 1, 1, 2, 2]  # sorted paths


def test_300_images_in_parquet_and_safetensors(tmp_path, folder300):
    root, paths = folder300
    source = exported(tmp_path)
    done = embed(source, root, tmp_path / "e.parquet", chunk=128)
    table = pq.read_table(tmp_path / "e.parquet")
    assert done.rows == table.num_rows == 300 and done.images_per_s > 0
    assert table.column("path").to_pylist() == sorted(paths)
    classes = ["ant", "bee", "cat"]
    assert [classes[j] for j in table.column("label").to_pylist()] == table.column("class").to_pylist()
    assert table.column("class").to_pylist() == [p.split("/")[1] for p in sorted(paths)]
    feats = np.stack(table.column("features").to_numpy(zero_copy_only=False))
    assert feats.shape == (300, 64) and feats.dtype == np.float32
    embed(source, root, tmp_path / "e.safetensors", chunk=128)
    state = load_file(str(tmp_path / "e.safetensors"))
    assert torch.equal(state["features"], torch.from_numpy(feats))
    assert state["labels"].tolist() == table.column("label").to_pylist()
    rows = (tmp_path / "e.csv").read_text().splitlines()
    assert rows[0] == "row,path,label,class" and len(rows) == 301 and rows[1].split(",")[1] == sorted(paths)[0]
    assert not (tmp_path / "e.parquet.partial").exists() and not (tmp_path / "e.safetensors.partial").exists()


def test_the_features_are_the_backbones_on_the_evaluation_crop(tmp_path):
    make_images(tmp_path / "img", 5)
    source = exported(tmp_path)
    embed(source, tmp_path / "img", tmp_path / "e.npy", chunk=2)
    feats = np.load(tmp_path / "e.npy")
    backbone, meta = load_exported(source)
    first = sorted((tmp_path / "img").rglob("*.png"))[0]
    x = resize_center_crop(first, 12).float()[None] / 255
    x = (x - torch.tensor(meta["mean"]).view(1, 3, 1, 1)) / torch.tensor(meta["std"]).view(1, 3, 1, 1)
    with torch.no_grad():
        want = backbone.eval()(x)[0].numpy()
    np.testing.assert_allclose(feats[0], want, rtol=1e-5, atol=1e-6)
    assert (tmp_path / "e.csv").read_text().splitlines()[1] == "0,train/ant/img0000.png,0,ant"


@pytest.mark.parametrize("suffix", [".parquet", ".safetensors"])
def test_a_run_stopped_after_k_chunks_and_rerun_ends_with_the_same_file(tmp_path, folder300, monkeypatch, suffix):
    root, _ = folder300
    source = exported(tmp_path)
    whole = embed(source, root, tmp_path / f"whole{suffix}", chunk=32).out
    k = random.Random(suffix).randint(1, 8)  # 10 chunks of 32
    monkeypatch.setenv(STOP_ENV, str(k))
    out = tmp_path / f"stopped{suffix}"
    with pytest.raises(KeyboardInterrupt):
        embed(source, root, out, chunk=32)
    partial = next((tmp_path / f"stopped{suffix}.partial").iterdir())
    assert len(list(partial.glob("chunk-*.safetensors"))) == k and not out.exists()
    monkeypatch.setenv(STOP_ENV, "100")
    done = embed(source, root, out, chunk=32)
    assert done.rows == 300
    assert out.read_bytes() == whole.read_bytes()  # byte-identical
    if suffix == ".safetensors":
        assert (tmp_path / "stopped.csv").read_bytes() == (tmp_path / "whole.csv").read_bytes()


@pytest.mark.spawn
def test_the_command_killed_at_a_random_chunk_and_rerun_ends_with_the_same_file(tmp_path, folder300):
    """SIGKILL of ``selfsup embed`` once a random number of its chunks are on disk (mid-write, maybe), then the same
    command again: the file is byte-identical to an embed that was never stopped."""
    root, _ = folder300
    source = exported(tmp_path)
    whole = embed(source, root, tmp_path / "whole.parquet", chunk=2).out
    out = tmp_path / "killed.parquet"
    command = [sys.executable, "-m", "selfsup", "embed", str(source), str(root), "--out", str(out), "--chunk", "2"]
    env = {**os.environ, "PYTHONPATH": str(Path(selfsup.__file__).parents[1]), "OMP_NUM_THREADS": "1"}
    k = random.Random(7).randint(3, 60)
    child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    while child.poll() is None and time.monotonic() < deadline:
        if len(list(tmp_path.glob("killed.parquet.partial/*/chunk-*.safetensors"))) >= k:
            child.send_signal(signal.SIGKILL)
            break
        time.sleep(0.01)
    assert child.wait(timeout=60) == -signal.SIGKILL, child.stderr.read().decode()[-2000:]
    assert not out.exists()
    rerun = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert "embed: 300 rows" in rerun.stdout
    first = int(rerun.stdout.split()[1].split("/")[0])  # "embed 2k+2/300 images": the finished chunks skipped
    assert first >= 2 * k + 2, rerun.stdout[:200]
    assert out.read_bytes() == whole.read_bytes()


def test_another_source_or_option_does_not_reuse_the_chunks(tmp_path, monkeypatch):
    make_images(tmp_path / "img", 6)
    monkeypatch.setenv(STOP_ENV, "1")
    with pytest.raises(KeyboardInterrupt):
        embed(exported(tmp_path), tmp_path / "img", tmp_path / "e.safetensors", chunk=2)
    with pytest.raises(KeyboardInterrupt):
        embed(exported(tmp_path), tmp_path / "img", tmp_path / "e.safetensors", chunk=2, half=True)
    assert len(list((tmp_path / "e.safetensors.partial").iterdir())) == 2  # one folder per key


def test_vit_tokens_half_and_an_unlabelled_folder_with_a_bad_file(tmp_path, capsys):
    make_images(tmp_path / "flat", 7, classes=())
    (tmp_path / "flat" / "broken.png").write_text("not a png")
    source = exported(tmp_path, "vit_nano", image_size=16, patch_size=4, registers=2)
    done = embed(source, tmp_path / "flat", tmp_path / "t.safetensors", tokens="patch", half=True, chunk=3)
    err = capsys.readouterr().err
    assert done.rows == 7 and done.skipped == 1
    assert "selfsup: skipped an unreadable image: unreadable image file" in err and "broken.png" in err
    with safe_open(str(tmp_path / "t.safetensors"), "pt") as f:
        assert set(f.keys()) == {"features", "tokens"}  # no labels: the folder is flat
        assert f.get_slice("tokens").get_shape() == [7, 16, 32] and f.get_tensor("features").dtype == torch.float16
    assert "broken.png" not in (tmp_path / "t.csv").read_text()
    embed(source, tmp_path / "flat", tmp_path / "c.parquet", tokens="cls")
    table = pq.read_table(tmp_path / "c.parquet")
    assert "label" not in table.column_names and len(table.column("tokens")[0]) == 32


def test_tar_shards_give_a_row_per_sample_with_its_cls_label(tmp_path, capsys):
    shards = write_shards(tmp_path / "shards", [5, 4], corrupt=(2,))
    source = exported(tmp_path)
    done = embed(source, shards, tmp_path / "s.parquet", chunk=4)
    table = pq.read_table(tmp_path / "s.parquet")
    assert done.rows == 8 and done.skipped == 1 and "shard-000000.tar:00002.png" in capsys.readouterr().err
    assert table.column("path").to_pylist()[:2] == ["shard-000000.tar:00000.png", "shard-000000.tar:00001.png"]
    assert table.column("label").to_pylist() == [0, 1, 3, 4, 5, 6, 7, 8]  # the .cls of each sample
    one = embed(source, shards / "shard-000001.tar", tmp_path / "one.safetensors")
    assert one.rows == 4
    feats = load_file(str(tmp_path / "one.safetensors"))["features"]
    whole = np.stack(table.column("features").to_numpy(zero_copy_only=False)[4:])
    torch.testing.assert_close(feats, torch.from_numpy(whole), rtol=1e-5, atol=1e-6)  # other batches: not bitwise


def test_refusals_are_one_line(tmp_path):
    make_images(tmp_path / "img", 2)
    source = exported(tmp_path)
    with pytest.raises(UserError, match="suffix, one of .parquet, .safetensors, .npy"):
        embed(source, tmp_path / "img", tmp_path / "e.csv")
    with pytest.raises(UserError, match="--tokens applies to ViT backbones"):
        embed(source, tmp_path / "img", tmp_path / "e.npy", tokens="patch")
    with pytest.raises(UserError, match="no image files under"):
        (tmp_path / "empty").mkdir()
        embed(source, tmp_path / "empty", tmp_path / "e.npy")


def test_progress_is_plain_lines_off_a_terminal(capsys):
    bar = Progress(100)
    for _ in range(20):
        bar.update(5)
    lines = capsys.readouterr().out.splitlines()
    assert 10 <= len(lines) <= 11 and lines[-1].startswith("embed 100/100 images (100%)") and "\r" not in lines[-1]


def test_the_command_and_the_api(tmp_path, capsys):
    make_images(tmp_path / "img", 9)
    source = exported(tmp_path)
    assert main(["embed", str(source), str(tmp_path / "img"), "--out", str(tmp_path / "e.parquet")]) == 0
    assert "embed: 9 rows" in capsys.readouterr().out
    assert main(["embed", str(source), str(tmp_path / "img"), "--out", str(tmp_path / "e.txt")]) == 2
    assert "selfsup: error: --out" in capsys.readouterr().err
    done = selfsup.embed(source, tmp_path / "img", tmp_path / "api.parquet")
    assert pq.read_table(done.out).equals(pq.read_table(tmp_path / "e.parquet"))
