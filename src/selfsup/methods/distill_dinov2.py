"""DINOv2's distillation of smaller models (Oquab et al. 2023, §5 "Distillation of smaller models").

The paper trains the small model with DINOv2's own training loop, except that (1) a larger pretrained model is
the teacher, frozen, not an EMA of the student; (2) a spare EMA of the student is kept and used as the final model;
(3) masking and stochastic depth are removed; (4) the iBOT loss is applied on the two global crops (on all their
patch tokens: nothing is masked). Per step, on DINOv2's parts (``methods.dinov2``, ``methods.teacher``):

    x = the 2 global crops (2B), then any local crops
    t_cls, t_patch = teacher_head(teacher_backbone(x)) [CLS], [every patch]      # frozen, eval, no gradient
    q_cls, q_patch = DINOv2's targets at τt: its EMA centres or Sinkhorn-Knopp (method.centering)
    s = backbone(x) (no mask token), backbone(x_local)                             # no stochastic depth
    loss = DINOv2.dinov2_loss: w_dino · L_dino + KoLeo(student [CLS]) + w_ibot · L_ibot over all patches of x
    optimiser step (DINOv2's: layer-wise lr decay, last layers frozen at first, per-module clipping)
    ema_backbone ← EMA of the student backbone (DINOv2's teacher-momentum schedule)   # the exported model

facebookresearch/dinov2 ships no distillation code (checked at b8931f7): its MODEL_CARD.md:102-103 says only
"Distillation follows the standard DINOv2 pretraining procedure, except the teacher is a pretrained ViT-g, frozen";
its student and teacher are always one architecture (``build_model`` returns two copies of ``cfg.student.arch``,
dinov2/models/__init__.py:14-43; the teacher is loaded from the student, train/ssl_meta_arch.py:396, and moved by
``update_teacher``, :356-365), and no config or entry point takes a separate teacher. So where the paper is silent,
this module chooses (each a line of docs/teacher-distillation.md):

- the teacher is a selfsup DINOv2 run (``method.teacher.weights``, a run folder): its backbone AND its DINO head
  (and separate iBOT head) from ``checkpoints/last.ckpt``'s ``teacher_*`` tensors, the architecture from its
  ``backbone.safetensors``; a hub / timm file has no heads (LightlyTrain's ``method.name=distill`` takes those);
- the student gets fresh heads of its own (``method.hidden_dim`` / ``bottleneck_dim`` / ``head_layers``) with the
  teacher's prototype counts K (and K2): ``method.out_dim`` / ``ibot_out_dim`` 0 read them, another value must be
  the teacher's; with the patch term, ``method.ibot_separate_head`` must be the teacher's;
- the teacher's outputs are centred as DINOv2 centres them (``method.centering``), at DINOv2's τt schedule; the EMA
  centres start from the teacher run's last ones (its centres of the same, now frozen, outputs; DINOv2 starts at 0);
- KoLeo stays on the student backbone's [CLS] of each global crop; local crops, as the view plan has them, are
  student crops only (DINOv2's);
- the spare EMA holds the student backbone only (the heads are not the final model), with DINOv2's teacher
  momentum schedule (``method.momentum`` cosine to 1); it is the evaluated and exported backbone;
- the teacher sees the student's views in its own input normalisation, in bf16 autocast on a GPU (``OutsideTeacher``);
  it is no child module: never in a checkpoint, its sha256 checked on resume;
- the patch term pairs the student's and the teacher's patch tokens one to one: the same grid (``model.patch_size``
  at ``data.image_size``); a student without ViT tokens (a ConvNet) trains the [CLS] term only
  (``method.ibot_loss_weight=0``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
from torch import nn

from selfsup.errors import UserError
from selfsup.methods.base import SSLMethod
from selfsup.methods.dinov2 import DINOv2, DINOv2Config
from selfsup.methods.teacher import Centres, OutsideTeacher, ema_teacher
from selfsup.models.heads import DINOHead
from selfsup.models.vit import VisionTransformer
from selfsup.step import StepOutput
from selfsup.weights import build_dinov2_teacher


@dataclass
class DINOv2TeacherConfig:
    """The frozen teacher: a selfsup DINOv2 run folder (its backbone and heads)."""

    weights: str | None = None  # a finished `selfsup pretrain dinov2-...` run folder


@dataclass
class DistillDINOv2Config(DINOv2Config):
    """DINOv2's hyper-parameters (its defaults) for the student, with a frozen teacher and no masking (§5)."""

    teacher: DINOv2TeacherConfig = field(default_factory=DINOv2TeacherConfig)
    out_dim: int = 0  # the student's [CLS] prototypes: the teacher's K (0: read from its head)
    momentum: float = 0.992  # the spare EMA of the student (DINOv2's teacher momentum schedule: cosine to 1)
    ibot_out_dim: int = 0  # the separate iBOT head's: the teacher's (0: read from its head)
    mask_sample_probability: float = 0.0  # masking removed (§5): must stay 0

    def validate(self) -> None:
        if not self.teacher.weights:
            raise UserError("method.teacher.weights is required: a selfsup DINOv2 run folder (selfsup pretrain "
                            "dinov2-...), whose checkpoint holds the teacher's heads")
        if self.mask_sample_probability != 0:
            raise UserError(f"method.mask_sample_probability={self.mask_sample_probability}: DINOv2's distillation "
                            "removes masking (§5); set it to 0")
        for key in ("out_dim", "ibot_out_dim"):
            if getattr(self, key) < 0:
                raise UserError(f"method.{key}={getattr(self, key)} must be >= 0 (0: the teacher's)")
        # DINOv2's checks with 0 (the teacher's count) in range: the counts are checked against the teacher's
        DINOv2Config.validate(dataclasses.replace(self, out_dim=self.out_dim or 1,
                                                  ibot_out_dim=self.ibot_out_dim or 1))


def prototypes(teacher) -> tuple[int, int]:
    """The teacher's prototype counts: its DINO head's K and its patch head's K2 (K where the patches share it)."""
    k = teacher.head.last_layer.weight_v.shape[0]
    return k, (teacher.ibot_head.last_layer.weight_v.shape[0] if teacher.ibot_head is not None else k)


def has_tokens(student: nn.Module) -> bool:
    """Whether the student gives the patch tokens the iBOT term pairs: a selfsup ViT with a class token."""
    return isinstance(student, VisionTransformer) and student.pool == "cls"


class DistillDINOv2(OutsideTeacher, DINOv2):
    """A student trained by DINOv2's loop against a frozen DINOv2 teacher (backbone + heads); the EMA is exported."""

    Config = DistillDINOv2Config
    eval_backbone_name = "ema_backbone"  # the spare EMA of the student: the final model (§5)
    collapse_remedy = ("method.centering=sinkhorn_knopp; a higher method.teacher_temp; a lower optim.base_lr; "
                       "check the teacher's own kNN")

    def __init__(self, cfg, info):
        SSLMethod.__init__(self, cfg, info)  # the student backbone: DINOv2's parts, not its EMA teacher or mask token
        c, student = cfg.method, self.backbone
        if cfg.model.drop_path_rate > 0:
            raise UserError(f"model.drop_path_rate={cfg.model.drop_path_rate}: DINOv2's distillation removes "
                            "stochastic depth from the student (§5); set model.drop_path_rate=0")
        teacher = build_dinov2_teacher(c.teacher.weights, info.channels, info.image_size, "method.teacher.weights")
        self.check_teacher(cfg, teacher, student)
        self.hold_teacher({"teacher_backbone": teacher.backbone, "teacher_head": teacher.head,
                           "teacher_ibot_head": teacher.ibot_head}, teacher.facts, teacher.norm)
        k, k2 = prototypes(teacher)
        width = student.num_features
        self.head = DINOHead(width, k, c.hidden_dim, c.bottleneck_dim, c.head_layers, False, c.norm_last_layer)
        if c.ibot_separate_head:
            self.ibot_head = DINOHead(width, k2, c.ibot_hidden_dim, c.ibot_bottleneck_dim, c.ibot_head_layers, False,
                                      c.norm_last_layer)
        self.ema_backbone = ema_teacher(self, student)  # the spare EMA, exported (§5)
        self.centres = Centres(self, center=((1, k), c.center_momentum), center2=((1, 1, k2), c.center_momentum))
        for name, value in teacher.centres.items():  # the teacher run's last centres (DINOv2 starts at 0)
            if getattr(self, name).shape == value.shape:
                getattr(self, name).copy_(value)
        self.teacher_temp = c.warmup_teacher_temp if c.warmup_teacher_temp_epochs else c.teacher_temp
        self.post_step_hooks.append(self.teacher_ema)  # the EMA of the student, after each optimiser step
        self.student_tokens = has_tokens(student)

    @staticmethod
    def check_teacher(cfg, teacher, student: nn.Module) -> None:
        """The student's heads and tokens against the teacher's: one line for each mismatch."""
        c = cfg.method
        k, k2 = prototypes(teacher)
        separate = teacher.ibot_head is not None
        if c.out_dim and c.out_dim != k:
            raise UserError(f"method.out_dim={c.out_dim}: the teacher's DINO head has {k} prototypes; set "
                            f"method.out_dim={k} (or 0: the teacher's)")
        if c.ibot_loss_weight == 0:  # the [CLS] term only: no patch head or token to match
            return
        if c.ibot_separate_head != separate:
            raise UserError(f"method.ibot_separate_head={str(c.ibot_separate_head).lower()}: the teacher's patches "
                            f"go through {'a separate iBOT head' if separate else 'its DINO head'}; set "
                            f"method.ibot_separate_head={str(separate).lower()}")
        if separate and c.ibot_out_dim and c.ibot_out_dim != k2:
            raise UserError(f"method.ibot_out_dim={c.ibot_out_dim}: the teacher's iBOT head has {k2} prototypes; "
                            f"set method.ibot_out_dim={k2} (or 0: the teacher's)")
        if not has_tokens(student):
            raise UserError(f"model.backbone={cfg.model.backbone!r} (model.pool={cfg.model.pool!r}) has no patch "
                            "tokens for the iBOT term: use a selfsup ViT with model.pool=cls, or set "
                            "method.ibot_loss_weight=0 (the [CLS] term only)")
        t, s = teacher.backbone.patch_size, student.patch_size
        if t != s:
            side = student.image_size
            raise UserError(f"model.patch_size={s}: the teacher's patches are {t} px (a {side // t}x{side // t} grid "
                            f"at data.image_size={side}, the student's {side // s}x{side // s}); the iBOT term pairs "
                            f"them one to one: set model.patch_size={t}, or method.ibot_loss_weight=0")

    # ----------------------------------------------------------------- the step
    def step_draws(self, views) -> dict[str, torch.Tensor]:
        """No masks (§5); the teacher moved to the step's device, outside the (compiled) step."""
        self.place_teacher(views[0].device)
        return {}

    def forward_views(self, views):
        """DINOv2's loss of a view plan (2 global crops, then any local crops) against the frozen teacher, the
        patch term on every patch token of the global crops."""
        c = self.cfg.method
        x = torch.cat(self.global_crops(views))
        patches = c.ibot_loss_weight > 0
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=x.is_cuda):
            t_tokens = self.teacher_backbone(self.teacher_input(x), return_all_tokens=True)
            t_patch = t_tokens[:, 1:].flatten(0, 1) if patches else t_tokens[:0, 0]
            t_cls_logits, t_patch_logits = self.heads(self.teacher_head, self.teacher_ibot_head, t_tokens[:, 0],
                                                      t_patch)
        t_logits = (t_cls_logits.float(), t_patch_logits.float())
        if self.student_tokens:
            s_tokens = self.backbone(x, return_all_tokens=True)
            s_cls = s_tokens[:, 0]
            s_patch = s_tokens[:, 1:].flatten(0, 1) if patches else s_cls[:0]
        else:  # a ConvNet student: its pooled feature is its [CLS] (the [CLS] term only)
            s_cls = self.backbone(x)
            s_patch = s_cls[:0]
        rows = s_patch.shape[0]  # every patch of every global crop: weight 1 / (patches of a crop)
        valid = s_cls.new_ones(rows)
        weights = valid / max(t_tokens.shape[1] - 1, 1)
        loss, scalars, signs = self.dinov2_loss(views, t_logits, s_cls, s_patch, valid, weights)
        b = views[0].shape[0]
        return StepOutput(loss, embedding=s_cls[:b].detach(), embedding2=s_cls[b:2 * b].detach(), scalars=scalars,
                          instruments=signs)
