"""The one training base of both families: declared capabilities, the checkpoint hooks, the shared rules."""

from __future__ import annotations

import csv
import math

import pytest
import torch

import selfsup.engine as engine
from selfsup.config import load_run_config, resolve
from selfsup.data.datasets import load_dataset
from selfsup.errors import UserError
from selfsup.export import export_backbone
from selfsup.methods import METHODS
from selfsup.methods.base import NonFiniteLoss, TrainingBase
from selfsup.methods.compiled import compile_step
from selfsup.methods.build import build_method, data_info
from selfsup.models.backbones import build_backbone
from ssl_helpers import TINY
from ssl_helpers import tiny_method

FLOW = ["data.batch_size=32", "trainer.accelerator=cpu", "trainer.devices=1", "trainer.progress_bar=false"]


def flow_method(preset="self-flow-digits", *overrides):
    cfg = load_run_config(preset, [*FLOW, *overrides])
    return build_method(cfg, data_info(cfg, load_dataset(cfg.data, "train")))


# beside the registry's methods with their defaults: variants that add a post-step hook or a momentum target
VARIANTS = {"byol+directpred": ("byol", {"predictor": "directpred"}),
            "simclr+projector_momentum": ("simclr", {"projector_momentum": 0.9})}
CASES = [*METHODS, *VARIANTS]  # every registered method: a new one is checked without editing this list


def registry_method(case: str, tmp_path):
    """A tiny instance of a registered method (or a variant): the joint ones on the micro ViT of ``tiny_method``, the
    flow ones as a micro SiT on digits (REPA with a random-init exported ViT as its frozen encoder)."""
    name, extra = VARIANTS.get(case, (case, None))
    if name == "distill":  # a frozen teacher from a file: a random-init exported ViT
        kwargs = dict(in_chans=1, image_size=8, patch_size=4)
        meta = {"backbone": "vit_micro", "kwargs": kwargs, "image_size": 8, "in_chans": 1, "mean": [0.3], "std": [0.3],
                "dataset": "digits", "method": "moco_v3"}
        path = export_backbone(build_backbone("vit_micro", **kwargs), tmp_path / "teacher.safetensors", meta)
        extra = {"teacher": {"weights": str(path)}, "queue_size": 16}
    if name == "distill_dinov2":  # a frozen teacher: a DINOv2 run folder (backbone + heads)
        from ssl_helpers import STUDENT_HEADS, dinov2_teacher_run

        extra = {"teacher": {"weights": str(dinov2_teacher_run(tmp_path))}, **STUDENT_HEADS}
    if METHODS[name].family == "joint":
        return tiny_method(name, extra)
    method = {"name": name, "size": "micro", "patch_size": 2}
    if name == "repa":
        kwargs = dict(in_chans=1, image_size=8, patch_size=4)
        meta = {"backbone": "vit_micro", "kwargs": kwargs, "image_size": 8, "in_chans": 1, "mean": [0.3], "std": [0.3],
                "dataset": "digits", "method": "moco_v3"}
        method["encoder"] = str(export_backbone(build_backbone("vit_micro", **kwargs), tmp_path / "enc.safetensors",
                                                meta))
    cfg = resolve({"method": method, "data": {"name": "digits", "batch_size": 32},
                   "trainer": {"accelerator": "cpu", "devices": 1, "progress_bar": False}})
    return build_method(cfg, data_info(cfg, load_dataset(cfg.data, "train")))


def test_every_registered_method_is_on_the_one_base():
    assert all(issubclass(cls, TrainingBase) for cls in METHODS.values())
    assert {cls.family for cls in METHODS.values()} == {"joint", "flow"}
    assert {name for name, cls in METHODS.items() if cls.uses_momentum} == {"moco_v3", "byol", "dino", "ibot", "dinov2",
                                                                            "dinov3", "ijepa", "distill_dinov2",
                                                                            "moco_v2", "tico"}


@pytest.mark.parametrize("case", CASES)
def test_trainable_declares_exactly_the_trained_parameters(case, tmp_path):
    """trainable() holds every parameter that takes gradients, and no EMA target (frozen by construction); a target
    exists where the method declares a momentum schedule, is a flow method (its EMA) or asks for a projector
    momentum; the evaluated backbone is declared."""
    model = registry_method(case, tmp_path)
    declared = {id(p) for m in model.trainable().values() for p in m.parameters() if p.requires_grad}
    assert declared == {id(p) for p in model.parameters() if p.requires_grad}
    targets = {id(p) for _, t in model.momentum_pairs for p in t.parameters()}
    assert bool(targets) == (model.uses_momentum or model.family == "flow"
                             or getattr(model.cfg.method, "projector_momentum", 0) > 0)
    assert not targets & {id(p) for m in model.trainable().values() for p in m.parameters()}
    assert isinstance(model.eval_backbone, torch.nn.Module) and model.eval_backbone.num_features > 0


def test_post_step_hooks_are_declared():
    assert tiny_method("byol").post_step_hooks == []
    dp = tiny_method("byol", {"predictor": "directpred"})
    assert dp.post_step_hooks == [dp.predictor.after_optimizer_step]
    flow = flow_method()
    assert flow.post_step_hooks == [flow.ema_after_step] and flow.momentum_pairs == [(flow.student, flow.ema)]


@pytest.mark.parametrize("case", CASES)
def test_the_loss_check_fires_before_every_checkpoint_of_every_method(case, tmp_path):
    """One on_save_checkpoint per family chain: the flow family extends it (the EMA decay) and still checks."""
    model = registry_method(case, tmp_path)
    checkpoint = {}
    model.on_save_checkpoint(checkpoint)
    assert "rng_state" in checkpoint and ("ema_decay" in checkpoint) == (model.family == "flow")
    model.finite_watch.observe(torch.tensor(float("nan")), 3)
    with pytest.raises(NonFiniteLoss, match="the loss became nan at step 3;"):
        model.on_save_checkpoint({})


# steps of a 5-epoch run of 10 steps: the first, in a warm-up, across an epoch boundary, the last
SCHEDULE_STEPS = ((0, 0), (9, 0), (10, 1), (23, 2), (49, 4))


@pytest.mark.parametrize("name", list(METHODS))
def test_schedule_returns_exactly_the_extras_its_method_declares(name, tmp_path):
    """Every registered method's ``schedule(step, epoch)``, without a Trainer, returns as extras exactly the names
    its class declares in ``schedule_extras`` (the names the hook sets as attributes), at every step: with the
    warm-ups that schedule them switched on (Self-Flow's and REPA's ``rep_weight`` ramp; DINO's τt warm-up)."""
    model = registry_method(name, tmp_path)
    model.total_steps, model.steps_per_epoch, model.max_epochs = 50, 10, 5
    c = model.cfg.method
    for key, value in (("rep_warmup_steps", 20), ("warmup_teacher_temp_epochs", 2)):
        if hasattr(c, key):
            setattr(c, key, value)
    for step, epoch in SCHEDULE_STEPS:
        extras = model.schedule(step, epoch).extras
        assert tuple(extras) == model.schedule_extras, (name, step)
        for key, value in extras.items():
            setattr(model, key, value)  # each is an attribute the method reads


def test_the_hook_refuses_an_extra_the_method_does_not_declare():
    """``on_train_batch_start`` sets a declared extra and refuses any other with an internal error naming the method
    and the key (it would otherwise set an attribute of any name: a misspelt one silently)."""
    from types import SimpleNamespace

    from selfsup.schedules import StepValues

    model = tiny_method("dino")
    opt = model.configure_optimizers()
    batches = SimpleNamespace(current=SimpleNamespace(completed=0))
    model._trainer = SimpleNamespace(global_step=0, current_epoch=0, optimizers=[opt], accumulate_grad_batches=1,
                                     fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=batches)))
    model.schedule = lambda step, epoch: StepValues(0.1, 0.1, momentum=0.9, extras={"teacher_temp": 0.07})
    model.on_train_batch_start(None, 0)
    assert model.teacher_temp == 0.07 and model.step_teacher_temp.item() == pytest.approx(0.07)
    model.schedule = lambda step, epoch: StepValues(0.1, 0.1, momentum=0.9, extras={"teacher_tmp": 0.07})
    with pytest.raises(RuntimeError, match="DINO.schedule returned the extra 'teacher_tmp'"):
        model.on_train_batch_start(None, 0)
    assert not hasattr(model, "teacher_tmp")


def test_flow_ema_decay_travels_in_the_checkpoint():
    model = flow_method("self-flow-digits", "method.ema_warmup_steps=10", "method.ema_decay=0.9")
    model.update_ema(5)
    checkpoint = {}
    model.on_save_checkpoint(checkpoint)
    fresh = flow_method("self-flow-digits", "method.ema_warmup_steps=10", "method.ema_decay=0.9")
    assert fresh.ema_decay == 0.9
    fresh.on_load_checkpoint(checkpoint)
    assert fresh.ema_decay == pytest.approx(0.45)


@pytest.mark.parametrize("precision, clip, fused", [("16-mixed", 1.0, False), ("16-mixed", None, True),
                                                    ("bf16-mixed", 1.0, True)])
def test_no_fused_adamw_for_fp16_with_clipping_in_both_families(precision, clip, fused):
    for model in (tiny_method("moco_v3", trainer={"precision": precision, "gradient_clip_val": clip}),
                  flow_method("self-flow-digits", f"trainer.precision={precision}",
                              f"trainer.gradient_clip_val={clip or 'null'}")):
        assert bool(model.configure_optimizers().defaults["fused"]) is fused


def test_trainer_compile_compiles_the_flow_step_in_place():
    """The flow family's step draws from the step's generator inside forward_flow: compiled module by module."""
    model = flow_method()
    names = [n for n, _ in model.named_parameters()]
    compile_step(model, "aot_eager")
    assert "forward_flow" not in vars(model)
    assert all(m._compiled_call_impl is not None for m in (model.student, model.head, model.ema))
    assert [n for n, _ in model.named_parameters()] == names


def test_method_compile_points_to_trainer_compile():
    with pytest.raises(UserError, match="method.compile is replaced by trainer.compile; set trainer.compile=true"):
        load_run_config("self-flow-digits", ["method.compile=true"])
    assert load_run_config("self-flow-sit-xl2-latents").trainer.compile


@pytest.mark.train
def test_lr_schedule_per_epoch_as_simsiam(tmp_path):
    """optim.lr_schedule_unit=epoch: the lr of epoch e is lr0 · ½(1 + cos(π e / E)) for all its steps
    (main_simsiam.py adjust_learning_rate); the fixed predictor lr stays lr0; iteration: per step."""
    assert load_run_config("simsiam-r50-imagenet").optim.lr_schedule_unit == "epoch"
    base = TINY + ["trainer.max_epochs=3", "optim.base_lr=0.05", "optim.fix_predictor_lr=true", "optim.warmup_epochs=0",
                   f"output_dir={tmp_path}"]
    lr0 = 0.05 * 64 / 256
    for unit, at in (("epoch", lambda s: s // 2 / 3), ("iteration", lambda s: s / 6)):
        run = engine.pretrain(load_run_config("simsiam-digits",
                                              base + [f"optim.lr_schedule_unit={unit}", f"name={unit}"]))
        with (run / "metrics.csv").open(newline="") as f:
            lrs = {int(r["step"]): float(r["train/lr"]) for r in csv.DictReader(f) if r.get("train/lr")}
        assert lrs == pytest.approx({s: lr0 * 0.5 * (1 + math.cos(math.pi * at(s))) for s in range(6)}, rel=1e-6)
        groups = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["optimizer_states"][0]["param_groups"]
        assert {g["name"]: g["lr"] for g in groups} == pytest.approx(
            {"backbone": lrs[5], "projector": lrs[5], "predictor": lr0}, rel=1e-6)
    assert lrs[2] != lrs[3]  # per iteration the lr moves inside an epoch
    with pytest.raises(UserError, match="optim.lr_schedule_unit='step' is not known; use iteration or epoch"):
        load_run_config("simsiam-digits", ["optim.lr_schedule_unit=step"])
