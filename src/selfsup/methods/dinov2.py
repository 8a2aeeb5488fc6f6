"""DINOv2 (Oquab et al. 2023), as facebookresearch/dinov2 ``dinov2/train/ssl_meta_arch.py`` and ``train/train.py``.

DINO's [CLS] self-distillation (``methods.dino``) and iBOT's masked-patch term (the teacher, centres and targets
they share: ``methods.teacher``), with DINOv2's own choices; per step
(ssl_meta_arch.py:132-346, file:line of the official code throughout; docs/DINOV2.md lists them):

    m = masks of the 2B global crops: half of them masked, ratios stratified over (0.1, 0.5)   # collate.py:20-36
    t_cls, t_patch = teacher_head(teacher_backbone(x_global))[cls], [masked patches only]      # no gradient
    q_cls, q_patch = centre(t_cls), centre(t_patch): DINO's EMA centres, or Sinkhorn-Knopp at τt (3 rounds, over
                     the global batch; the patches' over the masked ones of every process)
    s = backbone(x_global, mask=m), backbone(x_local)                                           # mask token
    L_dino  = Σ over (teacher crop g, student crop v ≠ g) of H(q_cls,g, s_cls,v) / (2 + max(2L, 1))
    L_koleo = 0.1 · Σ over the 2 global crops of KoLeo(student backbone [CLS])
    L_ibot  = Σ over masked patches of H(q_patch, s_patch) / (patches masked in its crop) / 2B
    loss = w_dino · L_dino + L_koleo + w_ibot · L_ibot
    optimiser step (AdamW, layer-wise lr decay, patch-embedding lr × 0.2, the last layers at lr 0 in the first
    epoch, each student module's gradient clipped to norm 3); teacher ← EMA of the student (every module)

Where DINOv2 differs from ``methods.dino`` / ``methods.ibot`` (and how it is reproduced here):

- the heads: DINO's head (weight-normalised last layer whose norm starts at 1 and *trains*: ``norm_last_layer``
  false, dinov2/layers/dino_head.py:22-23) for the [CLS] token and, shared or separate (``ibot_separate_head``), a
  whole second DINOHead for the patches (iBOT's heads share the MLP); the heads run on the [CLS] tokens and the
  masked patch tokens only (the static buffer of ``upperbound`` tokens of ssl_meta_arch.py:169-194, 249-262);
- the loss normalisation: every [CLS] term over ``2 + max(2L, 1)`` (``n_global_crops_loss_terms +
  n_local_crops_loss_terms``, :147-148, :282, :291-304): with local crops DINO's mean over pairs, without them
  2/3 of it; the patch term over the 2B crops (``forward_masked``, :322-334; ``loss_scales · ibot_loss_scale`` = 1);
- one teacher temperature for both terms, warmed up linearly per *iteration* (train.py:84-90), not per epoch;
- the masks (data.masks.dinov2_masks), the patch centre (the mean over the masked patch tokens of each process,
  averaged over the processes; ibot_patch_loss.py:128-151), Sinkhorn-Knopp over the masked patches only;
- the optimiser: per-parameter lr multipliers ``layerwise_decay^(depth + 1 − layer)`` and ×
  ``patch_embed_lr_mult`` on the patch embedding, no weight decay on biases, norms and LayerScale gammas
  (param_groups.py:9-90); the ``last_layer`` parameters at lr 0 (not dropped gradients: AdamW's moments still
  move) during ``freeze_last_layer`` epochs (train.py:97-101, :113-119); clipping by the global norm of each
  student module (backbone, heads; train.py:250-259), not per tensor as DINO;
- the lr rule ``base_lr · sqrt(batch / 1024)`` (``optim.lr_scaling=sqrt_1024`` in the presets; config.py:21-26).

An "epoch" of the official schedules is ``OFFICIAL_EPOCH_LENGTH`` = 1250 iterations whatever the data; here it is a
pass over the data (the same at batch 1024 on ImageNet-1k: 1251 iterations). The official student drops the
residual of a random subset of the batch (``drop_add_residual_stochastic_depth``, its rate above 0.1); here
per-sample stochastic depth (the same expectation).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from selfsup.data.masks import dinov2_masks, dinov2_upperbound
from selfsup.distributed import all_reduce_sum
from selfsup.errors import UserError
from selfsup.losses import dino_cross_entropy, dinov2_patch_loss
from selfsup.methods.base import encode_views
from selfsup.methods.dino import DINOConfig
from selfsup.methods.teacher import (Centres, SelfDistillation, add_mask_token, ema_teacher, require_cls_vit,
                                     teacher_targets)
from selfsup.models.heads import DINOHead
from selfsup.models.vit import VisionTransformer
from selfsup.optim import build_optimizer
from selfsup.schedules import StepValues, dino_cosine
from selfsup.step import StepOutput


@dataclass
class DINOv2Config(DINOConfig):
    """DINOv2 hyper-parameters; defaults are dinov2/configs/ssl_default_config.yaml (file:line in docs/DINOV2.md)."""

    out_dim: int = 65536  # dino.head_n_prototypes
    norm_last_layer: bool = False  # DINOv2's head: the last layer's norm starts at 1 and trains
    momentum: float = 0.992  # teacher.momentum_teacher (cosine to final_momentum_teacher 1)
    teacher_temp: float = 0.07  # τt of both terms after the warm-up
    warmup_teacher_temp: float = 0.04
    warmup_teacher_temp_epochs: int = 30  # linear per iteration
    koleo_loss_weight: float = 0.1  # dino.koleo_loss_weight
    dino_loss_weight: float = 1.0  # dino.loss_weight
    ibot_loss_weight: float = 1.0  # ibot.loss_weight; 0: no masks, no patch term
    mask_sample_probability: float = 0.5  # the share of global crops masked
    mask_ratio_min_max: tuple[float, float] = (0.1, 0.5)  # masked crops' ratios, stratified over this range
    ibot_separate_head: bool = False  # a DINOHead of its own for the patches (true in the ViT-L/g configs)
    ibot_out_dim: int = 65536  # ibot.head_n_prototypes (the separate head's)
    ibot_hidden_dim: int = 2048
    ibot_bottleneck_dim: int = 256
    ibot_head_layers: int = 3
    layerwise_decay: float = 0.9  # optim.layerwise_decay: lr × decay^(depth + 1 − layer_id) in the backbone
    patch_embed_lr_mult: float = 0.2  # optim.patch_embed_lr_mult
    clip_grad: float = 3.0  # each student module's gradients scaled to a global norm ≤ 3; 0 = off
    freeze_last_layer: int = 1  # optim.freeze_last_layer_epochs: the last layers' lr is 0
    # OFFICIAL_EPOCH_LENGTH: the iterations of one "epoch" of every schedule above and of optim.warmup_epochs (1250
    # in the official configs, whatever the data; the presets then give trainer.max_steps = epochs x 1250); 0: one
    # pass over the data, as every other method here
    epoch_length: int = 0

    def validate(self) -> None:
        super().validate()
        for key in ("ibot_out_dim", "ibot_hidden_dim", "ibot_bottleneck_dim", "ibot_head_layers"):
            if getattr(self, key) < 1:
                raise UserError(f"method.{key}={getattr(self, key)} must be >= 1")
        if self.centering == "none":
            raise UserError("method.centering=none: DINOv2 centres with centering or sinkhorn_knopp")
        for key in ("dino_loss_weight", "ibot_loss_weight", "patch_embed_lr_mult", "epoch_length"):
            if getattr(self, key) < 0:
                raise UserError(f"method.{key}={getattr(self, key)} must be >= 0")
        if not 0 < self.layerwise_decay <= 1:
            raise UserError(f"method.layerwise_decay={self.layerwise_decay} must be in (0, 1]")
        lo, hi = self.mask_ratio_min_max
        if not 0 <= lo <= hi < 1 or (self.ibot_loss_weight > 0 and not hi > 0):
            raise UserError(f"method.mask_ratio_min_max={list(self.mask_ratio_min_max)} must be 0 <= min <= max < 1 "
                            "with max > 0 (ssl_meta_arch.py:91)")
        if not 0 <= self.mask_sample_probability <= 1:
            raise UserError(f"method.mask_sample_probability={self.mask_sample_probability} must be in [0, 1]")
        if self.use_bn_in_head:
            raise UserError("method.use_bn_in_head=true: the DINOv2 heads run on token sets; set it to false")


def dinov2_param_groups(modules: dict[str, nn.Module], weight_decay: float, layerwise_decay: float,
                        patch_embed_lr_mult: float) -> list[dict]:
    """DINOv2's parameter groups (dinov2/utils/param_groups.py ``get_params_groups_with_decay`` + ``fuse``): per
    parameter an lr multiplier (in a ViT backbone ``decay^(depth + 1 − layer_id)``: 0 the embeddings, the class,
    mask and register tokens; i + 1 block i; depth + 1 the rest; × ``patch_embed_lr_mult`` on the patch
    embedding), no weight decay for names ending ``.bias`` or holding ``norm`` or ``gamma``, and ``last_layer``
    parameters in groups of their own (named ``last_layer``: the schedule's ``frozen``); groups fused by those
    three keys. Each group carries ``lr_scale``, ``fixed_lr``, ``name`` and its initial ``weight_decay``."""
    fused: dict[tuple, dict] = {}
    for module_name, module in modules.items():
        depth = module.depth if isinstance(module, VisionTransformer) else None
        for name, p in module.named_parameters():
            if not p.requires_grad:
                continue
            scale = 1.0
            if depth is not None:
                scale = layerwise_decay ** (depth + 1 - module.layer_id(name))
                if "patch_embed" in name:
                    scale *= patch_embed_lr_mult
            decayed = not (name.endswith(".bias") or "norm" in name or "gamma" in name)
            last = "last_layer" in name
            key = (scale, decayed, last)
            if key not in fused:
                fused[key] = dict(params=[], lr_scale=scale, fixed_lr=False, decayed=decayed,
                                  name="last_layer" if last else module_name,
                                  weight_decay=weight_decay if decayed else 0.0)
            fused[key]["params"].append(p)
    return list(fused.values())


def dinov2_heads(dino_head: nn.Module, ibot_head: nn.Module | None, cls: torch.Tensor,
                 patch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The [CLS] tokens through the DINO head and the patch tokens through the iBOT head, or both through the
    shared DINO head in one call (its rows are independent: the official block-diagonal call)."""
    if ibot_head is not None:
        return dino_head(cls), ibot_head(patch)
    out = dino_head(torch.cat([cls, patch]))
    return out[:cls.shape[0]], out[cls.shape[0]:]


class DINOv2Objective:
    """DINOv2's objective as one piece that each method training with it builds (DINOv2; ``DistillDINOv2``
    against a frozen teacher): the student's heads, the EMA centres, the teacher's targets and the loss
    (ssl_meta_arch.py:132-346). The heads (``head``, ``ibot_head``) and the centres (``center``, ``center2``) are
    registered on ``method`` under those names, the checkpoint keys; the objective is a plain object over it.
    ``out_dim`` / ``patch_out_dim``: the [CLS] head's prototype count K and the patch logits' K2 (the separate
    patch head's, else K: the width of the patch centre)."""

    def __init__(self, method: SelfDistillation, out_dim: int, patch_out_dim: int):
        c, width = method.cfg.method, method.backbone.num_features
        self.method = method
        method.head = DINOHead(width, out_dim, c.hidden_dim, c.bottleneck_dim, c.head_layers, False,
                               c.norm_last_layer)
        if c.ibot_separate_head:  # a whole DINOHead of its own (ssl_meta_arch.py:95-109)
            method.ibot_head = DINOHead(width, patch_out_dim, c.ibot_hidden_dim, c.ibot_bottleneck_dim,
                                        c.ibot_head_layers, False, c.norm_last_layer)
        m = c.center_momentum  # one momentum for both centres
        self.centres = Centres(method, center=((1, out_dim), m), center2=((1, 1, patch_out_dim), m))

    def heads(self) -> dict[str, nn.Module]:
        """The student's heads by name: ``head`` and, separate, ``ibot_head``."""
        m = self.method
        return {"head": m.head, **({"ibot_head": m.ibot_head} if m.cfg.method.ibot_separate_head else {})}

    def loss(self, views, t_logits: tuple[torch.Tensor, torch.Tensor], s_cls: torch.Tensor, s_patch: torch.Tensor,
             valid: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, dict, dict]:
        """DINOv2's loss from the teacher's logits ``t_logits`` = ([CLS] of the global crops (2B, K), patch rows
        (U, K2)) and the student's tokens of the same crops and rows, ``s_cls`` (2B, D) and ``s_patch`` (U, D): the
        student's local crops (``views[2:]``) and heads, the centred targets, the [CLS] term, KoLeo on ``s_cls``,
        the patch term over the rows weighted by ``weights`` (U,) (``valid``: the rows that are patches, not
        padding), and the centres' update. Returns (loss, scalars, signs)."""
        m = self.method
        c, n = m.cfg.method, m.n_global
        t_cls_logits, t_patch_logits = t_logits
        n_cls, n_local = s_cls.shape[0], len(views) - n
        s_local = torch.cat(encode_views(m.backbone, views[n:], False)) if n_local else s_cls[:0]
        s_cls_logits, s_patch_logits = dinov2_heads(m.head, m.ibot_head if c.ibot_separate_head else None,
                                                    torch.cat([s_cls, s_local]), s_patch)
        q_cls, q_patch = self.targets(t_cls_logits, t_patch_logits, valid)
        pairs, terms = n * (n + n_local) - n, n * (n - 1) + max(n_local * n, 1)  # ssl_meta_arch.py:147-148
        loss_dino = dino_cross_entropy(s_cls_logits, q_cls, c.student_temp, n) * (pairs / terms)
        loss = c.dino_loss_weight * loss_dino
        signs = m.teacher_signs(t_cls_logits, q_cls)
        scalars = {"loss_dino": loss_dino.detach()}
        if c.koleo_loss_weight > 0:
            koleo, koleo_signs = m.koleo(s_cls.chunk(n))
            loss = loss + koleo
            signs.update(koleo_signs)
            scalars["loss_koleo"] = koleo.detach()
        if s_patch.shape[0]:
            loss_ibot = dinov2_patch_loss(s_patch_logits, q_patch, weights, n_cls, c.student_temp)
            loss = loss + c.ibot_loss_weight * loss_ibot
            scalars["loss_ibot"] = loss_ibot.detach()
            signs.update(self.patch_signs(t_patch_logits, q_patch, valid))
        if c.centering == "centering":
            self.update_centers(t_cls_logits, t_patch_logits, valid)
        return loss, scalars, signs

    @torch.no_grad()
    def targets(self, t_cls: torch.Tensor, t_patch: torch.Tensor,
                valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The teacher's targets at one temperature τt: DINO's centres, ``softmax((t − C) / τt)`` and
        ``softmax((t − C2) / τt)``, or Sinkhorn-Knopp (3 rounds, ε = τt) over the global batch's [CLS] rows and
        over the masked patch rows of every process (ssl_meta_arch.py:199-222)."""
        m = self.method
        c = m.cfg.method
        q_patch = teacher_targets(t_patch, c.centering, m.center2[0], m.step_teacher_temp, c.sinkhorn_iterations,
                                  all_reduce_sum, valid=valid)
        return m.cls_targets(t_cls, all_reduce_sum), q_patch

    def update_centers(self, t_cls: torch.Tensor, t_patch: torch.Tensor, valid: torch.Tensor) -> None:
        """C ← m C + (1 − m) Σ t_cls / (2B · world) (dino_clstoken_loss.py:76-99); C2 ← m C2 + (1 − m) ·
        Σ_processes (mean over its masked patches of t_patch) / world (ibot_patch_loss.py:128-151: the buffer is
        (1, masked, K), so its "mean over patches" is over the masked tokens and its count 1); one all-reduce."""
        cls = {"center": (t_cls.float().sum(0), t_cls.shape[0])}
        if t_patch.shape[0]:
            patch_mean = (t_patch.float() * valid[:, None]).sum(0) / valid.sum().clamp(min=1)
            cls["center2"] = (patch_mean, 1)
        self.centres.update(all_reduce_sum, **cls)

    @torch.no_grad()
    def patch_signs(self, t_patch: torch.Tensor, q: torch.Tensor, valid: torch.Tensor) -> dict[str, torch.Tensor]:
        """DINO's collapse signs for the patch head, over the masked patch rows: the targets' mean entropy (log K:
        uniform), the teacher logits' spread (std over the rows, mean over the K outputs) in units of τt, and the
        patch centre's norm."""
        m = self.method
        n = valid.sum().clamp(min=2)
        q, t = q.float(), t_patch.float()
        entropy = (-torch.special.xlogy(q, q).sum(-1) * valid).sum() / n
        mean = (t * valid[:, None]).sum(0) / n
        var = (((t - mean) ** 2) * valid[:, None]).sum(0) / (n - 1)
        return {"dinov2_patch_teacher_entropy": entropy,
                "dinov2_patch_teacher_spread": var.sqrt().mean() / m.step_teacher_temp,
                "dinov2_center2_norm": m.center2.norm()}


@dataclass
class DINOv2Terms:
    """What one DINOv2 step computed: the global crops ``x`` (2B, C, H, W), their ``masks`` (2B, N), the teacher's
    and the student's tokens (2B, 1 + N, D), the loss, its scalars and collapse signs, the batch B."""
    x: torch.Tensor
    masks: torch.Tensor
    t_tokens: torch.Tensor
    s_tokens: torch.Tensor
    loss: torch.Tensor
    scalars: dict
    signs: dict
    batch: int


class DINOv2Training(SelfDistillation):
    """What the methods trained with DINOv2's objective share after their constructors (DINOv2, DistillDINOv2):
    the student's modules, DINOv2's optimiser groups, per-iteration schedules and per-module clipping. Like
    ``SelfDistillation`` it has no constructor: each method builds its ``DINOv2Objective`` (``self.objective``)."""

    objective: DINOv2Objective

    def trainable(self):
        return {"backbone": self.backbone, **self.objective.heads()}

    def configure_optimizers(self):
        """AdamW over ``dinov2_param_groups`` (train.py:61-62; the betas are ``optim.betas``)."""
        c, o = self.cfg.method, self.cfg.optim
        return build_optimizer(dinov2_param_groups(self.trainable(), o.weight_decay, c.layerwise_decay,
                                                   c.patch_embed_lr_mult), o)

    def global_crops(self, views) -> list[torch.Tensor]:
        """The view plan's 2 global crops (refused in one line without them)."""
        if len(views) < self.n_global:
            raise UserError(f"DINOv2 needs the 2 global crops of its view plan, got {len(views)} view(s)")
        return views[:self.n_global]

    def update_centers(self, t_cls: torch.Tensor, t_patch: torch.Tensor, valid: torch.Tensor) -> None:
        """The objective's centre update (``DINOv2Objective.update_centers``)."""
        self.objective.update_centers(t_cls, t_patch, valid)

    # ----------------------------------------------------------------- schedules
    @property
    def epoch_steps(self) -> int:
        """The iterations of one schedule epoch: ``method.epoch_length`` (the official 1250), else a data pass."""
        return self.cfg.method.epoch_length or self.steps_per_epoch

    def warmup_steps(self) -> int:
        """``optim.warmup_epochs`` schedule epochs in iterations (train.py:71)."""
        return int(round(self.cfg.optim.warmup_epochs * self.epoch_steps))

    def schedule(self, step: int, epoch: int) -> StepValues:
        """Per iteration (train.py:65-101, dinov2/utils/utils.py ``CosineScheduler``): lr warm-up from 0 and
        cosine to ``min_lr``; wd cosine to ``weight_decay_end``; teacher momentum cosine to 1; τt linear from
        ``warmup_teacher_temp`` over ``warmup_teacher_temp_epochs`` then constant; the ``last_layer`` groups at lr
        0 during ``freeze_last_layer`` epochs."""
        o, c, total, spe = self.cfg.optim, self.cfg.method, self.total_steps, self.epoch_steps
        peak = self.peak_lr()
        momentum = dino_cosine(step, total, 0, c.momentum, 1.0) if c.momentum_schedule == "cosine" else c.momentum
        warm = c.warmup_teacher_temp_epochs * spe
        temp = dino_cosine(step, warm, warm, c.teacher_temp, c.teacher_temp, c.warmup_teacher_temp) \
            if step < warm else c.teacher_temp
        frozen = ("last_layer",) if step < c.freeze_last_layer * spe else ()
        return StepValues(dino_cosine(step, total, self.warmup_steps(), peak, self.final_lr()), peak,
                          weight_decay=dino_cosine(step, total, 0, o.weight_decay, c.weight_decay_end),
                          momentum=momentum, extras={"teacher_temp": temp}, frozen=frozen)

    def on_before_optimizer_step(self, optimizer) -> None:
        """Each student module's gradients scaled to a global norm ≤ ``clip_grad`` (FSDP ``clip_grad_norm_`` per
        module, train.py:257-259: ``min(1, clip / (‖g‖ + 1e-6))``), on the device, no host read."""
        clip = self.cfg.method.clip_grad
        if clip <= 0:
            return
        for module in self.trainable().values():
            grads = [p.grad for p in module.parameters() if p.grad is not None]
            if grads:
                norm = torch.stack(torch._foreach_norm(grads)).float().norm()
                scale = (clip / (norm + 1e-6)).clamp(max=1.0)
                torch._foreach_mul_(grads, [scale] * len(grads))  # a list of device tensors: no host read


class DINOv2(DINOv2Training):
    """DINO's [CLS] distillation + iBOT's masked patches + KoLeo, with DINOv2's heads, masks and optimiser."""
    collapse_remedy = ("method.centering=sinkhorn_knopp; a higher method.teacher_temp or its warm-up; a lower "
                       "optim.base_lr; a smaller method.out_dim")

    Config = DINOv2Config

    def __init__(self, cfg, info):
        super().__init__(cfg, info)  # the student backbone
        c, vit = cfg.method, self.backbone
        require_cls_vit("dinov2", cfg, vit)
        patch_dim = c.ibot_out_dim if c.ibot_separate_head else c.out_dim
        self.objective = DINOv2Objective(self, c.out_dim, patch_dim)  # the heads and the centres
        self.teacher_backbone = ema_teacher(self, vit)
        self.teacher_head = ema_teacher(self, self.head)
        if c.ibot_separate_head:
            self.teacher_ibot_head = ema_teacher(self, self.ibot_head)
        self.grid = add_mask_token(vit, self.teacher_backbone)
        self.teacher_temp = c.warmup_teacher_temp if c.warmup_teacher_temp_epochs else c.teacher_temp
        self.post_step_hooks.append(self.teacher_ema)
        self._upperbounds: dict[int, int] = {}

    def upperbound(self, n_crops: int) -> int:
        """The static length of the masked-token buffer for ``n_crops`` global crops (0 without the patch term),
        computed once per batch size outside the (compiled) step: ``step_draws`` asks first, the step reads the
        cached Python int (a constant to a compiled graph, where the torch arithmetic would be data-dependent)."""
        if n_crops not in self._upperbounds:
            c = self.cfg.method
            self._upperbounds[n_crops] = 0 if c.ibot_loss_weight == 0 else dinov2_upperbound(
                n_crops, self.grid, c.mask_sample_probability, tuple(c.mask_ratio_min_max))
        return self._upperbounds[n_crops]

    # ----------------------------------------------------------------- the step
    def step_draws(self, views) -> dict[str, torch.Tensor]:
        """The global crops' masks (2B, N), drawn before the (compiled) step from the step's generator."""
        n = sum(v.shape[0] for v in views[:self.n_global])
        c = self.cfg.method  # drawn whatever ibot_loss_weight: the collate masks the student's crops regardless
        self.upperbound(n)
        masks = dinov2_masks(n, self.grid, self.rng(views[0].device), c.mask_sample_probability,
                             tuple(c.mask_ratio_min_max), views[0].device)
        return {"masks": masks.flatten(1)}

    def masked_tokens(self, masks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The static buffer of masked patch tokens (collate.py:37-39; ssl_meta_arch.py:169-194): ``index`` (U,)
        into the (2B·N) flattened patch tokens, every masked patch first in order (``mask_indices_list``) then
        padding, U = ``upperbound``; ``valid`` (U,) 1 for a masked patch; ``weights`` (U,) 1 / (masked patches of
        its crop) for a masked patch, 0 for padding (``masks_weight``). No host read, no data-dependent shape."""
        flat = masks.flatten()
        index = flat.to(torch.uint8).argsort(descending=True, stable=True)[:self.upperbound(masks.shape[0])]
        valid = flat[index].float()
        per_crop = 1.0 / masks.sum(-1).clamp(min=1).float()
        weights = valid * per_crop.repeat_interleave(masks.shape[1])[index]
        return index, valid, weights

    def forward_views(self, views, masks: torch.Tensor | None = None):
        """The loss of a view plan (2 global crops, then any local crops); ``masks`` (2B, N) bool of the global
        crops (default: ``step_draws``)."""
        terms = self.dinov2_terms(views, masks)
        return self.step_output(terms)

    def dinov2_terms(self, views, masks: torch.Tensor | None = None) -> DINOv2Terms:
        """The teacher's and the student's tokens of the global crops and DINOv2's loss, scalars and signs."""
        c = self.cfg.method
        x = torch.cat(self.global_crops(views))
        if masks is None:
            masks = self.step_draws(views)["masks"]
        index, valid, weights = self.masked_tokens(masks)
        with torch.no_grad():
            t_tokens = self.teacher_backbone(x, return_all_tokens=True)
            t_logits = dinov2_heads(self.teacher_head, self.teacher_ibot_head if c.ibot_separate_head else None,
                                    t_tokens[:, 0], t_tokens[:, 1:].flatten(0, 1)[index])
        s_tokens = self.backbone(x, masks, return_all_tokens=True)
        loss, scalars, signs = self.objective.loss(views, t_logits, s_tokens[:, 0],
                                                   s_tokens[:, 1:].flatten(0, 1)[index], valid, weights)
        if index.numel():
            signs["dinov2_masked_share"] = masks.float().mean()
        return DINOv2Terms(x, masks, t_tokens, s_tokens, loss, scalars, signs, views[0].shape[0])

    @staticmethod
    def step_output(terms: DINOv2Terms) -> StepOutput:
        """The step's output: the loss, the teacher's [CLS] of each global crop as the embeddings."""
        b, t = terms.batch, terms.t_tokens
        return StepOutput(terms.loss, embedding=t[:b, 0], embedding2=t[b:2 * b, 0], scalars=terms.scalars,
                          instruments=terms.signs)
