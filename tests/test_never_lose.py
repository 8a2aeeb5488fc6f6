"""A run is never lost: a checkpoint at every epoch end by default and on the clock, atomic writes with a checksum
that resume verifies, SIGINT / SIGTERM stop at a step boundary with a checkpoint, a non-finite stop keeps only
finite weights, a moved folder resumes, --resume refuses contradictions and extends a run, a failed start leaves
no folder, and run.json / the report say how a run ended. Every resumed run ends as the uninterrupted one."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

import selfsup.engine as engine
from selfsup.checkpoints import DIGEST_KEY, content_digest, write_checkpoint
from selfsup.config import load_run_config
from spawn import run_script
from ssl_helpers import RESUME, ROOT, TINY, assert_same_run, assert_user_error, ckpt, ckpt_step, forked_kill, run_cli

PRESET = "moco-v3-vit-digits"


def cfg_for(out, name, *extra):
    return load_run_config(PRESET, RESUME + list(extra) + [f"output_dir={out}", f"name={name}"])


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """A: 2 epochs of 3 batches, never stopped."""
    return engine.pretrain(cfg_for(tmp_path_factory.mktemp("straight"), "A"))


def facts(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


# --------------------------------------------------------------------------- when checkpoints are written
@pytest.mark.spawn
def test_a_default_run_writes_a_checkpoint_at_each_epoch_end_and_resumes(straight, tmp_path):
    """No checkpoint_every_n_steps: the end of epoch 1 is on disk when the run is killed in epoch 2; a temp file
    of a killed write, in checkpoints/ or in the run folder, is removed at the resume."""
    forked_kill(cfg_for(tmp_path, "B"), 4)
    run_b = tmp_path / "B"
    assert ckpt_step(run_b) == 3
    assert facts(run_b)["status"] == "running"  # no end record: the report calls it killed
    partial = run_b / "checkpoints" / ".last.ckpt.12345.tmp"
    partial.write_bytes(b"half a checkpoint")
    export = run_b / ".backbone.safetensors.12345.tmp"  # an export killed midway
    export.write_bytes(b"half an export")
    engine.pretrain(engine.load_run(run_b), resume=run_b)
    assert not partial.exists() and sorted(p.name for p in (run_b / "checkpoints").iterdir()) == ["last.ckpt"]
    assert not export.exists() and not list(run_b.glob(".*.tmp"))
    assert_same_run(straight, run_b)
    assert facts(run_b)["status"] == "finished"


@pytest.mark.spawn
def test_checkpoints_on_the_clock(tmp_path):
    """trainer.checkpoint_every_n_minutes alone writes mid-epoch checkpoints (here at every step)."""
    forked_kill(cfg_for(tmp_path, "B", "trainer.checkpoint_every_n_minutes=1e-9"), 2)
    assert ckpt_step(tmp_path / "B") == 2


@pytest.mark.train
def test_lightning_alone_would_write_nothing_before_the_last_epoch(tmp_path):
    """Why selfsup writes its own checkpoints: Lightning 2.6's ModelCheckpoint(save_last=True, save_top_k=0) saves
    last.ckpt at an epoch end only when it saved another checkpoint then, which save_top_k=0 never does."""
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint

    from selfsup.data.datasets import load_dataset
    from selfsup.methods.build import build_method, data_info

    cfg = cfg_for(tmp_path, "L", "instruments.enabled=false", "trainer.loggers=csv")
    train = load_dataset(cfg.data, "train")
    model = build_method(cfg, data_info(cfg, train))
    seen = []

    class Look(pl.Callback):
        def on_train_epoch_start(self, trainer, pl_module):
            seen.append((trainer.current_epoch, (tmp_path / "L" / "last.ckpt").exists()))

    trainer = pl.Trainer(default_root_dir=tmp_path / "L", max_epochs=2, accelerator="cpu", devices=1,
                         limit_train_batches=3, enable_progress_bar=False, logger=False, enable_model_summary=False,
                         callbacks=[ModelCheckpoint(dirpath=tmp_path / "L", save_last=True, save_top_k=0,
                                                    every_n_epochs=1), Look()], use_distributed_sampler=False)
    trainer.fit(model, datamodule=engine.PretrainData(cfg, train))
    assert seen == [(0, False), (1, False)]  # nothing on disk after epoch 1


# --------------------------------------------------------------------------- atomic, verified files
def zero_tensor_bytes(path: Path, n: int = 64) -> None:
    """Zero ``n`` bytes in the middle of the largest tensor record of a torch zip checkpoint (stored, not
    compressed: the file stays a readable zip)."""
    with zipfile.ZipFile(path) as z:
        info = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    raw = bytearray(path.read_bytes())
    name_len, extra_len = int.from_bytes(raw[info.header_offset + 26:info.header_offset + 28], "little"), \
        int.from_bytes(raw[info.header_offset + 28:info.header_offset + 30], "little")
    start = info.header_offset + 30 + name_len + extra_len + info.file_size // 2
    raw[start:start + n] = bytes(n)
    path.write_bytes(bytes(raw))


@pytest.mark.train
def test_a_checkpoint_with_zeroed_tensor_bytes_is_refused(straight, tmp_path):
    run = tmp_path / "copy"
    shutil.copytree(straight, run)
    state = ckpt(run)
    assert state[DIGEST_KEY] == content_digest(state)
    before = (run / "checkpoints" / "last.ckpt").read_bytes()
    zero_tensor_bytes(run / "checkpoints" / "last.ckpt")
    torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)  # still loads: only the digest can tell
    code, _, err = run_cli("pretrain", "--resume", run, "trainer.max_epochs=3")
    assert_user_error(code, err, "last.ckpt is damaged", "sha256")
    code, _, err = run_cli("eval", "knn", run / "checkpoints" / "last.ckpt")
    assert_user_error(code, err, "is damaged", only_line=False)
    assert (run / "checkpoints" / "last.ckpt").read_bytes() != before  # refused, not repaired or replaced


def test_a_write_killed_midway_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "checkpoints" / "last.ckpt"
    write_checkpoint({"state_dict": {"w": torch.ones(3)}, "global_step": 1}, path)
    before = path.read_bytes()

    def dies_midway(obj, f):
        f.write(b"PK\x03\x04 a partial zip")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", dies_midway)
    with pytest.raises(OSError):
        write_checkpoint({"state_dict": {"w": torch.zeros(3)}, "global_step": 2}, path)
    assert path.read_bytes() == before and os.listdir(path.parent) == ["last.ckpt"]


# --------------------------------------------------------------------------- SIGINT and SIGTERM
SIGNAL_CHILD = """
import json, os, signal, sys
import lightning.pytorch as pl
from selfsup.commands.main import main

argv, signum, step = json.loads(sys.argv[1])

class Signal(pl.Callback):  # a real signal to this process, delivered while step `step` trains
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == step:
            os.kill(os.getpid(), signum)

sys.exit(main(argv, callbacks=[Signal()]))
"""


@pytest.mark.spawn
@pytest.mark.parametrize("signum, step, written", [(signal.SIGTERM, 4, 5), (signal.SIGINT, 2, 3)])
def test_a_signal_writes_a_checkpoint_at_the_step_boundary_and_the_resume_is_exact(straight, tmp_path, signum,
                                                                                  step, written):
    """Mid-epoch (SIGTERM during step 4: the checkpoint after it) and at an epoch's last batch (SIGINT during
    step 2: written at that epoch's end); the process exits 128 + signal with the resume command."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    env.pop("SELFSUP_RUN_DIR", None)
    argv = ["pretrain", PRESET, *RESUME, f"output_dir={tmp_path}", "name=B"]
    script = tmp_path / "signal_child.py"
    script.write_text(SIGNAL_CHILD)  # a process of its own, forked from the tests' preloaded fork server
    proc = run_script(script, [json.dumps([argv, int(signum), step])], cwd=tmp_path, env=env, timeout=300)
    run_b = tmp_path / "B"
    assert proc.returncode == 128 + signum, proc.stderr[-3000:]
    assert f"continue with: selfsup pretrain --resume {run_b}" in proc.stderr
    assert ckpt_step(run_b) == written and not (run_b / "backbone.safetensors").exists()
    assert facts(run_b)["status"] == "interrupted" and facts(run_b)["signal"] == signal.Signals(signum).name
    code, _, err = run_cli("pretrain", "--resume", run_b)
    assert code == 0, err
    assert_same_run(straight, run_b)


# --------------------------------------------------------------------------- non-finite stops
@pytest.mark.train
def test_a_nan_at_the_first_step_says_no_checkpoint_exists(tmp_path, monkeypatch):
    from selfsup.methods import moco_v3

    forward = moco_v3.MoCoV3.forward_views

    def nan_loss(self, views):
        out = forward(self, views)
        out.loss = out.loss * float("nan")
        return out

    monkeypatch.setattr(moco_v3.MoCoV3, "forward_views", nan_loss)
    code, _, err = run_cli("pretrain", PRESET, *TINY, f"output_dir={tmp_path}", "name=r")
    assert_user_error(code, err, "at step 0", "no checkpoint was written", only_line=False)
    assert facts(tmp_path / "r")["status"] == "nan"  # the folder stays: its metrics say what happened


# --------------------------------------------------------------------------- moved folders
@pytest.mark.spawn
def test_a_moved_run_folder_resumes_from_its_newest_checkpoint(straight, tmp_path):
    forked_kill(cfg_for(tmp_path, "B", "trainer.checkpoint_every_n_steps=1"), 4)
    moved = tmp_path / "elsewhere" / "renamed"
    moved.parent.mkdir()
    shutil.move(tmp_path / "B", moved)
    code, _, err = run_cli("pretrain", "--resume", moved)
    assert code == 0, err
    assert sorted(p.name for p in (moved / "checkpoints").iterdir()) == ["last.ckpt"]  # no last-v1.ckpt
    assert_same_run(straight, moved)


# --------------------------------------------------------------------------- --resume
@pytest.mark.train
def test_resume_refuses_a_contradicting_preset_or_override(straight, tmp_path):
    run = tmp_path / "copy"
    shutil.copytree(straight, run)
    code, _, err = run_cli("pretrain", "simclr-digits", "--resume", run)
    assert_user_error(code, err, "preset simclr-digits sets method.name=simclr", "drop the preset argument")
    code, _, err = run_cli("pretrain", "--resume", run, "optim.base_lr=0.5")
    assert_user_error(code, err, "optim.base_lr=0.5 contradicts", "trainer.max_epochs")
    code, out, err = run_cli("pretrain", "--resume", run, PRESET, *RESUME)  # the run's own preset and overrides
    assert code == 0 and "is finished (6 steps, 2 epochs)" in out and "trainer.max_epochs=N" in out, err


@pytest.mark.train
def test_resume_extends_a_finished_run(straight, tmp_path):
    run = tmp_path / "copy"
    shutil.copytree(straight, run)
    code, out, err = run_cli("pretrain", "--resume", run)
    assert code == 0 and "is finished" in out and ckpt_step(run) == 6
    code, _, err = run_cli("pretrain", "--resume", run, "trainer.max_epochs=3")
    assert code == 0, err
    assert ckpt_step(run) == 9 and facts(run)["epochs"] == 3 and facts(run)["sessions"] == 2
    assert "max_epochs: 3" in (run / "config.yaml").read_text()
    code, _, err = run_cli("pretrain", "--resume", run, "trainer.max_steps=11")
    assert code == 0, err
    assert ckpt_step(run) == 11 and facts(run)["status"] == "finished"


@pytest.mark.train
def test_max_steps_stops_mid_epoch_and_extends_exactly(tmp_path):
    """trainer.max_steps=4 stops after epoch 2's first batch with a mid-epoch checkpoint (its schedules span 4
    steps); trainer.max_steps=6 continues it from the next batch."""
    code, _, err = run_cli("pretrain", PRESET, *RESUME, "trainer.max_steps=4", f"output_dir={tmp_path}", "name=s")
    assert code == 0, err
    run = tmp_path / "s"
    state = ckpt(run)
    assert state["global_step"] == 4 and facts(run)["status"] == "finished"
    assert state["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"]["ready"] == 1  # epoch 2: one batch
    code, _, err = run_cli("pretrain", "--resume", run, "trainer.max_steps=6")
    assert code == 0, err
    assert ckpt_step(run) == 6
    with pytest.raises(Exception, match="trainer.max_steps=-1 must be >= 0"):
        load_run_config(PRESET, ["trainer.max_steps=-1"])


# --------------------------------------------------------------------------- failed starts, how a run ended
@pytest.mark.train
def test_a_failed_start_removes_the_folder_it_made(tmp_path):
    code, _, err = run_cli("pretrain", PRESET, *TINY, "data.batch_size=100000", f"output_dir={tmp_path}", "name=f")
    assert_user_error(code, err, "data.batch_size=100000", only_line=False)
    assert not (tmp_path / "f").exists()


@pytest.mark.train
def test_the_report_says_when_a_run_did_not_finish(straight, tmp_path):
    from selfsup.report import ending, load_run

    assert ending(load_run(straight)) == "finished"
    run = tmp_path / "copy"
    shutil.copytree(straight, run)
    engine.mark_run(run, status="running")
    assert ending(load_run(run)).startswith("did not finish: killed")
    engine.mark_run(run, status="interrupted", signal="SIGTERM")
    assert "interrupted by SIGTERM" in ending(load_run(run))
    engine.mark_run(run, status="nan", reason="the loss became nan at step 3")
    assert ending(load_run(run)) == ("did not finish: stopped by a non-finite loss or weights (the loss became nan "
                                     "at step 3)")
    code, _, err = run_cli("report", run)
    assert code == 0, err
    assert "did not finish" in (run / "report" / "report.md").read_text()


@pytest.mark.train
def test_a_run_shorter_than_the_logging_interval_logs_every_step(tmp_path):
    from ssl_helpers import losses

    code, _, err = run_cli("pretrain", PRESET, *TINY, "trainer.log_every_n_steps=10", f"output_dir={tmp_path}",
                           "name=r")
    assert code == 0, err
    assert sorted(losses(tmp_path / "r")) == [0, 1]


GROUP_CHILD = """
import json, os, signal, subprocess, sys
import lightning.pytorch as pl
from selfsup.commands.main import main

argv, step = json.loads(sys.argv[1])  # a new interpreter in a session of its own, as a job under SLURM or

class GroupTerm(pl.Callback):  # `timeout`: SIGTERM to the whole group (the loader workers too) while step `step`
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):  # trains, sent by another process
        if trainer.global_step == step:
            subprocess.run(["kill", "-TERM", "--", f"-{os.getpgid(0)}"])

sys.exit(main(argv, callbacks=[GroupTerm()]))
"""


@pytest.mark.spawn
def test_sigterm_to_the_process_group_stops_as_sigint_does_with_loader_workers(tmp_path):
    """SLURM, ``timeout`` and supervisors signal the process group: the loader workers ignore SIGTERM, so the run
    stops at its step boundary with a checkpoint, says so at once, prints the resume line, and the resume ends
    as the run never stopped (a folder of images decoded by 2 workers)."""
    from PIL import Image

    root = tmp_path / "photos"
    root.mkdir()
    g = torch.Generator().manual_seed(0)
    for i in range(48):
        pixels = torch.randint(0, 256, (20, 20, 3), generator=g, dtype=torch.uint8).numpy()
        Image.fromarray(pixels).save(root / f"{i:02d}.png")
    folder = [f"data.root={root}", "data.name=images", "data.num_workers=2", "data.image_size=16",
              "model.patch_size=4", "data.batch_size=16", "eval.knn_every_n_steps=0", "eval.online_probe=false",
              "eval.knn_at_end=false"]
    argv = ["pretrain", PRESET, *RESUME, *folder, f"output_dir={tmp_path}"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    env.pop("SELFSUP_RUN_DIR", None)
    script = tmp_path / "group_child.py"
    script.write_text(GROUP_CHILD)
    proc = subprocess.run([sys.executable, str(script), json.dumps([argv + ["name=B"], 4])], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300, start_new_session=True)
    run_b = tmp_path / "B"
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
    assert "SIGTERM received: stopping after this step" in proc.stderr and "Traceback" not in proc.stderr
    assert f"continue with: selfsup pretrain --resume {run_b}" in proc.stderr
    assert ckpt_step(run_b) == 5 and facts(run_b)["status"] == "interrupted" and facts(run_b)["signal"] == "SIGTERM"
    code, _, err = run_cli("pretrain", "--resume", run_b)
    assert code == 0, err
    code, _, err = run_cli(*argv, "name=A")
    assert code == 0, err
    assert_same_run(tmp_path / "A", run_b)
