"""DINOv2's distillation of smaller models (Oquab et al. 2023, §5 "Distillation of smaller models").

The paper trains the small model with DINOv2's own training loop, except that (1) a larger pretrained model is
the teacher, frozen, not an EMA of the student; (2) a spare EMA of the student is kept and used as the final model;
(3) masking and stochastic depth are removed; (4) the iBOT loss is applied on the two global crops (on all their
patch tokens: nothing is masked). Per step, on DINOv2's parts (``methods.dinov2``, ``methods.teacher``):

    x = the 2 global crops (2B), then any local crops
    t_cls, t_patch = teacher_head(teacher_backbone(x)) [CLS], [every patch]      # frozen, eval, no gradient
    q_cls, q_patch = DINOv2's targets at τt: its EMA centres or Sinkhorn-Knopp (method.centering)
    s = backbone(x) (no mask token), backbone(x_local)                             # no stochastic depth
    loss = DINOv2Objective.loss: w_dino · L_dino + KoLeo(student [CLS]) + w_ibot · L_ibot over all patches of x
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
- the teacher sees the student's views in its own input normalisation, in bf16 autocast on a GPU
  (``methods.frozen.FrozenNetwork``); it is no child module: never in a checkpoint, its sha256 checked on resume;
- the patch term pairs the student's and the teacher's patch tokens one to one: the same grid (``model.patch_size``
  at ``data.image_size``); a student without ViT tokens (a ConvNet) trains the [CLS] term only
  (``method.ibot_loss_weight=0``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from selfsup.checkpoints import EXTRA_SAFE_GLOBALS
from selfsup.errors import UserError
from selfsup.export import read_meta
from selfsup.methods.dinov2 import DINOv2Config, DINOv2Objective, DINOv2Training, dinov2_heads
from selfsup.methods.frozen import TEACHER_SHA, FrozenNetwork, Renormalise
from selfsup.methods.teacher import ema_teacher
from selfsup.models.heads import DINOHead
from selfsup.models.vit import VisionTransformer
from selfsup.step import StepOutput
from selfsup.weights import RawWeights, build_from_weights, convert, state_sha256


@dataclass
class DINOv2TeacherConfig:
    """The frozen teacher: a selfsup DINOv2 run folder (its backbone and heads)."""

    weights: str | None = None  # a finished `selfsup pretrain dinov2-...` run folder


@dataclass
class DistillDINOv2Config(DINOv2Config):
    """DINOv2's hyper-parameters (its defaults) for the student, with a frozen teacher and no masking (§5)."""

    teacher: DINOv2TeacherConfig = field(default_factory=DINOv2TeacherConfig)  # the frozen DINOv2 run
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


# --------------------------------------------------------------------------- a DINOv2 run's teacher, heads included
TEACHER_MODULES = ("teacher_backbone", "teacher_head", "teacher_ibot_head")  # DINOv2's names: its checkpoint keys


class DINOv2Teacher(nn.Module):
    """A DINOv2 run's final teacher: its backbone and heads (``ibot_head`` None where the patches share the [CLS]
    head). Called on the global crops: the [CLS] logits, the logits of every patch token (``patches``; else none)
    and the patch tokens per crop."""

    def __init__(self, backbone: nn.Module, head: nn.Module, ibot_head: nn.Module | None):
        super().__init__()
        self.backbone, self.head, self.ibot_head = backbone, head, ibot_head

    def forward(self, x: Tensor, patches: bool) -> tuple[Tensor, Tensor, int]:
        tokens = self.backbone(x, return_all_tokens=True)
        patch = tokens[:, 1:].flatten(0, 1) if patches else tokens[:0, 0]
        cls_logits, patch_logits = dinov2_heads(self.head, self.ibot_head, tokens[:, 0], patch)
        return cls_logits, patch_logits, tokens.shape[1] - 1

    def prototypes(self) -> tuple[int, int]:
        """The prototype counts: the DINO head's K and the patch head's K2 (K where the patches share it)."""
        k = self.head.last_layer.weight_v.shape[0]
        return k, (self.ibot_head.last_layer.weight_v.shape[0] if self.ibot_head is not None else k)


def load_dinov2_teacher(spec: str, info, what: str = "method.teacher.weights") -> tuple[FrozenNetwork, dict]:
    """The teacher of the selfsup DINOv2 run folder ``spec``, frozen, and its run's last centres (``center`` (1, K),
    ``center2`` (1, 1, K2)): its architecture from ``backbone.safetensors``'s metadata (built at the run's image
    size and its own channels, positions resampled as ``weights.build_from_weights``), the tensors of
    ``checkpoints/last.ckpt``'s ``teacher_backbone.*``, ``teacher_head.*`` and ``teacher_ibot_head.*`` (the heads'
    shapes give their sizes). The facts' sha256 is over the backbone's and heads' tensors as loaded (``backbone.``,
    ``head.``, ``ibot_head.`` keys), their ``source_sha256`` (the resume check's) over the same tensors as read.
    Anything else: one line."""
    run = Path(spec).expanduser()
    export, ckpt = run / "backbone.safetensors", run / "checkpoints" / "last.ckpt"
    other = ("; a weights file, a DINOv2 hub checkpoint or timm:<name> has no DINO heads: distil it with "
             "method.name=distill (LightlyTrain's loss)")
    if not (run.is_dir() and export.exists() and ckpt.exists()):
        raise UserError(f"{what}={spec} is not a finished selfsup DINOv2 run folder (backbone.safetensors and "
                        f"checkpoints/last.ckpt){other}")
    meta = read_meta(export)
    if meta.get("method") != "dinov2":
        raise UserError(f"{what}={spec} is a {meta.get('method')} run, not a dinov2 one: its heads are not "
                        f"DINOv2's{other}")
    backbone, facts, norm = build_from_weights(str(run), "auto", {}, info.channels, info.image_size, what,
                                               own_channels=True)
    try:
        with torch.serialization.safe_globals(EXTRA_SAFE_GLOBALS):
            state = torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]
    except Exception as e:
        raise UserError(f"{what}={spec}: its checkpoint {ckpt} cannot be read ({type(e).__name__}: "
                        f"{' '.join(str(e).split())[:80]})") from None
    parts = {name: {k[len(name) + 1:]: v for k, v in state.items() if k.startswith(f"{name}.")}
             for name in TEACHER_MODULES}
    if not parts["teacher_backbone"] or not parts["teacher_head"]:
        raise UserError(f"{what}={spec}: its checkpoint {ckpt} holds no teacher_backbone / teacher_head{other}")
    loaded, _ = convert(RawWeights({None: parts["teacher_backbone"]}, "selfsup", str(ckpt), meta), backbone, what)
    with torch.no_grad():
        backbone.load_state_dict(loaded, strict=True)
    try:
        heads = {name: DINOHead.from_state_dict(parts[f"teacher_{name}"]) if parts[f"teacher_{name}"] else None
                 for name in ("head", "ibot_head")}
    except ValueError as e:
        raise UserError(f"{what}={spec}: its checkpoint's teacher heads are not DINOv2's ({e})") from None
    whole = {f"{prefix}.{k}": v for prefix, module in (("backbone", backbone), *heads.items()) if module is not None
             for k, v in module.state_dict().items()}
    facts.path, facts.tensors, facts.sha256 = str(ckpt), len(whole), state_sha256(whole)
    facts.source_sha256 = state_sha256({f"{name[len('teacher_'):]}.{k}": v for name, part in parts.items()
                                        for k, v in part.items()})  # as read: whatever the run's image size
    centres = {k: state[k].float() for k in ("center", "center2") if k in state}
    network = DINOv2Teacher(backbone, heads["head"], heads["ibot_head"])
    input_map = Renormalise(info.mean, info.std, norm, len(norm[0]) if norm else info.channels, f"{what}={spec}")
    return FrozenNetwork(network, facts, input_map, "teacher", what, TEACHER_SHA), centres


def has_tokens(student: nn.Module) -> bool:
    """Whether the student gives the patch tokens the iBOT term pairs: a selfsup ViT with a class token."""
    return isinstance(student, VisionTransformer) and student.pool == "cls"


# --------------------------------------------------------------------------- the method
class DistillDINOv2(DINOv2Training):
    """A student trained by DINOv2's loop against a frozen DINOv2 teacher (backbone + heads); the EMA is exported."""

    Config = DistillDINOv2Config
    eval_backbone_name = "ema_backbone"  # the spare EMA of the student: the final model (§5)
    collapse_remedy = ("method.centering=sinkhorn_knopp; a higher method.teacher_temp; a lower optim.base_lr; "
                       "check the teacher's own kNN")

    def __init__(self, cfg, info):
        super().__init__(cfg, info)  # the student backbone (no EMA teacher, no mask token: §5)
        c, student = cfg.method, self.backbone
        if cfg.model.drop_path_rate > 0:
            raise UserError(f"model.drop_path_rate={cfg.model.drop_path_rate}: DINOv2's distillation removes "
                            "stochastic depth from the student (§5); set model.drop_path_rate=0")
        self.teacher, centres = load_dinov2_teacher(c.teacher.weights, info)
        self.frozen_networks.append(self.teacher)  # outside the module tree, its sha256 in each checkpoint
        self.check_teacher(cfg, self.teacher.network, student)
        self.objective = DINOv2Objective(self, *self.teacher.network.prototypes())  # the teacher's K and K2
        self.ema_backbone = ema_teacher(self, student)  # the spare EMA, exported (§5)
        for name, value in centres.items():  # the teacher run's last centres (DINOv2 starts at 0)
            if getattr(self, name).shape == value.shape:
                getattr(self, name).copy_(value)
        self.teacher_temp = c.warmup_teacher_temp if c.warmup_teacher_temp_epochs else c.teacher_temp
        self.post_step_hooks.append(self.teacher_ema)  # the EMA of the student, after each optimiser step
        self.student_tokens = has_tokens(student)

    # the teacher's parts, by DINOv2's names
    teacher_backbone = property(lambda self: self.teacher.network.backbone)
    teacher_head = property(lambda self: self.teacher.network.head)
    teacher_ibot_head = property(lambda self: self.teacher.network.ibot_head)

    @staticmethod
    def check_teacher(cfg, teacher: DINOv2Teacher, student: nn.Module) -> None:
        """The student's heads and tokens against the teacher's: one line for each mismatch."""
        c = cfg.method
        k, k2 = teacher.prototypes()
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
    def forward_views(self, views):
        """DINOv2's loss of a view plan (2 global crops, then any local crops) against the frozen teacher, the
        patch term on every patch token of the global crops (no masks: §5)."""
        x = torch.cat(self.global_crops(views))
        patches = self.cfg.method.ibot_loss_weight > 0
        t_cls_logits, t_patch_logits, n_patches = self.teacher(x, patches)
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
        weights = valid / max(n_patches, 1)
        loss, scalars, signs = self.objective.loss(views, t_logits, s_cls, s_patch, valid, weights)
        b = views[0].shape[0]
        return StepOutput(loss, embedding=s_cls[:b].detach(), embedding2=s_cls[b:2 * b].detach(), scalars=scalars,
                          instruments=signs)
