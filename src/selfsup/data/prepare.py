"""``selfsup data shards SRC OUT``: an image folder written as webdataset tar shards, each image re-encoded at a
maximum side (FFCV's ``max_resolution`` idea), so that training decodes fewer pixels per image.

- **Labels and names kept**: ``labels="folders"``: ``SRC/<class>/...`` gives each image its class index (classes
  sorted, as the ``imagefolder`` loader numbers them), images directly under ``SRC`` are unlabelled (-1);
  ``labels="none"``: every image is unlabelled (-1), its folders only a place; ``labels="auto"`` (the default):
  folders when no image sits directly under ``SRC`` (the ImageFolder layout), else none (a folder of one's own
  photos, nested or not). Each sample is
  ``<key>.jpg`` (or ``.png`` where ``--format png``), ``<key>.cls`` (the label) and ``<key>.json`` (the source
  file relative to ``SRC``, its class name, its original size): the members the ``webdataset`` loader reads.
- **Re-encoded at a maximum side**: an image whose longer side exceeds ``max_side`` is decoded at the smallest
  JPEG DCT scale that keeps it above ``max_side`` (``draft``) and resized with a bicubic, antialiased filter; the
  colour modes are converted as training does (CMYK, palettes, 16-bit → RGB, or L with ``channels=1``).
- **Deterministic and resumable**: files are listed in sorted order and shard ``i`` holds files ``i·n …
  (i+1)·n − 1``; a shard is written to a temporary name and renamed when complete, and a rerun skips the shards
  already there, so an interrupted run continues where it stopped and writes the same bytes.
- **Unreadable files** (dangling symlinks included) are left out and listed, each, in ``OUT/skipped.jsonl``;
  ``OUT/shards.json`` records the count, the classes, how the labels were read and the settings.
"""

from __future__ import annotations

import io
import json
import math
import os
import tarfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from selfsup.data.datasets import IMAGE_SUFFIXES
from selfsup.errors import UserError


@dataclass
class ShardReport:
    files: int = 0  # images listed
    written: int = 0  # samples in the shards (this run and earlier ones)
    shards: int = 0
    shards_skipped: int = 0  # already complete from an earlier run
    skipped: list[dict] = field(default_factory=list)  # unreadable files, with the reason
    classes: list[str] = field(default_factory=list)
    labels: str = "folders"  # how the labels were read: folders (SRC/<class>/) or none (every image -1)
    bytes_in: int = 0  # of the source files of the shards written this run
    bytes_out: int = 0  # of those shards


def _image_name(p: Path) -> bool:
    return p.suffix.lower() in IMAGE_SUFFIXES and not p.name.startswith(".")


def listing(src: Path, labels: str = "folders") -> tuple[list[Path], list[int], list[str], list[dict]]:
    """Every image under ``src`` in sorted order, its label (``labels="folders"``: the index of its first-level
    folder among the sorted class folders, -1 directly under ``src``; ``"none"``: -1), the class names, and the
    image-named paths that are no file (a dangling symlink), each with the reason it is left out."""
    folders = sorted(d.name for d in src.iterdir() if d.is_dir() and not d.name.startswith("."))
    classes = folders if labels == "folders" else []
    files, out, dropped = [], [], []
    candidates = [(p, -1) for p in sorted(src.iterdir()) if _image_name(p) and not p.is_dir()]
    for k, name in enumerate(folders):
        candidates += [(p, k if classes else -1) for p in sorted((src / name).rglob("*"))
                       if _image_name(p) and not p.is_dir()]
    for f, label in candidates:
        if f.is_file():
            files.append(f)
            out.append(label)
        else:
            what = "a dangling symlink: its target does not exist" if f.is_symlink() else "not a regular file"
            dropped.append({"path": str(f), "reason": what})
    return files, out, classes, dropped


def resolve_labels(src: Path, labels: str) -> str:
    """``labels="auto"``: ``folders`` when no image sits directly under ``src`` (the ImageFolder layout), else
    ``none``; other values as given."""
    if labels != "auto":
        return labels
    return "none" if any(_image_name(p) for p in src.iterdir()) else "folders"


def reencode(path: Path, max_side: int, quality: int, channels: int, fmt: str) -> tuple[bytes, tuple[int, int]]:
    """The image at ``path`` with its longer side at most ``max_side``, encoded as ``fmt``; its original size."""
    with Image.open(path) as img:
        size = img.size
        mode = "L" if channels == 1 else "RGB"
        if img.format == "JPEG" and max(size) > max_side:  # decode at the smallest DCT scale above max_side
            img.draft(mode, (math.ceil(size[0] * max_side / max(size)), math.ceil(size[1] * max_side / max(size))))
        img = img.convert(mode) if img.mode != mode else img.copy()
    if max(img.size) > max_side:
        scale = max_side / max(img.size)
        img = img.resize((max(1, round(img.size[0] * scale)), max(1, round(img.size[1] * scale))),
                         Image.Resampling.BICUBIC, reducing_gap=None)
    buf = io.BytesIO()
    if fmt == "png":
        img.save(buf, format="PNG")
    else:
        img.save(buf, format="JPEG", quality=quality)
    return buf.getvalue(), size


def _member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), 0, 0o644  # fixed metadata: the same bytes on a rerun
    tar.addfile(info, io.BytesIO(data))


def write_shard(path: Path, items: list[tuple[int, Path, int]], src: Path, classes: list[str], max_side: int,
                quality: int, channels: int, fmt: str) -> tuple[int, list[dict], int]:
    """Shard ``path`` from ``items`` (global index, file, label), written under a temporary name then renamed;
    returns (samples written, the unreadable files, the bytes read)."""
    tmp = path.with_name(path.name + ".tmp")
    written, bad, read = 0, [], 0
    with tarfile.open(tmp, "w", format=tarfile.USTAR_FORMAT) as tar:
        for index, f, label in items:
            try:
                data, size = reencode(f, max_side, quality, channels, fmt)
            except (OSError, UnidentifiedImageError, ValueError, Image.DecompressionBombError) as e:
                bad.append({"path": str(f), "reason": f"{type(e).__name__}: {e}"})
                continue
            read += f.stat().st_size
            key = f"{index:09d}"
            meta = {"file": str(f.relative_to(src)), "class": classes[label] if label >= 0 else None,
                    "size": list(size)}
            _member(tar, f"{key}.{fmt}", data)
            _member(tar, f"{key}.cls", str(label).encode())
            _member(tar, f"{key}.json", json.dumps(meta, sort_keys=True).encode())
            written += 1
    os.replace(tmp, path)
    return written, bad, read


def write_shards(src: str | Path, out: str | Path, max_side: int = 320, quality: int = 90, shard_size: int = 1000,
                 channels: int = 3, fmt: str = "jpg", workers: int | None = None, progress=None,
                 labels: str = "auto") -> ShardReport:
    """Write ``src``'s images as shards ``OUT/shard-000000.tar`` … of ``shard_size`` images each (see the module
    docstring); ``progress(done, total)`` after each shard."""
    src, out = Path(src), Path(out)
    if not src.is_dir():
        raise UserError(f"{src} is not a folder; selfsup data shards reads an image folder (SRC/<class>/*.jpg or "
                        "unlabelled images)")
    if max_side < 16 or not 1 <= quality <= 100 or shard_size < 1 or channels not in (1, 3) or \
            fmt not in ("jpg", "png"):
        raise UserError(f"--max-side {max_side} (>= 16), --quality {quality} (1-100), --shard-size {shard_size} "
                        f"(>= 1), --channels {channels} (1 or 3), --format {fmt} (jpg or png): a value is out of range")
    if labels not in ("auto", "folders", "none"):
        raise UserError(f"--labels {labels} is not one of auto, folders, none")
    how = resolve_labels(src, labels)
    files, labels, classes, dropped = listing(src, how)
    if not files:
        raise UserError(f"no image files under {src} (looked for {', '.join(sorted(IMAGE_SUFFIXES))})")
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*.tar.tmp"):  # what an interrupted run left half-written
        stale.unlink()
    report = ShardReport(files=len(files), classes=classes, labels=how, skipped=list(dropped))
    n = math.ceil(len(files) / shard_size)
    todo, done = [], 0
    for i in range(n):
        path = out / f"shard-{i:06d}.tar"
        lo = i * shard_size
        items = [(j, files[j], labels[j]) for j in range(lo, min(lo + shard_size, len(files)))]
        if path.exists():
            report.shards_skipped += 1
            done += 1
        else:
            todo.append((path, items))
    if progress:
        progress(done, n)
    skipped_log = out / "skipped.jsonl"
    listed = {json.loads(x)["path"] for x in skipped_log.read_text().splitlines()} if skipped_log.exists() else set()
    if any(b["path"] not in listed for b in dropped):  # once, a rerun finding them again
        with skipped_log.open("a") as f:
            f.write("".join(json.dumps(b) + "\n" for b in dropped if b["path"] not in listed))
    with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
        jobs = [pool.submit(write_shard, path, items, src, classes, max_side, quality, channels, fmt)
                for path, items in todo]
        for (path, items), job in zip(todo, jobs):
            written, bad, read = job.result()
            report.bytes_in += read
            report.bytes_out += path.stat().st_size
            report.skipped += bad
            if bad:
                with skipped_log.open("a") as f:
                    f.write("".join(json.dumps(b) + "\n" for b in bad))
            done += 1
            if progress:
                progress(done, n)
    report.shards = n
    report.written = sum(_samples(out / f"shard-{i:06d}.tar") for i in range(n))
    meta = {"samples": report.written, "classes": classes, "labels": how, "max_side": max_side, "quality": quality,
            "channels": channels, "format": fmt, "shard_size": shard_size, "source": str(src)}
    (out / "shards.json").write_text(json.dumps(meta, indent=2))
    return report


def _samples(path: Path) -> int:
    with tarfile.open(path) as tar:
        return sum(1 for m in tar if m.name.endswith(".cls"))


def report_dict(report: ShardReport) -> dict:
    return asdict(report)
