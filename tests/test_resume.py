"""Resuming a run gives exactly the run that was never interrupted (epoch-end and mid-epoch checkpoints)."""

from __future__ import annotations

import json

import pytest

import selfsup.engine as engine
from selfsup.config import load_run_config
from ssl_helpers import FLOW_TINY, RESUME, StopAfterEpoch, assert_same_run, ckpt, interrupt_at


STATE = ["eval.knn_at_end=false"]  # what is compared is the state, not the end-of-run kNN (test_finishing.py's)


def cfg_for(out, name, *extra):
    return load_run_config("moco-v3-vit-digits", RESUME + STATE + list(extra) + [f"output_dir={out}", f"name={name}"])


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """Run A: 2 epochs without a stop (a checkpoint each step changes nothing in the training)."""
    out = tmp_path_factory.mktemp("straight")
    return engine.pretrain(cfg_for(out, "A", "trainer.checkpoint_every_n_steps=1"))


@pytest.mark.train
def test_resume_from_epoch_end_equals_uninterrupted_run(straight, tmp_path):
    cfg = cfg_for(tmp_path, "B")
    run_b = engine.pretrain(cfg, callbacks=[StopAfterEpoch()])
    first = ckpt(run_b)
    assert first["global_step"] == 3  # stopped after epoch 1 of 2 (3 batches each)
    seconds = json.loads((run_b / "run.json").read_text())["fit_seconds"]
    engine.pretrain(engine.load_run(run_b), resume=run_b)
    assert_same_run(straight, run_b)
    facts = json.loads((run_b / "run.json").read_text())  # the report's wall time: both sessions of fit
    assert (facts["global_step"], facts["epochs"], facts["sessions"]) == (6, 2, 2) and facts["fit_seconds"] > seconds


@pytest.mark.train
def test_resume_mid_epoch_equals_uninterrupted_run(straight, tmp_path, capsys):
    cfg = cfg_for(tmp_path, "B", "trainer.checkpoint_every_n_steps=1")
    interrupt_at(cfg)
    run_b = tmp_path / "B"
    assert f"interrupted; continue with: selfsup pretrain --resume {run_b}" in capsys.readouterr().err
    assert not (run_b / "backbone.safetensors").exists()
    first = ckpt(run_b)
    # 4 steps done: epoch 2 (index 1) is one batch in, so the resumed epoch must skip exactly that batch
    assert first["global_step"] == 4
    assert first["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"]["completed"] < 3
    engine.pretrain(engine.load_run(run_b), resume=run_b)
    assert_same_run(straight, run_b)


@pytest.mark.spawn
@pytest.mark.parametrize("name,suffix,decode", [("imagefolder", "png", "auto"), ("images", "png", "auto"),
                                                ("imagefolder", "jpg", "device")])
def test_resume_with_decoding_workers_equals_uninterrupted_run(tmp_path, name, suffix, decode):
    """imagefolder, and the same files as an unlabelled nested folder (images): crops made at decode time in a
    worker, seeded by (seed, epoch, index), so a mid-epoch resume sees the same views; and JPEGs under
    data.decode=device (the worker sends bytes and boxes, the module decodes them on its device, here the CPU)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in (("train", 24), ("val", 8)):
        for c in range(2):
            (tmp_path / "images" / split / f"c{c}").mkdir(parents=True)
            for i in range(n // 2):
                w, h = rng.integers(10, 24, 2)
                Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(
                    tmp_path / "images" / split / f"c{c}" / f"{i}.{suffix}")
    root = tmp_path / "images" if name == "imagefolder" else tmp_path / "images" / "train"
    folder = [f"data.name={name}", f"data.root={root}", "data.image_size=8",
              "data.batch_size=8", "data.num_workers=1", f"data.decode={decode}"]
    straight = engine.pretrain(cfg_for(tmp_path / "a", "A", *folder, "trainer.checkpoint_every_n_steps=1"))
    cfg = cfg_for(tmp_path / "b", "B", *folder, "trainer.checkpoint_every_n_steps=1")
    interrupt_at(cfg)
    run_b = tmp_path / "b" / "B"
    assert ckpt(run_b)["global_step"] == 4
    engine.pretrain(engine.load_run(run_b), resume=run_b)
    assert_same_run(straight, run_b)


@pytest.mark.train
def test_resume_mid_epoch_with_accumulated_gradients_equals_uninterrupted_run(tmp_path):
    """trainer.accumulate_grad_batches=2: 6 micro-batches = 3 optimiser steps per epoch; killed before step 4
    (one step, two micro-batches into epoch 2), the resumed run skips exactly those two micro-batches and ends
    bit-identical: the views are seeded by (step, micro-batch), the EMA moves once per step."""
    acc = ["trainer.accumulate_grad_batches=2", "trainer.limit_train_batches=6", "trainer.checkpoint_every_n_steps=1"]
    straight = engine.pretrain(cfg_for(tmp_path / "a", "A", *acc))
    interrupt_at(cfg_for(tmp_path / "b", "B", *acc))
    run_b = tmp_path / "b" / "B"
    first = ckpt(run_b)
    assert (first["global_step"] == 4
            and first["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"]["ready"] == 2)
    engine.pretrain(engine.load_run(run_b), resume=run_b)
    assert_same_run(straight, run_b)


@pytest.mark.train
def test_a_flow_run_resumed_mid_accumulation_equals_uninterrupted_run(tmp_path):
    """Self-Flow with trainer.accumulate_grad_batches=2 (its EMA a post-step hook, its noise, levels and masks drawn
    from the (step, micro-batch) seed, the representation weight ramped over optimiser steps): killed before step 4
    (two micro-batches into epoch 2), the resumed run ends as the uninterrupted one (``assert_same_run``)."""
    def cfg(out, name):
        return load_run_config("self-flow-digits", [
            *FLOW_TINY, *STATE, "data.batch_size=32", "trainer.max_epochs=2", "optim.warmup_epochs=1",
            "trainer.accumulate_grad_batches=2", "trainer.limit_train_batches=6", "trainer.checkpoint_every_n_steps=1",
            "method.rep_warmup_steps=3", "method.ema_warmup_steps=3", f"output_dir={out}", f"name={name}"])

    straight = engine.pretrain(cfg(tmp_path / "a", "A"))
    interrupt_at(cfg(tmp_path / "b", "B"))
    run_b = tmp_path / "b" / "B"
    first = ckpt(run_b)
    assert (first["global_step"] == 4
            and first["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"]["ready"] == 2)
    engine.pretrain(engine.load_run(run_b), resume=run_b)
    assert_same_run(straight, run_b, momentum=False)
    assert any(k.startswith("ema.") for k in ckpt(run_b)["state_dict"])


@pytest.mark.spawn
def test_resume_on_tar_shards_equals_uninterrupted_run(tmp_path):
    """data.name=webdataset with a decoding worker: killed mid-epoch, the resumed run re-reads its stream up to the
    consumed batches and continues at the right sample (the same views, seeded by (seed, epoch, sample))."""
    from shard_files import write_shards

    write_shards(tmp_path / "shards", [9, 8, 7])  # 24 samples, batch 8: 3 steps per epoch
    shards = ["data.name=webdataset", f"data.root={tmp_path / 'shards'}", "data.image_size=8", "data.batch_size=8",
              "data.num_workers=1", "data.shuffle_buffer=5", "trainer.checkpoint_every_n_steps=1"]
    straight = engine.pretrain(cfg_for(tmp_path / "a", "A", *shards))
    interrupt_at(cfg_for(tmp_path / "b", "B", *shards))
    run_b = tmp_path / "b" / "B"
    assert ckpt(run_b)["global_step"] == 4
    engine.pretrain(engine.load_run(run_b), resume=run_b)
    assert_same_run(straight, run_b)


@pytest.mark.train
def test_mae_resume_mid_epoch_equals_uninterrupted_run(tmp_path):
    """MAE draws each sample's mask from the step's generator (seed, step, rank): a run stopped mid-epoch and
    resumed masks every step as the uninterrupted run did, and ends with the same weights and optimiser state."""
    mae = ["method.decoder_embed_dim=32", "method.decoder_depth=1", "method.decoder_num_heads=2",
           *[o for o in RESUME if not o.startswith("method.")], "trainer.checkpoint_every_n_steps=1", *STATE]

    def cfg(out, name):
        return load_run_config("mae-digits", mae + [f"output_dir={out}", f"name={name}"])

    straight = engine.pretrain(cfg(tmp_path / "a", "A"))
    interrupt_at(cfg(tmp_path / "b", "B"))
    run_b = tmp_path / "b" / "B"
    assert ckpt(run_b)["global_step"] == 4 and any(k.startswith("decoder.") for k in ckpt(run_b)["state_dict"])
    engine.pretrain(engine.load_run(run_b), resume=run_b)
    assert_same_run(straight, run_b, momentum=False)
