"""The test tiers (``make test-fast`` runs ``-m "not spawn and not train"``): a test that starts another process is
marked ``spawn``, one that trains through a Lightning ``Trainer.fit`` is marked ``train``, and each tier has its
own timeout (``TIMEOUTS``, pytest-timeout; a test's own ``@pytest.mark.timeout`` wins).

The marks were taken from a measured run, not by reading the tests: ``SELFSUP_TIERS_RECORD=FILE`` records, per test,
whether it started a process (``subprocess``, ``os.fork``, ``multiprocessing``: DDP workers, the CLI in a new
interpreter, forked kill-and-resume children, DataLoader workers; a system probe such as ``uname`` does not count) and
whether it called ``Trainer.fit``, over its setup, call and teardown (a shared fixture's work counts for every test
that uses it), beside its duration; ``python tests/tiers.py FILE`` writes the marks. Without it,
``pytest_runtest_protocol`` holds the marks to what the tests do: an unmarked test that starts a process or trains
fails with the mark it needs, so the fast tier cannot quietly grow slow tests.
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


PROBES = {"uname", "lscpu", "git", "nvidia-smi", "ldconfig", "nproc", "getconf"}  # cached one-line answers


def probe(cmd) -> bool:
    """Whether a ``subprocess`` command line is a system probe: asked once per process by whichever test comes
    first (``platform.processor()`` runs ``uname -p``), so it cannot decide a test's tier."""
    first = cmd if isinstance(cmd, (str, bytes, os.PathLike)) else (cmd[0] if cmd else "")
    return os.path.basename(os.fsdecode(first).split()[0] if first else "") in PROBES


class Watch:
    """What a test does that decides its tier, in its whole run (its fixtures' setup too: a module's fixture that
    starts a process counts for the test that sets it up): a process started, a ``Trainer.fit`` called."""

    def __init__(self, forbid: tuple[str, ...]):
        import lightning.pytorch as pl

        self.seen: set[str] = set()
        self.shared: dict[str, set[str]] = {}  # a module / session fixture's name -> what its setup did
        self.forbid = forbid
        self.patched = [(subprocess.Popen, "__init__", "spawn"), (os, "fork", "spawn"),
                        (multiprocessing.process.BaseProcess, "start", "spawn"), (pl.Trainer, "fit", "train")]
        self.originals = [getattr(owner, name) for owner, name, _ in self.patched]

    def __enter__(self):
        for (owner, name, what), original in zip(self.patched, self.originals):
            setattr(owner, name, self.wrap(original, what))
        return self

    def __exit__(self, *exc):
        for (owner, name, _), original in zip(self.patched, self.originals):
            setattr(owner, name, original)

    def wrap(self, original, what: str):
        def watched(*args, **kwargs):
            if original is self.originals[0] and probe(args[1] if len(args) > 1 else kwargs.get("args")):
                return original(*args, **kwargs)  # a system probe (platform.processor's uname, git), not a process
            self.seen.add(what)
            if what in self.forbid:
                pytest.fail(f"this test {'starts a process' if what == 'spawn' else 'trains (Trainer.fit)'} (or a "
                            f"fixture it sets up does) but is not marked: add @pytest.mark.{what} (tests/tiers.py)",
                            pytrace=False)
            return original(*args, **kwargs)

        return watched


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Record (``SELFSUP_TIERS_RECORD``) or hold (otherwise) the marks of every test, over its setup, call and
    teardown."""
    marked = tier(item)
    forbid = () if RECORD or marked == "spawn" else ("spawn", "train") if marked is None else ("spawn",)
    start = time.perf_counter()
    with Watch(forbid) as watch:
        CURRENT[:] = [watch]
        yield
        CURRENT.clear()
    if RECORD:
        with open(RECORD, "a") as f:
            f.write(json.dumps({"test": item.nodeid, "seen": sorted(watch.seen), "marked": marked,
                                "fixtures": sorted(getattr(item, "fixturenames", [])),
                                "shared_fixtures": {k: sorted(v) for k, v in watch.shared.items()},
                                "seconds": round(time.perf_counter() - start, 3)}) + "\n")


CURRENT: list[Watch] = []  # the running test's watch


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    """What a fixture shared beyond one test (module or session scope) did as it was set up."""
    watch = CURRENT[0] if CURRENT else None
    before = set(watch.seen) if watch else set()
    yield
    if watch is not None and fixturedef.scope != "function" and watch.seen - before:
        watch.shared[fixturedef.argname] = watch.seen - before


def apply(record: str) -> None:
    """Write the marks a recorded run calls for into the test files: a function any of whose cases started a process
    is marked ``spawn``, else one that trained ``train``; a module whose every test has the same mark gets
    ``pytestmark`` instead. ``python tests/tiers.py RECORD`` (a file of ``SELFSUP_TIERS_RECORD``)."""
    import ast
    import re
    from collections import defaultdict
    from pathlib import Path

    rows = [json.loads(line) for line in Path(record).read_text().splitlines()]
    # a fixture shared by tests (module or session scope) starts its process or trains once, for the first of them:
    # every test that uses one of its name takes its needs (under -m the first may be left out, the next one set it up)
    shared: dict[str, set] = defaultdict(set)
    for row in rows:
        for fixture, seen in row.get("shared_fixtures", {}).items():
            shared[fixture].update(seen)
    need: dict[str, dict[str, set]] = defaultdict(lambda: defaultdict(set))
    for row in rows:
        path, name = row["test"].split("::")[:2]
        need[path][re.sub(r"\[.*$", "", name)].update(row["seen"])
        for fixture in row.get("fixtures", []):
            need[path][re.sub(r"\[.*$", "", name)].update(shared.get(fixture, ()))
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
