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


# the light commands that load no torch either: each answers in well under 0.5 s and 100 MiB on an idle machine
# (docs/development.md); the test bounds the memory, which a loaded machine does not move, not the time
NO_TORCH = ("import selfsup", "--version", "--help", "eval --help", "presets", "run facts")
MAX_RSS_MIB = 100


@pytest.mark.spawn
@pytest.mark.parametrize("what", NO_TORCH)
def test_the_light_commands_load_no_torch_and_stay_small(what):
    """The config layer declares data (``selfsup.choices``), and a command family's flags are built only when it is
    run: ``--help``, ``presets`` and the run facts import no torch, and the whole process peaks under 100 MiB. So does
    ``eval --help``: its flags' defaults come from the protocols' configs, declared without torch
    (``selfsup.eval_configs``)."""
    code = LIGHT[what] + "\nimport sys\nprint('torch' in sys.modules)"
    # a parent of its own, so that the peak is this command's alone (RUSAGE_CHILDREN: the largest waited-for child)
    parent = ("import resource, subprocess, sys\n"
              "out = subprocess.run([sys.executable, '-c', sys.argv[1]], capture_output=True, text=True)\n"
              "print(out.returncode, out.stdout.split()[-1:], out.stderr[-2000:])\n"
              "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", parent, code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    status, peak_kib = out.stdout.strip().rsplit("\n", 1)
    assert status.startswith("0 ['False']"), f"{what}: {status}"  # exit 0, torch not imported
    assert int(peak_kib) / 1024 < MAX_RSS_MIB, f"{what} peaks at {int(peak_kib) / 1024:.0f} MiB"


# --------------------------------------------------------------------------- imports inside functions
# The imports a function makes, by file: the deliberate lazy loads, each group with its why. Any other import goes to
# the top of its module; the counts can only go down (lower an entry when you move one up, drop it at zero).
INNER_IMPORTS = {
    # the command line (selfsup.commands): a command imports what it runs, so `--help`, `presets` and a family's
    # `--help` load no torch or Lightning (the claims' registry imports the engine; an eval protocol, torch)
    "commands/claims.py": 21, "commands/eval.py": 6, "commands/generate.py": 2, "commands/main.py": 9,
    "commands/reconstruct.py": 1, "commands/generation.py": 1,
    # what the light reads share with training: `import selfsup` (selfsup.pretrain on first use), a config
    # (the method registry when it is resolved), run.json (torch only to write a GPU's name) and
    # `selfsup.runs.GenerationConfig` (the run folder and its session, Lightning, when a run is evaluated)
    "__init__.py": 1, "config.py": 1, "runs/facts.py": 1, "runs/generation.py": 2,
    # a third-party import of one path: pyplot chooses its backend when imported (each plot sets Agg first); timm
    # and scikit-learn's datasets take ~2.4 s to import; webdataset, torch-fidelity and torchmetrics are optional
    "claims/suite.py": 2, "eval/ood.py": 2, "report.py": 2, "simulate/byol_dynamics.py": 2,
    "simulate/norm_convergence.py": 2, "eval/mae_recipe.py": 3, "export.py": 1, "models/backbones.py": 1,
    "data/datasets.py": 1, "data/shards.py": 1, "flow/metrics.py": 3, "weights.py": 2,
    # the Python API: the engine (Lightning) when a run starts, the method layer when selfsup.method builds one,
    # the embedding's reader (issue 63)
    "api.py": 5,
}


def inner_imports(root=PACKAGE) -> dict[str, int]:
    """``path`` → the ``import`` / ``from ... import`` statements inside function bodies (nested ones once)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        seen = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                seen |= {id(n) for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))}
        if seen:
            out[path.relative_to(root).as_posix()] = len(seen)
    return out


def test_the_reader_counts_inner_imports(tmp_path):
    (tmp_path / "m.py").write_text("import os\n\n\ndef f():\n    import json\n\n    def g():\n"
                                   "        from pathlib import Path\n\n\nclass A:\n    def h(self):\n"
                                   "        import re, sys\n")
    (tmp_path / "n.py").write_text("import os\n")
    assert inner_imports(tmp_path) == {"m.py": 3}


def test_imports_inside_functions_are_the_deliberate_ones():
    found = inner_imports()
    assert sum(found.values()) <= sum(INNER_IMPORTS.values()) <= 75
    grown = {k: v for k, v in found.items() if v > INNER_IMPORTS.get(k, 0)}
    assert not grown, f"imports inside functions beyond INNER_IMPORTS (move them to the top of the module): {grown}"
    shrunk = {k: (v, found.get(k, 0)) for k, v in INNER_IMPORTS.items() if found.get(k, 0) < v}
    assert not shrunk, f"fewer inner imports now (allowed, found): lower INNER_IMPORTS: {shrunk}"


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


def test_the_training_base_stays_under_600_lines():
    """Issue 61's bar: methods/base.py holds the step and the families' bases in at most 600 lines; the batch path to
    the views lives in methods/device_views.py, trainer.compile in methods/compiled.py."""
    lines = (PACKAGE / "methods" / "base.py").read_text().count("\n")
    assert lines <= 600, f"methods/base.py has {lines} lines: move what is neither the step nor a family's base out"
