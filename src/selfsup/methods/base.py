"""The one training base of every method family, and the joint-embedding family's base.

``TrainingBase`` holds, once, what every family's LightningModule needs: the per-step seeded
generator, the schedule (``schedule(step, epoch)``: a pure function giving the step's lr, weight decay, momentum
and a method's own values, applied by one hook; warmup + cosine, ``fixed_lr`` groups, per iteration or per epoch
by default), the step counts, EMA targets and their update, ``trainer.compile``, the optimiser (with the
fused-AdamW rule), the training step and its logging (logging steps only), the non-finite loss watch, and the
checkpoint hooks. A family states what the base needs as declarations: ``trainable()`` (the modules the
optimiser trains), ``eval_backbone`` (the backbone it is judged by), ``uses_momentum`` (a momentum target
scheduled by ``method.momentum``), ``post_step_hooks`` (what acts after each optimiser step),
``forward_step(batch)`` (the family's step forward). Evaluating it (the end-of-run report) is the application
layer's (``selfsup.runs.finish``).

A joint-embedding method subclasses ``SSLMethod``, builds its heads in ``__init__``, declares
``trainable()`` and writes ``forward_views``: views in, a ``selfsup.step.StepOutput`` out (the loss plus
the detached embeddings / projections / predictions that instruments and online evaluators read, and the
method's own scalars, which the base logs). A method whose official schedule differs overrides ``schedule``:
``SelfDistillation`` (DINO's), iBOT, DINOv2 (DistillDINOv2's too), SwAV, W-MSE, I-JEPA, LeJEPA; Self-Flow and REPA.
The flow family's base is ``selfsup.methods.flow.FlowMatching``.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from selfsup.data.inputs import adopt_pil_collate
from selfsup.data.views import build_view_plan
from selfsup.distributed import world
from selfsup.errors import UserError
from selfsup.interventions import grad_scale
from selfsup.memory_format import match_optimizer_state, resolve_memory_format, set_memory_format
from selfsup.methods.compiled import compile_step
from selfsup.methods.device_views import DeviceViews, check_local_crops
from selfsup.methods.ema import frozen_copy, momentum_update
from selfsup.models.backbones import build_backbone
from selfsup.optim import build_optimizer, param_groups
from selfsup.schedules import (StepValues, fit_phases, fitted_line, micro_batch, momentum_cosine, scaled_lr,
                                step_seed, warmup_cosine)
from selfsup.step import StepOutput


@dataclass
class DataInfo:
    """What a method needs to know of its data: channels, model input size, normalisation."""

    channels: int
    image_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    num_classes: int = 0  # 0: unlabelled data
    # a user's own network (``selfsup.method``): the method's backbone in place of ``model.backbone``; it must
    # map (B, C, S, S) images to (B, num_features) and carry ``num_features``
    backbone: nn.Module | None = None


class NonFiniteLoss(UserError):
    """The loss became NaN or Inf: training stops and the last checkpoint stays as it was (the engine names it)."""


class TrainingCollapsed(UserError):
    """The representation collapsed so far that the loss cannot be computed (W-MSE: a sub-batch's covariance no
    longer positive definite): training stops, the last checkpoint stays as it was (the engine names it)."""


class FiniteLossWatch:
    """Watches the loss for NaN / Inf without reading it back to the host each step: ``observe`` keeps
    the first non-finite step and value on the loss's device; ``check`` reads them (one host sync) and
    stops training with ``NonFiniteLoss`` naming that step."""

    def __init__(self) -> None:
        self.step: Tensor | None = None  # int64, -1 while every loss seen was finite
        self.value: Tensor | None = None

    def observe(self, loss: Tensor, step: int) -> None:
        loss = loss.detach().float()
        if self.step is None or self.step.device != loss.device:
            self.step = torch.full((), -1, dtype=torch.long, device=loss.device)
            self.value = torch.zeros((), device=loss.device)
        first = ~torch.isfinite(loss) & (self.step < 0)
        self.step = torch.where(first, torch.full_like(self.step, step), self.step)
        self.value = torch.where(first, loss, self.value)

    def check(self) -> None:
        if self.step is not None and int(self.step) >= 0:
            raise NonFiniteLoss(
                f"the loss became {float(self.value)} at step {int(self.step)}; training stopped without "
                "writing a checkpoint. Lower optim.base_lr, add warmup, or set trainer.gradient_clip_val")


def has_batch_statistics(module: nn.Module) -> bool:
    """Whether ``module`` normalises with batch statistics (BatchNorm / SyncBatchNorm anywhere inside)."""
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in module.modules())


def encode_views(encoder: nn.Module, views: list[Tensor], per_view_batch_norm: bool = True) -> list[Tensor]:
    """``[encoder(v) for v in views]``, computed in one call per run of consecutive views of equal shape
    (DINO's MultiCropWrapper, utils.py:594-629: the global crops in one call, the local crops in another)
    when ``encoder`` has no batch statistics (the ViT: LayerNorm only), where that gives the same per-sample
    outputs with larger, faster matrix products (stochastic depth then draws its per-sample masks in one
    call: the same distribution). With BatchNorm each view keeps its own statistics, as the official
    two-view codes forward each view separately, unless ``per_view_batch_norm`` is False (DINO's wrapper
    concatenates the crops of a resolution whatever the backbone)."""
    if len(views) == 1 or (per_view_batch_norm and has_batch_statistics(encoder)):
        return [encoder(v) for v in views]
    out, first = [], 0
    for i in range(1, len(views) + 1):
        if i == len(views) or views[i].shape[1:] != views[first].shape[1:]:
            run = views[first:i]
            out += list(encoder(torch.cat(run)).split([v.shape[0] for v in run])) if len(run) > 1 else [encoder(run[0])]
            first = i
    return out


def multicrop_mean(two_view: Tensor, local_terms: list[Tensor], two_view_terms: int = 2) -> Tensor:
    """The loss with local-crop pair terms (SwAV-style multi-crop): ``two_view`` is the two-view loss, a sum of
    ``two_view_terms`` pair terms; the result is the mean over all pair terms times ``two_view_terms``, so its
    scale is the two-view loss's (and it is that loss when there is no local term)."""
    if not local_terms:
        return two_view
    return (two_view + sum(local_terms)) * (two_view_terms / (two_view_terms + len(local_terms)))


def backbone_kwargs(cfg, info: DataInfo) -> dict:
    """The keyword arguments of ``build_backbone`` for this run (also stored with an exported backbone)."""
    m = cfg.model
    return dict(in_chans=info.channels, image_size=info.image_size, patch_size=m.patch_size,
                drop_path_rate=m.drop_path_rate, pool=m.pool, stop_grad_conv1=m.stop_grad_conv1,
                small_stem=m.small_stem, **({"layer_scale": m.layer_scale} if m.layer_scale else {}),
                **({"pos_embed": m.pos_embed} if m.pos_embed != "sincos" else {}),
                **({"final_norm": False} if not m.final_norm else {}),
                **({"init": m.init} if m.init != "moco_v3" else {}),
                **({"registers": m.registers} if m.registers else {}), **({"ffn": m.ffn} if m.ffn != "mlp" else {}),
                **({"drop_path_uniform": True} if m.drop_path_uniform else {}),
                **({"class_token": False} if not m.class_token else {}),
                **({"zero_init_residual": True} if m.zero_init_residual else {}))


class TrainingBase(pl.LightningModule):
    """The training plumbing every method family shares; a family subclasses it and declares:

    - ``trainable()``: the modules the optimiser trains, by name (``predictor`` gets its lr multiplier);
    - ``uses_momentum``: its momentum targets follow ``method.momentum`` / ``method.momentum_schedule``
      (set per step in ``self.momentum``, logged as ``train/momentum``);
    - ``post_step_hooks``: callables run right after each optimiser step, in order (DirectPred's predictor,
      the flow EMA), before Lightning's callbacks see the step, so a step checkpoint holds their state;
    - ``forward_step(batch)``: the family's step forward on a transferred batch, a ``StepOutput``.

    ``schedule(step, epoch)`` gives each optimiser step's ``StepValues`` (a pure function of the step, the
    epoch, the config and the run's length); ``on_train_batch_start`` applies them, and the training step logs
    them with the loss and the step's own scalars.

    Per-step values leave the device only at Lightning's logging steps (every ``trainer.log_every_n_steps``),
    in one copy, so the steps between run without a host-device sync: on a GPU, ``self.log`` of a Python
    float copies it to the device, and a progress-bar tensor is read back at every batch end; both wait for
    the queued step. The loss is watched for NaN / Inf on the device (``FiniteLossWatch``) and checked
    at those logging steps, before every checkpoint and at the end of training, so a bad step never reaches
    a checkpoint or an export. Checkpoints carry the global RNG state (CPU and CUDA), so a resumed run
    continues bit for bit. A family that adds to the checkpoint hooks extends them with ``super()``.
    """

    Config: ClassVar[type]
    family: ClassVar[str]
    uses_momentum: ClassVar[bool] = False
    # What the collapse alarm (instruments/collapse.py) suggests when this method's representation collapses.
    collapse_remedy: ClassVar[str] = "lower optim.base_lr or lengthen optim.warmup_epochs"
    scales_min_lr: ClassVar[bool] = True  # the official final lr scales with the batch as the peak (Barlow Twins)
    # the names of the extras its ``schedule`` returns (``StepValues.extras``), each set as the attribute of that name
    # before every step; the hook refuses any other (DINO: teacher_temp; iBOT: and teacher_patch_temp)
    schedule_extras: ClassVar[tuple[str, ...]] = ()
    step_forward: ClassVar[str | None] = "forward_views"  # the method trainer.compile compiles whole (compile_step)
    progress_bar: ClassVar[tuple[str, ...]] = ("train/loss",)  # the logged values the progress bar shows
    # the heads (child names, in order after the backbone) whose output the loss normalises with a gradient: the
    # "loss-side embedding" of the embedding-norm paper (its norm slows learning as 1/‖z‖); () where none is
    loss_embedding: ClassVar[tuple[str, ...]] = ()
    # what the backbone was started from (``model.weights``: ``weights.StartFacts.as_dict``; run.json's ``weights``),
    # set by the builder (``methods.build.start_from_weights``); None: a random init
    start_weights: dict | None = None
    # the batch path to the step's views (a joint-embedding method's; ``runs.data`` reads its crops); None: the
    # method takes whole images (the flow family)
    device_views: DeviceViews | None = None

    def __init__(self, cfg, info: DataInfo):
        super().__init__()
        self.cfg, self.info = cfg, info
        self.lr = 0.0  # this step's scheduled lr (set per iteration by on_train_batch_start, as step_values)
        self.max_lr = 0.0  # the largest scheduled lr of this session's steps
        self.phases_fitted: list[dict] = []  # schedule phases shortened to fit the run (schedules.fit_phases)
        # this step's EMA weight 1 − m on the device (0-d, not checkpointed: set before every step with self.momentum)
        self.register_buffer("ema_weight", torch.zeros(()), persistent=False)
        self.momentum = cfg.method.momentum if self.uses_momentum else 0.0
        self.step_values = StepValues(0.0, 0.0, momentum=self.momentum if self.uses_momentum else None)
        self.total_steps, self.steps_per_epoch, self.max_epochs = 1, 1, 1  # the run's length (on_fit_start)
        self.finite_watch = FiniteLossWatch()
        self.post_step_hooks: list[Callable[[], None]] = []
        self.momentum_pairs: list[tuple[nn.Module, nn.Module]] = []  # (online, EMA target)
        # trained networks that do not train (``methods.frozen.FrozenNetwork``: a distillation teacher, REPA's
        # encoder), held outside the module tree: their facts in run.json, their sha256 in each checkpoint
        self.frozen_networks: list = []
        self._ema_params: tuple[list[Tensor], list[Tensor]] | None = None
        self._generator: torch.Generator | None = None

    # ----------------------------------------------------------------- declared by a family or method
    def trainable(self) -> dict[str, nn.Module]:
        """The modules the optimiser trains, by name."""
        raise NotImplementedError(f"{type(self).__name__} must declare trainable(): the modules its optimiser trains")

    @property
    def run_facts(self) -> dict:
        """What ``run.json`` records of the model's start: ``weights`` (``model.weights``'s facts) and each frozen
        network's facts under its name (a distillation ``teacher``, REPA's ``encoder``)."""
        facts = {"weights": self.start_weights} if self.start_weights is not None else {}
        return {**facts, **{net.name: net.facts for net in self.frozen_networks}}

    @property
    def eval_backbone(self) -> nn.Module:
        """The backbone that is evaluated: exported, the end-of-run kNN (``runs.finish``), the kNN monitor, the online
        probe, RankMe (the joint family: the online backbone, DINO's teacher; the flow family: its ``FlowEncoder``)."""
        raise NotImplementedError(f"{type(self).__name__} must declare eval_backbone: the backbone it is judged by")

    def momentum_target(self, online: nn.Module) -> nn.Module:
        """A frozen copy of ``online`` that ``update_momentum_encoder`` keeps as its EMA."""
        target = frozen_copy(online)
        self.momentum_pairs.append((online, target))
        return target

    def step_modules(self) -> dict[str, nn.Module]:
        """The modules of the step: the trainable ones and the EMA targets (``trainer.compile``, memory format)."""
        targets = [t for _, t in self.momentum_pairs]
        return {**self.trainable(), **{n: c for n, c in self.named_children() if any(c is t for t in targets)}}

    # ----------------------------------------------------------------- EMA
    @property
    def momentum(self) -> float:
        """This step's EMA momentum m (a host float, logged); setting it sets ``ema_weight`` to 1 − m."""
        return self._momentum

    @momentum.setter
    def momentum(self, m: float) -> None:
        self._momentum = m
        self.ema_weight.fill_(1.0 - m)

    def update_momentum_encoder(self) -> None:
        """``ema_step`` with this step's momentum from inside the training step, once per optimiser step. It
        reads ``ema_weight``, the device copy of 1 − ``self.momentum``, which ``on_train_batch_start`` sets to 0
        on the later micro-batches of an accumulated step (a lerp by 0 leaves the targets as they are): no
        Python branch and no per-step constant in the step, so a compiled step neither recompiles for each new
        m nor reads it back."""
        self.ema_step(self.ema_weight)

    def ema_step(self, m: float | Tensor) -> None:
        """``target ← m · target + (1 − m) · online`` for every momentum target (``m`` a float, or the weight
        1 − m as a device tensor: ``momentum_update``; a post-step hook calls this:
        it runs once per optimiser step by construction), parameter by parameter of the same name in both
        (iBOT's EMA over the names the student and teacher share, main_ibot.py:380-390; a copy shares all)."""
        if not self.momentum_pairs:
            return
        if self._ema_params is None:  # gathered once (on_fit_start: after any strategy wrapping), else here
            self._ema_params = self.ema_params()
        momentum_update(*self._ema_params, m)

    def ema_params(self) -> tuple[list[Tensor], list[Tensor]]:
        """The (online, target) parameter lists of every momentum pair, matched by name (in order where a
        wrapper changed the names)."""
        online, target = [], []
        for o, t in self.momentum_pairs:
            shadow = dict(t.named_parameters())
            common = [(p, shadow[n]) for n, p in o.named_parameters() if n in shadow]
            for p, q in common or zip(o.parameters(), t.parameters()):
                online.append(p)
                target.append(q)
        return online, target

    # ----------------------------------------------------------------- the step's random numbers
    def rng(self, device) -> torch.Generator:
        """The step's generator (seeded per step and process by ``seed_step``; a fixed seed outside fit)."""
        if self._generator is None or self._generator.device != torch.device(device):
            self._generator = torch.Generator(device=device).manual_seed(self.cfg.trainer.seed)
        return self._generator

    def seed_step(self, device) -> torch.Generator:
        """Seed the step's generator with ``step_seed(trainer, seed, world_size, rank)``: per step, micro-batch and
        process."""
        rank, size = world()
        return self.rng(device).manual_seed(step_seed(self.trainer, self.cfg.trainer.seed, size, rank))

    # ----------------------------------------------------------------- schedules
    @property
    def global_batch_size(self) -> int:
        """Samples per optimiser step, all processes: data.batch_size × trainer.accumulate_grad_batches (lr scaling)."""
        return self.cfg.data.batch_size * self.cfg.trainer.accumulate_grad_batches

    def on_fit_start(self) -> None:
        self._ema_params = self.ema_params() if self.momentum_pairs else None  # after the strategy's wrapping
        if self.cfg.trainer.compile:  # across processes the step's collectives may split its graph: allowed there
            compile_step(self, self.cfg.trainer.compile_backend, self.cfg.trainer.compile_mode,
                         fullgraph=world()[1] == 1)
        t = self.trainer
        if self.cfg.trainer.max_steps:  # the run's length in steps; Lightning runs epochs until the stop at it
            t.fit_loop.setup_data()
            self.total_steps = self.cfg.trainer.max_steps
            self.steps_per_epoch = max(-(-int(t.num_training_batches) // t.accumulate_grad_batches), 1)
        else:
            self.total_steps = max(int(t.estimated_stepping_batches), 1)
            self.steps_per_epoch = max(self.total_steps // t.max_epochs, 1)
        self.max_epochs = t.max_epochs
        if t.log_every_n_steps > self.total_steps:  # a run shorter than the logging interval logs every step
            t.log_every_n_steps = 1
        # a warm-up (any schedule phase) as long as the run is shortened, said once; runs/finish.py records it
        cfg = copy.deepcopy(self.cfg)  # the run's config object stays as given (config.yaml, a claim's other arms)
        self.phases_fitted = fit_phases(cfg, self.total_steps, getattr(self, "epoch_steps", self.steps_per_epoch))
        if self.phases_fitted:
            self.cfg = cfg
        if t.is_global_zero:
            for record in self.phases_fitted:
                print(fitted_line(record))  # on stdout, as the instruments' lines: stderr is for errors

    def final_lr(self) -> float:
        """The lr the cosine ends at: ``optim.min_lr`` scaled by ``optim.lr_scaling`` as the peak where the method's
        official code scales it (``scales_min_lr``; Barlow Twins' end lr is 0.001 × the scaled peak), as given
        where it does not (DINO, iBOT, MAE); ``optim.scale_min_lr`` true / false overrides the method's rule."""
        o = self.cfg.optim
        scale = self.scales_min_lr if o.scale_min_lr is None else o.scale_min_lr
        return scaled_lr(o.min_lr, self.global_batch_size, o.lr_scaling) if scale else o.min_lr

    def peak_lr(self) -> float:
        """``optim.base_lr`` scaled by ``optim.lr_scaling`` to the global batch (``scaled_lr``)."""
        o = self.cfg.optim
        return scaled_lr(o.base_lr, self.global_batch_size, o.lr_scaling)

    def warmup_steps(self) -> int:
        """``optim.warmup_epochs`` in optimiser steps (rounded)."""
        return int(round(self.cfg.optim.warmup_epochs * self.steps_per_epoch))

    def scheduled_lr(self, step: int) -> float:
        """Warmup then cosine from the peak (``peak_lr``) to ``final_lr``, at each iteration
        (``optim.lr_schedule_unit=iteration``: MoCo v3's ``adjust_learning_rate`` at the fractional epoch, MAE's
        util/lr_sched.py) or at each epoch's start (``epoch``: SimSiam's main_simsiam.py ``adjust_learning_rate``,
        called once per epoch with ``epoch / epochs``)."""
        o, spe = self.cfg.optim, self.steps_per_epoch
        peak, final = self.peak_lr(), self.final_lr()
        if o.lr_schedule_unit == "epoch":
            return warmup_cosine(step // spe, max(self.total_steps // spe, 1), o.warmup_epochs, peak, final)
        return warmup_cosine(step, self.total_steps, self.warmup_steps(), peak, final)

    def schedule(self, step: int, epoch: int) -> StepValues:
        """The values of optimiser step ``step`` (0-based, of ``total_steps``) in epoch ``epoch``: ``scheduled_lr``
        (``fixed_lr`` groups: the peak) and, where ``uses_momentum``, the momentum: MoCo v3's cosine ramp
        ``1 − (1 − m0) · ½ (1 + cos(π step / total))`` (BYOL's τ) or constant. Pure: no trainer is read."""
        m = None
        if self.uses_momentum:
            c = self.cfg.method
            m = momentum_cosine(step, self.total_steps, c.momentum) if c.momentum_schedule == "cosine" else c.momentum
        return StepValues(self.scheduled_lr(step), self.peak_lr(), momentum=m)

    def on_train_batch_start(self, batch, batch_idx: int) -> None:
        """Applies this step's ``schedule``: each parameter group's lr (× its ``lr_scale``; ``fixed_lr`` groups the
        peak; the ``frozen`` groups 0) and, where given, weight decay (the ``decayed`` groups), the momentum
        (``self.momentum`` and the in-step EMA weight) and the method's extras (attributes of their names), each
        one its class declares in ``schedule_extras`` (another is an internal error naming the method and the key)."""
        v = self.schedule(self.trainer.global_step, self.current_epoch)
        for group in self.trainer.optimizers[0].param_groups:
            group["lr"] = (v.peak_lr if group["fixed_lr"] else v.lr) * group["lr_scale"]
            if group.get("name") in v.frozen:
                group["lr"] = 0.0
            if v.weight_decay is not None and group["decayed"]:
                group["weight_decay"] = v.weight_decay
        if v.momentum is not None:
            self.momentum = v.momentum
        for name, value in v.extras.items():
            if name not in self.schedule_extras:
                raise RuntimeError(f"{type(self).__name__}.schedule returned the extra {name!r}, which "
                                   f"{type(self).__name__}.schedule_extras {self.schedule_extras} does not declare")
            setattr(self, name, value)
        # the in-step EMA acts at an optimiser step's first micro-batch only
        self.ema_weight.fill_(0.0 if micro_batch(self.trainer) else 1.0 - self.momentum)
        self.lr, self.step_values = v.lr, v
        self.max_lr = max(self.max_lr, v.lr)  # a host float: whether the lr ever left 0 (runs/learning.py)

    # ----------------------------------------------------------------- optimiser
    def optimizer_step(self, *args, **kwargs) -> None:
        """The optimiser step, then every post-step hook (before the callbacks: part of the step checkpoint)."""
        super().optimizer_step(*args, **kwargs)
        for hook in self.post_step_hooks:
            hook()

    def configure_optimizers(self):
        """The optimiser over ``param_groups``; each group is marked ``decayed`` (the groups a scheduled weight
        decay is written to: DINO's param_groups[0], main_dino.py:309-312; with ``optim.decay_1d: false`` the
        biases and 1-D tensors keep none)."""
        o, t = self.cfg.optim, self.cfg.trainer
        if o.fused and t.precision.startswith("16") and t.gradient_clip_val:  # fp16 clipping needs unscaled grads
            o = dataclasses.replace(o, fused=False)
        optimizer = build_optimizer(param_groups(self.trainable(), o), o)
        for group in optimizer.param_groups:
            group["decayed"] = o.decay_1d or any(p.ndim > 1 for p in group["params"])
        return optimizer

    # ----------------------------------------------------------------- the step
    def forward_step(self, batch) -> StepOutput:
        """The family's step forward on a transferred batch (``SSLMethod``: ``forward_views``; flow:
        ``forward_flow``)."""
        raise NotImplementedError

    def training_step(self, batch, batch_idx: int):
        """``forward_step``, then ``log_step`` of the loss, this step's ``step_values`` and the step's own
        scalars; returns Lightning's ``{"loss", "step"}``: the loss with its graph and the ``StepOutput``
        (its loss detached, the batch's labels added) that callbacks read. The frozen networks are placed on the
        step's device first (outside the compiled step)."""
        for net in self.frozen_networks:
            net.place(self.device)
        out = self.forward_step(batch)
        v, loss = self.step_values, out.loss
        values = {"train/loss": loss, "train/lr": v.lr}
        if v.weight_decay is not None:
            values["train/wd"] = v.weight_decay
        if v.momentum is not None:
            values["train/momentum"] = v.momentum
        values.update({f"train/{name}": value for name, value in {**v.extras, **out.scalars}.items()})
        self.log_step(loss, values, prog_bar=self.progress_bar)
        out.loss, out.labels = loss.detach(), batch[1]
        return {"loss": loss, "step": out}

    # ----------------------------------------------------------------- logging steps only
    def log_step(self, loss: Tensor, values: dict, prog_bar: tuple[str, ...] = ("train/loss",)) -> None:
        """Observe ``loss``; at a logging step, check it and log ``values`` (tensors or floats)."""
        t = self.trainer
        self.finite_watch.observe(loss, t.global_step)
        if t.log_every_n_steps == 0 or ((t.global_step + 1) % t.log_every_n_steps and not t.should_stop):
            return
        self.finite_watch.check()
        tensors = [k for k, v in values.items() if isinstance(v, Tensor)]
        host = (dict(zip(tensors, torch.stack([values[k].detach().float().reshape(()) for k in tensors]).cpu()))
                if tensors else {})  # one device-to-host copy for all of them; floats stay on the host
        for name, value in values.items():
            self.log(name, host[name] if name in host else torch.tensor(float(value)), prog_bar=name in prog_bar,
                     on_step=True, on_epoch=False)

    def on_train_end(self) -> None:
        self.finite_watch.check()

    # ----------------------------------------------------------------- checkpoints
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """The loss check (raising here leaves the previous checkpoint file as it was), then the RNG state and each
        frozen network's sha256."""
        self.finite_watch.check()
        checkpoint["rng_state"] = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            checkpoint["rng_state"]["cuda"] = torch.cuda.get_rng_state_all()
        for net in self.frozen_networks:
            checkpoint[net.checkpoint_key] = net.sha256

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Each frozen network checked against the checkpoint's (another is one line), then the RNG state."""
        for net in self.frozen_networks:
            net.check(checkpoint.get(net.checkpoint_key))
        state = checkpoint.get("rng_state")
        if state:
            torch.set_rng_state(state["torch"])
            if "cuda" in state and torch.cuda.is_available():
                torch.cuda.set_rng_state_all(state["cuda"])


class SSLMethod(TrainingBase):
    """Base of the joint-embedding methods. Subclasses set ``Config`` and ``recipe``, declare ``trainable()``
    and write ``forward_views``."""

    family = "joint"
    recipe: str = "moco_v3"
    eval_backbone_name: str = "backbone"  # the child evaluated, exported and read by the instruments (DINO: teacher)
    reads_labels: ClassVar[bool] = False  # forward_views takes the batch's labels (NNCLR's label-agreement sign)

    @property
    def eval_backbone(self) -> nn.Module:
        """The backbone that is evaluated, exported and measured (the online one; DINO's teacher)."""
        return getattr(self, self.eval_backbone_name)

    # ----------------------------------------------------------------- the family's answers to the registry
    @classmethod
    def data_info(cls, cfg, dataset) -> DataInfo:
        """Channels, model input size (data.image_size, else the data's own), normalisation, classes."""
        image_size = cfg.data.image_size or dataset.image_size
        return DataInfo(dataset.channels, image_size, tuple(dataset.mean), tuple(dataset.std), dataset.num_classes)

    @classmethod
    def backbone_meta(cls, cfg, info: DataInfo) -> dict:
        """How to rebuild the backbone (stored in the exported file; the builder adds the method name)."""
        return {"backbone": cfg.model.backbone, "kwargs": backbone_kwargs(cfg, info), "image_size": info.image_size,
                "in_chans": info.channels, "mean": list(info.mean), "std": list(info.std), "dataset": cfg.data.name}

    @classmethod
    def backbone_state(cls, state_dict: dict) -> dict:
        """A checkpoint's evaluated backbone (``backbone.*``; DINO: ``teacher_backbone.*``) under the exported
        backbone's keys."""
        prefix = f"{cls.eval_backbone_name}."
        return {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}

    def __init__(self, cfg, info: DataInfo):
        super().__init__(cfg, info)
        try:
            self.backbone = info.backbone if info.backbone is not None else build_backbone(
                cfg.model.backbone, **backbone_kwargs(cfg, info))
        except ValueError as e:
            raise UserError(f"model: {e}") from None
        plan = build_view_plan(cfg.augment, self.recipe, info.image_size)
        check_local_crops(plan, getattr(self.backbone, "patch_size", None), not cfg.augment.local_crops_size)
        self.device_views = DeviceViews(plan, info)
        self.augment = self.device_views.augment  # a child module (the normalisation's buffers follow the device)
        self.memory_format = torch.contiguous_format  # of the convolutions and views (trainer.memory_format, setup)

    # ----------------------------------------------------------------- to write in a method
    def forward_views(self, views: list[Tensor]) -> StepOutput:
        """Views → the step's ``StepOutput`` (the loss, detached tensors for the instruments, own scalars)."""
        raise NotImplementedError

    def project_pair(self, views: list[Tensor], normalize: bool = False) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Two views through the backbone (one call when it has no BatchNorm) and the ``projector`` (its BatchNorm:
        per-view statistics), L2-normalised where ``normalize`` (``method.normalize_embeddings``), then GradScale:
        ``h1, h2, z1, z2`` (Barlow Twins, VICReg)."""
        h1, h2 = encode_views(self.backbone, views)
        z1, z2 = self.projector(h1), self.projector(h2)
        if normalize:
            z1, z2 = F.normalize(z1, dim=1), F.normalize(z2, dim=1)
        return h1, h2, self.grad_scale(z1), self.grad_scale(z2)

    def predict_views(self, views: list[Tensor]) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
        """The in-step EMA of the momentum targets (``update_momentum_encoder``, this step's momentum), then every view
        through the online branch: ``h`` = backbone (one call per resolution when it has no BatchNorm), ``z`` =
        projector(h), ``p`` = GradScale(predictor(z)) (MoCo v3's queries, BYOL's predictions)."""
        self.update_momentum_encoder()
        h = encode_views(self.backbone, views)
        z = [self.projector(x) for x in h]
        return h, z, [self.grad_scale(self.predictor(x)) for x in z]

    def step_draws(self, views: list[Tensor]) -> dict[str, Tensor]:
        """The step's other random tensors, drawn from the step's generator after the augmentation's draws (MAE's
        mask noise, iBOT's masks), as keyword arguments of ``forward_views``: drawn before it, so the compiled
        step holds no generator (``trainer.compile``); none by default."""
        return {}

    def grad_scale(self, z: Tensor) -> Tensor:
        """GradScale (``interventions.grad_scale_p``; identity when 0): see selfsup.interventions for its place."""
        return grad_scale(z, self.cfg.interventions.grad_scale_p)

    # ----------------------------------------------------------------- memory format
    def use_memory_format(self, memory_format: torch.memory_format) -> None:
        """Convolution weights (online and momentum modules) and from now on the views in ``memory_format``."""
        self.memory_format = memory_format
        for module in self.step_modules().values():
            set_memory_format(module, memory_format)

    def setup(self, stage: str) -> None:
        """``trainer.memory_format`` for this backbone and device, applied before the strategy moves and wraps
        the model (DDP's gradient buckets follow the parameters' strides) and before the optimiser is built."""
        if stage == "fit":  # a user's DataLoader given to fit (Lightning iterates it once loaded): PIL images stacked
            adopt_pil_collate(getattr(getattr(self.trainer.fit_loop, "_data_source", None), "instance", None))
            self.use_memory_format(resolve_memory_format(self.cfg.trainer.memory_format, self.backbone,
                                                         self.trainer.strategy.root_device))

    def on_train_start(self) -> None:
        """Optimiser state resumed from a checkpoint written in the other memory format takes its parameters'
        strides."""
        for optimizer in self.trainer.optimizers:
            match_optimizer_state(optimizer)


    # ----------------------------------------------------------------- the step
    def on_before_batch_transfer(self, batch, dataloader_idx: int):
        """``data.decode=device``: the workers' bytes decoded and cropped on this module's device; any other batch
        collated (``DeviceViews.decode``)."""
        return self.device_views.decode(batch, self._trainer, self.device)

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        """Augment on the device: per-sample random views from the step's generator (``seed_step``), in the
        method's memory format (``DeviceViews.views``)."""
        if self.trainer is None or not self.trainer.training:
            return batch
        return self.device_views.views(batch, self.seed_step, self.memory_format)

    def forward_step(self, batch) -> StepOutput:
        """``forward_views`` of the augmented views, with the step's draws (and the labels where ``reads_labels``)."""
        views, labels = batch
        inputs = self.step_draws(views)
        if self.reads_labels:
            inputs["labels"] = labels if isinstance(labels, Tensor) else None
        return self.forward_views(views, **inputs)
