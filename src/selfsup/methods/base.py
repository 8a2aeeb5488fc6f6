"""The shared plumbing of every method: backbone, batched views, schedules, EMA, optimiser, logging.

A method subclasses ``SSLMethod``, builds its heads in ``__init__`` and writes ``forward_views``:
views in, a dict of named tensors out (``loss`` plus detached embeddings/projections/predictions
that instruments and online evaluators read).
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

import lightning.pytorch as pl
import torch
from torch import Tensor, nn

from selfsup.data.views import AugmentConfig, MultiViewAugment, build_view_plan
from selfsup.distributed import world
from selfsup.errors import UserError
from selfsup.memory_format import images_in, match_optimizer_state, resolve_memory_format, set_memory_format
from selfsup.models.backbones import build_backbone
from selfsup.optim import build_optimizer, param_groups
from selfsup.schedules import momentum_cosine, scaled_lr, warmup_cosine


@dataclass
class DataInfo:
    """What a method needs to know of its data: channels, model input size, normalisation."""

    channels: int
    image_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    num_classes: int = 0  # 0: unlabelled data


class NonFiniteLoss(UserError):
    """The loss became NaN or Inf: training stops and the last good checkpoint stays as it was."""


class FiniteLossWatch:
    """Watches the loss for NaN / Inf without reading it back to the host each step: ``observe`` keeps
    the first non-finite step and value on the loss's device; ``check`` reads them (one host sync) and
    stops training with :class:`NonFiniteLoss` naming that step."""

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
                f"the loss became {float(self.value)} at step {int(self.step)}; training stopped and the last "
                "good checkpoint is kept. Lower optim.base_lr, add warmup, or set trainer.gradient_clip_val")


class LogStepsOnly:
    """Per-step values (loss, lr, momentum, ...) leave the device only at Lightning's logging steps
    (every ``trainer.log_every_n_steps``), in one copy, so the steps between run without a host-device
    sync: on a GPU, ``self.log`` of a Python float copies it to the device, and a progress-bar tensor
    is read back at every batch end; both wait for the queued step. The loss is watched for NaN / Inf
    on the device (:class:`FiniteLossWatch`) and checked at those logging steps, before any checkpoint
    is written and at the end of training, so a bad step never reaches a checkpoint or an export.
    Mixed into every method family's LightningModule."""

    @property
    def finite_watch(self) -> FiniteLossWatch:
        """This module's watch, made at first use (a mixin without an ``__init__`` of its own)."""
        if "_finite_watch" not in self.__dict__:
            self.__dict__["_finite_watch"] = FiniteLossWatch()
        return self.__dict__["_finite_watch"]

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

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        self.finite_watch.check()  # raising here leaves the previous checkpoint file as it was
        super().on_save_checkpoint(checkpoint)

    def on_train_end(self) -> None:
        self.finite_watch.check()


def check_momentum(cfg) -> None:
    """Validate an EMA method's ``momentum`` (in [0, 1]) and ``momentum_schedule`` (cosine | constant)."""
    if not 0 <= cfg.momentum <= 1:
        raise UserError(f"method.momentum={cfg.momentum} must be in [0, 1]")
    if cfg.momentum_schedule not in ("cosine", "constant"):
        raise UserError(f"method.momentum_schedule={cfg.momentum_schedule!r}; use cosine or constant")


def frozen_copy(module: nn.Module) -> nn.Module:
    """A copy of ``module`` that receives no gradient (a momentum / EMA target)."""
    target = copy.deepcopy(module)
    for p in target.parameters():
        p.requires_grad_(False)
    return target


@torch.no_grad()
def momentum_update(online: list[Tensor], target: list[Tensor], m: float) -> None:
    """``target ← m · target + (1 − m) · online`` for each pair of parameters (MoCo / BYOL EMA)."""
    torch._foreach_lerp_(target, online, 1.0 - m)


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


def compile_step_modules(method: nn.Module, backend: str = "inductor") -> None:
    """``torch.compile`` each trainable child of a method in place (``trainer.compile=true``);
    parameter names, and so checkpoints and exports, stay as they are."""
    for name, child in method.named_children():
        if name != "augment":
            child.compile(backend=backend)


def backbone_kwargs(cfg, info: DataInfo) -> dict:
    """The keyword arguments of ``build_backbone`` for this run (also stored with an exported backbone)."""
    m = cfg.model
    return dict(in_chans=info.channels, image_size=info.image_size, patch_size=m.patch_size,
                drop_path_rate=m.drop_path_rate, pool=m.pool, stop_grad_conv1=m.stop_grad_conv1,
                small_stem=m.small_stem, **({"layer_scale": m.layer_scale} if m.layer_scale else {}),
                **({"pos_embed": m.pos_embed} if m.pos_embed != "sincos" else {}),
                **({"init": m.init} if m.init != "moco_v3" else {}),
                **({"zero_init_residual": True} if m.zero_init_residual else {}))


def augment_branches(cfg, default_recipe: str) -> list[AugmentConfig]:
    """The recipe's two branches (the global crops) with the config's overrides applied."""
    return [g.augment for g in build_view_plan(cfg.augment, default_recipe, 0)[:2]]


def knn_report(backbone: nn.Module, init_backbone: nn.Module, cfg, info: DataInfo, train, run_dir) -> list[str]:
    """The weighted kNN (k, T from ``cfg.eval``) on the test split of the trained and of the random-init
    backbone, written to ``run_dir/knn.json``; the lines the engine prints."""
    import json

    from selfsup.data.datasets import load_dataset
    from selfsup.eval.features import extract_features
    from selfsup.eval.knn import knn_accuracy

    test = load_dataset(cfg.data, "test")
    k, temperature = cfg.eval.knn_k, cfg.eval.knn_temperature
    out = {"k": k, "temperature": temperature, "train_size": len(train), "test_size": len(test)}
    for key, model in (("pretrained", backbone), ("random_init", init_backbone)):
        ftr, ytr = extract_features(model, train, info.image_size, info.mean, info.std, cfg.eval.batch_size)
        fte, yte = extract_features(model, test, info.image_size, info.mean, info.std, cfg.eval.batch_size)
        out[key] = knn_accuracy(ftr, ytr, fte, yte, k=k, temperature=temperature)
    (run_dir / "knn.json").write_text(json.dumps(out, indent=2))
    lines = [f"kNN (k={k}, T={temperature}) on {cfg.data.name} test ({len(test)} images):"]
    lines += [f"  {key:<12} top-1 {out[key]['top1']:6.2f}%   top-5 {out[key]['top5']:6.2f}%"
              for key in ("pretrained", "random_init")]
    return lines


class ExactResume:
    """Checkpoints carry the global RNG state (CPU and CUDA) so a resumed run continues bit for bit;
    mixed into every method family's LightningModule."""

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["rng_state"] = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            checkpoint["rng_state"]["cuda"] = torch.cuda.get_rng_state_all()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        state = checkpoint.get("rng_state")
        if state:
            torch.set_rng_state(state["torch"])
            if "cuda" in state and torch.cuda.is_available():
                torch.cuda.set_rng_state_all(state["cuda"])


class SSLMethod(LogStepsOnly, ExactResume, pl.LightningModule):
    """Base of every method. Subclasses set ``Config`` and ``recipe`` and write ``forward_views``."""

    Config: type
    recipe: str = "moco_v3"
    eval_backbone_name: str = "backbone"  # the child evaluated, exported and read by the instruments (DINO: teacher)

    @property
    def eval_backbone(self) -> nn.Module:
        """The backbone that is evaluated, exported and measured (the online one; DINO's teacher)."""
        return getattr(self, self.eval_backbone_name)

    def __init__(self, cfg, info: DataInfo):
        super().__init__()
        self.cfg, self.info = cfg, info
        try:
            self.backbone = build_backbone(cfg.model.backbone, **backbone_kwargs(cfg, info))
        except ValueError as e:
            raise UserError(f"model: {e}") from None
        self.augment = MultiViewAugment.from_plan(build_view_plan(cfg.augment, self.recipe, info.image_size),
                                                  info.image_size, info.mean, info.std)
        self.momentum = getattr(cfg.method, "momentum", 0.0)
        self.lr = 0.0  # set per iteration by on_train_batch_start
        self.total_steps = 1
        self._ema_pairs: list[tuple[nn.Module, nn.Module]] = []
        self._ema_params: tuple[list[Tensor], list[Tensor]] | None = None
        self._generator: torch.Generator | None = None
        self.memory_format = torch.contiguous_format  # of the convolutions and views (trainer.memory_format, setup)

    # ----------------------------------------------------------------- to write in a method
    def forward_views(self, views: list[Tensor]) -> dict[str, Tensor]:
        """Views → {"loss": ..., other named tensors}."""
        raise NotImplementedError

    def momentum_target(self, online: nn.Module) -> nn.Module:
        """A frozen copy of ``online`` that ``update_momentum_encoder`` keeps as its EMA."""
        target = frozen_copy(online)
        self._ema_pairs.append((online, target))
        return target

    def update_momentum_encoder(self) -> None:
        """EMA step of every momentum target with the current coefficient ``self.momentum``."""
        if not self._ema_pairs:
            return
        if self._ema_params is None:  # gathered once, at the first step (after any strategy wrapping)
            self._ema_params = ([p for o, _ in self._ema_pairs for p in o.parameters()],
                                [p for _, t in self._ema_pairs for p in t.parameters()])
        momentum_update(*self._ema_params, self.momentum)

    def grad_scale(self, z: Tensor) -> Tensor:
        """GradScale (``interventions.grad_scale_p``; identity when 0): see selfsup.interventions for its place."""
        from selfsup.interventions import grad_scale

        return grad_scale(z, self.cfg.interventions.grad_scale_p)

    # ----------------------------------------------------------------- schedules
    @property
    def global_batch_size(self) -> int:
        return self.cfg.data.batch_size

    def use_memory_format(self, memory_format: torch.memory_format) -> None:
        """Convolution weights (online and momentum backbones) and from now on the views in ``memory_format``."""
        self.memory_format = memory_format
        for name, child in self.named_children():
            if name != "augment":
                set_memory_format(child, memory_format)

    def setup(self, stage: str) -> None:
        """``trainer.memory_format`` for this backbone and device, applied before the strategy moves and wraps
        the model (DDP's gradient buckets follow the parameters' strides) and before the optimiser is built."""
        if stage == "fit":
            self.use_memory_format(resolve_memory_format(self.cfg.trainer.memory_format, self.backbone,
                                                         self.trainer.strategy.root_device))

    def on_train_start(self) -> None:
        """Optimiser state resumed from a checkpoint written in the other memory format takes its parameters' strides."""
        for optimizer in self.trainer.optimizers:
            match_optimizer_state(optimizer)

    def on_fit_start(self) -> None:
        if self.cfg.trainer.compile:
            compile_step_modules(self, self.cfg.trainer.compile_backend)
        self.total_steps = max(int(self.trainer.estimated_stepping_batches), 1)
        self.steps_per_epoch = max(self.total_steps // self.trainer.max_epochs, 1)

    def on_train_batch_start(self, batch, batch_idx: int) -> None:
        """Per-iteration lr (warmup + cosine, linear scaling) and momentum (cosine ramp or constant)."""
        step, o = self.trainer.global_step, self.cfg.optim
        peak = scaled_lr(o.base_lr, self.global_batch_size, o.lr_scaling)
        final = scaled_lr(o.min_lr, self.global_batch_size, o.lr_scaling)
        lr = warmup_cosine(step, self.total_steps, int(round(o.warmup_epochs * self.steps_per_epoch)), peak, final)
        for group in self.trainer.optimizers[0].param_groups:
            group["lr"] = (peak if group["fixed_lr"] else lr) * group["lr_scale"]
        m = self.cfg.method
        if hasattr(m, "momentum"):
            cosine = getattr(m, "momentum_schedule", "cosine") == "cosine"
            self.momentum = momentum_cosine(step, self.total_steps, m.momentum) if cosine else m.momentum
        self.lr = lr

    # ----------------------------------------------------------------- the step
    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        """Augment on the device: per-sample random views from a generator seeded by (seed, step, rank)."""
        if self.trainer is None or not self.trainer.training:
            return batch
        images, labels = batch
        device = (images[0] if isinstance(images, (list, tuple)) else images).device  # decoded runs of sizes
        if self._generator is None or self._generator.device != device:
            self._generator = torch.Generator(device=device)
        rank, size = world()
        self._generator.manual_seed((self.cfg.trainer.seed * 1_000_003 + self.trainer.global_step) * size + rank)
        views = self.augment(images, self._generator)
        if self.memory_format != torch.contiguous_format:
            views = [images_in(v, self.memory_format) for v in views]
        return views, labels

    def training_step(self, batch, batch_idx: int):
        views, labels = batch
        out = self.forward_views(views)
        loss = out["loss"]
        values = {"train/loss": loss, "train/lr": self.lr}
        if hasattr(self.cfg.method, "momentum"):
            values["train/momentum"] = self.momentum
        self.log_step(loss, values)
        out["labels"] = labels
        return out

    def optimizer_step(self, *args, **kwargs) -> None:
        """The optimiser step, then the predictor's post-step update (running F; DirectPred / DirectCopy)."""
        super().optimizer_step(*args, **kwargs)
        update = getattr(getattr(self, "predictor", None), "after_optimizer_step", None)
        if update is not None:
            update()

    def configure_optimizers(self):
        modules = {name: child for name, child in self.named_children() if name != "augment"}
        o, t = self.cfg.optim, self.cfg.trainer
        if o.fused and t.precision.startswith("16") and t.gradient_clip_val:  # fp16 clipping needs unscaled grads
            o = dataclasses.replace(o, fused=False)
        return build_optimizer(param_groups(modules, o), o)

    # ----------------------------------------------------------------- end of run
    def end_of_run_report(self, train, init_backbone: nn.Module, run_dir) -> list[str]:
        """What the engine prints after fit: :func:`knn_report` of the trained and the random-init backbone."""
        return knn_report(self.eval_backbone, init_backbone, self.cfg, self.info, train, run_dir)
