"""A run SIGKILLed and resumed ends bit-identical to one never interrupted.

The run is killed (SIGKILL: no shutdown hook runs, nothing is flushed) by the process itself, a fork of the test
process (a DDP run: new ones, rank 0 forked from the tests' preloaded fork server, ``spawn.run_script``) at a chosen
place of a chosen step, and resumed from its last checkpoint each time.
Mid-epoch (``CASES``): one method of each family, BYOL with DirectPred's predictor (its running F and W_p change
after the optimiser step) and DINO on a multi-crop plan (its teacher EMA is a post-step hook; drop path draws from
the global RNG), Barlow Twins, VICReg, MAE, iBOT and DINOv2 (their masks come from the step's generator), SwAV with its
queue live, W-MSE (its sub-batch permutations) and NNCLR (its support set wraps around). At the epoch boundaries,
over successive resumes: every method of the registry, and 2 processes. The exported backbone, the
last checkpoint's weights and optimiser state, the step count and every logged ``train/*`` value must be equal bit
for bit to those of the run that was never stopped; the instruments' events.jsonl and metrics.csv too.
"""

from __future__ import annotations

import csv
import json
import os
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import selfsup.engine as engine
from selfsup.config import load_run_config
from selfsup.methods import METHODS
from spawn import run_script
from ssl_helpers import TINY, ckpt_step, forked_kill, nano

pytestmark = pytest.mark.spawn  # tests/tiers.py

ROOT = Path(__file__).resolve().parents[1]
# 3 batches per epoch, 2 epochs, warmup over the first: lr, momentum and EMA decay change every step. No end-of-run
# kNN (what is compared is the state; the finishing's resume is test_finishing.py's): a third of a case's time
STEPS = ["trainer.max_epochs=2", "trainer.limit_train_batches=3", "trainer.checkpoint_every_n_steps=1",
         "optim.warmup_epochs=1", "eval.knn_at_end=false"]
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
# DINOv2 on 2 global + 2 local crops: separate heads, Sinkhorn-Knopp targets, KoLeo, its masks from the step's
# generator, the last layers at lr 0 in epoch 0 and per-module clipping
DINOV2 = ["method.out_dim=64", "method.ibot_out_dim=64", "method.hidden_dim=32", "method.bottleneck_dim=16",
          "method.ibot_hidden_dim=32", "method.ibot_bottleneck_dim=16", "method.ibot_separate_head=true",
          "method.centering=sinkhorn_knopp", "method.freeze_last_layer=1", "augment.local_crops_number=2"]
# the Gram phase in 3-step epochs: loaded before step 1, refreshed after steps 2, 3, 4, the weight 0 -> 2 over steps 1-3
GRAM = ["method.ibot_hidden_dim=32", "method.gram_it_load_ema_teacher=0.34", "method.gram_it_first_update=1",
        "method.gram_update_frequency=0.34", "method.gram_max_updates=3",
        "method.gram_loss_weight_schedule=[0,0,2,0.34,0.67]"]
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
    "dinov2": ("dinov2-digits", CPU + DINOV2 + STEPS, [(4, "end")]),
    # DINOv3: the Gram teacher loaded before step 1 (killed right before it: the resume loads it), refreshed after
    # steps 2, 3 and 4 (killed after the last, before its checkpoint: the resume redoes it), its weight scheduled
    "dinov3": ("dinov3-digits", CPU + DINOV2 + STEPS + GRAM, [(1, "start"), (4, "end")]),
    "swav_queue": ("swav-digits", CPU + SWAV + STEPS, [(4, "end")]),
    # W-MSE's sub-batch permutations (w_iter 2) come from the step's generator
    "wmse": ("wmse-digits", CPU + ["method.head_size=64", "method.emb=16", "method.w_size=32", "method.w_iter=2"]
             + STEPS, [(4, "end")]),
    # NNCLR's support set (a FIFO of 192 rows: it wraps around during the run) and its pointer in the checkpoint
    "nnclr": ("nnclr-digits", CPU + HEADS + ["method.pred_hidden_dim=64", "method.queue_size=192"] + STEPS,
              [(4, "end")]),
    # I-JEPA's masks (host draws from the step's seed) and the EMA of the target encoder after each step
    "ijepa": ("ijepa-digits", CPU + ["method.pred_depth=1", "method.pred_emb_dim=32"] + STEPS, [(2, "start"),
                                                                                                (4, "end")]),
    # LeJEPA's slices (from the step's seed, no rank) and its local views
    "lejepa": ("lejepa-digits", CPU + ["method.proj_hidden_dim=64", "augment.local_crops_number=2",
                                       "augment.local_crops_size=4"] + STEPS, [(4, "end")]),
}

def killed(preset: str, overrides: list[str], resume: Path | None, step: int, where: str) -> None:
    """Run (or resume) in a forked child that SIGKILLs itself at ``step`` / ``where``."""
    forked_kill(Path(resume) if resume else load_run_config(preset, overrides), step, where)


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
    overrides = overrides + nano(preset, overrides)
    straight = engine.pretrain(load_run_config(preset, overrides + [f"output_dir={tmp_path}", "name=A"]))
    run_b = tmp_path / "B"
    (step, where), *later = kills
    killed(preset, overrides + [f"output_dir={tmp_path}", "name=B"], None, step, where)
    for step, where in later:
        killed(preset, overrides, run_b, step, where)
    assert torch.load(run_b / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["global_step"] == 4
    engine.pretrain(engine.load_run(run_b), resume=run_b)
    assert_bit_identical(straight, run_b)


# --------------------------------------------------------------------------- every method, at the epoch boundaries
# 3 epochs of 3 batches. The kills land right after the checkpoint of an epoch's last batch (step 3), of the next
# epoch's first batch (step 4, written by the session resumed from the last-batch checkpoint: Lightning once
# restored that one as an unfinished epoch, and every checkpoint written after it sent the next resume back to
# its epoch's start) and of that epoch's last batch (step 6, from a second resumed session); the last session
# trains to the end. Every method of the registry, on its digits preset with narrow heads (vit_nano in place of the
# micro ViT).
BOUNDARY_KILLS = (3, 4, 6)
BOUNDARY = ["data.batch_size=32", "trainer.accelerator=cpu", "trainer.devices=1", "trainer.progress_bar=false",
            "trainer.max_epochs=3", "trainer.limit_train_batches=3", "trainer.checkpoint_every_n_steps=1",
            "trainer.log_every_n_steps=1", "optim.warmup_epochs=1", "eval.knn_at_end=false"]
NARROW = {"proj_hidden_dim": 32, "pred_hidden_dim": 32, "dim": 16, "out_dim": 32, "hidden_dim": 32,
          "bottleneck_dim": 16, "patch_out_dim": 32, "decoder_embed_dim": 16, "decoder_depth": 1,
          "decoder_num_heads": 2, "ema_warmup_steps": 4, "rep_warmup_steps": 4, "warmup_teacher_temp_epochs": 2,
          # W-MSE: a sub-batch wider than the embedding, dividing the batch; I-JEPA's predictor
          "head_size": 32, "emb": 16, "w_size": 32, "pred_depth": 1, "pred_emb_dim": 32}


def method_preset(name: str) -> str:
    """The digits preset of method ``name`` (every registered method has one: the test fails for one without)."""
    import yaml

    from selfsup.config import PRESET_DIR

    for path in sorted(PRESET_DIR.glob("*-digits.yaml")):
        method = (yaml.safe_load(path.read_text()) or {}).get("method", {})
        if method.get("name") == name:
            return path.stem
    raise AssertionError(f"method {name} has no *-digits preset: add one so the kill-and-resume tests cover it")


def boundary_overrides(name: str, tmp_path: Path) -> list[str]:
    import dataclasses

    from selfsup.methods import METHODS

    fields = {f.name for f in dataclasses.fields(METHODS[name].Config)}
    out = BOUNDARY + [f"method.{k}={v}" for k, v in NARROW.items() if k in fields]
    out += nano(method_preset(name), out)
    if "encoder" in fields:  # REPA: a frozen ViT encoder from a file
        out.append(f"method.encoder={random_vit(tmp_path)}")
    if name == "distill":  # a frozen teacher from a file (reloaded and checked at each resume)
        out += [f"method.teacher.weights={random_vit(tmp_path)}", "method.queue_size=48"]
    if name == "distill_dinov2":  # a frozen teacher: a DINOv2 run folder, its K = NARROW's out_dim
        from ssl_helpers import TEACHER_HEADS, dinov2_teacher_run

        assert TEACHER_HEADS["out_dim"] == NARROW["out_dim"]
        out.append(f"method.teacher.weights={dinov2_teacher_run(tmp_path)}")
    return out


def random_vit(tmp_path: Path) -> Path:
    from selfsup.export import export_backbone
    from selfsup.models.backbones import build_backbone

    path = tmp_path / "encoder.safetensors"
    if not path.exists():
        kwargs = dict(in_chans=1, image_size=8, patch_size=4)
        torch.manual_seed(0)
        meta = {"backbone": "vit_micro", "kwargs": kwargs, "image_size": 8, "in_chans": 1, "mean": [0.3],
                "std": [0.3], "dataset": "digits", "method": "moco_v3"}
        export_backbone(build_backbone("vit_micro", **kwargs), path, meta)
    return path


def assert_same_final_state(a: Path, b: Path, steps: int) -> None:
    """The same step count, weights, optimiser state, exported backbone and logged values, bit for bit."""
    ca, cb = (torch.load(r / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True) for r in (a, b))
    assert ca["global_step"] == cb["global_step"] == steps, (ca["global_step"], cb["global_step"])
    assert ca["epoch"] == cb["epoch"]
    assert ca["state_dict"].keys() == cb["state_dict"].keys()
    for k, v in ca["state_dict"].items():
        assert torch.equal(v, cb["state_dict"][k]), f"checkpoint {k}: max |Δ| {(v - cb['state_dict'][k]).abs().max()}"
    oa, ob = ca["optimizer_states"][0]["state"], cb["optimizer_states"][0]["state"]
    assert oa.keys() == ob.keys()
    for i in oa:
        for name, value in oa[i].items():
            assert torch.equal(value, ob[i][name]), f"optimizer state {i}.{name}"
    ba, bb = load_file(str(a / "backbone.safetensors")), load_file(str(b / "backbone.safetensors"))
    assert ba.keys() == bb.keys() and all(torch.equal(ba[k], bb[k]) for k in ba)
    la, lb = logged(a), logged(b)
    assert sorted(la) == list(range(steps)) and la == lb


# a method's other versions, with state of their own (distill v3: two heads, the queue, the teacher's maps)
VARIANTS = {"distill_v3": ("distill", ["method.version=v3"])}


@pytest.mark.parametrize("name", list(METHODS) + list(VARIANTS))
def test_every_method_resumes_exactly_across_epoch_boundaries(name, tmp_path):
    name, extra = VARIANTS.get(name, (name, []))
    preset = method_preset(name)
    overrides = boundary_overrides(name, tmp_path) + extra
    straight = engine.pretrain(load_run_config(preset, overrides + [f"output_dir={tmp_path}", "name=A"]))
    run_b = tmp_path / "B"
    first, *later = BOUNDARY_KILLS
    forked_kill(load_run_config(preset, overrides + [f"output_dir={tmp_path}", "name=B"]), first)
    assert ckpt_step(run_b) == first
    for step in later:
        forked_kill(run_b, step)
        assert ckpt_step(run_b) == step
    engine.pretrain(engine.load_run(run_b), resume=run_b)
    assert_same_final_state(straight, run_b, 9)


DDP_CHILD = """
import json, os, signal, sys
import lightning.pytorch as pl
import selfsup.engine as engine
from selfsup.config import load_run_config

preset, overrides, resume, step, how = json.loads(sys.argv[1])

class Kill(pl.Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == step and how == "kill":  # every process kills itself at the same boundary
            os.kill(os.getpid(), signal.SIGKILL)
        if trainer.global_step == step and how == "term" and trainer.global_rank == 0:  # rank 0 only
            os.kill(os.getpid(), signal.SIGTERM)

try:
    if resume:
        engine.pretrain(engine.load_run(resume), resume=resume, callbacks=[Kill()])
    else:
        engine.pretrain(load_run_config(preset, overrides), callbacks=[Kill()])
except KeyboardInterrupt as e:  # engine.RunInterrupted, as the CLI exits
    sys.exit(128 + getattr(e, "signum", 2))
"""


def test_two_processes_resume_exactly_across_epoch_boundaries(tmp_path):
    """Under 2 CPU processes (gloo DDP) every process SIGKILLs itself at the step boundary: at an epoch's last step
    (3), then, resumed, at the next epoch's first (4, the session that once went back to its epoch's start). The
    session resumed from there gets a SIGTERM to rank 0 alone during step 7: both processes write the checkpoint
    after it and stop (the decision is all-reduced), and the last resume ends as the uninterrupted run. (The third
    boundary kill, 6, is the single-process test's; one chain of 5 sessions keeps this test's cost down.)"""
    script = tmp_path / "ddp_child.py"  # Lightning's DDP launcher re-runs the script: a file, not -c
    script.write_text(DDP_CHILD)
    overrides = boundary_overrides("moco_v3", tmp_path) + ["trainer.devices=2", "trainer.strategy=ddp"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    env.pop("SELFSUP_RUN_DIR", None)

    def run(resume, step, name="B", how="kill"):
        args = json.dumps(["moco-v3-vit-digits", overrides + [f"output_dir={tmp_path}", f"name={name}"],
                           str(resume) if resume else None, step, how])
        return run_script(script, [args], cwd=tmp_path, env=env, timeout=300)  # rank 0 from the fork server

    straight = run(None, -1, "A")
    assert straight.returncode == 0, straight.stderr[-3000:]
    proc = run(None, 3)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    proc = run(tmp_path / "B", 4)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    assert ckpt_step(tmp_path / "B") == 4
    proc = run(tmp_path / "B", 7, how="term")
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
    assert ckpt_step(tmp_path / "B") == 8 and "--resume" in proc.stderr
    proc = run(tmp_path / "B", -1)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_same_final_state(tmp_path / "A", tmp_path / "B", 9)


# --------------------------------------------------------------------------- the instruments' files
# the gradient norms read back every 4 steps and a sensitive spike detector (a short window, low k): the
# checkpoint the run resumes from comes with norms buffered and a detector window full; byol with a linear
# predictor keeps the predictor-alignment instrument's running F
INSTRUMENTED = BOUNDARY + ["trainer.max_epochs=4", "trainer.checkpoint_every_n_steps=5",
                           "instruments.every_n_steps=4", "instruments.spike_k=0.05", "instruments.spike_window=3",
                           "instruments.spike_min_history=2", "instruments.rank_every_n_steps=3",
                           "method.predictor=linear", "method.proj_hidden_dim=32", "method.pred_hidden_dim=32",
                           "method.dim=16"]


def metric_rows(run_dir: Path) -> dict[int, dict[str, str]]:
    """metrics.csv as step → every non-empty value logged for it (however the rows were split when written)."""
    rows: dict[int, dict[str, str]] = {}
    with (run_dir / "metrics.csv").open(newline="") as f:
        for r in csv.DictReader(f):
            if r.get("step", "").isdigit():
                rows.setdefault(int(r["step"]), {}).update({k: v for k, v in r.items() if v})
    return rows


def test_a_resumed_run_writes_the_same_events_and_metrics(tmp_path):
    straight = engine.pretrain(load_run_config("byol-digits", INSTRUMENTED + [f"output_dir={tmp_path}", "name=A"]))
    events = (straight / "events.jsonl").read_text().splitlines()
    assert len(events) >= 3 and any(json.loads(e)["step"] > 7 for e in events)  # the test sees spikes to lose
    forked_kill(load_run_config("byol-digits", INSTRUMENTED + [f"output_dir={tmp_path}", "name=B"]), 7)
    assert ckpt_step(tmp_path / "B") == 6  # epoch 1's end: norms of steps 5 and 6 buffered, a window full
    engine.pretrain(engine.load_run(tmp_path / "B"), resume=tmp_path / "B")
    assert (tmp_path / "B" / "events.jsonl").read_text().splitlines() == events
    a, b = metric_rows(straight), metric_rows(tmp_path / "B")
    assert sorted(a) == sorted(b) == list(range(12))
    assert a == b
    assert any(k.startswith("instruments/pred_") for k in a[8]) and any(k.startswith("instruments/grad_") for k in a[8])
