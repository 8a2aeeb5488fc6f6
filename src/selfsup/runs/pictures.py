"""The pictures of an evaluation source's embedding (``eval.pictures``) over a set of images: ``selfsup embed ...
--plot DIR`` draws them over the embedded folder, ``selfsup report`` over a run's test images (``run_pictures``,
written to ``RUN/pictures/``; docs/embed.md, "Pictures").

Each call writes ``embedding_map.png`` (UMAP or t-SNE, by label where there are labels), ``neighbours.png`` (a few
seeded queries and their nearest neighbours by cosine similarity) and, for a ViT, ``patch_pca.png`` (the first three
principal components of its patch tokens as RGB), and ``pictures.json``: each file's caption, the settings and the
source's fingerprint (``run_pictures`` draws again only when one of them changed).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor

from selfsup.data.datasets import UNLABELLED
from selfsup.diskspace import write_text
from selfsup.errors import UserError
from selfsup.eval.pictures import (draw_map, draw_neighbours, draw_patch_pca, embedding_map, nearest, patch_pca,
                                   query_indices)
from selfsup.models.vit import VisionTransformer
from selfsup.runs.embed import CHUNK, Embedded, Embedder, decode_image, embed, list_images
from selfsup.runs.session import EvalSession
from selfsup.runs.source import EvalSource, load_source

PICTURES_DIR = "pictures"  # RUN/pictures/: the report's
RECORD = "pictures.json"


@dataclass(frozen=True)
class PictureSettings:
    """What the pictures are drawn with: the seed (the map, the queries), queries and neighbours, images in the patch
    picture, the map method (auto | umap | tsne), the patch picture's foreground threshold (None: every patch), the
    report's number of test images."""

    seed: int = 0
    queries: int = 6
    neighbours: int = 5
    patch_images: int = 4
    method: str = "auto"
    foreground: float | None = None
    limit: int = 1000


def draw_pictures(source: EvalSource, features: Tensor, images: Callable[[Tensor], Tensor], out_dir: Path,
                  labels: Tensor | None = None, classes: list[str] | None = None,
                  settings: PictureSettings = PictureSettings(), what: str = "") -> dict[str, str]:
    """Draw the pictures of ``features`` (N, D) in ``out_dir``; ``images(rows)`` gives the uint8 (B, C, S, S) images
    of those rows (as the source takes them). Returns {file name: caption}, also written to ``pictures.json``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    s = settings
    classes = classes or ([str(i) for i in range(int(labels.max()) + 1)] if labels is not None else [])
    name = source.meta.get("backbone", "the backbone")
    xy, how = embedding_map(features, s.seed, s.method)
    by = "coloured by label" if labels is not None else "unlabelled"
    captions = {"embedding_map.png": f"the embedding of {len(features)} {what}images, {how}, {by}"}
    draw_map(xy, labels, classes, f"{name}: {len(features)} {what}images, {by}\n{how}", out_dir / "embedding_map.png")
    queries = query_indices(len(features), s.queries, s.seed)
    idx, sims = nearest(features, queries, s.neighbours)
    pics = images(torch.cat([queries, idx.reshape(-1)]))
    q = len(queries)
    draw_neighbours(pics[:q], pics[q:].reshape(q, idx.shape[1], *pics.shape[1:]), sims, out_dir / "neighbours.png",
                    labels[queries] if labels is not None else None, labels[idx] if labels is not None else None,
                    classes)
    captions["neighbours.png"] = f"{q} seeded queries and their {idx.shape[1]} nearest neighbours (cosine)"
    if isinstance(source.backbone, VisionTransformer):
        rows = queries[:s.patch_images]
        shown = images(rows)
        embedder = Embedder(source.backbone.cpu().float(), source.meta["mean"], source.meta["std"], "patch")
        tokens = embedder(shown)[1]
        where = "every patch" if s.foreground is None else f"the foreground (first component > {s.foreground})"
        captions["patch_pca.png"] = f"the first three principal components of the patch tokens as RGB, over {where}"
        draw_patch_pca(shown, patch_pca(tokens, s.foreground), out_dir / "patch_pca.png", f"{name}: patch tokens")
    record = {"captions": captions, "settings": asdict(s), "source": source.fingerprint, "map": how}
    write_text(out_dir / RECORD, json.dumps(record, indent=2), "the pictures' record")
    return captions


def _record(out: Path) -> dict:
    try:
        return json.loads((out / RECORD).read_text())
    except (OSError, ValueError):
        return {}


def folder_pictures(source: EvalSource, root: str, out_dir: Path, settings: PictureSettings = PictureSettings(),
                    device: str | None = None) -> dict[str, str]:
    """The pictures of an unlabelled folder or shards (``embed.list_images``): a seeded ``settings.limit`` of its
    images, decoded as embed decodes them (the unreadable ones left out), their pooled features, no labels."""
    listing = list_images(root)
    size, channels = int(source.meta["image_size"]), int(source.meta.get("in_chans", 3))
    picked = query_indices(len(listing.files), settings.limit, settings.seed).tolist()
    decoded = [d for d in (decode_image(listing, i, size, channels) for i in picked) if isinstance(d, Tensor)]
    if not decoded:
        raise UserError(f"no image of {root} could be read for the pictures")
    images = torch.stack(decoded)
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    embedder = Embedder(source.backbone, source.meta["mean"], source.meta["std"]).to(dev)
    features = torch.cat([embedder(images[k:k + CHUNK])[0].cpu() for k in range(0, len(images), CHUNK)])
    return draw_pictures(source, features, lambda rows: images[rows], out_dir, settings=settings,
                         what="unlabelled ")


def run_pictures(run_dir: str | Path, settings: PictureSettings = PictureSettings(),
                 device: str | None = None) -> dict[str, str] | None:
    """A finished run's pictures over a seeded ``settings.limit`` of its test images (train's where it has no test
    split), through the evaluation's feature cache, or of its own images where its data has no labels
    (``folder_pictures``), in ``RUN/pictures/``; drawn again only when the backbone or the settings changed. None
    (nothing drawn) for a folder without a trained backbone."""
    run_dir = Path(run_dir)
    if not (run_dir / "backbone.safetensors").exists():
        return None
    source = load_source(run_dir)
    out = run_dir / PICTURES_DIR
    done = _record(out)
    if (done.get("source") == source.fingerprint and done.get("settings") == asdict(settings)
            and all((out / name).exists() for name in done.get("captions", {}))):
        return done["captions"]
    data = source.run_cfg.data if source.run_cfg is not None else None
    if data is not None and data.name in UNLABELLED and data.root:
        return folder_pictures(source, data.root, out, settings, device)
    session = EvalSession(run_dir, device=device)
    split = "test"
    try:
        features, labels = session.features(split, limit=settings.limit)
    except UserError:  # an image folder without test/ or val/
        split = "train"
        features, labels = session.features(split, limit=settings.limit)
    dataset = session.split(split, limit=settings.limit)
    labels = labels if bool((labels >= 0).all()) else None
    return draw_pictures(session.source, features.cpu(), lambda rows: dataset.images[rows], out, labels, None,
                         settings, what=f"{split} ")


def embed_pictures(source: EvalSource, done: Embedded, out_dir: str | Path,
                   settings: PictureSettings = PictureSettings()) -> dict[str, str]:
    """``selfsup embed ... --plot DIR``: the pictures of an embed's rows (its features; its folder's labels and class
    names where it is labelled; the images decoded again as the embed decoded them) in ``out_dir``."""
    listing, index = done.listing, done.index
    labels = torch.tensor(listing.labels)[index] if listing.labels is not None else None
    size, channels = int(source.meta["image_size"]), int(source.meta.get("in_chans", 3))

    def images(rows: Tensor) -> Tensor:
        return torch.stack([decode_image(listing, int(index[r]), size, channels) for r in rows.tolist()])

    return draw_pictures(source, done.features.float(), images, Path(out_dir), labels, listing.classes or None,
                         settings)


def embed_with_pictures(source, folder, out, *, plot: str | Path | None = None,
                        plot_settings: PictureSettings = PictureSettings(), **options) -> Embedded:
    """``selfsup embed SOURCE FOLDER --out FILE [--plot DIR]``: ``runs.embed.embed`` (``options``: tokens, half,
    chunk, device), then, with ``plot``, ``embed_pictures`` in that folder (``Embedded.pictures``: their captions)."""
    src = source if isinstance(source, EvalSource) else load_source(source)
    done = embed(src, folder, out, **options)
    if plot is not None:
        done.pictures = embed_pictures(src, done, plot, plot_settings)
    return done
