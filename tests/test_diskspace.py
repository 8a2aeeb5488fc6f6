"""A full disk (issue 39, item 5): a write that runs out of space partway ends in one line naming the file system,
the space needed and what was kept, exit 2, and the previous file stays whole. The disk here is a real folder whose
writes, through ``diskspace.open_for_write``, stop with ENOSPC after a byte budget, as the kernel's do."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
import torch
from torch import nn

from selfsup import diskspace
from selfsup.checkpoints import load_checkpoint, write_checkpoint
from selfsup.diskspace import DiskFull, is_disk_full
from selfsup.export import export_backbone
from ssl_helpers import TINY, assert_user_error, run_cli


class FillingDisk:
    """``open_for_write`` over a disk with ``free`` bytes left for the files ``only`` matches (None: all files):
    a write past it puts what fits and raises ENOSPC."""

    def __init__(self, free: int | None, only: str = ""):
        self.free, self.only, self.sizes = free, only, []

    def open(self, path, mode="wb"):
        return _Filling(open(path, mode), self if self.only in Path(path).name else None)


class _Filling:
    def __init__(self, f, disk: FillingDisk | None):
        self.f, self.disk, self.written = f, disk, 0

    def write(self, data) -> int:
        n = memoryview(data).nbytes
        if self.disk is not None and self.disk.free is not None and n > self.disk.free:
            self.f.write(memoryview(data).cast("B")[: self.disk.free])
            self.disk.free = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if self.disk is not None and self.disk.free is not None:
            self.disk.free -= n
        self.written += n
        return self.f.write(data)

    def close(self):
        if self.disk is not None:
            self.disk.sizes.append(self.written)
        self.f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __getattr__(self, name):  # flush, fileno
        return getattr(self.f, name)


def test_the_chain_of_a_full_disk_is_recognised():
    """Python's ENOSPC / EDQUOT, torch's writer wrapping it ("unexpected pos", the OSError as its context) and
    safetensors' "os error 28" are a full disk; other errors are not."""
    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    except RuntimeError as e:
        assert is_disk_full(e)
    assert is_disk_full(Exception("Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "
                                  "\"No space left on device\" })"))
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not is_disk_full(RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"))


def test_a_checkpoint_that_runs_out_of_space_partway_keeps_the_previous_one(tmp_path, monkeypatch):
    path = tmp_path / "checkpoints" / "last.ckpt"
    write_checkpoint({"state_dict": {"w": torch.zeros(1000)}, "global_step": 1}, path)
    before = path.read_bytes()
    disk = FillingDisk(free=2000)  # less than the new checkpoint's 4,000 tensor bytes: it stops partway
    monkeypatch.setattr(diskspace, "open_for_write", disk.open)
    with pytest.raises(DiskFull) as caught:
        write_checkpoint({"state_dict": {"w": torch.ones(1000)}, "global_step": 2}, path)
    message = str(caught.value)
    assert "\n" not in message
    for words in ("no space left on the", f"file system at {diskspace._mount(tmp_path)[0]}", "free of",
                  f"writing the checkpoint {path}", "about 4.0 kB needed", "the previous last.ckpt is unchanged",
                  "set output_dir to another disk"):
        assert words in message, (words, message)
    assert path.read_bytes() == before  # the old file, whole
    assert load_checkpoint(path, "")["global_step"] == 1
    assert [p.name for p in path.parent.iterdir()] == ["last.ckpt"]  # the partial temp file removed


def test_an_export_that_runs_out_of_space_leaves_no_partial_file(tmp_path, monkeypatch):
    monkeypatch.setattr(diskspace, "open_for_write", FillingDisk(free=100).open)
    with pytest.raises(DiskFull, match="writing the exported backbone .* nothing was written there"):
        export_backbone(nn.Linear(64, 64), tmp_path / "backbone.safetensors", {"backbone": "linear"})
    assert list(tmp_path.iterdir()) == []


def test_sizes_read_as_df_says_them():
    assert [diskspace.size_text(n) for n in (0, 999, 1000, 6_400_000, 2_500_000_000)] == [
        "0 B", "999 B", "1.0 kB", "6.4 MB", "2.5 GB"]


@pytest.mark.train
def test_a_run_whose_second_checkpoint_does_not_fit_stops_in_one_line_and_resumes(tmp_path, monkeypatch):
    """The first checkpoint (step 1) fits; the disk then holds half of the next one, whose write fails partway.
    The run stops with exit 2 and one line naming the file system, the checkpoint's size and the step kept;
    run.json's reason is that line; last.ckpt is step 1's, byte for byte, and resumes once there is space."""
    disk = FillingDisk(free=None, only="last.ckpt")
    ckpt, saved = tmp_path / "r" / "checkpoints" / "last.ckpt", {}
    real_open = disk.open

    def open_then_fill(path, mode="wb"):
        if disk.sizes and disk.free is None:  # the first checkpoint is written: half the next one fits
            saved["bytes"], disk.free = ckpt.read_bytes(), disk.sizes[0] // 2
        return real_open(path, mode)

    monkeypatch.setattr(diskspace, "open_for_write", open_then_fill)
    args = ["pretrain", "moco-v3-vit-digits", *TINY, "trainer.checkpoint_every_n_steps=1", f"output_dir={tmp_path}",
            "name=r"]
    code, _, err = run_cli(*args)
    assert_user_error(code, err, "no space left on the", "file system at", f"writing the checkpoint {ckpt}",
                      "needed", "the last checkpoint, with finite weights, is step 1", "--resume")
    line = next(x for x in err.splitlines() if x.startswith("selfsup: error:"))
    facts = json.loads((tmp_path / "r" / "run.json").read_text())
    assert facts["status"] == "failed" and facts["reason"] == line.removeprefix("selfsup: error: ")
    assert ckpt.read_bytes() == saved["bytes"]
    assert sorted(p.name for p in ckpt.parent.iterdir()) == ["last.ckpt"]
    monkeypatch.setattr(diskspace, "open_for_write", open)  # space again
    code, _, err = run_cli("pretrain", "--resume", tmp_path / "r")
    assert code == 0, err
    assert torch.load(ckpt, weights_only=False)["global_step"] == 2


@pytest.mark.train
def test_a_logger_write_on_a_full_disk_names_the_run_folder_and_the_checkpoint(tmp_path, monkeypatch):
    """A write selfsup does not make itself (Lightning's metrics.csv here) fails with ENOSPC: the run still ends
    in one line, naming the run folder's file system and what it needs for its next checkpoint."""
    from lightning.pytorch.loggers.csv_logs import ExperimentWriter

    def full(self):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(ExperimentWriter, "save", full)
    code, _, err = run_cli("pretrain", "moco-v3-vit-digits", *TINY, f"output_dir={tmp_path}", "name=r")
    assert_user_error(code, err, "no space left on the", f"writing the run's logs in {tmp_path / 'r'}")


@pytest.mark.train
def test_a_report_whose_figures_do_not_fit_names_its_folder(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    code, _, err = run_cli("pretrain", "moco-v3-vit-digits", *TINY, f"output_dir={tmp_path}", "name=r")
    assert code == 0, err

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Figure, "savefig", full)
    code, _, err = run_cli("report", tmp_path / "r")
    assert_user_error(code, err, "no space left on the", f"writing the report's figures in {tmp_path / 'r' / 'report'}",
                      "the run folders are unchanged")


def test_a_write_no_writer_of_selfsup_named_is_said_with_the_command_output():
    """An ENOSPC that names no file (a library's write) is said with the command's output folder."""
    line = str(DiskFull.of(RuntimeError("flush failed"), Path("/tmp/out")))
    assert line.startswith("no space left on the") and "writing output to /tmp/out" in line
    named = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/tmp/out/result.json")
    assert "writing output to /tmp/out/result.json" in str(DiskFull.of(named, Path("/elsewhere")))
