"""benchmarks/ is one package run from the repository root (``python -m benchmarks.NAME``): every module imports and
parses ``--help``, none reaches another through ``sys.path`` or a private name, and the harness they share (the
timing loop, the summary of timed steps, the JSON writer) does what it says; a quick run keeps the schema of the
committed results."""

from __future__ import annotations

import json
import re
import runpy
import subprocess
import sys

import pytest

from ssl_helpers import ROOT

BENCHMARKS = ROOT / "benchmarks"
SCRIPTS = sorted(p.stem for p in BENCHMARKS.glob("*.py") if p.stem not in ("__init__", "harness"))


def test_there_are_the_benchmarks():
    assert len(SCRIPTS) >= 30 and "throughput" in SCRIPTS and "mfu" in SCRIPTS


@pytest.mark.parametrize("name", SCRIPTS)
def test_each_benchmark_runs_as_a_module_and_parses_help(name, monkeypatch, capsys):
    """``python -m benchmarks.NAME --help``, in this process (torch imported once): exit 0 and a usage line."""
    monkeypatch.setattr(sys, "argv", [f"benchmarks.{name}", "--help"])
    monkeypatch.delitem(sys.modules, f"benchmarks.{name}", raising=False)  # imported by another benchmark
    with pytest.raises(SystemExit) as stop:
        runpy.run_module(f"benchmarks.{name}", run_name="__main__", alter_sys=True)
    assert stop.value.code in (0, None)
    assert "usage:" in capsys.readouterr().out


@pytest.mark.spawn
def test_a_benchmark_runs_from_the_repository_root_in_a_fresh_interpreter():
    """The command the README gives, as a user types it (no PYTHONPATH to the repository: -m puts the current
    folder first)."""
    done = subprocess.run([sys.executable, "-m", "benchmarks.throughput", "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--quick" in done.stdout


def test_no_benchmark_reaches_another_through_sys_path_or_a_private_name():
    for path in BENCHMARKS.glob("*.py"):
        text = path.read_text()
        assert "sys.path" not in text, f"{path.name}: a sys.path line"
        for module, names in re.findall(r"^\s*from benchmarks\.(\w+) import \(?([^)\n]+)", text, re.M):
            private = [n.strip() for n in names.split(",") if n.strip().startswith("_")]
            assert not private, f"{path.name}: imports {private} from benchmarks.{module}"
        assert not re.search(r"^\s*(from|import) (throughput|mfu|decode|dino_cpu|redundancy)\b", text, re.M), \
            f"{path.name}: imports a benchmark as a top-level module"


def test_timed_gives_wall_and_cpu_seconds_of_each_call_after_the_warmup():
    from benchmarks.harness import timed

    calls = []
    times = timed(lambda: calls.append(sum(range(20000))), 3, warmup=2)
    assert len(calls) == 5 and len(times) == 3
    assert all(w > 0 and c >= 0 for w, c in times)


def test_between_and_the_step_clock_time_the_steps_after_the_warmup():
    from benchmarks.harness import between, step_clock

    assert between([(1.0, 0.5), (1.5, 0.75), (3.0, 1.0)]) == [(0.5, 0.25), (1.5, 0.25)]

    class Trainer:
        should_stop = False

    clock, trainer = step_clock(stop_after=4), Trainer()
    for _ in range(3):
        clock.on_train_batch_end(trainer)
    assert not trainer.should_stop
    clock.on_train_batch_end(trainer)
    assert trainer.should_stop
    clock.marks = [(0.0, 0.0), (1.0, 0.5), (3.0, 1.0), (6.0, 2.0)]
    assert clock.times(2) == [(2.0, 0.5), (3.0, 1.0)]  # steps 3 and 4 after 2 warm-up steps


def test_summarize_by_hand():
    """Two repetitions of steps (wall, CPU): per repetition the mean; the lowest and the median across them."""
    from benchmarks.harness import summarize

    reps = [[(0.1, 0.2), (0.3, 0.2)], [(0.4, 0.1), (0.4, 0.3)]]  # means: wall 0.2 / 0.4, CPU 0.2 / 0.2
    s = summarize(reps, batch_size=32)
    assert s["step_ms_min"] == pytest.approx(200) and s["step_ms_median"] == pytest.approx(300)
    assert s["cpu_step_ms_min"] == pytest.approx(200) and s["cpu_step_ms_median"] == pytest.approx(200)
    assert s["step_ms_median_all_steps"] == pytest.approx(350)  # of 0.1, 0.3, 0.4, 0.4
    assert s["images_per_s_best"] == pytest.approx(160) and s["images_per_s_median"] == pytest.approx(32 / 0.3)
    assert s["rep_step_ms"] == [200.0, 400.0] and s["rep_cpu_step_ms"] == [200.0, 200.0]
    best = summarize(reps, batch_size=32, lowest="best")  # mfu's names
    assert best["step_ms_best"] == s["step_ms_min"] and "step_ms_min" not in best


def test_write_report_writes_the_whole_file_or_leaves_the_old_one(tmp_path):
    from benchmarks.harness import read_report, write_report

    out = tmp_path / "deep" / "r.json"
    assert read_report(out) == {}
    write_report({"a": 1}, out)
    with pytest.raises(TypeError):
        write_report({"a": object()}, out)  # not JSON: the earlier file stays whole
    assert read_report(out) == {"a": 1} and [p.name for p in out.parent.iterdir()] == ["r.json"]


def keys(report: dict, depth: int = 4, prefix: str = "") -> set[str]:
    """The dotted keys of a report down to ``depth`` levels (a result row's figures, not every method's name)."""
    out = set()
    for k, v in report.items():
        out.add(prefix + k)
        if isinstance(v, dict) and depth > 1:
            out |= keys(v, depth - 1, prefix + k + ".")
    return out


@pytest.mark.train
def test_throughput_quick_keeps_the_schema_of_its_committed_results(tmp_path):
    """A quick run writes every key the committed results/throughput.json has (docs and side_by_side read them)."""
    from benchmarks import throughput

    out = tmp_path / "throughput.json"
    assert throughput.main(["--quick", "--methods", "simclr", "--out", str(out)]) == 0
    new = json.loads(out.read_text())
    old = json.loads((BENCHMARKS / "results" / "throughput.json").read_text())
    method = next(iter(old["results"]))
    old["results"] = {"simclr": old["results"][method]}
    old["settings"]["method_settings"] = {}
    new["settings"]["method_settings"] = {}
    assert keys(old) <= keys(new)
    row = new["results"]["simclr"]
    assert row["engine"]["step_ms_min"] > 0 and row["bare"]["cpu_step_ms_min"] > 0


@pytest.mark.train
def test_train_pretrains_a_preset_in_this_process_and_returns_its_facts_and_knn(tmp_path):
    """``harness.train``: the run in the folder it names, its run.json facts and end-of-run kNN; extra callbacks first
    on the Trainer; ``report=False`` skips the kNN report; the engine is left as it was."""
    import lightning.pytorch as pl

    import selfsup.engine as engine
    import selfsup.runs.finish as finish
    from benchmarks.harness import pretrain, trained
    from ssl_helpers import tiny_run

    make, report, where = engine.make_trainer, finish.end_of_run_report, []

    class Where(pl.Callback):
        def on_train_start(self, trainer, module):
            where.append(trainer.callbacks.index(self))

    done = pretrain("moco-v3-vit-digits", tiny_run(), tmp_path / "a", callbacks=[Where()])
    assert done.run == tmp_path / "a" and done.facts["status"] == "finished" and done.facts["global_step"] == 2
    assert {"pretrained", "random_init"} <= set(done.knn) and done.wall_s > 0 and where == [0]
    read = trained(done.run)
    assert (read.facts, read.knn, read.wall_s) == (done.facts, done.knn, None)
    quiet = pretrain("moco-v3-vit-digits", tiny_run(), tmp_path / "b", report=False)
    assert quiet.knn is None and (quiet.run / "backbone.safetensors").exists() and quiet.facts["status"] == "finished"
    assert (engine.make_trainer, finish.end_of_run_report) == (make, report)
