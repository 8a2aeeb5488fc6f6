"""The flow-matching methods as LightningModules: plain flow matching, Self-Flow, REPA.

Each keeps the student SiT, an EMA copy (a momentum target of the shared training base: the sampling
model; Self-Flow's teacher), and a method head. A batch is images (uint8 → [−1, 1], or float latents as
they are) fitted to the model's size; the step draws noise, timesteps and masks from the base's generator
seeded by (seed, step, rank). The EMA update is a post-step hook, so a step checkpoint holds it. The run's
``backbone`` is the EMA model as a feature extractor (``models.sit.FlowEncoder``, exported as
``flow_encoder``). ``FlowMatching`` is the concrete plain method and the family's base: it answers the
registry's questions (``data_info``, ``backbone_meta``, ``backbone_state``) for ``SelfFlow`` and ``Repa`` too.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from selfsup.errors import UserError
from selfsup.export import read_meta
from selfsup.flow.objective import (RepaProjector, SimpleHead, alignment_loss, noise_level_buckets,
                                    per_token_flow_loss, repa_loss, self_flow_levels, token_mask)
from selfsup.flow.path import T_SAMPLINGS, interpolate, sample_t, velocity_target
from selfsup.methods.base import DataInfo, TrainingBase
from selfsup.methods.frozen import FrozenNetwork
from selfsup.models.sit import FITS, FLOW_ENCODER, SIT_SIZES, FlowEncoder, SiT, fit_images
from selfsup.schedules import StepValues, linear_ramp
from selfsup.step import StepOutput
from selfsup.weights import build_from_weights


def default_block(depth: int, fraction: float) -> int:
    """About ``fraction`` of the depth, counted from 1 (0.3 → 8 and 0.7 → 20 for depth 28)."""
    return min(max(int(round(fraction * depth)), 1), depth)


@dataclass
class FlowConfig:
    """The SiT, the path and the EMA: plain flow matching's config, and the base of every flow method's."""

    size: str = "tiny"  # micro | tiny | S | B | L | XL (hidden, depth, heads of SiT-S..XL)
    patch_size: int = 2
    hidden: int | None = None  # overrides of the size's hidden width / depth / heads
    depth: int | None = None
    heads: int | None = None
    fit: str = "resize"  # resize | pad: how images reach a data.image_size other than their own
    class_conditional: bool = True  # False: every sample gets the null class
    label_dropout: float = 0.1  # share of labels replaced by the null class (classifier-free guidance)
    t_sampling: str = "uniform"  # uniform | logit_normal
    t_mean: float = 0.0  # logit-normal location and scale
    t_std: float = 1.0
    ema_decay: float = 0.9999
    ema_warmup_steps: int = 0  # > 0: the decay ramps linearly from 0 to ema_decay over these steps
    compile: bool = False  # gone: refused when true (trainer.compile compiles the student, EMA and head in place)
    feature_block: int | None = None  # block (from 1) whose tokens evaluation reads; None: round(0.7 depth)
    feature_t: float = 0.1  # noise level of the evaluated features (0 = clean)
    loss_buckets: int = 4  # flow loss logged per noise-level bucket

    @property
    def model_depth(self) -> int:
        if self.size not in SIT_SIZES:
            raise UserError(f"method.size={self.size!r} is not known; use one of {', '.join(SIT_SIZES)}")
        return self.depth or SIT_SIZES[self.size][1]

    def check_block(self, key: str, value: int | None) -> None:
        if value is not None and not 1 <= value <= self.model_depth:
            raise UserError(f"method.{key}={value} is outside the model's blocks 1..{self.model_depth}")

    def validate(self) -> None:
        if self.compile:
            raise UserError("method.compile is replaced by trainer.compile; "
                            "set trainer.compile=true (and drop method.compile)")
        self.model_depth  # noqa: B018  (checks method.size)
        self.check_block("feature_block", self.feature_block)
        if self.patch_size < 1:
            raise UserError(f"method.patch_size={self.patch_size} must be >= 1")
        if self.fit not in FITS:
            raise UserError(f"method.fit={self.fit!r} is not known; use resize or pad")
        if self.t_sampling not in T_SAMPLINGS:
            raise UserError(f"method.t_sampling={self.t_sampling!r} is not known; use uniform or logit_normal")
        if not 0 <= self.label_dropout <= 1:
            raise UserError(f"method.label_dropout={self.label_dropout} must be in [0, 1]")
        if not 0 <= self.ema_decay <= 1:
            raise UserError(f"method.ema_decay={self.ema_decay} must be in [0, 1]")
        if self.ema_warmup_steps < 0 or self.loss_buckets < 1:
            raise UserError("method.ema_warmup_steps must be >= 0 and method.loss_buckets >= 1")
        if not 0 <= self.feature_t <= 1:
            raise UserError(f"method.feature_t={self.feature_t} must be in [0, 1]")
        if self.t_std <= 0:
            raise UserError(f"method.t_std={self.t_std} must be > 0")

    def eval_block(self) -> int:
        return self.feature_block or default_block(self.model_depth, 0.7)


def check_rep_warmup(steps: int) -> None:
    if steps < 0:
        raise UserError(f"method.rep_warmup_steps={steps} must be >= 0 (0: the full weight from step 0)")


def with_rep_weight(values: StepValues, step: int, c) -> StepValues:
    """Self-Flow's and REPA's schedule: ``values`` plus, where ``method.rep_warmup_steps`` ramps it, the
    representation-loss weight ``rep_weight`` (``method.rep_weight`` linearly from 0 over those optimiser steps;
    logged as ``train/rep_weight``). Without a ramp (the official schedule) the weight is ``method.rep_weight``
    from step 0 and is not scheduled."""
    if not c.rep_warmup_steps:
        return values
    return replace(values, extras={**values.extras, "rep_weight": linear_ramp(step, c.rep_weight, c.rep_warmup_steps)})


@dataclass
class SelfFlowConfig(FlowConfig):
    """Self-Flow: R_M, the student block l, the teacher block k and the weight of 1 − cos."""

    mask_ratio: float = 0.25  # R_M
    student_block: int | None = None  # l; None: round(0.3 depth) (8 for depth 28)
    teacher_block: int | None = None  # k; None: round(0.7 depth) (20 for depth 28)
    rep_weight: float = 0.8
    rep_warmup_steps: int = 0  # > 0: rep_weight ramps linearly from 0 over these steps; 0 (official): full from step 0

    def validate(self) -> None:
        super().validate()
        check_rep_warmup(self.rep_warmup_steps)
        if not 0 <= self.mask_ratio <= 1:
            raise UserError(f"method.mask_ratio={self.mask_ratio} (R_M) must be in [0, 1]")
        self.check_block("student_block", self.student_block)
        self.check_block("teacher_block", self.teacher_block)
        if self.rep_weight < 0:
            raise UserError(f"method.rep_weight={self.rep_weight} must be >= 0")

    def eval_block(self) -> int:
        return self.feature_block or self.teacher_block or default_block(self.model_depth, 0.7)


@dataclass
class RepaConfig(FlowConfig):
    """REPA: the frozen encoder (any ``model.weights`` source of a ViT), block l, MLP width, weight."""

    # required: the frozen ViT encoder, any model.weights source (a selfsup run folder or export, a DINOv2 hub file,
    # timm:<name>); a selfsup export is fed at its own image size, any other source at 224 px (REPA's DINOv2 input)
    encoder: str = ""
    align_block: int | None = None  # l; None: round(0.3 depth) (8 for depth 28, REPA's SiT-XL setting)
    proj_hidden_dim: int = 2048
    rep_weight: float = 0.5
    rep_warmup_steps: int = 0  # > 0: rep_weight ramps linearly from 0 over these steps; 0 (official): full from step 0

    def validate(self) -> None:
        super().validate()
        check_rep_warmup(self.rep_warmup_steps)
        if not self.encoder:
            raise UserError("method.encoder is required for repa: a ViT's weights (a selfsup ViT run folder or "
                            "backbone .safetensors, a DINOv2 hub file, timm:<name>)")
        self.check_block("align_block", self.align_block)
        if self.rep_weight < 0 or self.proj_hidden_dim < 1:
            raise UserError("method.rep_weight must be >= 0 and method.proj_hidden_dim >= 1")


def with_alignment(out: StepOutput, weight: float, rep: Tensor, prediction: Tensor, target: Tensor) -> StepOutput:
    """The flow loss's ``out`` plus ``weight`` × the representation loss ``rep`` (logged as ``train/rep_loss``),
    with the head's tokens and their targets, one row per token, for the instruments' alignment."""
    return replace(out, loss=out.loss + weight * rep, prediction=prediction.detach().flatten(0, 1),
                   target=target.flatten(0, 1), scalars={**out.scalars, "rep_loss": rep.detach()})


def _sit_only(kwargs: dict) -> dict:
    """SiT kwargs with the size name resolved to explicit hidden/depth/heads (stable across size tables)."""
    k = dict(kwargs)
    D, L, H = SIT_SIZES[k.pop("size")]
    k["hidden"], k["depth"], k["heads"] = k["hidden"] or D, k["depth"] or L, k["heads"] or H
    return k


def sit_kwargs(cfg, info: DataInfo) -> dict:
    """The SiT constructor arguments of a run (model size = data.image_size or the data's own)."""
    c = cfg.method
    return dict(input_size=cfg.data.image_size or info.image_size, in_channels=info.channels,
                patch_size=c.patch_size, size=c.size, hidden=c.hidden, depth=c.depth, heads=c.heads,
                num_classes=(info.num_classes or 0) if c.class_conditional else 0)


class FlowMatching(TrainingBase):
    """Plain flow matching (SiT): ``loss = E ||v_θ(x_t, t, y) − (ε − x_0)||²``, t per sample."""

    Config = FlowConfig
    family = "flow"
    # trainer.compile compiles the student, its EMA and the head module by module: forward_flow draws its noise,
    # levels and masks from the step's generator inside, which a whole-step graph cannot hold (yet)
    step_forward = None
    progress_bar = ("train/loss", "train/rep_loss")

    # ------------------------------------------------------------------ the family's answers to the registry
    @classmethod
    def data_info(cls, cfg, dataset) -> DataInfo:
        """The data at its own size, scaled to [−1, 1] (mean = std = 0.5; latents as they are, 0 and 1); the model
        size (data.image_size) is the method's business (``fit_images``)."""
        c = dataset.channels
        latents = dataset.images.dtype != torch.uint8
        mean, std = ((0.0,) * c, (1.0,) * c) if latents else ((0.5,) * c, (0.5,) * c)
        return DataInfo(c, dataset.image_size, mean, std, dataset.num_classes)

    @classmethod
    def backbone_meta(cls, cfg, info: DataInfo) -> dict:
        """The exported ``backbone.safetensors``: the EMA model as a ``FlowEncoder``
        (method name added by the builder)."""
        c = cfg.method
        sit = _sit_only(sit_kwargs(cfg, info))
        return {"backbone": FLOW_ENCODER,
                "kwargs": dict(sit=sit, block=c.eval_block(), t=c.feature_t, fit=c.fit, seed=cfg.trainer.seed),
                "image_size": info.image_size, "in_chans": info.channels, "mean": list(info.mean),
                "std": list(info.std), "dataset": cfg.data.name, "num_classes": sit["num_classes"]}

    @staticmethod
    def backbone_state(state_dict: dict) -> dict:
        """A checkpoint's EMA weights (``ema.*``) as the exported ``FlowEncoder``'s (``model.*``)."""
        return {"model." + k[len("ema."):]: v for k, v in state_dict.items() if k.startswith("ema.")}

    def __init__(self, cfg, info: DataInfo):
        super().__init__(cfg, info)
        c = cfg.method
        if c.class_conditional and not info.num_classes:
            raise UserError(f"data {cfg.data.name!r} ({cfg.data.root or 'default location'}) has no labels; "
                            "add labels or set method.class_conditional=false")
        try:
            self.student = SiT(**sit_kwargs(cfg, info))
        except ValueError as e:
            raise UserError(f"model: {e}") from None
        self.ema = self.momentum_target(self.student)
        self.ema_decay = c.ema_decay
        self.post_step_hooks.append(self.ema_after_step)

    # ------------------------------------------------------------------ the run's feature extractor
    @property
    def backbone(self) -> FlowEncoder:
        """The EMA model's block-k tokens at level ``method.feature_t``, average-pooled."""
        c = self.cfg.method
        return FlowEncoder(self.ema, c.eval_block(), c.feature_t, c.fit, self.cfg.trainer.seed)

    @property
    def eval_backbone(self) -> FlowEncoder:
        """The evaluated backbone: ``backbone`` (exported as ``flow_encoder``)."""
        return self.backbone

    # ------------------------------------------------------------------ data
    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        """uint8 images → [−1, 1] (float latents unchanged), fitted to the model size; labels → y."""
        images, labels = batch
        # noise, t, masks, label dropout: seeded by step and rank
        if self._trainer is not None and self.trainer.training:
            self.seed_step(images.device)
        x = images.float().div_(127.5).sub_(1.0) if images.dtype == torch.uint8 else images.float()
        x = fit_images(x, self.student.input_size, self.cfg.method.fit)
        return x, labels

    def class_labels(self, labels: Tensor) -> Tensor:
        """y with the null class for unconditional runs, unlabelled samples and the label-dropout share."""
        null = self.student.num_classes
        if not self.cfg.method.class_conditional:
            return torch.full_like(labels, null)
        drop = (torch.rand(labels.shape, device=labels.device, generator=self.rng(labels.device))
                < self.cfg.method.label_dropout)
        return torch.where(drop | (labels < 0), null, labels)

    def draw_t(self, n: int, device) -> Tensor:
        c = self.cfg.method
        return sample_t(n, c.t_sampling, c.t_mean, c.t_std, device=device, generator=self.rng(device))

    def draw_noise(self, x0: Tensor) -> Tensor:
        return torch.randn(x0.shape, device=x0.device, dtype=x0.dtype, generator=self.rng(x0.device))

    # ------------------------------------------------------------------ the step
    def forward_step(self, batch) -> StepOutput:
        """``forward_flow`` of the batch, its labels through ``class_labels``."""
        x0, labels = batch
        return self.forward_flow(x0, self.class_labels(labels))

    def flow_output(self, per_token: Tensor, levels: Tensor, h: Tensor) -> StepOutput:
        """The flow loss's StepOutput: the loss (mean of the per-token loss), the block tokens average-pooled as the
        embedding, and the scalars logged as ``train/<name>``: ``flow_loss``, its mean per noise-level bucket (NaN
        when empty) and ``ema_decay`` (the last EMA update's decay: the teacher's and sampling model's)."""
        b, detached = self.cfg.method.loss_buckets, per_token.detach()
        means, _ = noise_level_buckets(detached, levels, b)
        scalars = {"flow_loss": detached.mean(),
                   **{f"flow_loss_t{i / b:.2f}-{(i + 1) / b:.2f}": means[i] for i in range(b)},
                   "ema_decay": self.ema_decay}
        return StepOutput(per_token.mean(), embedding=h.detach().mean(1), scalars=scalars)

    def forward_flow(self, x0: Tensor, y: Tensor) -> StepOutput:
        """Plain flow matching; the eval block's tokens come from the same forward as the loss."""
        noise = self.draw_noise(x0)
        t = self.draw_t(x0.shape[0], x0.device)
        v, (h,) = self.student(interpolate(x0, noise, t), t, y, features=(self.cfg.method.eval_block(),))
        return self.flow_output(per_token_flow_loss(v, velocity_target(x0, noise), self.student.patch_size), t, h)

    # ------------------------------------------------------------------ EMA
    def ema_after_step(self) -> None:
        """The post-step hook: the optimiser steps done, this one included (Lightning counts it on return)."""
        self.update_ema(self.trainer.global_step + 1)

    def update_ema(self, step: int) -> None:
        """EMA after ``step`` optimiser steps: ``ema ← d·ema + (1 − d)·student``, d = ``method.ema_decay`` ramped
        linearly from 0 over ``method.ema_warmup_steps`` (``linear_ramp``; 0: the official fixed decay)."""
        c = self.cfg.method
        self.ema_decay = linear_ramp(step, c.ema_decay, c.ema_warmup_steps)
        self.ema_step(self.ema_decay)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["ema_decay"] = self.ema_decay  # the last update's decay (logged with the next step)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        self.ema_decay = checkpoint.get("ema_decay", self.ema_decay)

    # ------------------------------------------------------------------ optimiser
    def trainable(self) -> dict[str, nn.Module]:
        return {"student": self.student}


class SelfFlow(FlowMatching):
    """Self-Flow: mixed-level student (mask ratio R_M at level s, rest at t), EMA teacher at min(t, s).

    ``loss = flow(student velocity, each token at its own level) + 0.8 · mean(1 − cos(h(student_l), sg(teacher_k)))``.
    """

    Config = SelfFlowConfig
    schedule_extras = ("rep_weight",)  # ramped over method.rep_warmup_steps (with_rep_weight)

    def __init__(self, cfg, info: DataInfo):
        super().__init__(cfg, info)
        c, depth = cfg.method, self.student.depth
        self.l = c.student_block or default_block(depth, 0.3)
        self.k = c.teacher_block or default_block(depth, 0.7)
        self.head = SimpleHead(self.student.hidden)
        self.rep_weight = c.rep_weight  # this step's weight of 1 − cos (a host number: schedule, with_rep_weight)

    def trainable(self) -> dict[str, nn.Module]:
        return {"student": self.student, "head": self.head}

    def schedule(self, step: int, epoch: int) -> StepValues:
        """The family's lr schedule and, where ramped, ``rep_weight`` (``with_rep_weight``)."""
        return with_rep_weight(super().schedule(step, epoch), step, self.cfg.method)

    def forward_flow(self, x0: Tensor, y: Tensor) -> StepOutput:
        c, B, p = self.cfg.method, x0.shape[0], self.student.patch_size
        noise = self.draw_noise(x0)
        t, s = self.draw_t(B, x0.device), self.draw_t(B, x0.device)
        mask = token_mask(B, self.student.num_tokens, c.mask_ratio, device=x0.device, generator=self.rng(x0.device))
        levels, teacher_level = self_flow_levels(t, s, mask)
        # the student's conditioning per level (t, s), gathered to the tokens: the per-token values, fewer FLOPs
        v, (h,) = self.student(interpolate(x0, noise, levels, p), torch.stack([t, s], dim=1), y,
                               features=(self.l,), token_index=mask.long())
        out = self.flow_output(per_token_flow_loss(v, velocity_target(x0, noise), p), levels, h)
        if self.rep_weight == 0:  # no teacher forward, no head: the same loss (flow + 0 · rep), no wasted compute
            return out
        with torch.no_grad():  # the teacher: whole image at min(t, s), the same noise, blocks 1..k only
            target = self.ema.block_tokens(interpolate(x0, noise, teacher_level), teacher_level, y, self.k)
        prediction = self.head(h)
        return with_alignment(out, self.rep_weight, alignment_loss(prediction, target), prediction, target)


# --------------------------------------------------------------------------- REPA's frozen encoder


REPA_SIZE = 224  # the encoder's input size where its source states none (REPA's DINOv2 encoders: 224 px)
REPA_SHA = "repa_encoder_sha256"  # the checkpoint key of the encoder's sha256


def encoder_size(location: str) -> int:
    """A selfsup export's own image size (read from its metadata alone), else ``REPA_SIZE``."""
    path = Path(location).expanduser()
    path = path / "backbone.safetensors" if path.is_dir() else path
    if path.suffix != ".safetensors" or not path.exists():
        return REPA_SIZE
    try:
        return int(read_meta(path)["image_size"])
    except UserError:  # a plain .safetensors: no selfsup metadata
        return REPA_SIZE


class RepaInput(nn.Module):
    """The flow's clean image x₀ ∈ [−1, 1] in the encoder's input normalisation at its size:
    ``((x₀ + 1) / 2 − mean) / std`` resized to ``size``."""

    def __init__(self, mean, std, size: int):
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(std).view(1, -1, 1, 1))
        self.size = size

    def forward(self, x0: Tensor) -> Tensor:
        return fit_images(((x0 + 1) / 2 - self.mean) / self.std, self.size, "resize")


class PatchTokens(nn.Module):
    """The encoder's patch tokens on a ``grid`` × ``grid`` token grid (``patch_tokens``)."""

    def __init__(self, encoder: nn.Module, grid: int):
        super().__init__()
        self.encoder, self.grid = encoder, grid

    def forward(self, x: Tensor) -> Tensor:
        return patch_tokens(self.encoder, x, self.grid)


def load_repa_encoder(location: str, info: DataInfo, grid: int) -> tuple[FrozenNetwork, int]:
    """REPA's frozen encoder, from any ``model.weights`` source (``weights.build_from_weights``), giving its
    clean-image patch tokens on the student's ``grid``; and the tokens' width."""
    size = encoder_size(location)
    encoder, facts, norm = build_from_weights(location, "auto", {}, info.channels, size, "method.encoder",
                                              own_channels=True)
    if facts.kind == "selfsup" and read_meta(Path(facts.path)).get("backbone") == FLOW_ENCODER:
        raise UserError(f"method.encoder={location} is a flow run; "
                        "REPA needs a joint-embedding ViT (moco_v3, byol, ...)")
    mean, std = norm if norm else ((0.0,) * info.channels, (1.0,) * info.channels)  # no statement: [0, 1] pixels
    if len(mean) != info.channels:
        raise UserError(f"method.encoder={location} takes {len(mean)}-channel images but the data has "
                        f"{info.channels}; pretrain the encoder on this dataset")
    try:
        with torch.no_grad():
            probe = encoder.forward_features(torch.zeros(1, len(mean), size, size))
    except AttributeError:
        probe = None
    if probe is None or probe.ndim != 3 or probe.shape[1] - _prefix_tokens(encoder) < 1:
        raise UserError(f"method.encoder={location} gives no patch tokens; use a ViT encoder")
    network = FrozenNetwork(PatchTokens(encoder, grid), facts, RepaInput(mean, std, size), "encoder",
                            "method.encoder", REPA_SHA)
    return network, probe.shape[-1]


def _prefix_tokens(encoder: nn.Module) -> int:
    """Class / register tokens before the patch tokens (timm: num_prefix_tokens; selfsup ViT: 1)."""
    return int(getattr(encoder, "num_prefix_tokens", 1))


def patch_tokens(encoder: nn.Module, x: Tensor, grid: int) -> Tensor:
    """(B, grid², D): the encoder's patch tokens, bilinearly resized from its own token grid to ``grid``."""
    tokens = encoder.forward_features(x)[:, _prefix_tokens(encoder):]
    B, N, D = tokens.shape
    g = int(round(N ** 0.5))
    if g * g != N:
        raise UserError(f"the REPA encoder's {N} patch tokens do not form a square grid")
    if g != grid:
        fmap = tokens.transpose(1, 2).reshape(B, D, g, g)
        tokens = F.interpolate(fmap.float(), size=(grid, grid), mode="bilinear", align_corners=False)
        tokens = tokens.flatten(2).transpose(1, 2)
    return tokens


class Repa(FlowMatching):
    """REPA: ``loss = flow + 0.5 · mean(−cos(mlp(student_l), encoder(x_0) patch tokens)))``, frozen encoder."""

    Config = RepaConfig
    schedule_extras = ("rep_weight",)  # ramped over method.rep_warmup_steps (with_rep_weight)

    def __init__(self, cfg, info: DataInfo):
        super().__init__(cfg, info)
        c = cfg.method
        if cfg.data.name == "latents":
            raise UserError("repa needs pixel images (its encoder sees the clean image); use a pixel dataset")
        self.encoder, dim = load_repa_encoder(c.encoder, info, self.student.grid)
        self.frozen_networks.append(self.encoder)  # outside the module tree, its sha256 in each checkpoint
        self.l = c.align_block or default_block(self.student.depth, 0.3)
        self.projector = RepaProjector(self.student.hidden, c.proj_hidden_dim, dim)
        self.rep_weight = c.rep_weight  # this step's weight of −cos (a host number: schedule, with_rep_weight)

    def trainable(self) -> dict[str, nn.Module]:
        return {"student": self.student, "projector": self.projector}

    def schedule(self, step: int, epoch: int) -> StepValues:
        """The family's lr schedule and, where ramped, ``rep_weight`` (``with_rep_weight``)."""
        return with_rep_weight(super().schedule(step, epoch), step, self.cfg.method)

    def forward_flow(self, x0: Tensor, y: Tensor) -> StepOutput:
        noise = self.draw_noise(x0)
        t = self.draw_t(x0.shape[0], x0.device)
        v, (h,) = self.student(interpolate(x0, noise, t), t, y, features=(self.l,))
        out = self.flow_output(per_token_flow_loss(v, velocity_target(x0, noise), self.student.patch_size), t, h)
        if self.rep_weight == 0:  # no encoder forward, no projector: the same loss without the wasted compute
            return out
        target = self.encoder(x0)  # the frozen encoder's clean-image patch tokens on the student's grid
        prediction = self.projector(h)
        return with_alignment(out, self.rep_weight, repa_loss(prediction, target), prediction, target)

