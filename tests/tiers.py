"""The test tiers (``make test-fast`` runs ``-m "not spawn and not train"``): a test that starts another process is
marked ``spawn``, one that trains through a Lightning ``Trainer.fit`` is marked ``train``, and each tier has its
own timeout (``TIMEOUTS``, pytest-timeout; a test's own ``@pytest.mark.timeout`` wins).

The marks were taken from a measured run, not by reading the tests: ``SELFSUP_TIERS_RECORD=FILE`` records, per test,
whether it started a process (``subprocess``, ``os.fork``, ``multiprocessing``: DDP workers, the CLI in a new
interpreter, forked kill-and-resume children, DataLoader workers) and whether it called ``Trainer.fit``, beside its
duration. Without it, ``guard`` holds the marks to what the tests do: an unmarked test that starts a process or
trains fails with the mark it needs, so the fast tier cannot quietly grow slow tests.
"""

from __future__ import annotations

import json
import multiprocessing.process
import os
import subprocess
import time

import pytest

TIMEOUTS = {"spawn": 900, "train": 600, None: 300}  # seconds, on 2 shared cores (the slowest measured: see docs)
RECORD = os.environ.get("SELFSUP_TIERS_RECORD")


def tier(item) -> str | None:
    """The item's tier: ``spawn`` before ``train`` (a spawning test may also train), None for the fast tier."""
    for name in ("spawn", "train"):
        if item.get_closest_marker(name) is not None:
            return name
    return None


def add_timeouts(items) -> None:
    """Each item without its own timeout mark gets its tier's."""
    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(TIMEOUTS[tier(item)]))


class Watch:
    """What a test does that decides its tier: a process started, a ``Trainer.fit`` called."""

    def __init__(self, monkeypatch, forbid: tuple[str, ...]):
        self.seen: set[str] = set()
        self.forbid = forbid
        for owner, name, what in ((subprocess.Popen, "__init__", "spawn"), (os, "fork", "spawn"),
                                  (multiprocessing.process.BaseProcess, "start", "spawn")):
            monkeypatch.setattr(owner, name, self.wrap(getattr(owner, name), what))
        import lightning.pytorch as pl

        monkeypatch.setattr(pl.Trainer, "fit", self.wrap(pl.Trainer.fit, "train"))

    def wrap(self, original, what: str):
        def watched(*args, **kwargs):
            self.seen.add(what)
            if what in self.forbid:
                pytest.fail(f"this test {'starts a process' if what == 'spawn' else 'trains (Trainer.fit)'} but is "
                            f"not marked: add @pytest.mark.{what} (tests/tiers.py)", pytrace=False)
            return original(*args, **kwargs)

        return watched


@pytest.fixture(autouse=True)
def guard(request, monkeypatch):
    """Record (``SELFSUP_TIERS_RECORD``) or hold (otherwise) the marks of every test."""
    marked = tier(request.node)
    forbid = () if RECORD or marked == "spawn" else ("spawn", "train") if marked is None else ("spawn",)
    watch = Watch(monkeypatch, forbid)
    start = time.perf_counter()
    yield
    if RECORD:
        with open(RECORD, "a") as f:
            f.write(json.dumps({"test": request.node.nodeid, "seen": sorted(watch.seen), "marked": marked,
                                "seconds": round(time.perf_counter() - start, 3)}) + "\n")


def apply(record: str) -> None:
    """Write the marks a recorded run calls for into the test files: a function any of whose cases started a process
    is marked ``spawn``, else one that trained ``train``; a module whose every test has the same mark gets
    ``pytestmark`` instead. ``python tests/tiers.py RECORD`` (a file of ``SELFSUP_TIERS_RECORD``)."""
    import ast
    import re
    from collections import defaultdict
    from pathlib import Path

    need: dict[str, dict[str, set]] = defaultdict(lambda: defaultdict(set))
    for line in Path(record).read_text().splitlines():
        row = json.loads(line)
        path, name = row["test"].split("::")[:2]
        need[path][re.sub(r"\[.*$", "", name)].update(row["seen"])
    root = Path(__file__).resolve().parents[1]
    for path, tests in need.items():
        file = root / path
        lines = file.read_text().splitlines(keepends=True)
        marks = {t: ("spawn" if "spawn" in seen else "train" if "train" in seen else None) for t, seen in tests.items()}
        tree = ast.parse("".join(lines))
        defs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test")}
        kinds = {marks.get(name) for name in defs}
        at = max((n.end_lineno for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))), default=0)
        if len(kinds) == 1 and None not in kinds:
            (mark,) = kinds
            lines.insert(at, f"\npytestmark = pytest.mark.{mark}  # tests/tiers.py\n")
        else:
            for name, node in sorted(defs.items(), key=lambda kv: -kv[1].lineno):
                if marks.get(name):
                    first = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
                    lines.insert(first, f"@pytest.mark.{marks[name]}\n")
        if not re.search(r"^import pytest$", "".join(lines), re.M) and kinds - {None}:
            lines.insert(at, "import pytest\n")  # after the last import (ruff's isort is off)
        file.write_text("".join(lines))


if __name__ == "__main__":
    import sys

    apply(sys.argv[1])
