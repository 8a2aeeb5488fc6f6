"""A run SIGKILLed mid-epoch under step checkpoints and resumed ends bit-identical to one never interrupted.

The run is killed (SIGKILL: no shutdown hook runs, nothing is flushed) by the process itself at a chosen
place of a chosen step (the flow run twice), and resumed from its last step checkpoint each time. One method of each
family, BYOL with DirectPred's predictor (its running F and W_p change after the optimiser step) and DINO
on a multi-crop plan (its teacher EMA is a post-step hook; drop path draws from the global RNG), Barlow Twins,
VICReg, MAE and iBOT (their masks come from the step's generator), SwAV with its queue, W-MSE (its sub-batch
permutations), NNCLR (its support set):
the exported backbone, the last checkpoint's weights and every logged ``train/*`` value must be equal
bit for bit to those of the run that was never stopped.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import selfsup.engine as engine
from selfsup.config import load_run_config
from ssl_helpers import TINY

ROOT = Path(__file__).resolve().parents[1]
# 3 batches per epoch, 2 epochs, warmup over the first: lr, momentum and EMA decay change every step
STEPS = ["trainer.max_epochs=2", "trainer.limit_train_batches=3", "trainer.checkpoint_every_n_steps=1",
         "optim.warmup_epochs=1"]
FLOW = ["data.batch_size=32", "trainer.progress_bar=false", "trainer.log_every_n_steps=1",
        "trainer.accelerator=cpu", "trainer.devices=1", "method.ema_warmup_steps=4"]
# DINO on a 2 global + 2 local crop plan, drop path on the student, the last layer frozen in epoch 0
DINO = ["method.out_dim=64", "method.hidden_dim=32", "method.bottleneck_dim=16", "augment.local_crops_number=2",
        "method.freeze_last_layer=1",
        "data.batch_size=32", "trainer.progress_bar=false", "trainer.log_every_n_steps=1", "trainer.accelerator=cpu",
        "trainer.devices=1"]
# the other new methods on their CPU presets, heads narrowed
CPU = ["data.batch_size=64", "trainer.progress_bar=false", "trainer.log_every_n_steps=1", "trainer.accelerator=cpu",
       "trainer.devices=1"]
HEADS = ["method.proj_hidden_dim=64", "method.dim=32"]
MAE = ["method.decoder_embed_dim=32", "method.decoder_depth=1", "method.decoder_num_heads=2"]
# iBOT on 2 global + 2 local crops, half the global crops block-masked (the masks from the step's generator)
IBOT = ["method.out_dim=64", "method.patch_out_dim=64", "method.hidden_dim=32", "method.bottleneck_dim=16",
        "augment.local_crops_number=2", "method.warmup_teacher_temp_epochs=2", "method.teacher_temp=0.04",
        "method.teacher_patch_temp=0.07"]
# SwAV on 2 global + 4 local crops: the queue starts at epoch 1 (step 3), is full after step 4 and used from
# step 5, after the resume (the queue and its fill count are buffers of the checkpoint); prototypes frozen 2 steps
SWAV = ["method.hidden_mlp=64", "method.feat_dim=32", "method.nmb_prototypes=30", "method.queue_length=128",
        "method.epoch_queue_starts=1", "method.freeze_prototypes_niters=2", "augment.local_crops_number=4"]
# kills (global step, where): "start" before the step runs; "end" after its optimiser step and post-step
# updates, before its checkpoint is written (a callback ahead of Lightning's checkpoint callback)
CASES = {
    "moco_v3": ("moco-v3-vit-digits", TINY + STEPS, [(4, "end")]),
    "byol_directpred": ("byol-digits", TINY + STEPS + ["method.predictor=directpred"], [(4, "end")]),
    "self_flow": ("self-flow-digits", FLOW + STEPS, [(2, "start"), (4, "end")]),
    # the representation weight ramps over steps 0-4 (step 0: no teacher forward), killed at its end
    "self_flow_rep_warmup": ("self-flow-digits", FLOW + STEPS + ["method.rep_warmup_steps=4"], [(4, "end")]),
    "dino_multicrop": ("dino-digits", DINO + STEPS, [(4, "end")]),
    "barlow_twins": ("barlow-twins-digits", CPU + HEADS + STEPS, [(4, "end")]),
    "vicreg": ("vicreg-digits", CPU + HEADS + STEPS, [(4, "end")]),
    "mae": ("mae-digits", CPU + MAE + STEPS, [(4, "end")]),
    "ibot": ("ibot-digits", CPU + IBOT + STEPS, [(4, "end")]),
    "swav_queue": ("swav-digits", CPU + SWAV + STEPS, [(4, "end")]),
    # W-MSE's sub-batch permutations (w_iter 2) come from the step's generator
    "wmse": ("wmse-digits", CPU + ["method.head_size=64", "method.emb=16", "method.w_size=32", "method.w_iter=2"]
             + STEPS, [(4, "end")]),
    # NNCLR's support set (a FIFO of 192 rows: it wraps around during the run) and its pointer in the checkpoint
    "nnclr": ("nnclr-digits", CPU + HEADS + ["method.pred_hidden_dim=64", "method.queue_size=192"] + STEPS,
              [(4, "end")]),
}

CHILD = """
import json, os, signal, sys
import lightning.pytorch as pl
import selfsup.engine as engine
from selfsup.config import load_run_config

preset, overrides, resume, step, where = json.loads(sys.argv[1])

class Kill(pl.Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if where == "start" and trainer.global_step == step:
            os.kill(os.getpid(), signal.SIGKILL)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if where == "end" and trainer.global_step == step + 1:
            os.kill(os.getpid(), signal.SIGKILL)

make = engine.make_trainer
def patched(cfg, run_dir):
    trainer = make(cfg, run_dir)
    trainer.callbacks.insert(0, Kill())
    return trainer
engine.make_trainer = patched
if resume:
    engine.pretrain(engine.load_run(resume), resume=resume)
else:
    engine.pretrain(load_run_config(preset, overrides))
"""


def killed(preset: str, overrides: list[str], resume: Path | None, step: int, where: str) -> None:
    """Run (or resume) in a child process that SIGKILLs itself at ``step`` / ``where``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    env.pop("SELFSUP_RUN_DIR", None)
    args = json.dumps([preset, overrides, str(resume) if resume else None, step, where])
    proc = subprocess.run([sys.executable, "-c", CHILD, args], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]


def logged(run_dir: Path) -> dict[int, dict[str, str]]:
    """Every ``train/*`` value of metrics.csv by step, as written (NaN of an empty bucket included)."""
    with (run_dir / "metrics.csv").open(newline="") as f:
        return {int(r["step"]): {k: v for k, v in r.items() if k.startswith("train/") and v}
                for r in csv.DictReader(f) if r.get("train/loss")}


def assert_bit_identical(a: Path, b: Path) -> None:
    ca, cb = (torch.load(r / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True) for r in (a, b))
    assert ca["global_step"] == cb["global_step"] == 6
    assert ca["state_dict"].keys() == cb["state_dict"].keys()
    for k, v in ca["state_dict"].items():
        assert torch.equal(v, cb["state_dict"][k]), f"checkpoint {k}: max |Δ| {(v - cb['state_dict'][k]).abs().max()}"
    ba, bb = load_file(str(a / "backbone.safetensors")), load_file(str(b / "backbone.safetensors"))
    assert ba.keys() == bb.keys()
    for k in ba:
        assert torch.equal(ba[k], bb[k]), f"backbone {k}: max |Δ| {(ba[k] - bb[k]).abs().max()}"
    la, lb = logged(a), logged(b)
    assert sorted(la) == list(range(6)) and la == lb


@pytest.mark.parametrize("case", list(CASES))
def test_sigkilled_run_resumes_bit_identical(case, tmp_path):
    preset, overrides, kills = CASES[case]
    straight = engine.pretrain(load_run_config(preset, overrides + [f"output_dir={tmp_path}", "name=A"]))
    run_b = tmp_path / "B"
    (step, where), *later = kills
    killed(preset, overrides + [f"output_dir={tmp_path}", "name=B"], None, step, where)
    for step, where in later:
        killed(preset, overrides, run_b, step, where)
    assert torch.load(run_b / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["global_step"] == 4
    engine.pretrain(engine.load_run(run_b), resume=run_b)
    assert_bit_identical(straight, run_b)
