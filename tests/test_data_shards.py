"""``selfsup data shards SRC OUT``: labels, names and sizes kept; images re-encoded at the maximum side; unreadable
files left out and listed; resumable with the same bytes; and the shards train as data.name=webdataset."""

from __future__ import annotations

import io
import json
import tarfile

import numpy as np
import pytest
from PIL import Image

from selfsup.data.prepare import write_shards
from ssl_helpers import assert_user_error, run_cli


@pytest.fixture
def src(tmp_path):
    g = np.random.default_rng(0)
    root = tmp_path / "src"
    for c in ("cat", "dog"):
        (root / c / "sub").mkdir(parents=True)
        for i in range(6):
            Image.fromarray(g.integers(0, 255, (300 + 10 * i, 500, 3), dtype=np.uint8)).save(
                root / c / ("sub" if i == 5 else "") / f"{i}.jpg", quality=90)
    Image.new("CMYK", (400, 200), (0, 50, 100, 0)).save(root / "cat" / "cmyk.jpg")
    Image.new("P", (90, 60)).save(root / "dog" / "palette.png")
    (root / "dog" / "broken.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    Image.new("RGB", (40, 30)).save(root / "unlabelled.png")
    return root


def members(path):
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar}


def test_shards_keep_labels_and_names_and_cap_the_side(src, tmp_path):
    out = tmp_path / "out"
    code, stdout, err = run_cli("data", "shards", src, out, "--shard-size", "4", "--max-side", "128",
                                "--labels", "folders")  # an image directly under SRC: auto would read none
    assert code == 0, err
    assert "15 images in 4 shards" in stdout and f"left out: {src / 'dog' / 'broken.jpg'}" in stdout
    assert "labels: 2 classes, the first-level folders" in stdout
    meta = json.loads((out / "shards.json").read_text())
    assert meta["samples"] == 15 and meta["classes"] == ["cat", "dog"]
    samples = {}
    for shard in sorted(out.glob("shard-*.tar")):
        for name, data in members(shard).items():
            key, ext = name.split(".", 1)
            samples.setdefault(key, {})[ext] = data
    assert len(samples) == 15
    by_file = {json.loads(s["json"])["file"]: s for s in samples.values()}
    assert int(by_file["unlabelled.png"]["cls"]) == -1
    assert int(by_file["cat/sub/5.jpg"]["cls"]) == 0 and int(by_file["dog/palette.png"]["cls"]) == 1
    assert json.loads(by_file["cat/3.jpg"]["json"])["size"] == [500, 330]
    for s in samples.values():
        img = Image.open(io.BytesIO(s["jpg"]))
        assert img.format == "JPEG" and img.mode == "RGB" and max(img.size) <= 128
    small = Image.open(io.BytesIO(by_file["unlabelled.png"]["jpg"]))
    assert small.size == (40, 30)  # smaller images keep their size
    assert [json.loads(x)["path"] for x in (out / "skipped.jsonl").read_text().splitlines()] == [
        str(src / "dog" / "broken.jpg")]


def test_an_unlabelled_folder_stays_unlabelled_and_every_file_left_out_is_listed(tmp_path):
    """Issue 49: a folder of one's own photos, nested, with loose images at its top: its subfolders are no classes
    (--labels auto), and a dangling symlink is listed with the unreadable files, each on its own line."""
    root = tmp_path / "photos"
    for folder in ("2019", "2020/summer"):
        (root / folder).mkdir(parents=True)
        Image.new("RGB", (40, 30)).save(root / folder / "a.png")
    Image.new("RGB", (40, 30)).save(root / "top.png")
    (root / "2019" / "gone.jpg").symlink_to(tmp_path / "nowhere.jpg")
    (root / "2019" / "text.png").write_text("not an image")
    out = tmp_path / "out"
    code, stdout, err = run_cli("data", "shards", root, out)
    assert code == 0, err
    assert "labels: none, every image unlabelled" in stdout
    meta = json.loads((out / "shards.json").read_text())
    assert meta["classes"] == [] and meta["labels"] == "none" and meta["samples"] == 3
    labels = [int(data) for name, data in members(out / "shard-000000.tar").items() if name.endswith(".cls")]
    assert labels == [-1, -1, -1]
    left = [line for line in stdout.splitlines() if line.startswith("left out: ")]
    assert sorted(left) == [f"left out: {root / '2019' / 'gone.jpg'} (a dangling symlink: its target does not exist)",
                            *[x for x in left if "text.png" in x]] and len(left) == 2
    logged = [json.loads(x)["path"] for x in (out / "skipped.jsonl").read_text().splitlines()]
    assert sorted(logged) == sorted([str(root / "2019" / "gone.jpg"), str(root / "2019" / "text.png")])
    write_shards(root, out)  # a rerun: the shard is there, the log holds each file once
    assert len((out / "skipped.jsonl").read_text().splitlines()) == 2
    labelled = write_shards(root, tmp_path / "out2", labels="folders")
    assert labelled.classes == ["2019", "2020"] and labelled.labels == "folders"


def test_shards_resume_with_the_same_bytes(src, tmp_path):
    out = tmp_path / "out"
    write_shards(src, out, max_side=96, shard_size=4)
    first = {p.name: p.read_bytes() for p in out.glob("shard-*.tar")}
    (out / "shard-000001.tar").unlink()
    (out / "shard-000002.tar.tmp").write_bytes(b"half")  # an interrupted write
    report = write_shards(src, out, max_side=96, shard_size=4)
    assert report.shards_skipped == 3 and not list(out.glob("*.tmp"))
    assert {p.name: p.read_bytes() for p in out.glob("shard-*.tar")} == first


def test_the_shards_train_as_webdataset(src, tmp_path):
    from selfsup.config import DataConfig
    from selfsup.data.datasets import load_dataset

    out = tmp_path / "out"
    write_shards(src, out, max_side=64, shard_size=4)
    train = load_dataset(DataConfig(name="webdataset", root=str(out), image_size=32), "train")
    assert len(train) == 15


def test_user_errors(tmp_path):
    code, _, err = run_cli("data", "shards", tmp_path / "nope", tmp_path / "out")
    assert_user_error(code, err, "is not a folder")
    (tmp_path / "empty").mkdir()
    code, _, err = run_cli("data", "shards", tmp_path / "empty", tmp_path / "out")
    assert_user_error(code, err, "no image files")
    code, _, err = run_cli("data", "shards", tmp_path / "empty", tmp_path / "out", "--quality", "0")
    assert_user_error(code, err, "--quality 0")
