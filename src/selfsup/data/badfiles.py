"""The cap on unreadable training files under ``data.on_bad_file=skip`` and the one line each skipped file gets.

The cap is ``max(MIN_BAD_FILES, ⌊data.max_bad_fraction · n⌋)`` of ``n`` files: a folder of a few hundred images may
hold a few bad files (a stray text file named .png, a truncated download) and still train, as a folder of a million
may hold a thousandth of them; past it the run stops in one line. Each skipped file is said once per run: the worker
processes share the run's ``bad_files.jsonl``, so a file another process already logged is not said again.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

MIN_BAD_FILES = 10  # the unreadable files any run may skip, whatever its size (then data.max_bad_fraction of them)

_SAID: set[tuple[str, str]] = set()  # (run folder, file): the files this process said it skipped


def bad_file_cap(n: int, max_fraction: float) -> int:
    """The unreadable files a run of ``n`` files may skip: ``max(MIN_BAD_FILES, ⌊max_fraction · n⌋)``."""
    return max(MIN_BAD_FILES, int(max_fraction * n))


def cap_words(n: int, max_fraction: float) -> str:
    """How the cap of ``n`` files reads in a line: its value and its rule."""
    return (f"at most {bad_file_cap(n, max_fraction)} of {n}: the larger of {MIN_BAD_FILES} and "
            f"data.max_bad_fraction={max_fraction:g} of them")


def too_many_bad_files(paths: list[str], n: int, max_fraction: float) -> str:
    """The one line that stops a run past :func:`bad_file_cap`: the count, the first files, the fixes."""
    return (f"{len(paths)} of {n} images could not be read (first: {', '.join(paths[:3])}), more than the "
            f"{bad_file_cap(n, max_fraction)} that data.on_bad_file=skip allows (the larger of {MIN_BAD_FILES} and "
            f"data.max_bad_fraction={max_fraction:g} of them); list them with `selfsup data check ROOT` and remove or "
            "replace them, or raise data.max_bad_fraction")


def logged_paths(log: Path | None) -> set[str]:
    """The files in the run's skipped-file log (written by any process of the run, in any epoch or session)."""
    if log is None or not Path(log).exists():
        return set()
    paths = set()
    for line in Path(log).read_text().splitlines():
        try:
            paths.add(json.loads(line)["path"])
        except (json.JSONDecodeError, KeyError, TypeError):
            continue
    return paths


def logged(log: Path | None, path: str) -> bool:
    """Whether ``path`` is already in the run's skipped-file log (written by any process of the run)."""
    return path in logged_paths(log)


def say_skipped(path: str, reason: str, stands_in: str, count: int, n: int, max_fraction: float,
                log: Path | None) -> bool:
    """The one line of a skipped file, on stderr, unless this run already said it (in this process: the training
    loader, the instruments' fixed batch and the end-of-run kNN read the same files; or in another: the run's log
    has it); whether ``path`` is still to be written to ``log``."""
    key = (os.environ.get("SELFSUP_RUN_DIR", ""), path)  # the run this process serves (workers inherit it)
    new = not logged(log, path)
    if new and key not in _SAID:
        print(f"selfsup: skipped an unreadable image: {reason.split(' (')[0].removeprefix('corrupt or ')}; "
              f"{stands_in} ({count} skipped, {cap_words(n, max_fraction)})", file=sys.stderr)
    _SAID.add(key)
    return new
