"""runs/memory.py: the step's memory estimated before the first step (issue "The practitioner's path", part 2), and
a step that would not fit refused in one line naming the keys that shrink it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from selfsup.errors import UserError
from selfsup.runs import memory
from selfsup.runs.memory import check_step_memory, saved_bytes, step_estimate
from ssl_helpers import tiny_config, tiny_method


def test_saved_bytes_counts_what_autograd_keeps_and_not_the_weights():
    """Linear keeps its input (8 floats), ReLU its output (16 floats); the weight is not an activation."""
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
    assert saved_bytes(net, torch.zeros(1, 8)) == (8 + 16) * 4


def test_the_estimate_grows_with_the_tokens_and_the_batch_and_leaves_no_trace():
    m = tiny_method("simclr")  # micro ViT, 8 px, patch 2
    before = {k: v.clone() for k, v in m.state_dict().items()}
    rng = torch.get_rng_state()
    small = step_estimate(m, 16)
    assert torch.equal(rng, torch.get_rng_state())  # a seeded run draws as without the probe
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())
    assert small.sizes == (8, 8) and small.per_image > 0 and small.total == small.per_image * 16 + small.state
    from selfsup.methods import DataInfo
    from selfsup.methods.build import build_method

    big = build_method(tiny_config("simclr", data={"image_size": 32}), DataInfo(1, 32, (0.5,), (0.25,)))
    assert step_estimate(big, 16).sizes == (32, 32)
    assert step_estimate(big, 16).per_image > 8 * small.per_image  # 256 tokens an image, not 16
    assert step_estimate(tiny_method("dino", {"out_dim": 64}), 16).sizes[:2] == (8, 8)


def test_a_step_that_would_not_fit_is_one_line_naming_the_keys(monkeypatch):
    m = tiny_method("simclr")
    cfg = tiny_config("simclr")
    est = step_estimate(m, cfg.data.batch_size)
    monkeypatch.setattr(memory, "free_memory", lambda device: est.total * 100)
    assert check_step_memory(m, cfg, torch.device("cpu")).total == est.total  # fits: runs
    monkeypatch.setattr(memory, "free_memory", lambda device: (est.state + est.per_image * 3.5) / memory.FIT_SHARE)
    with pytest.raises(UserError) as e:
        check_step_memory(m, cfg, torch.device("cpu"))
    line = str(e.value)
    assert "\n" not in line and "data.batch_size=3 or lower" in line and "model.patch_size" in line
    assert "16 tokens an image at model.patch_size=2" in line


def test_the_flow_family_is_not_estimated():
    assert step_estimate(nn.Linear(2, 2), 4) is None


def test_a_run_on_a_gpu_is_estimated_and_never_refused_here(monkeypatch):
    """The estimate sits beside the GPU's measured first step; CUDA's own error names an allocation too large."""
    m = tiny_method("simclr")
    cfg = tiny_config("simclr")
    cfg.trainer.accelerator = "gpu"
    monkeypatch.setattr(memory, "free_memory", lambda device: 1)  # would refuse any step
    assert check_step_memory(m, cfg).total == step_estimate(m, cfg.data.batch_size).total


class _Module(nn.Linear):
    """A LightningModule's two attributes FirstStepMemory reads: its device and the estimate made before the step."""

    def __init__(self, device: str, estimate):
        super().__init__(500, 500)  # 251,000 floats: 1,004,000 bytes of weights
        self.where, self.step_memory = torch.device(device), estimate

    @property
    def device(self):
        return self.where


def _first_step(tmp_path, module, work):
    """FirstStepMemory around one optimiser step of two micro-batches, ``work`` run in the first; run.json's record."""
    import json
    from types import SimpleNamespace

    cb = memory.FirstStepMemory(tmp_path)
    trainer = SimpleNamespace(global_step=0, is_global_zero=True)
    cb.on_train_batch_start(trainer, module, None, 0)
    work()
    cb.on_train_batch_end(trainer, module, None, None, 0)  # an accumulated micro-batch: the step is not done
    assert not (tmp_path / "run.json").exists()
    cb.on_train_batch_start(trainer, module, None, 1)
    trainer.global_step = 1
    cb.on_train_batch_end(trainer, module, None, None, 1)
    record = json.loads((tmp_path / "run.json").read_text())["step_memory"]
    cb.on_train_batch_start(trainer, module, None, 2)  # later steps: not measured again
    trainer.global_step = 2
    cb.on_train_batch_end(trainer, module, None, None, 2)
    assert json.loads((tmp_path / "run.json").read_text())["step_memory"] == record
    return record


def test_the_first_step_s_resident_peak_is_recorded_beside_the_estimate_and_a_wide_miss_said(tmp_path, capsys):
    held, touched = 1_004_000, 300 * 2 ** 20

    def work():  # 300 MiB touched, then freed: the peak keeps it
        x = torch.ones(touched // 4)
        del x

    record = _first_step(tmp_path / "a", _Module("cpu", memory.StepEstimate(1000, 0, 1, (8,))), work)
    assert record["measured"] == "resident peak less resident before, plus the weights"
    # the pages counted in kB and the resident set before the step moving by a few of them: within 1 MiB below
    assert held + touched - (1 << 20) <= record["measured_bytes"] < held + touched + (64 << 20)
    assert (record["estimate_bytes"], record["estimate_per_image_bytes"], record["batch"]) == (1000, 1000, 1)
    line = capsys.readouterr().err
    assert line.count("\n") == 1 and "the first step peaked at" in line and "lower data.batch_size" in line
    record = _first_step(tmp_path / "b", _Module("cpu", memory.StepEstimate(1 << 30, 0, 1, (8,))), work)
    assert record["estimate_bytes"] == 1 << 30 and capsys.readouterr().err == ""  # inside the estimate: silent
    # just over 2x an estimate but under SLACK above it (the first step's one-off allocations): silent
    record = _first_step(tmp_path / "c", _Module("cpu", memory.StepEstimate(100 << 20, 0, 1, (8,))), work)
    assert record["measured_bytes"] > 2 * (100 << 20) and capsys.readouterr().err == ""


def test_on_a_gpu_the_first_step_reads_torch_s_peak_of_allocated_bytes(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device: calls.append(("reset", device)))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: calls.append(("peak", device)) or 12345)
    record = _first_step(tmp_path, _Module("cuda", None), lambda: None)
    assert calls == [("reset", torch.device("cuda")), ("peak", torch.device("cuda"))]
    assert record == {"step": 1, "device": "cuda", "measured_bytes": 12345,
                      "measured": "torch.cuda.max_memory_allocated", "estimate_bytes": None,
                      "estimate_per_image_bytes": None, "batch": None}
