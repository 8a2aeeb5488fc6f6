"""The finishing work of a run (export, the end-of-run report: knn.json, a flow run's samples_end.png) survives a
kill: killed at any point of it, a resume finishes the run, and the folder then holds the same files as the run that
was never killed (the same backbone and heads bytes, the same kNN numbers and label-free measures, the same
samples)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
from pathlib import Path

import pytest

import selfsup
import selfsup.engine as engine
from selfsup.config import load_run_config
from ssl_helpers import FLOW_TINY, RESUME, run_cli, tiny_run

pytestmark = pytest.mark.spawn  # tests/tiers.py

RUNS = {"joint": ("moco-v3-vit-digits", RESUME), "flow": ("self-flow-digits", FLOW_TINY),
        # DINO exports and scores its teacher; MAE's encoder sees the kept patches only
        "dino": ("dino-digits", [*tiny_run(heads=False), "method.out_dim=64", "method.hidden_dim=32",
                                 "method.bottleneck_dim=16", "augment.local_crops_number=2", "data.batch_size=32"]),
        "mae": ("mae-digits", [*tiny_run(heads=False), "method.decoder_embed_dim=32", "method.decoder_depth=1",
                               "method.decoder_num_heads=2"])}
SAME_BYTES = ("backbone.safetensors", "heads.safetensors", "backbone_init.safetensors", "samples_end.png")


def cfg_for(family: str, out: Path, name: str):
    preset, extra = RUNS[family]
    return load_run_config(preset, [*extra, f"output_dir={out}", f"name={name}"])


def kill_at_replace(k: int, before: bool) -> None:
    """From now on in this process: SIGKILL itself at the ``k``-th (0-based) atomic write (``os.replace``),
    ``before`` its rename (the temp file written) or right after it."""
    real, seen = os.replace, {"n": 0}

    def replace(src, dst, *args, **kwargs):
        if before and seen["n"] == k:
            os.kill(os.getpid(), signal.SIGKILL)
        real(src, dst, *args, **kwargs)
        if not before and seen["n"] == k:
            os.kill(os.getpid(), signal.SIGKILL)
        seen["n"] += 1

    os.replace = replace


def kill_once_trained() -> None:
    """From now on in this process: SIGKILL itself right after the write of run.json that says the run is trained
    (the first write of its finishing)."""
    real = os.replace

    def replace(src, dst, *args, **kwargs):
        real(src, dst, *args, **kwargs)
        if Path(dst).name == "run.json" and json.loads(Path(dst).read_text()).get("status") == "trained":
            os.kill(os.getpid(), signal.SIGKILL)

    os.replace = replace


def forked(work) -> int:
    """``work()`` in a forked child (its output to /dev/null); the child's wait status."""
    sys.stdout.flush(), sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            sys.stdout = sys.stderr = open(os.environ.get("FINISHING_LOG", os.devnull), "a")
            os.environ.pop("SELFSUP_RUN_DIR", None)
            work()
            code = 0
        finally:
            os._exit(code)
    return os.waitpid(pid, 0)[1]


def killed(status: int) -> bool:
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def resume(run: Path) -> None:
    """``selfsup pretrain --resume RUN`` in this process: the resume rules decide to train, finish or do nothing."""
    selfsup.pretrain(resume=run)


def assert_same_finish(a: Path, b: Path) -> None:
    for name in SAME_BYTES:
        assert (a / name).exists() == (b / name).exists(), name
        if (a / name).exists():
            assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert json.loads((a / "knn.json").read_text()) == json.loads((b / "knn.json").read_text())
    assert (a / "label_free.json").exists() == (b / "label_free.json").exists()
    if (a / "label_free.json").exists():  # the label-free measures: the same views, the same numbers
        assert json.loads((a / "label_free.json").read_text()) == json.loads((b / "label_free.json").read_text())
    facts = json.loads((b / "run.json").read_text())
    assert facts["status"] == "finished" and "finished_steps" not in facts
    assert not list(b.glob(".*.tmp"))


def straight_and_trained(family: str, out: Path) -> tuple[Path, Path]:
    """The run never killed, and the same run killed right after its training (run.json says trained, nothing of
    its finishing is done)."""
    straight = engine.pretrain(cfg_for(family, out, "A"))
    status = forked(lambda: (kill_once_trained(), engine.pretrain(cfg_for(family, out, "B"))))
    assert killed(status), status
    trained = out / "B"
    facts = json.loads((trained / "run.json").read_text())
    assert facts["status"] == "trained" and "finished_steps" not in facts
    assert not (trained / "backbone.safetensors").exists() and not (trained / "knn.json").exists()
    return straight, trained


@pytest.fixture(scope="module", params=["joint", "flow"])
def runs(request, tmp_path_factory):
    """(the family, the run never killed, a copy of it killed right after its training)."""
    return request.param, *straight_and_trained(request.param, tmp_path_factory.mktemp(request.param))


@pytest.mark.parametrize("family", ["dino", "mae"])
def test_a_run_killed_once_trained_is_finished_from_its_checkpoint_as_if_never_killed(family, tmp_path):
    """The model a resume rebuilds from the last checkpoint exports and scores as the one fit left: DINO's teacher,
    MAE's encoder."""
    straight, trained = straight_and_trained(family, tmp_path)
    assert forked(lambda: resume(trained)) == 0
    assert_same_finish(straight, trained)


# the atomic writes of the finishing: backbone, heads (a joint run's), run.json (export done), knn.json,
# label_free.json and run.json's label_free (a joint run's), samples_end.png (a flow run's), run.json (report done),
# run.json (finished)
WRITES = {"joint": 8, "flow": 6}


@pytest.mark.parametrize("before", [True, False], ids=["before-rename", "after-rename"])
def test_a_kill_anywhere_in_the_finishing_then_a_resume_gives_the_uninterrupted_run(runs, tmp_path, before):
    family, straight, trained = runs
    for k in range(WRITES[family] + 1):
        run = tmp_path / f"{k}"
        shutil.copytree(trained, run)
        status = forked(lambda: (kill_at_replace(k, before), resume(run)))
        if k == WRITES[family]:  # past the last write: the finishing ends without a kill
            assert status == 0, status
        else:
            assert killed(status), f"write {k} of the finishing: the child ended with status {status}"
            last = k == WRITES[family] - 1 and not before
            assert json.loads((run / "run.json").read_text())["status"] == ("finished" if last else "trained")
            assert forked(lambda: resume(run)) == 0
        assert_same_finish(straight, run)
        assert forked(lambda: (kill_at_replace(0, True), resume(run))) == 0  # finished: nothing is written again


def test_the_cli_resume_of_a_trained_run_finishes_it_and_then_has_nothing_to_do(runs, tmp_path):
    family, straight, trained = runs
    run = tmp_path / "B"
    shutil.copytree(trained, run)
    code, out, err = run_cli("pretrain", "--resume", run)
    assert code == 0, err
    assert "pretrained   top-1" in out and f"run folder: {run}" in out  # the report, printed
    assert_same_finish(straight, run)
    code, out, err = run_cli("pretrain", "--resume", run)
    assert code == 0 and "is finished" in out and "nothing to train" in out
