"""A full disk, said in one line: the file system, the space the write needed, and what was kept.

Every file selfsup writes whole (checkpoints, exported weights, results, reports, run facts) goes through
:func:`atomic_write`: a temp file beside the target, fsync, then a rename over the previous file, which stays whole
until then. A write that runs out of space partway (``ENOSPC`` or ``EDQUOT``, raised by Python's ``write`` or
wrapped by torch's ``inline_container.cc`` "unexpected pos" and safetensors' "os error 28") removes its temp file
and raises :class:`DiskFull`: a :class:`~selfsup.errors.UserError`, so the command line prints its one line and
exits 2. Appended logs go through :func:`writing`. Writes selfsup does not make itself (Lightning's CSV logger,
TensorBoard) are recognised by :func:`is_disk_full` where the run stops (``engine``, the command line).
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from selfsup.errors import UserError

FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
FULL_TEXTS = ("No space left on device", "Disk quota exceeded", "os error 28", "os error 122")
TEMP_SUFFIX = ".tmp"


class DiskFull(UserError):
    """A write that found no space: ``path``, ``what`` it was, the bytes it ``needed`` (None: not known)."""

    def __init__(self, path: Path, what: str, needed: int | None, kept: str,
                 fix: str = "free space there or set output_dir to another disk"):
        self.path, self.what, self.needed, self.kept, self.fix = Path(path), what, needed, kept, fix
        need = f"about {size_text(needed)} needed" if needed is not None else "its size not known ahead"
        super().__init__(f"no space left on {file_system(self.path)} writing {what} {self.path} ({need}); {kept}; "
                         f"{fix}")

    def keeping(self, kept: str) -> "DiskFull":
        """The same write, saying ``kept`` (e.g. the run's last checkpoint) in place of the writer's own words."""
        return DiskFull(self.path, self.what, self.needed, kept, self.fix)

    @classmethod
    def of(cls, exc: BaseException, where: Path | None = None) -> "DiskFull":
        """Any write found out of space (:func:`is_disk_full`) as one line: selfsup's own writer's words where it
        made the write, else the file the error names, else ``where`` (the command's output; the working folder)."""
        own = written_by_selfsup(exc)
        if own is not None:
            return own
        named = next((e.filename for e in chain(exc) if getattr(e, "filename", None)), None)
        path = Path(named or where or Path.cwd())
        return cls(path, "output to", None, "the files written before it are kept",
                   "free space there or write to another disk (output_dir=, --out)")


def chain(exc: BaseException | None) -> Iterator[BaseException]:
    """``exc`` and what it was raised from or during (``__cause__``, else ``__context__``), each once."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def is_disk_full(exc: BaseException | None) -> bool:
    """Whether ``exc`` or anything in its chain is a full disk or quota."""
    return any(isinstance(e, DiskFull) or (isinstance(e, OSError) and e.errno in FULL_ERRNOS)
               or any(text in str(e) for text in FULL_TEXTS) for e in chain(exc))


def written_by_selfsup(exc: BaseException | None) -> DiskFull | None:
    """The :class:`DiskFull` in ``exc``'s chain (a write of selfsup's own, which names its file), or None."""
    return next((e for e in chain(exc) if isinstance(e, DiskFull)), None)


def size_text(n: int) -> str:
    """Bytes as a person reads them: 512 B, 6.1 MB, 1.2 GB (powers of 1000, as ``df -H``)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def _mount(path: Path) -> tuple[Path, str]:
    """The mount point holding ``path`` (its nearest existing folder) and that file system's type ('' unknown)."""
    p = Path(os.path.abspath(path))
    while not p.exists() and p != p.parent:
        p = p.parent
    while not os.path.ismount(p) and p != p.parent:
        p = p.parent
    kind = ""
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            fields = line.split()
            if len(fields) > 2 and fields[1] == str(p):
                kind = fields[2]  # the last line of a mount point is the one in effect
    except OSError:
        pass
    return p, kind


def file_system(path: Path) -> str:
    """``the tmpfs file system at /mnt/x (12.0 kB free of 3.1 MB)`` for the file system holding ``path``."""
    mount, kind = _mount(path)
    try:
        usage = shutil.disk_usage(mount)
        room = f" ({size_text(usage.free)} free of {size_text(usage.total)})"
    except OSError:
        room = ""
    return f"the {kind + ' ' if kind else ''}file system at {mount}{room}"


def tensor_bytes(value) -> int:
    """The bytes of every tensor in ``value`` (dicts, lists and tuples walked): what a file of them needs at least."""
    if hasattr(value, "element_size") and hasattr(value, "numel"):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(tensor_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(tensor_bytes(v) for v in value)
    return 0


def open_for_write(path: Path, mode: str = "wb"):
    """The one ``open`` behind this module's writers (a test stands a file system that fills up in its place)."""
    return open(path, mode)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # a file system without directory handles
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: Path, write: Callable, what: str, needed: int | None = None, fsync: bool = True) -> Path:
    """``write(f)`` into a temp file beside ``path``, then rename it over ``path``: a reader sees the old file or
    the new one, never part of one. Out of space: the temp file is removed and :class:`DiskFull` raised."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}{TEMP_SUFFIX}"
    try:
        with open_for_write(tmp, "wb") as f:
            write(f)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except Exception as e:
        if not is_disk_full(e):
            raise
        kept = f"the previous {path.name} is unchanged" if path.exists() else "nothing was written there"
        raise DiskFull(path, what, needed, kept) from None
    finally:
        if tmp.exists():
            tmp.unlink()
    if fsync:
        _fsync_dir(path.parent)
    return path


def write_text(path: Path, text: str, what: str) -> Path:
    """``text`` to ``path`` atomically (UTF-8), as :func:`atomic_write`; results and reports are small, no fsync."""
    data = text.encode()
    return atomic_write(path, lambda f: f.write(data), what, len(data), fsync=False)


@contextmanager
def writing(path: Path, what: str, needed: int | None = None, kept: str | None = None) -> Iterator[None]:
    """Around writes that are not :func:`atomic_write` (an append to a log, a library's figure): out of space,
    :class:`DiskFull` for ``path``; ``kept`` says what stays (default: the lines before it in the log)."""
    try:
        yield
    except Exception as e:
        if not is_disk_full(e) or isinstance(e, DiskFull):
            raise
        raise DiskFull(path, what, needed, kept or f"the lines before it in {Path(path).name} are kept") from None
