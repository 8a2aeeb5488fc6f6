"""Checking a folder of images before a long run: which files would stop it, and what the rest look like.

``check_file`` decodes one file whole and says what it is: ``ok``, or a problem a run would meet (``empty``,
``unreadable``, ``truncated``, ``bomb``: over PIL's decompression-bomb limit, ``too_small``: a shorter side under
the given minimum), with its PIL mode (``CMYK``, ``I;16`` for 16-bit PNGs, ``P`` with transparency, ...), which
training converts to RGB or L. ``check_shard`` does the same for the image members of a tar shard and
names the shard and the byte offset where a truncated or damaged shard stops. ``walk_images`` lists the image
files under a root, following symlinked folders
once and naming a symlink loop instead of following it. ``check_folder`` checks them in parallel threads and
summarises: the bad files by kind, the modes, the files per class folder (the folder holding them, relative to
the root; a leaf folder with no image is listed), and the distribution of the shorter side.
"""

from __future__ import annotations

import io
import os
import statistics
import tarfile
import warnings
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from PIL import Image, UnidentifiedImageError

from selfsup.data.datasets import IMAGE_SUFFIXES  # the files training reads

BAD = ("empty", "unreadable", "truncated", "bomb", "too_small")


@dataclass
class FileCheck:
    path: str
    status: str  # ok or one of BAD
    mode: str = ""
    size: tuple[int, int] | None = None  # (width, height)
    reason: str = ""


def check_file(path: str | Path, min_size: int = 0) -> FileCheck:
    """Open and fully decode ``path``; its status, PIL mode (``P+transparency`` for a palette with a transparent
    colour) and size."""
    path = Path(path)
    try:
        if path.stat().st_size == 0:
            return FileCheck(str(path), "empty", reason="0 bytes")
    except OSError as e:
        return FileCheck(str(path), "unreadable", reason=f"{type(e).__name__}: {e}")
    return check_image(path, str(path), min_size)


def check_image(source, name: str, min_size: int = 0) -> FileCheck:
    """Decode ``source`` (a path or a file object) whole under the name ``name``."""
    mode, size = "", None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(source) as im:
                mode, size = im.mode, im.size
                if mode == "P" and "transparency" in im.info:
                    mode = "P+transparency"
                im.load()
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        return FileCheck(name, "bomb", reason=f"over PIL's decompression-bomb limit of {Image.MAX_IMAGE_PIXELS} "
                                              f"pixels ({e.__class__.__name__})")
    except UnidentifiedImageError:
        return FileCheck(name, "unreadable", reason="not an image PIL can identify")
    except OSError as e:
        kind = "truncated" if "truncated" in str(e).lower() else "unreadable"
        return FileCheck(name, kind, mode, size, reason=f"{type(e).__name__}: {e}")
    except (SyntaxError, ValueError, EOFError) as e:
        return FileCheck(name, "unreadable", reason=f"{type(e).__name__}: {e}")
    if min_size and min(size) < min_size:
        return FileCheck(name, "too_small", mode, size, reason=f"{size[0]}x{size[1]} px, under {min_size}")
    return FileCheck(name, "ok", mode, size)


def check_shard(path: str | Path, min_size: int = 0) -> list[FileCheck]:
    """Every image member of the tar shard ``path`` decoded whole (named ``shard.tar:member``); a shard that ends
    inside a member, or whose header is damaged, gives one ``truncated`` / ``unreadable`` entry naming the shard
    and the byte offset of the member where reading stopped."""
    out, offset = [], 0
    try:
        with tarfile.open(path, "r:*") as tar:
            for member in tar:
                offset = member.offset
                if not member.isfile() or Path(member.name).suffix.lower() not in IMAGE_SUFFIXES:
                    continue
                name = f"{path}:{member.name}"
                data = tar.extractfile(member).read()
                if len(data) < member.size:
                    reason = f"the shard ends in this member (offset {member.offset}, {len(data)}/{member.size} B)"
                    out.append(FileCheck(name, "truncated", reason=reason))
                    break
                out.append(FileCheck(name, "empty", reason="0 bytes") if not data
                           else check_image(io.BytesIO(data), name, min_size))
    except (tarfile.TarError, OSError, EOFError) as e:
        kind = "truncated" if isinstance(e, EOFError) or "unexpected end" in str(e) else "unreadable"
        out.append(FileCheck(f"{path}", kind, reason=f"{type(e).__name__} at the member at byte offset {offset}: {e}"))
    return out


def walk_images(root: str | Path) -> tuple[list[Path], list[str], list[str]]:
    """(image files under ``root`` sorted, leaf folders holding no image (relative), symlink loops found). Symlinked
    folders are followed, each real folder once; a link back to a folder already on the path is a loop."""
    root = Path(root)
    files, empty, loops = [], [], []

    def visit(folder: Path, ancestors: frozenset) -> None:
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as e:
            loops.append(f"{folder}: {type(e).__name__}")
            return
        subdirs, here = [], 0
        for entry in entries:
            if entry.name.startswith("."):
                continue
            if entry.is_dir(follow_symlinks=True):
                real = os.path.realpath(entry.path)
                if real in ancestors:
                    loops.append(f"{entry.path} -> {real}")
                else:
                    subdirs.append((Path(entry.path), ancestors | {real}))
            elif Path(entry.name).suffix.lower() in IMAGE_SUFFIXES:
                files.append(Path(entry.path))
                here += 1
        if not subdirs and not here and folder != root:
            empty.append(str(folder.relative_to(root)))
        for sub, anc in subdirs:
            visit(sub, anc)

    visit(root, frozenset({os.path.realpath(root)}))
    return sorted(files), empty, loops


def class_of(name: str, root: Path) -> str:
    """The folder holding a file, relative to ``root`` (a shard member: its shard's name)."""
    if ".tar:" in name:
        return Path(name.split(".tar:")[0] + ".tar").name
    path = Path(name)
    return str(path.parent.relative_to(root)) if root.is_dir() and path.is_relative_to(root) else path.parent.name


@dataclass
class FolderReport:
    root: str
    files: int
    bad: dict[str, list[FileCheck]] = field(default_factory=dict)
    modes: dict[str, int] = field(default_factory=dict)
    classes: dict[str, int] = field(default_factory=dict)
    empty_folders: list[str] = field(default_factory=list)
    symlink_loops: list[str] = field(default_factory=list)
    shorter_side: dict[str, float] = field(default_factory=dict)

    @property
    def n_bad(self) -> int:
        return sum(len(v) for v in self.bad.values())


def check_folder(root: str | Path, min_size: int = 0, workers: int | None = None,
                 progress: Callable[[int, int], None] | None = None) -> FolderReport:
    """Every image under ``root`` checked by ``check_file`` in ``workers`` threads (PIL decodes outside the GIL)."""
    root = Path(root)
    files, empty, loops = walk_images(root) if root.is_dir() else ([], [], [])
    shards = sorted(root.rglob("*.tar")) if root.is_dir() else [root]
    results: list[FileCheck] = []
    with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
        jobs = [(check_file, f) for f in files] + [(check_shard, t) for t in shards]
        for i, result in enumerate(pool.map(lambda job: job[0](job[1], min_size), jobs), start=1):
            results.extend(result if isinstance(result, list) else [result])
            if progress is not None:
                progress(i, len(jobs))
    report = FolderReport(str(root), len(results), empty_folders=empty, symlink_loops=loops)
    for kind in BAD:
        found = [r for r in results if r.status == kind]
        if found:
            report.bad[kind] = found
    report.modes = dict(Counter(r.mode for r in results if r.mode).most_common())
    report.classes = dict(sorted(Counter(class_of(r.path, root) for r in results).items()))
    sides = sorted(min(r.size) for r in results if r.size)
    if sides:
        q = statistics.quantiles(sides, n=10, method="inclusive") if len(sides) > 1 else [sides[0]] * 9
        report.shorter_side = {"min": sides[0], "p10": q[0], "median": statistics.median(sides), "p90": q[8],
                               "max": sides[-1]}
    return report
