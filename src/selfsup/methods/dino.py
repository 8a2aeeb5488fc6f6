"""DINO (Caron et al. 2021): self-distillation with no labels, as facebookresearch/dino main_dino.py.

Per step (Algorithm 1 of the paper, with the official code's details):

    t = teacher_head(teacher_backbone(x_global))        # the 2 global crops only, no gradient
    s = head(backbone(x_all))                           # every crop; one backbone call per resolution
    loss = mean over pairs (i, v), v ≠ i, of H(softmax((t_i − C) / τt), softmax(s_v / τs))
    C ← m_c · C + (1 − m_c) · mean(t)                   # over the global batch (all-reduce), after the loss
    optimiser step; then teacher ← λ · teacher + (1 − λ) · student   (parameters only)

Official behaviour reproduced (file:line of the official code in docs/NEW-METHODS, DINO part):
the DINO head (``models.heads.DINOHead``: MLP → bottleneck, L2-normalised, weight-normalised last layer,
``norm_last_layer``); teacher = a copy of the student without drop path; lr, weight decay and teacher
momentum follow ``utils.cosine_scheduler`` per iteration (``schedules.dino_cosine``: lr warm-up from 0,
wd 0.04 → 0.4 on the decayed parameter groups only, λ 0.996 → 1); τt warms up per epoch
(``schedules.teacher_temperature``); gradients are clipped per parameter tensor (``clip_grad``, not one
global norm) and then the last layer's gradients are dropped (``grad = None``: AdamW neither moves nor
decays it) during the first ``freeze_last_layer`` epochs; biases and 1-D tensors get no weight decay
(``optim.decay_1d: false`` in the presets). Crops of one resolution go through a backbone in one call, with
BatchNorm too (the MultiCropWrapper). The teacher backbone is the one evaluated, exported and measured.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from selfsup.distributed import all_reduce_sum, world
from selfsup.errors import UserError
from selfsup.losses import dino_center, dino_cross_entropy, dino_teacher_probs, koleo_loss, sinkhorn_knopp
from selfsup.methods.base import SSLMethod, check_momentum, encode_views
from selfsup.models.heads import DINOHead
from selfsup.schedules import StepValues, dino_cosine, teacher_temperature
from selfsup.step import StepOutput


@dataclass
class DINOConfig:
    """DINO hyper-parameters; defaults are main_dino.py's argument defaults."""

    out_dim: int = 65536  # K prototypes
    hidden_dim: int = 2048
    bottleneck_dim: int = 256
    head_layers: int = 3
    use_bn_in_head: bool = False
    norm_last_layer: bool = True  # False for ViT-S in the boosted recipe ("only safe with vit_small")
    momentum: float = 0.996  # momentum_teacher λ0 (0.9995 advised at batch 256)
    momentum_schedule: str = "cosine"  # cosine (official: λ → 1 per iteration) | constant
    student_temp: float = 0.1
    teacher_temp: float = 0.04  # final τt
    warmup_teacher_temp: float = 0.04
    warmup_teacher_temp_epochs: int = 0  # code default 0 (its help text says 30; the README recipe uses 30)
    center_momentum: float = 0.9
    # How the teacher's targets are centred: ``centering`` (DINO's EMA centre C, main_dino.py:388-416) or
    # ``sinkhorn_knopp`` (DINOv2's, dinov2/loss/dino_clstoken_loss.py ``sinkhorn_knopp_teacher``: Sinkhorn-Knopp
    # at ε = τt over the global batch, ``sinkhorn_iterations`` rounds; the centre is then neither used nor
    # updated, as DINOv2's ssl_meta_arch.py does); ``none``: sharpening only, softmax(t / τt) (the DINO paper's
    # Fig. 7 ablation: it collapses to one output; the collapse alarm's test case).
    centering: str = "centering"
    sinkhorn_iterations: int = 3  # DINOv2's n_iterations
    # DINOv2's KoLeo term (ssl_meta_arch.py: koleo_loss_weight, 0.1 in ssl_default_config.yaml; 0 here: DINO has
    # none): weight × Σ over the 2 global crops of koleo(the student backbone's features of that crop).
    koleo_loss_weight: float = 0.0
    weight_decay_end: float = 0.4  # wd cosine from optim.weight_decay (0.04) to this, per iteration
    clip_grad: float = 3.0  # per-parameter-tensor gradient norm bound; 0 = off
    freeze_last_layer: int = 1  # epochs during which the last layer's gradients are dropped

    def validate(self) -> None:
        for key in ("out_dim", "hidden_dim", "bottleneck_dim", "head_layers"):
            if getattr(self, key) < 1:
                raise UserError(f"method.{key}={getattr(self, key)} must be >= 1")
        for key in ("student_temp", "teacher_temp", "warmup_teacher_temp"):
            if not getattr(self, key) > 0:
                raise UserError(f"method.{key}={getattr(self, key)} must be > 0")
        if self.centering not in ("centering", "sinkhorn_knopp", "none"):
            raise UserError(f"method.centering={self.centering!r} is not one of: centering, sinkhorn_knopp, none")
        if self.sinkhorn_iterations < 1:
            raise UserError(f"method.sinkhorn_iterations={self.sinkhorn_iterations} must be >= 1")
        if not 0 <= self.center_momentum < 1:
            raise UserError(f"method.center_momentum={self.center_momentum} must be in [0, 1)")
        for key in ("warmup_teacher_temp_epochs", "freeze_last_layer", "clip_grad", "weight_decay_end",
                    "koleo_loss_weight"):
            if getattr(self, key) < 0:
                raise UserError(f"method.{key}={getattr(self, key)} must be >= 0")
        check_momentum(self)


def _without_drop_path(module: nn.Module) -> nn.Module:
    """The teacher is built without stochastic depth (main_dino.py:162-166): every drop-path rate set to 0."""
    for m in module.modules():
        if hasattr(m, "drop_prob"):  # timm DropPath
            m.drop_prob = 0.0
        elif type(m).__name__ == "DropPath" and hasattr(m, "p"):  # selfsup ViT
            m.p = 0.0
    return module


def require_cls_vit(method: str, cfg, backbone: nn.Module) -> None:
    """iBOT's and DINOv2's patch terms need the selfsup ViT's tokens with a class token (``model.pool=cls``)."""
    from selfsup.models.vit import VisionTransformer

    if not isinstance(backbone, VisionTransformer) or backbone.pool != "cls":
        raise UserError(f"method {method} needs a selfsup ViT backbone with model.pool=cls (vit_micro, vit_tiny, "
                        f"deit_small, vit_small, vit_base, vit_large), not model.backbone={cfg.model.backbone!r}, "
                        f"model.pool={cfg.model.pool!r}")


class DINO(SSLMethod):
    """Student ``head(backbone(x))`` on every crop, EMA teacher on the two global crops, centred targets."""
    collapse_remedy = ("method.centering=sinkhorn_knopp (DINOv2's targets); a higher method.teacher_temp or its "
                       "warm-up (method.warmup_teacher_temp_epochs); a lower optim.base_lr; a smaller "
                       "method.out_dim")

    Config = DINOConfig
    recipe = "dino"
    eval_backbone_name = "teacher_backbone"  # the official kNN and the released weights are the teacher's
    uses_momentum = True
    scales_min_lr = False  # main_dino.py:238-243 cosine_scheduler(lr × batch/256, args.min_lr, ...): as given
    n_global = 2

    def __init__(self, cfg, info):
        super().__init__(cfg, info)
        c = cfg.method
        self.head = self.build_head(c)
        self.teacher_backbone = _without_drop_path(self.momentum_target(self.backbone))
        self.teacher_head = self.build_teacher_head(c)
        self.register_buffer("center", torch.zeros(1, c.out_dim))
        self.register_buffer("step_teacher_temp", torch.ones(()), persistent=False)  # τt on the device, per step
        self.teacher_temp = c.warmup_teacher_temp if c.warmup_teacher_temp_epochs else c.teacher_temp
        self.post_step_hooks.append(self.teacher_ema)

    def build_head(self, c) -> nn.Module:
        """The student's projection head (iBOT: its own)."""
        return DINOHead(self.backbone.num_features, c.out_dim, c.hidden_dim, c.bottleneck_dim, c.head_layers,
                        c.use_bn_in_head, c.norm_last_layer)

    def build_teacher_head(self, c) -> nn.Module:
        """The teacher's head: a frozen copy of the student's, its EMA."""
        return self.momentum_target(self.head)

    def trainable(self):
        return {"backbone": self.backbone, "head": self.head}

    @property
    def teacher_temp(self) -> float:
        """This epoch's teacher temperature τt (a host float, logged); setting it sets ``step_teacher_temp``, the
        copy the step reads (a compiled step neither recompiles for each new τt nor reads it back)."""
        return self._teacher_temp

    @teacher_temp.setter
    def teacher_temp(self, value: float) -> None:
        self._teacher_temp = value
        self.step_teacher_temp.fill_(value)

    # ----------------------------------------------------------------- the step
    def forward_views(self, views):
        c = self.cfg.method
        if len(views) < self.n_global:
            raise UserError(f"DINO needs the 2 global crops of its view plan, got {len(views)} view(s)")
        with torch.no_grad():  # the teacher sees the global crops only, in one call per resolution
            t_feats = encode_views(self.teacher_backbone, views[:self.n_global], per_view_batch_norm=False)
            t_logits = self.teacher_head(torch.cat(t_feats))
        s_feats = encode_views(self.backbone, views, per_view_batch_norm=False)
        s_logits = self.head(torch.cat(s_feats))
        q = self.teacher_targets(t_logits)
        loss = dino_cross_entropy(s_logits, q, c.student_temp, self.n_global)
        signs = self.teacher_signs(t_logits, q)
        signs["dino_kl_teacher_student"] = loss.detach() - signs["dino_teacher_entropy"]  # mean KL(q_i || p_v)
        if c.koleo_loss_weight > 0:
            koleo, koleo_signs = self.koleo(s_feats[:self.n_global])
            loss = loss + koleo
            signs.update(koleo_signs)
        if c.centering == "centering":
            self.update_center(t_logits)
        return StepOutput(loss, embedding=t_feats[0], embedding2=t_feats[1], instruments=signs)

    def koleo(self, global_feats) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """DINOv2's KoLeo term on the student backbone's features of each global crop, not across the crops of one
        image (ssl_meta_arch.py:313-320): ``koleo_loss_weight · Σ_crops koleo(crop)``; and its signs, the term
        and the mean nearest-neighbour distance it acts on."""
        terms = [koleo_loss(f) for f in global_feats]
        koleo = self.cfg.method.koleo_loss_weight * sum(t[0] for t in terms)
        return koleo, {"koleo_loss": koleo.detach(), "koleo_nn_distance": sum(t[1] for t in terms) / len(terms)}

    @torch.no_grad()
    def teacher_targets(self, t_logits: torch.Tensor) -> torch.Tensor:
        """The teacher's targets q (2B, K): ``softmax((t − C) / τt)`` with DINO's centre, or DINOv2's Sinkhorn-Knopp
        at ε = τt over the global batch (``method.centering``; one Sinkhorn, SwAV's ``losses.sinkhorn_knopp``)."""
        c = self.cfg.method
        if c.centering == "sinkhorn_knopp":
            _, size = world()
            return sinkhorn_knopp(t_logits, self.step_teacher_temp, c.sinkhorn_iterations, world_size=size,
                                  all_reduce=all_reduce_sum)
        center = self.center if c.centering == "centering" else torch.zeros_like(self.center)  # none: sharpening only
        return dino_teacher_probs(t_logits, center, self.step_teacher_temp)

    @torch.no_grad()
    def teacher_signs(self, t_logits: torch.Tensor, q: torch.Tensor) -> dict[str, torch.Tensor]:
        """The collapse signs DINO users watch (the paper's Fig. 7), from this step's teacher logits, its targets
        ``q`` and the centre before its update: the mean entropy of the targets (log K: uniform), and the logits'
        spread over the batch (std over its images, mean over the K outputs) in units of τt: under 1, what the
        centre leaves of the logits is too small against τt for any target to be sharp (benchmarks/dino_cpu.py)."""
        q = q.float()
        return {"dino_teacher_entropy": -torch.special.xlogy(q, q).sum(-1).mean(),
                "dino_teacher_spread": t_logits.float().std(0).mean() / self.step_teacher_temp,
                "dino_center_norm": self.center.norm()}

    @torch.no_grad()
    def update_center(self, teacher_logits: torch.Tensor) -> None:
        """C ← m C + (1 − m) · (teacher outputs of the global crops, summed and all-reduced) / (2 B · world)."""
        _, size = world()
        total = all_reduce_sum(teacher_logits.float().sum(dim=0, keepdim=True))
        self.center.copy_(dino_center(self.center, total, teacher_logits.shape[0] * size,
                                      self.cfg.method.center_momentum))

    # ----------------------------------------------------------------- schedules
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

    def teacher_ema(self) -> None:
        """The post-step hook: the teacher's EMA with this iteration's momentum (main_dino.py:344-350)."""
        self.ema_step(self.momentum)
