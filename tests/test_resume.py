"""Resuming a run gives exactly the run that was never interrupted (epoch-end and mid-epoch checkpoints)."""

from __future__ import annotations

import csv

import lightning.pytorch as pl
import pytest
import torch
from safetensors.torch import load_file

import selfsup.engine as engine
from selfsup.config import load_run_config
from conftest import TINY

# 3 batches per epoch, 2 epochs, warmup over the first epoch: lr and momentum change every step,
# so a resume that saw another total step count or another step index would differ.
RESUME = TINY + ["trainer.max_epochs=2", "trainer.limit_train_batches=3", "optim.warmup_epochs=1"]


def cfg_for(out, name, *extra):
    return load_run_config("moco-v3-vit-digits", RESUME + list(extra) + [f"output_dir={out}", f"name={name}"])


class StopAfterEpoch(pl.Callback):
    """Ends fit cleanly at the end of the first epoch (the epoch-end checkpoint is still written)."""

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.current_epoch == 0:
            trainer.should_stop = True


class CtrlCAtStep(pl.Callback):
    """A Ctrl-C before training step ``step`` (0-based): the last checkpoint is the one after ``step`` steps."""

    def __init__(self, step):
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            raise KeyboardInterrupt


def with_callback(monkeypatch, callback):
    make = engine.make_trainer

    def patched(cfg, run_dir):
        trainer = make(cfg, run_dir)
        trainer.callbacks.insert(0, callback)
        return trainer

    monkeypatch.setattr(engine, "make_trainer", patched)


def ckpt(run_dir):
    return torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)  # selfsup writes only plain types


def losses(run_dir):
    with (run_dir / "metrics.csv").open(newline="") as f:
        return {int(r["step"]): float(r["train/loss"]) for r in csv.DictReader(f) if r.get("train/loss")}


def assert_same_run(a, b, momentum: bool = True):
    ca, cb = ckpt(a), ckpt(b)
    assert ca["global_step"] == cb["global_step"] == 6
    sa, sb = ca["state_dict"], cb["state_dict"]
    assert sa.keys() == sb.keys()
    if momentum:
        assert any(k.startswith("momentum_backbone.") for k in sa) and any(k.startswith("momentum_projector.") for k in sa)
    for k in sa:
        torch.testing.assert_close(sa[k], sb[k], atol=1e-6, rtol=0, msg=lambda m: f"{k}: {m}")
    oa, ob = ca["optimizer_states"][0], cb["optimizer_states"][0]
    assert oa["state"].keys() == ob["state"].keys() and len(oa["state"]) > 0
    for i in oa["state"]:
        for name, value in oa["state"][i].items():
            torch.testing.assert_close(value, ob["state"][i][name], atol=1e-6, rtol=0)
    assert [g["lr"] for g in oa["param_groups"]] == pytest.approx([g["lr"] for g in ob["param_groups"]], rel=1e-12)
    ba, bb = load_file(str(a / "backbone.safetensors")), load_file(str(b / "backbone.safetensors"))
    for k in ba:
        torch.testing.assert_close(ba[k], bb[k], atol=1e-6, rtol=0)
    # the resumed run's metrics.csv keeps the first half and continues it with the same losses
    la, lb = losses(a), losses(b)
    assert sorted(la) == sorted(lb) == list(range(6))
    assert lb == pytest.approx(la, abs=1e-5)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """Run A: 2 epochs without a stop (a checkpoint each step changes nothing in the training)."""
    out = tmp_path_factory.mktemp("straight")
    return engine.pretrain(cfg_for(out, "A", "trainer.checkpoint_every_n_steps=1"))


def test_resume_from_epoch_end_equals_uninterrupted_run(straight, tmp_path, monkeypatch):
    cfg = cfg_for(tmp_path, "B")
    with monkeypatch.context() as m:
        with_callback(m, StopAfterEpoch())
        run_b = engine.pretrain(cfg)
    first = ckpt(run_b)
    assert first["global_step"] == 3  # stopped after epoch 1 of 2 (3 batches each)
    engine.pretrain(engine.load_run(run_b), resume=run_b)
    assert_same_run(straight, run_b)


def test_resume_mid_epoch_equals_uninterrupted_run(straight, tmp_path, monkeypatch, capsys):
    cfg = cfg_for(tmp_path, "B", "trainer.checkpoint_every_n_steps=1")
    with monkeypatch.context() as m:
        with_callback(m, CtrlCAtStep(4))
        with pytest.raises(KeyboardInterrupt):
            engine.pretrain(cfg)
    run_b = tmp_path / "B"
    assert f"interrupted; continue with: selfsup pretrain --resume {run_b}" in capsys.readouterr().err
    assert not (run_b / "backbone.safetensors").exists()
    first = ckpt(run_b)
    # 4 steps done: epoch 2 (index 1) is one batch in, so the resumed epoch must skip exactly that batch
    assert first["global_step"] == 4
    assert first["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"]["completed"] < 3
    engine.pretrain(engine.load_run(run_b), resume=run_b)
    assert_same_run(straight, run_b)


def test_resume_with_decoding_workers_equals_uninterrupted_run(tmp_path, monkeypatch):
    """imagefolder: crops made at decode time in a worker, seeded by (seed, epoch, index), so a mid-epoch
    resume sees the same views."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in (("train", 24), ("val", 8)):
        for c in range(2):
            (tmp_path / "images" / split / f"c{c}").mkdir(parents=True)
            for i in range(n // 2):
                w, h = rng.integers(10, 24, 2)
                Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(
                    tmp_path / "images" / split / f"c{c}" / f"{i}.png")
    folder = ["data.name=imagefolder", f"data.root={tmp_path / 'images'}", "data.image_size=8",
              "data.batch_size=8", "data.num_workers=1"]
    straight = engine.pretrain(cfg_for(tmp_path / "a", "A", *folder, "trainer.checkpoint_every_n_steps=1"))
    cfg = cfg_for(tmp_path / "b", "B", *folder, "trainer.checkpoint_every_n_steps=1")
    with monkeypatch.context() as m:
        with_callback(m, CtrlCAtStep(4))
        with pytest.raises(KeyboardInterrupt):
            engine.pretrain(cfg)
    run_b = tmp_path / "b" / "B"
    assert ckpt(run_b)["global_step"] == 4
    engine.pretrain(engine.load_run(run_b), resume=run_b)
    assert_same_run(straight, run_b)


def test_mae_resume_mid_epoch_equals_uninterrupted_run(tmp_path, monkeypatch):
    """MAE draws each sample's mask from the step's generator (seed, step, rank): a run stopped mid-epoch and
    resumed masks every step as the uninterrupted run did, and ends with the same weights and optimiser state."""
    mae = ["method.decoder_embed_dim=32", "method.decoder_depth=1", "method.decoder_num_heads=2",
           *[o for o in RESUME if not o.startswith("method.")], "trainer.checkpoint_every_n_steps=1"]

    def cfg(out, name):
        return load_run_config("mae-digits", mae + [f"output_dir={out}", f"name={name}"])

    straight = engine.pretrain(cfg(tmp_path / "a", "A"))
    with monkeypatch.context() as m:
        with_callback(m, CtrlCAtStep(4))
        with pytest.raises(KeyboardInterrupt):
            engine.pretrain(cfg(tmp_path / "b", "B"))
    run_b = tmp_path / "b" / "B"
    assert ckpt(run_b)["global_step"] == 4 and any(k.startswith("decoder.") for k in ckpt(run_b)["state_dict"])
    engine.pretrain(engine.load_run(run_b), resume=run_b)
    assert_same_run(straight, run_b, momentum=False)
