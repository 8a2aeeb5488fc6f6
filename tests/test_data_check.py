"""``selfsup data check``: every kind of bad or unusual file a real image folder holds, found and named."""

from __future__ import annotations

import io
import json
import os

import numpy as np
from PIL import Image

from selfsup.commands.main import main
from selfsup.data.check import check_file, check_folder, walk_images


def jpeg_bytes(size=(40, 30), mode="RGB") -> bytes:
    buf = io.BytesIO()
    Image.new(mode, size, 128 if mode == "L" else (200, 100, 50)).save(buf, "JPEG")
    return buf.getvalue()


def make_folder(root):
    """train/<class>/ with one file of each kind, a class folder with no image and a symlink loop."""
    cat, dog = (root / "train" / c for c in ("cat", "dog"))
    for d in (cat, dog):
        d.mkdir(parents=True)
    (cat / "ok.jpg").write_bytes(jpeg_bytes())
    Image.new("L", (32, 32), 7).save(cat / "grey.png")
    (cat / "corrupt.jpg").write_bytes(b"this is no jpeg at all" * 10)
    (cat / "empty.jpg").write_bytes(b"")
    (dog / "truncated.jpg").write_bytes(jpeg_bytes((64, 64))[:300])
    Image.new("CMYK", (40, 40), (0, 50, 100, 0)).save(dog / "cmyk.jpg")
    Image.fromarray(np.full((20, 24), 40000, dtype=np.uint16)).save(dog / "sixteen.png")  # 16-bit PNG
    pal = Image.new("P", (24, 24), 1)
    pal.putpalette([0, 0, 0, 255, 0, 0] + [0] * 762)
    pal.save(dog / "palette.png", transparency=0)
    Image.new("RGB", (8, 8)).save(dog / "tiny.png")
    (root / "train" / "fish").mkdir()  # a class folder with no image
    os.symlink(root / "train", cat / "loop")  # points back up: a loop
    return root


def test_each_kind_of_file_is_named(tmp_path):
    root = make_folder(tmp_path)
    status = {p.name: check_file(p, min_size=16) for p in (root / "train").rglob("*.*")}
    assert {n: c.status for n, c in status.items()} == {
        "ok.jpg": "ok", "grey.png": "ok", "corrupt.jpg": "unreadable", "empty.jpg": "empty",
        "truncated.jpg": "truncated", "cmyk.jpg": "ok", "sixteen.png": "ok", "palette.png": "ok",
        "tiny.png": "too_small"}
    assert status["cmyk.jpg"].mode == "CMYK" and status["sixteen.png"].mode.startswith("I")
    assert status["palette.png"].mode == "P+transparency" and status["grey.png"].mode == "L"
    assert status["ok.jpg"].size == (40, 30)


def test_a_decompression_bomb_is_refused_in_one_line(tmp_path, monkeypatch):
    Image.new("L", (100, 100)).save(tmp_path / "big.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # 10,000 pixels: past PIL's limit (and twice it)
    result = check_file(tmp_path / "big.png")
    assert result.status == "bomb" and "1000 pixels" in result.reason and "\n" not in result.reason


def test_the_walk_follows_a_symlinked_folder_once_and_names_a_loop(tmp_path):
    root = make_folder(tmp_path)
    files, empty, loops = walk_images(root)
    assert len(files) == 9 and len(set(files)) == 9  # the loop adds no file twice
    assert empty == ["train/fish"]
    assert len(loops) == 1 and "loop" in loops[0]


def test_the_folder_report_and_the_command(tmp_path, capsys):
    root = make_folder(tmp_path)
    report = check_folder(root, min_size=16, workers=2)
    assert report.files == 9 and report.n_bad == 4
    assert sorted(report.bad) == ["empty", "too_small", "truncated", "unreadable"]
    assert report.classes == {"train/cat": 4, "train/dog": 5}
    assert report.modes["RGB"] >= 1 and "CMYK" in report.modes
    out = tmp_path / "check.json"
    assert main(["data", "check", str(root), "--min-size", "16", "--out", str(out)]) == 2
    text = capsys.readouterr()
    assert "bad files: 4 (empty 1, unreadable 1, truncated 1, too_small 1)" in text.out
    assert "train/dog/truncated.jpg" in text.out and "folders with no image: train/fish" in text.out
    assert "symlink loops" in text.out and "CMYK" in text.out and "checked 9/9 files" in text.err
    assert json.loads(out.read_text())["files"] == 9
    good = tmp_path / "good"
    good.mkdir()
    (good / "a.jpg").write_bytes(jpeg_bytes())
    assert main(["data", "check", str(good)]) == 0
    assert "bad files: none" in capsys.readouterr().out


def test_user_errors_are_one_line(tmp_path, capsys):
    assert main(["data", "check", str(tmp_path / "nothing")]) == 2
    assert "is not a folder" in capsys.readouterr().err
    assert main(["data", "check", str(tmp_path)]) == 2
    assert "no image files under" in capsys.readouterr().err


def test_shards_name_the_bad_member_and_where_a_truncated_shard_stops(tmp_path, capsys):
    from selfsup.data.check import check_shard
    from shard_files import write_shards

    folder = write_shards(tmp_path / "shards", [3, 3], corrupt=(4,))
    good, second = sorted(folder.glob("*.tar"))
    assert [c.status for c in check_shard(good)] == ["ok"] * 3
    assert [c.status for c in check_shard(second)] == ["ok", "unreadable", "ok"]
    assert check_shard(second)[1].path == f"{second}:00004.png"
    import tarfile

    with tarfile.open(second) as tar:
        first = tar.getmembers()[0]
    cut = tmp_path / "cut.tar"
    cut.write_bytes(second.read_bytes()[:first.offset_data + first.size // 2])  # inside the first image
    last = check_shard(cut)[-1]
    assert last.status == "truncated" and "offset" in last.reason and str(cut) in last.path
    assert main(["data", "check", str(folder), "--min-size", "8"]) == 2
    out = capsys.readouterr().out
    assert "6 image files" in out and "shard-000001.tar:00004.png" in out and "symlink" not in out
    assert main(["data", "check", str(good), "--min-size", "8"]) == 0  # one shard alone
