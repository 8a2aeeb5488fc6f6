"""The house's bars that are not layers: the light commands load no Lightning, no function is longer than a reader
can hold (80 lines; benchmarks/ too, past a list that only shrinks), and no test or benchmark swaps the engine's
functions (callbacks and ``report`` are arguments of ``engine.pretrain``)."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from test_layers import PACKAGE

LIGHT = {
    "import selfsup": "import selfsup",
    "--version": "from selfsup.commands.main import main\ntry:\n    main(['--version'])\nexcept SystemExit:\n    pass",
    "--help": "from selfsup.commands.main import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass",
    "eval --help": "from selfsup.commands.main import main\ntry:\n    main(['eval', '--help'])\nexcept SystemExit:\n"
                   "    pass",
    "presets": "from selfsup.commands.main import main\nmain(['presets'])",
    "run facts": "from selfsup.runs.facts import read_run_facts\nfrom selfsup.runs.resume import resume_action\n"
                 "read_run_facts('.')",
}


@pytest.mark.spawn
@pytest.mark.parametrize("what", LIGHT)
def test_the_light_commands_load_no_lightning(what):
    """``selfsup --version``, ``--help``, ``presets`` and reading a run's facts need no engine: no ``lightning`` /
    ``pytorch_lightning`` module is imported (the engine is imported by the commands that train)."""
    code = LIGHT[what] + ("\nimport json, sys\nprint(json.dumps(sorted(m for m in sys.modules "
                          "if m.split('.')[0] in ('lightning', 'pytorch_lightning'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded == [], f"{what} loads {len(loaded)} Lightning modules, e.g. {loaded[:3]}"


@pytest.mark.spawn
def test_the_version_is_answered_without_torch():
    """``selfsup --version`` is answered before the subcommands' parsers (whose defaults import torch) are built."""
    code = LIGHT["--version"] + "\nimport sys\nprint('torch' in sys.modules, 'scipy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.split()[-2:] == ["False", "False"], out.stdout + out.stderr


# --------------------------------------------------------------------------- no function over 80 lines
MAX_LINES = 80
# functions over the bar in parts owned elsewhere, named so the list can only shrink: it must go to zero
ALLOWED_LONG: set[str] = set()


def long_functions(root=PACKAGE, limit: int = MAX_LINES) -> dict[str, int]:
    """``path:function`` → lines (def to last line, docstring included) of every function over ``limit`` lines."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    out[f"{path.relative_to(root).as_posix()}:{node.name}"] = lines
    return out


def test_the_reader_counts_a_long_function(tmp_path):
    (tmp_path / "m.py").write_text("def short():\n    pass\n\n\ndef long():\n" + "    x = 1\n" * 80)
    assert long_functions(tmp_path) == {"m.py:long": 81}


def test_no_function_is_over_80_lines():
    found = long_functions()
    assert set(found) - ALLOWED_LONG == set(), {k: v for k, v in found.items() if k not in ALLOWED_LONG}
    assert ALLOWED_LONG <= set(found), f"shorter now, drop from ALLOWED_LONG: {sorted(ALLOWED_LONG - set(found))}"


# benchmarks/ under the same bar: its long functions of today, with their lengths, which may only shrink
BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
BENCHMARKS_ALLOWED_LONG: dict[str, int] = {
    "decode.py:realistic": 112, "folder_recipe.py:main": 84, "methods_fmnist.py:main": 129, "mfu.py:main": 177,
    "self_flow.py:main": 130, "throughput.py:main": 86}


def over_the_bar(found: dict[str, int], allowed: dict[str, int]) -> list[str]:
    """What breaks an allow-list that only shrinks (``found``: ``long_functions``): a function over the bar that is
    not listed, a listed one longer or shorter than its number (write the new one), a listed one now under the bar."""
    wrong = [f"{k}: {n} lines, over {MAX_LINES}" for k, n in found.items() if k not in allowed]
    wrong += [f"{k}: {found[k]} lines, listed at {n}{' (grew)' if found[k] > n else ': write the new count'}"
              for k, n in allowed.items() if k in found and found[k] != n]
    return wrong + [f"{k}: under {MAX_LINES + 1} lines now: drop it from the list" for k in allowed if k not in found]


def test_the_allow_list_only_shrinks():
    assert over_the_bar({"a.py:f": 90}, {"a.py:f": 90}) == []
    assert over_the_bar({"a.py:f": 91, "b.py:g": 81}, {"a.py:f": 90}) == [
        "b.py:g: 81 lines, over 80", "a.py:f: 91 lines, listed at 90 (grew)"]
    assert over_the_bar({"a.py:f": 85}, {"a.py:f": 90}) == ["a.py:f: 85 lines, listed at 90: write the new count"]
    assert over_the_bar({}, {"a.py:f": 90}) == ["a.py:f: under 81 lines now: drop it from the list"]


def test_no_benchmark_function_is_over_80_lines_past_the_list():
    assert over_the_bar(long_functions(BENCHMARKS), BENCHMARKS_ALLOWED_LONG) == []


# --------------------------------------------------------------------------- the engine is called, never patched
# an assignment to the engine module (``engine.make_trainer = ...``, ``setattr(engine, ...)``), in code or in a
# script held in a string
ENGINE_PATCH = re.compile(r"\bengine\.\w+\s*=(?!=)|setattr\(\s*engine\s*,|\bmake_trainer\s*=(?!=)")


def engine_patches(paths) -> list[str]:
    """``path:line`` of each line of ``paths`` that matches ``ENGINE_PATCH``."""
    return [f"{path.name}:{i}" for path in paths for i, line in enumerate(path.read_text().splitlines(), 1)
            if ENGINE_PATCH.search(line)]


def test_the_reader_finds_an_engine_patch(tmp_path):
    (tmp_path / "m.py").write_text("make = engine.make_trainer\nengine.make_trainer = patched\n"
                                   "monkeypatch.setattr(engine, 'make_trainer', patched)\nassert engine.x == y\n")
    assert engine_patches([tmp_path / "m.py"]) == ["m.py:2", "m.py:3"]


def test_no_test_or_benchmark_swaps_the_engines_functions():
    """Issue 61: callbacks and ``report`` are ``engine.pretrain``'s arguments, so nothing replaces ``make_trainer``
    (or anything else of the engine) as a module global. This file, which holds the examples, is not read."""
    tests = Path(__file__).resolve().parent
    paths = [p for p in sorted(tests.rglob("*.py")) + sorted(BENCHMARKS.rglob("*.py")) if p.name != "test_house.py"]
    assert len(paths) > 100 and engine_patches(paths) == []


def test_the_engine_stays_thin():
    """Issue 48's bar: engine.py orchestrates a run (start, fit, finish) in at most 300 lines; its side concerns
    live in runs/ (data, loggers, facts, resume, finish)."""
    lines = (PACKAGE / "engine.py").read_text().count("\n")
    assert lines <= 300, f"engine.py has {lines} lines: move what is not the run's orchestration to runs/"
