"""The teacher, and what the DINO family (DINO, iBOT, DINOv2) shares around it, as pieces a constructor composes.

A method's ``__init__`` reads as one straight sequence, each piece taking what the one before made:

    super().__init__(cfg, info)                                   # the student backbone (SSLMethod)
    require_cls_vit("ibot", cfg, self.backbone)                   # a patch term needs the ViT's tokens
    self.head = ...                                               # the student's heads
    self.teacher_backbone = ema_teacher(self, self.backbone)      # the teacher: copies, no gradient
    self.teacher_head = ema_teacher(self, self.head)
    self.grid = add_mask_token(self.backbone, self.teacher_backbone)   # the student's mask token only
    self.centres = Centres(self, center=((1, K), m))              # buffers: the EMA centres
    self.teacher_temp = τt                                        # the scheduled temperature and its device copy
    self.post_step_hooks.append(self.teacher_ema)                 # how the teacher follows the student

The checkpoint keys are the modules' and buffers' own names (``teacher_backbone.*``, ``teacher_head.*``,
``center``, ``center2``): the pieces register them on the method, they add no level of their own.

The teacher here is ``ema_teacher``: a copy of a student module that follows it as an exponential moving average
(DINO's teacher, main_dino.py:162-166, :344-350; iBOT's; DINOv2's; DINOv2 distillation's spare EMA of the
student). It is a momentum target of the method (``TrainingBase.momentum_pairs``, as I-JEPA's target encoder from
``momentum_target``), updated after the optimiser step by a post-step hook calling ``ema_step(self.momentum)``
(``SelfDistillation.teacher_ema``); its momentum is ``self.momentum``, set per step by the method's ``schedule``
(``uses_momentum = True``). A trained teacher that never moves (distillation) is another object,
``methods.frozen.FrozenNetwork``.

The all-reduce a distributed piece uses (``Centres``, ``teacher_targets``) is passed in, as SwAV's
``losses.sinkhorn_knopp`` takes it: ``distributed.all_reduce_sum`` from the calling method's module.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor, nn

from selfsup.distributed import world
from selfsup.errors import UserError
from selfsup.losses import dino_center, dino_teacher_probs, koleo_loss, sinkhorn_knopp
from selfsup.methods.base import SSLMethod
from selfsup.models.vit import VisionTransformer
from selfsup.schedules import StepValues, dino_cosine, teacher_temperature


# --------------------------------------------------------------------------- the teacher
def without_drop_path(module: nn.Module) -> nn.Module:
    """Every drop-path rate of ``module`` set to 0: the teacher has no stochastic depth (main_dino.py:162-166)."""
    for m in module.modules():
        if hasattr(m, "drop_prob"):  # timm DropPath
            m.drop_prob = 0.0
        elif type(m).__name__ == "DropPath" and hasattr(m, "p"):  # selfsup ViT
            m.p = 0.0
    return module


def ema_teacher(method: SSLMethod, student: nn.Module, like: nn.Module | None = None) -> nn.Module:
    """The EMA teacher of ``student``: a copy without stochastic depth that receives no gradient, registered as a
    momentum target of ``method`` (``ema_step`` / ``update_momentum_encoder`` move it towards the student).
    ``like``: a teacher of another shape, given the student's ``state_dict`` non-strictly (iBOT's teacher head with
    its own ``shared_head_teacher``, main_ibot.py:263); the EMA then runs over the parameter names both hold."""
    if like is None:
        return without_drop_path(method.momentum_target(student))
    like.load_state_dict(student.state_dict(), strict=False)
    like.requires_grad_(False)
    method.momentum_pairs.append((student, like))
    return without_drop_path(like)


def add_mask_token(student: nn.Module, teacher: nn.Module) -> tuple[int, int]:
    """The student ViT's learned mask token (``backbone.masked_embed``, iBOT models/vision_transformer.py:169-172),
    added after the teacher's copy: the teacher sees every crop unmasked and holds none (the EMA runs over the
    names both hold). Returns the patch grid (rows, columns) the masks are drawn on."""
    if hasattr(teacher, "masked_embed"):
        raise RuntimeError("add_mask_token after the teacher's copy: the teacher must not hold the mask token")
    student.add_mask_token()
    side = student.image_size // student.patch_size
    return side, side


def require_cls_vit(method: str, cfg, backbone: nn.Module) -> None:
    """iBOT's and DINOv2's patch terms need the selfsup ViT's tokens with a class token (``model.pool=cls``)."""
    if not isinstance(backbone, VisionTransformer) or backbone.pool != "cls":
        raise UserError(f"method {method} needs a selfsup ViT backbone with model.pool=cls (vit_micro, vit_tiny, "
                        f"deit_small, vit_small, vit_base, vit_large), not model.backbone={cfg.model.backbone!r}, "
                        f"model.pool={cfg.model.pool!r}")


# --------------------------------------------------------------------------- the teacher's targets
class Centres:
    """The EMA centres of the teacher's outputs (DINO's C, main_dino.py:406-416; iBOT's and DINOv2's patch centre
    C2), buffers of ``method`` under their own names (the checkpoint keys ``center``, ``center2``), each given as
    ``name=(shape, momentum)``. ``update`` moves them after the loss, in one all-reduce."""

    def __init__(self, method: nn.Module, **centres: tuple[tuple[int, ...], float]):
        self.method, self.momenta = method, {}
        for name, (shape, momentum) in centres.items():
            method.register_buffer(name, torch.zeros(shape))
            self.momenta[name] = momentum

    @torch.no_grad()
    def update(self, all_reduce, **sums: tuple[Tensor, int]) -> None:
        """``C ← m C + (1 − m) · Σ_processes s / (n · world)`` for each ``name=(s, n)``: ``s`` this process's sum of
        the centre's rows (any shape of C's size, float32), ``n`` how many rows it sums (iBOT's C2: images, each
        its mean over patches; DINOv2's C2: 1, its mean over the masked patches). The sums are all-reduced in one
        call (``all_reduce``: ``distributed.all_reduce_sum``); a centre not named keeps its value."""
        _, size = world()
        total = all_reduce(torch.cat([s.reshape(-1) for s, _ in sums.values()])[None])
        start = 0
        for name, (s, count) in sums.items():
            centre = getattr(self.method, name)
            part = total[:, start:start + s.numel()].view(centre.shape)
            centre.copy_(dino_center(centre, part, count * size, self.momenta[name]))
            start += s.numel()


@torch.no_grad()
def teacher_targets(logits: Tensor, centering: str, center: Tensor, tau: Tensor | float, iterations: int,
                    all_reduce, valid: Tensor | None = None) -> Tensor:
    """The teacher's targets q (rows, K) by ``method.centering``: ``centering``, ``softmax((t − C) / τ)`` (DINO's
    centre, main_dino.py:388-390); ``none``, ``softmax(t / τ)`` (sharpening only); ``sinkhorn_knopp``,
    Sinkhorn-Knopp at ε = τ over the global batch, ``iterations`` rounds (DINOv2's ``sinkhorn_knopp_teacher``,
    dino_clstoken_loss.py / ibot_patch_loss.py; SwAV's ``losses.sinkhorn_knopp``), where ``valid`` (rows,) marks the
    rows that are samples (DINOv2's masked patches in a static buffer) and ``all_reduce`` sums over the processes."""
    if centering == "sinkhorn_knopp":
        if not logits.shape[0]:  # no row at all (DINOv2 without its patch term)
            return logits
        _, size = world()
        return sinkhorn_knopp(logits, tau, iterations, world_size=size, all_reduce=all_reduce, valid=valid)
    return dino_teacher_probs(logits, center if centering == "centering" else torch.zeros_like(center), tau)


class StepScalar:
    """A value the schedule sets once per step (a ``StepValues`` extra: a host float, logged), mirrored into the 0-d
    buffer ``step_<name>`` that the step reads: a compiled step neither recompiles for each new value nor reads it
    back. The buffer (not saved: the schedule sets it before every step) is registered by the first assignment,
    in the constructor."""

    def __set_name__(self, owner, name: str) -> None:
        self.name, self.buffer = f"_{name}", f"step_{name}"

    def __get__(self, method, owner=None):
        return self if method is None else method.__dict__[self.name]

    def __set__(self, method: nn.Module, value: float) -> None:
        if self.buffer not in method._buffers:
            method.register_buffer(self.buffer, torch.ones(()), persistent=False)
        method.__dict__[self.name] = value
        getattr(method, self.buffer).fill_(value)


# --------------------------------------------------------------------------- the family's shared behaviour
class SelfDistillation(SSLMethod):
    """What DINO, iBOT and DINOv2 share after their constructors: the teacher evaluated and exported, its EMA after
    each optimiser step, the scheduled τt (``teacher_temp``), DINO's schedules and per-tensor clipping (DINOv2
    overrides both), the collapse signs and KoLeo. It has no constructor of its own: each method builds its
    student, teacher and buffers in its ``__init__`` from the pieces above."""

    recipe = "dino"
    eval_backbone_name = "teacher_backbone"  # the official kNN and the released weights are the teacher's
    uses_momentum = True
    scales_min_lr = False  # main_dino.py:238-243 cosine_scheduler(lr × batch/256, args.min_lr, ...): as given
    schedule_extras: ClassVar[tuple[str, ...]] = ("teacher_temp",)
    n_global = 2

    teacher_temp = StepScalar()  # this epoch's (DINOv2: iteration's) teacher temperature τt; step_teacher_temp

    def trainable(self):
        return {"backbone": self.backbone, "head": self.head}

    def teacher_ema(self) -> None:
        """The post-step hook: the teacher's EMA with this iteration's momentum (main_dino.py:344-350)."""
        self.ema_step(self.momentum)

    def cls_targets(self, t_logits: Tensor, all_reduce) -> Tensor:
        """The [CLS] targets q (2B, K) by ``method.centering`` at τt (``teacher_targets``, centre C)."""
        c = self.cfg.method
        return teacher_targets(t_logits, c.centering, self.center, self.step_teacher_temp, c.sinkhorn_iterations,
                               all_reduce)

    @torch.no_grad()
    def teacher_signs(self, t_logits: Tensor, q: Tensor) -> dict[str, Tensor]:
        """The collapse signs DINO users watch (the paper's Fig. 7), from this step's teacher logits, its targets
        ``q`` and the centre before its update: the mean entropy of the targets (log K: uniform), and the logits'
        spread over the batch (std over its images, mean over the K outputs) in units of τt: under 1, what the
        centre leaves of the logits is too small against τt for any target to be sharp (benchmarks/dino_cpu.py)."""
        q = q.float()
        return {"dino_teacher_entropy": -torch.special.xlogy(q, q).sum(-1).mean(),
                "dino_teacher_spread": t_logits.float().std(0).mean() / self.step_teacher_temp,
                "dino_center_norm": self.center.norm()}

    def koleo(self, global_feats) -> tuple[Tensor, dict[str, Tensor]]:
        """DINOv2's KoLeo term on the student backbone's features of each global crop, not across the crops of one
        image (ssl_meta_arch.py:313-320): ``koleo_loss_weight · Σ_crops koleo(crop)``; and its signs, the term
        and the mean nearest-neighbour distance it acts on."""
        terms = [koleo_loss(f) for f in global_feats]
        koleo = self.cfg.method.koleo_loss_weight * sum(t[0] for t in terms)
        return koleo, {"koleo_loss": koleo.detach(), "koleo_nn_distance": sum(t[1] for t in terms) / len(terms)}

    def schedule(self, step: int, epoch: int) -> StepValues:
        """Per iteration: lr (warm-up from 0, cosine to min_lr), wd of the decayed groups (cosine to
        ``weight_decay_end``), teacher momentum (cosine to 1), all ``utils.cosine_scheduler``
        (main_dino.py:238-251); τt per epoch (main_dino.py:374-378, logged as ``train/teacher_temp``)."""
        o, c, total = self.cfg.optim, self.cfg.method, self.total_steps
        peak = self.peak_lr()
        momentum = dino_cosine(step, total, 0, c.momentum, 1.0) if c.momentum_schedule == "cosine" else c.momentum
        temp = teacher_temperature(epoch, c.warmup_teacher_temp, c.teacher_temp, c.warmup_teacher_temp_epochs)
        return StepValues(dino_cosine(step, total, self.warmup_steps(), peak, self.final_lr()), peak,
                          weight_decay=dino_cosine(step, total, 0, o.weight_decay, c.weight_decay_end),
                          momentum=momentum, extras={"teacher_temp": temp})

    def on_before_optimizer_step(self, optimizer) -> None:
        """Per-tensor gradient clipping (utils.clip_gradients: each gradient scaled to norm ≤ ``clip_grad``),
        then the last layer's gradients dropped during the first ``freeze_last_layer`` epochs
        (utils.cancel_gradients_last_layer: ``grad = None``, after clipping). No host read: the scale is
        ``min(1, clip / (‖g‖ + 1e-6))`` on the device (exactly 1 where the official code skips the tensor)."""
        clip = self.cfg.method.clip_grad
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        if clip > 0 and grads:
            norms = torch.stack(torch._foreach_norm(grads))
            torch._foreach_mul_(grads, (clip / (norms + 1e-6)).clamp(max=1.0).unbind())
        if self.current_epoch < self.cfg.method.freeze_last_layer:
            for name, p in self.named_parameters():
                if "last_layer" in name:
                    p.grad = None
