"""``selfsup embed SOURCE FOLDER --out FILE``: one row per image of a folder through an evaluation source's backbone
(docs/embed.md).

Each row holds the image's path relative to the folder, its label where the folder is labelled (every image in a
class folder: ``<class>/`` or ``train|val|test/<class>/``, classes sorted by name as the data module reads them), the
pooled feature (the source's own pooling) and, with ``tokens``, the ViT's class token, mean patch token or
(``patch``) its N×D patch tokens. Images are decoded as evaluation decodes them (shorter side to size / 0.875, the
centre square) and normalised by the source's own mean and std. Webdataset tar shards (a ``.tar`` file, a folder of
them, a glob) are read too: a row per sample with an image, its path ``<shard>:<member>``, its label the samples'
``.cls`` where every sample has one. The format is the suffix of ``out``: ``.parquet``,
``.safetensors`` or ``.npy`` (these two with a ``.csv`` of paths and labels beside).

Resumable: chunks of ``chunk`` images are written to ``<out>.partial/<key>/``, ``key`` the hash of the sorted file
list, the source's weights and the options; a rerun skips the finished chunks, and the file is assembled at the end
from the chunks alone, so a killed and rerun embed ends with the same file. Unreadable images are skipped, each named
in one line as training names them (``data.badfiles``), within training's cap.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import shutil
import sys
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save
from torch import Tensor, nn

from selfsup.config import DataConfig
from selfsup.data.datasets import image_files
from selfsup.data.decode import record_bad_file, resize_center_crop
from selfsup.data.shards import IMAGE_EXTS, LABEL_EXTS, NamedBytes, shard_urls
from selfsup.diskspace import atomic_write
from selfsup.errors import UserError
from selfsup.export import write_safetensors
from selfsup.models.vit import VisionTransformer
from selfsup.runs.source import EvalSource, load_source

try:  # optional: the .parquet format (pip install selfsup[embed])
    import pyarrow as pa
    import pyarrow.parquet as pq
except ImportError:  # pragma: no cover - the extra is installed with dev
    pa = pq = None

FORMATS = (".parquet", ".safetensors", ".npy")
TOKENS = ("cls", "mean", "patch")
SPLITS = ("train", "val", "test")
CHUNK = 256  # images per chunk: the unit of a resumed embed (one forward each)
STOP_ENV = "SELFSUP_EMBED_STOP_AFTER"  # tests: stop (as Ctrl-C) after this many chunks are written
FORMAT_TAG = "selfsup-embed/1"


@dataclass(frozen=True)
class Member:
    """An image inside an uncompressed tar shard: where its bytes lie."""

    shard: Path
    offset: int
    size: int
    name: str


@dataclass
class Listing:
    """The images of a folder (or shards), sorted: ``files`` (paths or ``Member``), ``paths`` relative to ``root``
    (POSIX; ``<shard>:<member>``), and, where every image has a class, ``labels`` (indices into ``classes``)."""

    root: Path
    files: list
    paths: list[str]
    labels: list[int] | None = None
    classes: list[str] = field(default_factory=list)


def class_folder(path: str) -> str | None:
    """The class of a relative image path: ``<class>/...`` or ``train|val|test/<class>/...``; None at the top."""
    parts = path.split("/")
    if parts[0] in SPLITS:
        return parts[1] if len(parts) >= 3 else None
    return parts[0] if len(parts) >= 2 else None


def _shard_samples(path: Path) -> list[tuple[Member, str | None]]:
    """(image member, label text or None) of each sample of an uncompressed tar shard, in tar order (webdataset's
    keys: a member's name up to its basename's first dot)."""
    samples: dict[str, dict] = {}
    try:
        with tarfile.open(path, "r:") as tar:
            for m in tar:
                folder, _, base = m.name.rpartition("/")
                stem, _, ext = base.partition(".")
                key, ext = f"{folder}/{stem}" if folder else stem, ext.lower()
                if m.isreg() and ext in IMAGE_EXTS and "image" not in samples.setdefault(key, {}):
                    samples[key]["image"] = Member(path, m.offset_data, m.size, f"{path.name}:{m.name}")
                elif m.isreg() and ext in LABEL_EXTS:
                    samples.setdefault(key, {})["label"] = tar.extractfile(m).read().decode().strip()
    except (tarfile.TarError, OSError, EOFError, UnicodeDecodeError) as e:
        raise UserError(f"shard {path} is not a readable uncompressed tar file ({type(e).__name__}); selfsup embed "
                        "reads .tar shards (not .tgz): rewrite or remove it") from None
    return [(v["image"], v.get("label")) for v in samples.values() if "image" in v]


def list_shards(location: str) -> Listing:
    """The samples with an image of local tar shards (a ``.tar`` file, a folder of them, a pattern), in shard then
    tar order; labelled by their ``.cls`` integer where every sample has one (class names: the integers)."""
    urls = [location] if Path(location).is_file() else shard_urls(location)
    paths = [Path(u.removeprefix("file:")) for u in urls]
    if any(not p.is_file() for p in paths):
        raise UserError(f"{location}: selfsup embed reads local shard files; copy the shards here first")
    samples = [s for p in paths for s in _shard_samples(p)]
    if not samples:
        raise UserError(f"no sample with an image in the shards of {location}")
    root = paths[0].parent
    files, labels = [m for m, _ in samples], [label for _, label in samples]
    if any(label is None or not label.isdigit() for label in labels):  # the data module's labels: .cls integers
        return Listing(root, files, [m.name for m in files])
    ints = [int(label) for label in labels]
    return Listing(root, files, [m.name for m in files], ints, [str(c) for c in range(max(ints) + 1)])


def is_shards(location: str | Path) -> bool:
    """A tar file, a folder of tar files with no image file beside them, or a pattern."""
    path = Path(location)
    if path.is_file():
        return path.name.endswith(".tar")
    if path.is_dir():
        return any(f.name.endswith(".tar") for f in path.iterdir()) and not image_files(path)
    return any(c in str(location) for c in "*?[{")


def list_images(folder: str | Path) -> Listing:
    """Every image under ``folder`` (``data.datasets.image_files``: any depth, sorted) and its class, if labelled;
    tar shards through ``list_shards``."""
    if is_shards(folder):
        return list_shards(str(folder))
    root = Path(folder)
    if not root.is_dir():
        raise UserError(f"{folder} is not a folder; pass a folder of images (flat, <class>/ or train/<class>/) "
                        "or .tar shards")
    files = image_files(root)
    if not files:
        raise UserError(f"no image files under {folder}; pass a folder of .jpg/.png/... images")
    paths = [f.relative_to(root).as_posix() for f in files]
    names = [class_folder(p) for p in paths]
    if any(n is None for n in names):
        return Listing(root, files, paths)
    classes = sorted(set(names))
    index = {c: i for i, c in enumerate(classes)}
    return Listing(root, files, paths, [index[n] for n in names], classes)


class Embedder(nn.Module):
    """uint8 (B, C, S, S) images → (pooled features, tokens or None): normalised by the source's mean and std, through
    the backbone in eval mode without gradients; ``tokens`` (ViTs): ``cls``, ``mean`` (of the patch tokens) or
    ``patch`` (B, N, D)."""

    def __init__(self, backbone: nn.Module, mean, std, tokens: str | None = None):
        super().__init__()
        self.backbone, self.tokens = backbone.eval(), tokens
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1))

    @torch.inference_mode()
    def forward(self, images: Tensor) -> tuple[Tensor, Tensor | None]:
        x = (images.to(self.mean.device, non_blocking=True).float() / 255 - self.mean) / self.std
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=x.device.type == "cuda"):
            if self.tokens is None:
                return self.backbone(x).float(), None
            vit = self.backbone
            feats = vit.forward_features(x)
            patches = feats[:, vit.prefix:]
            tok = {"cls": feats[:, 0] if vit.prefix else None, "mean": patches.mean(dim=1), "patch": patches}
            return vit.pool_tokens(feats).float(), tok[self.tokens].float()


def check_options(source: EvalSource, out: Path, tokens: str | None) -> None:
    """One line for a format, token kind or backbone that cannot be written."""
    if out.suffix not in FORMATS:
        raise UserError(f"--out {out}: the format is the suffix, one of {', '.join(FORMATS)}; rename it")
    if out.suffix == ".parquet" and pa is None:
        raise UserError("--out *.parquet needs pyarrow: pip install 'selfsup[embed]' (or pyarrow), "
                        "or write .safetensors / .npy")
    if tokens is None:
        return
    if tokens not in TOKENS:
        raise UserError(f"--tokens {tokens}: choose one of {', '.join(TOKENS)}")
    if not isinstance(source.backbone, VisionTransformer):
        raise UserError(f"--tokens applies to ViT backbones; {source.weights} holds a "
                        f"{source.meta.get('backbone', type(source.backbone).__name__)}: leave --tokens out")
    if tokens == "cls" and not source.backbone.prefix:
        raise UserError(f"--tokens cls: {source.weights}'s ViT has no class token; use --tokens mean or patch")


def pooling(backbone: nn.Module) -> str:
    """How the source's feature is pooled, in words (the file's metadata)."""
    if isinstance(backbone, VisionTransformer):
        return {"cls": "class token", "avg": "mean of the patch tokens",
                "global": "mean of the patch tokens, then fc_norm"}[backbone.pool]
    return "the backbone's own (a CNN's global average pool)"


def partial_dir(out: Path, listing: Listing, source: EvalSource, options: dict) -> Path:
    """``<out>.partial/<key>``: ``key`` hashes the sorted file list, the source's weights and the options."""
    raw = json.dumps({"paths": listing.paths, "source": source.fingerprint, **options}, sort_keys=True)
    return out.with_name(out.name + ".partial") / hashlib.sha1(raw.encode()).hexdigest()[:16]


def decode_image(listing: Listing, i: int, size: int, channels: int) -> Tensor | str:
    """Image ``i`` of ``listing`` as uint8 (C, size, size), as evaluation decodes it, or why it cannot be read."""
    f = listing.files[i]
    try:
        if isinstance(f, Member):
            with open(f.shard, "rb") as shard:
                shard.seek(f.offset)
                f = NamedBytes(shard.read(f.size), f.name)
        return resize_center_crop(f, size, None, channels)
    except UserError as e:
        return str(e)
    except OSError as e:  # a file removed or unreadable after listing
        return f"unreadable image file {listing.files[i]} ({type(e).__name__})"


class Progress:
    """Images done of ``total``: one rewritten line on a terminal, else a plain line about every tenth."""

    def __init__(self, total: int, done: int = 0, stream=None):
        self.total, self.done, self.stream = total, done, stream or sys.stdout
        self.start, self.fresh, self.said = time.perf_counter(), 0, -1
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def update(self, n: int) -> None:
        self.done += n
        self.fresh += n
        rate = self.fresh / max(time.perf_counter() - self.start, 1e-9)
        line = f"embed {self.done}/{self.total} images ({100 * self.done // self.total}%), {rate:.0f} images/s"
        if self.tty:
            self.stream.write("\r" + line + ("\n" if self.done >= self.total else ""))
            self.stream.flush()
        elif (tenth := 10 * self.done // self.total) > self.said:
            self.said = tenth
            print(line, file=self.stream, flush=True)


def run_chunks(embedder: Embedder, listing: Listing, folder: Path, size: int, channels: int, chunk: int,
               progress: Progress) -> None:
    """Embed every chunk not yet in ``folder`` (``chunk-<k>.safetensors``: the rows' ``index``, ``features`` and
    ``tokens``, the unreadable files in the metadata), decoding the next chunk while this one runs."""
    n, stop = len(listing.files), int(os.environ.get(STOP_ENV, "0") or 0)
    todo = [k for k in range(0, n, chunk) if not (folder / f"chunk-{k // chunk:06d}.safetensors").exists()]
    bad: dict = {}
    written = 0
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        def submit(k):
            return [pool.submit(decode_image, listing, i, size, channels) for i in range(k, min(k + chunk, n))]

        pending = submit(todo[0]) if todo else []
        for j, k in enumerate(todo):
            decoded = [f.result() for f in pending]
            pending = submit(todo[j + 1]) if j + 1 < len(todo) else []
            good = [i for i, d in enumerate(decoded) if isinstance(d, Tensor)]
            for i, d in enumerate(decoded):
                if isinstance(d, str):
                    record_bad_file(bad, k + i, listing.paths[k + i], d, n, DataConfig.max_bad_fraction, None,
                                    stands_in="it is left out")
            state = {"index": torch.tensor([k + i for i in good], dtype=torch.int64)}
            if good:
                feats, tok = embedder(torch.stack([decoded[i] for i in good]))
                state["features"] = feats.cpu().contiguous()
                if tok is not None:
                    state["tokens"] = tok.cpu().contiguous()
            meta = {"bad": json.dumps({listing.paths[k + i]: d for i, d in enumerate(decoded) if isinstance(d, str)})}
            write_safetensors(state, meta, folder / f"chunk-{k // chunk:06d}.safetensors", "an embed chunk")
            progress.update(len(decoded))
            written += 1
            if stop and written >= stop:
                raise KeyboardInterrupt(f"stopped after {written} chunks ({STOP_ENV})")


def gather(folder: Path, n_chunks: int, half: bool) -> tuple[Tensor, Tensor, Tensor | None]:
    """(row indices, features, tokens or None) of the finished chunks, in order; float16 under ``half``."""
    parts = [load_file(str(folder / f"chunk-{k:06d}.safetensors")) for k in range(n_chunks)]
    parts = [p for p in parts if "features" in p]
    if not parts:
        raise UserError(f"no image under the folder could be read ({n_chunks} chunks); see the skipped files above")
    index = torch.cat([p["index"] for p in parts])
    dtype = torch.float16 if half else torch.float32
    feats = torch.cat([p["features"] for p in parts]).to(dtype)
    tokens = torch.cat([p["tokens"] for p in parts]).to(dtype) if "tokens" in parts[0] else None
    return index, feats, tokens


def _rows_csv(listing: Listing, index: Tensor) -> bytes:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["row", "path"] + (["label", "class"] if listing.labels is not None else []))
    for row, i in enumerate(index.tolist()):
        extra = [listing.labels[i], listing.classes[listing.labels[i]]] if listing.labels is not None else []
        w.writerow([row, listing.paths[i], *extra])
    return out.getvalue().encode()


def _arrow_array(x: Tensor):
    """A (M, ...) tensor as a (nested) fixed-size-list Arrow array of its dtype."""
    values = pa.array(x.numpy().reshape(-1))
    for width in reversed(x.shape[1:]):
        values = pa.FixedSizeListArray.from_arrays(values, width)
    return values


def write_output(out: Path, listing: Listing, index: Tensor, feats: Tensor, tokens: Tensor | None, meta: dict) -> None:
    """The assembled file at ``out`` in its suffix's format (atomically), with its ``.csv`` beside where needed."""
    labels = torch.tensor([listing.labels[i] for i in index.tolist()]) if listing.labels is not None else None
    if out.suffix == ".parquet":
        cols = {"path": pa.array([listing.paths[i] for i in index.tolist()], pa.string())}
        if labels is not None:
            cols["label"] = pa.array(labels.numpy(), pa.int64())
            cols["class"] = pa.array([listing.classes[j] for j in labels.tolist()], pa.string())
        cols["features"] = _arrow_array(feats)
        if tokens is not None:
            cols["tokens"] = _arrow_array(tokens)
        table = pa.table(cols).replace_schema_metadata({"selfsup": json.dumps(meta)})
        atomic_write(out, lambda f: pq.write_table(table, f), "the embeddings")
        return
    atomic_write(out.with_suffix(".csv"), lambda f: f.write(_rows_csv(listing, index)), "the embeddings' paths")
    if out.suffix == ".safetensors":
        state = {"features": feats, **({"tokens": tokens} if tokens is not None else {}),
                 **({"labels": labels} if labels is not None else {})}
        atomic_write(out, lambda f: f.write(save(state, metadata={"selfsup": json.dumps(meta)})), "the embeddings")
        return
    atomic_write(out, lambda f: np.save(f, feats.numpy()), "the embeddings")
    if tokens is not None:
        atomic_write(out.with_suffix(".tokens.npy"), lambda f: np.save(f, tokens.numpy()), "the embeddings' tokens")


@dataclass
class Embedded:
    """What an embed wrote: the file, its rows, the skipped images, the images per second of this call; the rows'
    indices into ``listing`` and their features, for what is drawn of them (``runs.pictures.embed_pictures``)."""

    out: Path
    rows: int
    skipped: int
    images_per_s: float
    seconds: float
    listing: Listing | None = field(default=None, repr=False)
    index: Tensor | None = field(default=None, repr=False)
    features: Tensor | None = field(default=None, repr=False)
    pictures: dict | None = None  # with --plot: the pictures drawn, file → caption


def embed(source: str | Path | EvalSource, folder: str | Path, out: str | Path, *, tokens: str | None = None,
          half: bool = False, chunk: int = CHUNK, device: str | None = None, stream=None) -> Embedded:
    """Embed every image under ``folder`` through ``source`` (anything ``selfsup eval`` accepts) into ``out``."""
    src = source if isinstance(source, EvalSource) else load_source(source)
    out = Path(out)
    check_options(src, out, tokens)
    if chunk < 1:
        raise UserError(f"--chunk {chunk} must be at least 1 image")
    listing = list_images(folder)
    meta = src.meta
    size, channels = int(meta["image_size"]), int(meta.get("in_chans", 3))
    options = {"tokens": tokens, "half": half, "chunk": chunk, "image_size": size}
    work = partial_dir(out, listing, src, options)
    work.mkdir(parents=True, exist_ok=True)
    n_chunks = -(-len(listing.files) // chunk)
    done = sum((work / f"chunk-{k:06d}.safetensors").exists() for k in range(n_chunks))
    progress = Progress(len(listing.files), min(done * chunk, len(listing.files)), stream)
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    embedder = Embedder(src.backbone, meta["mean"], meta["std"], tokens).to(dev)
    run_chunks(embedder, listing, work, size, channels, chunk, progress)
    index, feats, toks = gather(work, n_chunks, half)
    info = {"format": FORMAT_TAG, "source": str(src.weights), "backbone": meta.get("backbone"), "image_size": size,
            "mean": list(meta["mean"]), "std": list(meta["std"]), "pooling": pooling(src.backbone),
            "tokens": tokens, "dtype": str(feats.dtype).removeprefix("torch."), "rows": len(index),
            "classes": listing.classes}
    write_output(out, listing, index, feats, toks, info)
    shutil.rmtree(work)
    if work.parent.exists() and not any(work.parent.iterdir()):
        work.parent.rmdir()
    seconds = time.perf_counter() - progress.start
    rate = progress.fresh / max(seconds, 1e-9)
    return Embedded(out, len(index), len(listing.files) - len(index), rate, seconds, listing, index, feats)
