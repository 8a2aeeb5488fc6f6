"""The embedding's pictures (``selfsup.eval.pictures``, ``selfsup.runs.pictures``): a seeded 2-D map, the nearest
neighbours by cosine and the patch tokens' first three principal components as RGB, each checked against a reference
written here; PNGs written, non-trivial and the same bytes for the same seed, by ``selfsup embed --plot`` and in
``selfsup report``'s Embedding section."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
import torch
from PIL import Image

import selfsup
import test_hub
from selfsup.commands.main import main
from selfsup.errors import UserError
from selfsup.eval.pictures import embedding_map, nearest, patch_pca, query_indices
from selfsup.runs.pictures import PictureSettings
from test_embed import exported, make_images


def assert_picture(path: Path, min_side: int = 200) -> np.ndarray:
    """A PNG of sane size that is not one colour; its pixels."""
    img = np.asarray(Image.open(path).convert("RGB"))
    assert min(img.shape[:2]) >= min_side and max(img.shape[:2]) < 4000, img.shape
    assert len(np.unique(img.reshape(-1, 3), axis=0)) > 20 and img.std() > 10, path
    return img


def unit(x: np.ndarray) -> np.ndarray:
    return (x - x.min(0)) / (x.max(0) - x.min(0))


def test_patch_pca_is_the_first_three_components_of_every_patch_as_rgb():
    tokens = torch.randn(3, 16, 8, generator=torch.Generator().manual_seed(0)) * torch.linspace(3, 0.5, 8)
    rgb = patch_pca(tokens)
    assert rgb.shape == (3, 4, 4, 3) and rgb.min() == 0 and rgb.max() == 1
    # reference: the covariance's top eigenvectors (numpy), each projection scaled to [0, 1], up to its sign
    x = tokens.reshape(48, 8).double().numpy()
    x = x - x.mean(0)
    vals, vecs = np.linalg.eigh(x.T @ x)
    proj = x @ vecs[:, np.argsort(vals)[::-1][:3]]
    got = rgb.reshape(48, 3).double().numpy()
    for c in range(3):
        assert min(np.abs(got[:, c] - unit(proj[:, c])).max(), np.abs(got[:, c] - unit(-proj[:, c])).max()) < 1e-5
    fg = patch_pca(tokens, foreground=0.5)
    back = (got[:, 0] <= 0.5)
    assert back.any() and (~back).any()
    assert torch.all(fg.reshape(48, 3)[torch.from_numpy(back)] == 0)
    with pytest.raises(UserError, match="no square grid"):
        patch_pca(torch.randn(1, 15, 4))


def test_nearest_neighbours_by_cosine_leave_the_query_out():
    feats = torch.randn(40, 6, generator=torch.Generator().manual_seed(1))
    queries = query_indices(40, 5, seed=3)
    assert torch.equal(queries, query_indices(40, 5, seed=3)) and len(set(queries.tolist())) == 5
    idx, sims = nearest(feats, queries, 4)
    z = feats.numpy() / np.linalg.norm(feats.numpy(), axis=1, keepdims=True)
    for row, q in enumerate(queries.tolist()):
        cos = z @ z[q]
        cos[q] = -np.inf
        assert idx[row].tolist() == list(np.argsort(-cos)[:4])
        assert np.allclose(sims[row].numpy(), np.sort(cos)[::-1][:4], atol=1e-6)


def test_the_map_is_seeded():
    feats = torch.randn(30, 12, generator=torch.Generator().manual_seed(2))
    a, how = embedding_map(feats, seed=0, method="tsne")
    b, _ = embedding_map(feats, seed=0, method="tsne")
    assert a.shape == (30, 2) and np.array_equal(a, b) and how.startswith("t-SNE")  # PCA-initialised: the same
    assert np.isfinite(a).all() and a.std(axis=0).min() > 0.1
    with pytest.raises(UserError, match="at least 5 images"):
        embedding_map(feats[:4])


def test_embed_plot_draws_the_three_pictures_the_same_for_the_same_seed(tmp_path, capsys):
    root = tmp_path / "images"
    make_images(root, 30)
    src = exported(tmp_path, "vit_micro", image_size=12, patch_size=4)
    assert main(["embed", str(src), str(root), "--out", str(tmp_path / "a.parquet"), "--plot", str(tmp_path / "a"),
                 "--map", "tsne"]) == 0
    assert "pictures →" in capsys.readouterr().out
    done = selfsup.embed(src, root, tmp_path / "b.parquet", plot=tmp_path / "b",  # from Python: the same bytes
                         plot_settings=PictureSettings(method="tsne"))
    assert done.rows == 30 and set(done.pictures) == {"embedding_map.png", "neighbours.png", "patch_pca.png"}
    record = json.loads((tmp_path / "a" / "pictures.json").read_text())
    assert set(record["captions"]) == {"embedding_map.png", "neighbours.png", "patch_pca.png"}
    assert "coloured by label" in record["captions"]["embedding_map.png"] and record["settings"]["seed"] == 0
    for name in record["captions"]:
        assert_picture(tmp_path / "a" / name)
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    flat = tmp_path / "flat"  # unlabelled: one colour, no classes; a CNN: no patch picture
    make_images(flat, 12, classes=())
    cnn = exported(tmp_path, "bn_cnn_tiny")
    assert main(["embed", str(cnn), str(flat), "--out", str(tmp_path / "c.npy"), "--plot", str(tmp_path / "c"),
                 "--seed", "1"]) == 0
    assert sorted(p.name for p in (tmp_path / "c").glob("*.png")) == ["embedding_map.png", "neighbours.png"]
    record = json.loads((tmp_path / "c" / "pictures.json").read_text())
    assert "unlabelled" in record["captions"]["embedding_map.png"] and record["settings"]["seed"] == 1
    assert_picture(tmp_path / "c" / "neighbours.png")


class FakeUMAP:
    """umap-learn's reducer as the map calls it: what it was given, a fixed projection."""

    seen: dict = {}

    def __init__(self, **kwargs):
        FakeUMAP.seen = kwargs

    def fit_transform(self, x):
        return x[:, :2] * 10


def test_the_map_is_umaps_where_umap_learn_is_importable(monkeypatch):
    import selfsup.eval.pictures as pictures

    feats = torch.randn(12, 4, generator=torch.Generator().manual_seed(3))
    monkeypatch.setattr(pictures, "umap", None)
    with pytest.raises(UserError, match="needs umap-learn"):
        embedding_map(feats, method="umap")
    assert embedding_map(feats)[1].startswith("t-SNE")
    monkeypatch.setattr(pictures, "umap", type("umap", (), {"UMAP": FakeUMAP}))
    xy, how = embedding_map(feats, seed=5)
    z = feats / feats.norm(dim=1, keepdim=True)
    assert how.startswith("UMAP") and np.allclose(xy, z[:, :2].numpy() * 10)
    assert FakeUMAP.seen == {"n_components": 2, "n_neighbors": 11, "metric": "cosine", "random_state": 5}
    assert embedding_map(feats, method="tsne")[1].startswith("t-SNE")


def write_metrics(run: Path) -> None:
    with (run / "metrics.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["epoch", "step", "train/loss"])
        w.writeheader()
        for step in range(0, 20, 2):
            w.writerow({"epoch": step // 10, "step": step, "train/loss": 5 * math.exp(-step / 10)})


def test_the_report_shows_the_runs_embedding_pictures(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(test_hub.CASES, "digits_vit", ("vit_micro", dict(in_chans=1, image_size=8, patch_size=2)))
    run, _ = test_hub.fake_run(tmp_path, "digits_vit")
    write_metrics(run)
    assert main(["report", str(run)]) == 0
    pictures = {p.name: p.stat().st_mtime_ns for p in (run / "pictures").glob("*.png")}
    assert set(pictures) == {"embedding_map.png", "neighbours.png", "patch_pca.png"}
    for name in pictures:
        assert_picture(run / "pictures" / name)
    md = (run / "report" / "report.md").read_text()
    assert "## Embedding" in md and "../pictures/embedding_map.png" in md and "359 test images" in md
    html = (run / "report" / "report.html").read_text()
    assert html.count("data:image/png;base64") >= 4 and "id='embedding'" in html
    assert main(["report", str(run)]) == 0  # the same backbone and settings: not drawn again
    assert {p.name: p.stat().st_mtime_ns for p in (run / "pictures").glob("*.png")} == pictures
    other = tmp_path / "other"
    other.mkdir()
    write_metrics(other)
    (other / "backbone.safetensors").write_bytes((run / "backbone.safetensors").read_bytes())  # no config: no data
    capsys.readouterr()
    assert main(["report", str(other), "--no-pictures"]) == 0 and not (other / "pictures").exists()


def test_an_unlabelled_runs_report_draws_its_own_images_in_one_colour(tmp_path, monkeypatch):
    monkeypatch.setitem(test_hub.CASES, "folder_vit", ("vit_micro", dict(in_chans=3, image_size=12, patch_size=4)))
    run, _ = test_hub.fake_run(tmp_path, "folder_vit")
    folder = tmp_path / "photos"
    make_images(folder, 14, classes=())
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["data"].update(name="images", root=str(folder))
    (run / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    write_metrics(run)
    assert main(["report", str(run)]) == 0
    record = json.loads((run / "pictures" / "pictures.json").read_text())
    assert record["captions"]["embedding_map.png"].startswith("the embedding of 14 unlabelled images")
    assert "unlabelled" in record["captions"]["embedding_map.png"] and len(record["captions"]) == 3
    for name in record["captions"]:
        assert_picture(run / "pictures" / name)
    assert "## Embedding" in (run / "report" / "report.md").read_text()
