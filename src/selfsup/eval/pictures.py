"""Pictures of a representation, pure (features, images or patch tokens in, a PNG out): a 2-D map of the embedding
(UMAP where umap-learn is importable, else scikit-learn's t-SNE; seeded), coloured by label where there are labels;
a grid of each query image's nearest neighbours by cosine similarity; and the first three principal components of a
ViT's patch tokens as RGB over each image (the DINOv2 paper's Fig. 1 and §7.3: one PCA over the patches of all the
images shown, optionally on the foreground only, the patches whose first component passes a threshold).

Drawn with matplotlib's object API (``matplotlib.figure.Figure``, printed by its Agg canvas: pyplot and its global
backend are never touched) and written atomically without a timestamp, so the same inputs give the same bytes.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from matplotlib.figure import Figure
from PIL import Image
from sklearn.decomposition import PCA
from sklearn.manifold import TSNE
from torch import Tensor

from selfsup.diskspace import atomic_write
from selfsup.errors import UserError

try:  # optional: pip install umap-learn (the map falls back to t-SNE)
    import umap
except ImportError:  # pragma: no cover - not installed with dev
    umap = None

MAP_METHODS = ("auto", "umap", "tsne")
MIN_POINTS = 5  # a t-SNE needs its perplexity under the number of points
PCA_DIMS = 50  # the features are reduced to this many dimensions before t-SNE (scikit-learn's TSNE docs advise it)


def save(fig: Figure, path: Path, what: str) -> Path:
    """``fig`` as a PNG at ``path``, atomically, without the metadata that would differ between two runs."""
    path = Path(path)
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=100, metadata={"Software": None}), what)
    return path


def embedding_map(features: Tensor, seed: int = 0, method: str = "auto") -> tuple[np.ndarray, str]:
    """(N, 2) coordinates of the L2-normalised ``features`` and the method in words: UMAP (cosine) where
    ``method`` is umap, or auto with umap-learn importable; else t-SNE (PCA to ``PCA_DIMS`` first, PCA init,
    perplexity min(30, (N − 1) / 3)). Seeded by ``seed``."""
    if method not in MAP_METHODS:
        raise UserError(f"map method {method!r}: choose one of {', '.join(MAP_METHODS)}")
    n = len(features)
    if n < MIN_POINTS:
        raise UserError(f"an embedding map needs at least {MIN_POINTS} images, got {n}")
    x = F.normalize(features.float(), dim=1).numpy().astype(np.float64)
    if method == "umap" or (method == "auto" and umap is not None):
        if umap is None:
            raise UserError("map method umap needs umap-learn: pip install umap-learn, or use tsne")
        reducer = umap.UMAP(n_components=2, n_neighbors=min(15, n - 1), metric="cosine", random_state=seed)
        return np.asarray(reducer.fit_transform(x)), f"UMAP (umap-learn, cosine, seed {seed})"
    if x.shape[1] > PCA_DIMS and n > PCA_DIMS:
        x = PCA(PCA_DIMS, random_state=seed).fit_transform(x)
    perplexity = min(30.0, (n - 1) / 3)
    tsne = TSNE(2, perplexity=perplexity, init="pca", random_state=seed, max_iter=500)
    return tsne.fit_transform(x), f"t-SNE (scikit-learn, perplexity {perplexity:.0f}, seed {seed})"


def draw_map(xy: np.ndarray, labels: Tensor | None, classes: list[str], title: str, path: Path) -> Path:
    """The 2-D map, one dot per image, coloured by label (a legend up to 20 classes) or in one colour."""
    fig = Figure(figsize=(6.4, 6.0))
    ax = fig.add_subplot()
    if labels is None:
        ax.scatter(xy[:, 0], xy[:, 1], s=8, color="tab:blue", alpha=0.7, linewidths=0)
    else:
        lab = labels.numpy()
        cmap = "tab10" if len(classes) <= 10 else "tab20"
        dots = ax.scatter(xy[:, 0], xy[:, 1], c=lab, cmap=cmap, vmin=-0.5, vmax=max(len(classes), 1) - 0.5,
                          s=8, alpha=0.8, linewidths=0)
        if len(classes) <= 20:
            handles = [ax.scatter([], [], color=dots.cmap(dots.norm(i)), s=20) for i in range(len(classes))]
            ax.legend(handles, classes, fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return save(fig, path, "the embedding map")


def query_indices(n: int, queries: int, seed: int = 0) -> Tensor:
    """``queries`` distinct row indices drawn with ``seed``, sorted."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:min(queries, n)].sort().values


def nearest(features: Tensor, queries: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """(indices, cosine similarities), each (Q, k): every query's ``k`` nearest other rows by cosine similarity."""
    z = F.normalize(features.float(), dim=1)
    sims = z[queries] @ z.T
    sims[torch.arange(len(queries)), queries] = -math.inf  # not itself
    top = sims.topk(min(k, len(z) - 1), dim=1)
    return top.indices, top.values


TILE, GAP, BAND, TOP = 96, 4, 14, 22  # a picture's square in pixels, the gap between, its label's band, the title's


def _tile(image: np.ndarray) -> np.ndarray:
    """(H, W, 1 or 3) uint8 → (TILE, TILE, 3) uint8, resized by its nearest pixels."""
    rgb = np.repeat(image, 3, axis=2) if image.shape[2] == 1 else image[:, :, :3]
    return np.asarray(Image.fromarray(np.ascontiguousarray(rgb)).resize((TILE, TILE), Image.NEAREST))


def image_tile(image: Tensor) -> np.ndarray:
    """A uint8 (C, H, W) image as a tile."""
    return _tile(image.permute(1, 2, 0).numpy())


def draw_grid(tiles: list[list[np.ndarray]], labels: list[list[tuple[str, str]]], title: str, path: Path,
              what: str) -> Path:
    """Rows of tiles on white, each labelled above (text, colour), one pixel of the PNG per pixel of the tiles: one
    image on one axes (a grid of axes draws ten times slower)."""
    rows, cols = len(tiles), max(len(r) for r in tiles)
    height, width = TOP + rows * (BAND + TILE + GAP), GAP + cols * (TILE + GAP)
    canvas = np.full((height, width, 3), 255, dtype=np.uint8)
    fig = Figure(figsize=(width / 100, height / 100))
    ax = fig.add_axes((0, 0, 1, 1))
    for i, row in enumerate(tiles):
        for j, tile in enumerate(row):
            y, x = TOP + i * (BAND + TILE + GAP) + BAND, GAP + j * (TILE + GAP)
            canvas[y:y + TILE, x:x + TILE] = tile
            text, colour = labels[i][j]
            ax.text(x, y - 2, text, fontsize=7, color=colour, va="bottom", ha="left")
    ax.imshow(canvas, interpolation="nearest")
    ax.text(width / 2, TOP / 2, title, fontsize=8, ha="center", va="center")
    ax.set_xlim(0, width)
    ax.set_ylim(height, 0)
    ax.axis("off")
    return save(fig, path, what)


def draw_neighbours(query_images: Tensor, neighbour_images: Tensor, sims: Tensor, path: Path,
                    query_labels: Tensor | None = None, neighbour_labels: Tensor | None = None,
                    classes: list[str] | None = None) -> Path:
    """One row per query: the query, then its neighbours left to right, each labelled with its cosine similarity (and
    its class, green where it is the query's, red where not)."""
    q, k = sims.shape
    tiles, labels = [], []
    for i in range(q):
        tiles.append([image_tile(query_images[i])] + [image_tile(neighbour_images[i, j]) for j in range(k)])
        row = [(f"query {classes[query_labels[i]] if query_labels is not None else ''}".strip(), "black")]
        for j in range(k):
            colour, text = "black", f"{sims[i, j].item():.2f}"
            if neighbour_labels is not None:
                same = neighbour_labels[i, j].item() == query_labels[i].item()
                colour, text = ("green" if same else "red"), f"{classes[neighbour_labels[i, j]]} {text}"
            row.append((text, colour))
        labels.append(row)
    return draw_grid(tiles, labels, "nearest neighbours (cosine similarity of the features)", path,
                     "the nearest-neighbour grid")


def _components(x: Tensor, n: int) -> Tensor:
    """The projections of the rows of ``x`` on its first ``n`` principal components (an SVD of the centred rows;
    each component's sign fixed so that its largest loading is positive, as scikit-learn's ``svd_flip``)."""
    centred = x - x.mean(dim=0, keepdim=True)
    _, _, vh = torch.linalg.svd(centred, full_matrices=False)
    vh = vh[:n]
    signs = torch.sign(vh.gather(1, vh.abs().argmax(dim=1, keepdim=True)))
    return centred @ (vh * signs).T


def _unit(x: Tensor) -> Tensor:
    """Each column scaled to [0, 1] over its rows."""
    lo, hi = x.min(dim=0).values, x.max(dim=0).values
    return (x - lo) / (hi - lo).clamp_min(1e-12)


def patch_pca(tokens: Tensor, foreground: float | None = None) -> Tensor:
    """(n, g, g, 3) RGB in [0, 1] of ``tokens`` (n, g·g, D), a ViT's patch tokens: one PCA over the patches of all
    n images, its first three components as red, green and blue, each scaled to [0, 1] over them all.
    ``foreground`` (a fraction): the patches whose first component, scaled to [0, 1], passes it are the foreground;
    the PCA is taken again over them alone and the background drawn black (the DINOv2 paper, §7.3)."""
    n, patches, dim = tokens.shape
    g = math.isqrt(patches)
    if g * g != patches:
        raise UserError(f"patch tokens of {patches} patches are no square grid; the patch picture needs one")
    flat = tokens.reshape(n * patches, dim).double()
    rgb = _unit(_components(flat, 3))
    if foreground is not None:
        keep = rgb[:, 0] > foreground
        rgb = torch.zeros_like(rgb)
        if keep.sum() > 3:
            rgb[keep] = _unit(_components(flat[keep], 3))
    return rgb.reshape(n, g, g, 3).float()


def draw_patch_pca(images: Tensor, rgb: Tensor, path: Path, title: str) -> Path:
    """Each image above its patch picture (the components as RGB, one square per patch)."""
    pca = [_tile((rgb[i].numpy() * 255).round().astype(np.uint8)) for i in range(len(images))]
    tiles = [[image_tile(im) for im in images], pca]
    labels = [[(f"image {i + 1}", "black") for i in range(len(images))], [("PCA 1-3 → RGB", "black")] * len(images)]
    return draw_grid(tiles, labels, title, path, "the patch picture")
