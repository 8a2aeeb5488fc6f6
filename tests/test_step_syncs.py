"""The training step reads nothing back to the host between logging steps (a host-device sync on a GPU)."""

from __future__ import annotations

import traceback

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from selfsup.methods import METHODS
from selfsup.methods.base import FiniteLossWatch, NonFiniteLoss
from ssl_helpers import tiny_config, tiny_run

READS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default}


class CountReads(TorchDispatchMode):
    """Counts the operators that copy a tensor's value to the host (``.item()``, ``bool(t)``, ``float(t)``),
    except Lightning's conversion of logged values for the progress bar: those are the host copies
    ``log_step`` made (on a CPU run every tensor is a host tensor, so the two cannot be told apart by
    device; that only logged host copies reach Lightning is checked on ``self.log`` itself)."""

    def __init__(self):
        super().__init__()
        self.reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in READS and not any(f.name == "convert_tensors_to_scalars" for f in traceback.extract_stack()):
            self.reads += 1
        return func(*args, **(kwargs or {}))


def random_vit(tmp_path):
    """A random-init micro ViT exported as a selfsup backbone (REPA's frozen encoder)."""
    from selfsup.export import export_backbone
    from selfsup.models.backbones import build_backbone

    kwargs = dict(in_chans=1, image_size=8, patch_size=4)
    meta = {"backbone": "vit_micro", "kwargs": kwargs, "image_size": 8, "in_chans": 1, "mean": [0.3], "std": [0.3],
            "dataset": "digits", "method": "moco_v3"}
    return export_backbone(build_backbone("vit_micro", **kwargs), tmp_path / "encoder.safetensors", meta)


def _fit_counting(cfg, tmp_path):
    """Fit ``cfg`` (8 steps, logging every 4) with the progress bar on; host reads per step, through
    the whole iteration: on_train_batch_start .. the logger's write (callbacks, instruments included)."""
    import lightning.pytorch as pl

    from selfsup.data.datasets import load_dataset
    from selfsup.engine import PretrainData, make_trainer
    from selfsup.methods.build import build_method, data_info

    reads: dict[int, int] = {}

    class Count(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if getattr(self, "mode", None) is not None:
                self.mode.__exit__(None, None, None)
                reads[batch_idx - 1] = self.mode.reads
            self.mode = CountReads()
            self.mode.__enter__()

        def on_train_epoch_end(self, trainer, pl_module):
            self.mode.__exit__(None, None, None)
            self.mode = None

    train = load_dataset(cfg.data, "train")
    model = build_method(cfg, data_info(cfg, train))
    logged: list[tuple[int, str, torch.device]] = []
    log = model.log

    def spy(name, value, *args, **kwargs):
        logged.append((model.trainer.global_step, name, value.device if isinstance(value, torch.Tensor) else None))
        return log(name, value, *args, **kwargs)

    model.log = spy
    trainer = make_trainer(cfg, tmp_path / "run")
    trainer.callbacks.insert(0, Count())
    trainer.fit(model, datamodule=PretrainData(cfg, train))
    return reads, logged


@pytest.mark.train
@pytest.mark.parametrize("method", [*METHODS, "distill_v3"])  # every registered method: a new one is checked too
def test_no_host_reads_between_logging_steps(tmp_path, method):
    """12 steps, logging every 4, the default instruments every 5: a logging step reads once (the NaN
    check; the logged values come back in one copy), an instrument step reads what it measures, and
    every other step reads nothing, with the progress bar on (distill_v3: method.version=v3 of distill)."""
    trainer = {"limit_train_batches": 12, "log_every_n_steps": 4, "progress_bar": True}
    version = {"version": "v3"} if method == "distill_v3" else {}
    method = "distill" if method == "distill_v3" else method
    if METHODS[method].family == "flow":
        from selfsup.config import load_run_config

        encoder = [f"method.encoder={random_vit(tmp_path)}"] if method == "repa" else []  # REPA's frozen encoder
        cfg = load_run_config(f"{method.replace('_', '-')}-digits",
                              [*tiny_run(batch_size=16, heads=False), "method.size=micro", *encoder,
                               "instruments.every_n_steps=5",
                               *[f"trainer.{k}={v}" for k, v in trainer.items()], f"output_dir={tmp_path}", "name=run"])
    else:
        multicrop = {"augment": {"local_crops_number": 2, "local_crops_size": 4}} if method in ("dino", "ibot") else {}
        masking = {"pred_ratio": [0.0, 0.3], "pred_ratio_var": [0.0, 0.2]} if method == "ibot" else None
        if method == "distill":  # a frozen teacher from a file
            masking = {"teacher": {"weights": str(random_vit(tmp_path))}, "queue_size": 32, **version}
        if method == "distill_dinov2":  # a frozen teacher: a DINOv2 run folder (backbone + heads)
            from ssl_helpers import STUDENT_HEADS, dinov2_teacher_run

            masking = {"teacher": {"weights": str(dinov2_teacher_run(tmp_path))}, **STUDENT_HEADS}
        cfg = tiny_config(method, masking, trainer=trainer, instruments={"every_n_steps": 5}, output_dir=str(tmp_path),
                          name="run", **multicrop)
    reads, logged = _fit_counting(cfg, tmp_path)
    assert set(reads) == set(range(11))  # step 11's iteration ends with the epoch
    instrument_steps, logging_steps = {0, 5, 10}, {3, 7}
    # the method logs at logging steps only ((step + 1) % 4 == 0), host tensors; instruments at their own steps
    own = [(step, device) for step, name, device in logged if name.startswith("train/")]
    assert {step for step, _ in own} == logging_steps | {11}
    assert {device.type for _, device in own} == {"cpu"}
    assert {s: n for s, n in reads.items() if s not in instrument_steps | logging_steps and n} == {}
    assert {s: reads[s] for s in logging_steps} == {3: 1, 7: 1}


def test_the_watch_names_the_first_non_finite_step():
    watch = FiniteLossWatch()
    for step, value in enumerate([1.0, 0.5, float("nan"), 0.2, float("inf")]):
        watch.observe(torch.tensor(value), step)
    with pytest.raises(NonFiniteLoss, match="the loss became nan at step 2;"):
        watch.check()
    finite = FiniteLossWatch()
    for step in range(3):
        finite.observe(torch.tensor(1.0), step)
    finite.check()  # nothing to report
    FiniteLossWatch().check()  # nothing observed yet
