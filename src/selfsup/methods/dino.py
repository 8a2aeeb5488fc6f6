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

What DINO shares with iBOT and DINOv2 (the EMA teacher, the centre, the Sinkhorn-or-centre targets, the schedules,
the clipping, the collapse signs) lives in ``methods.teacher``; the constructor composes it in one sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from selfsup.distributed import all_reduce_sum
from selfsup.errors import UserError
from selfsup.losses import dino_cross_entropy
from selfsup.methods.base import encode_views
from selfsup.methods.ema import check_momentum
from selfsup.methods.teacher import Centres, SelfDistillation, ema_teacher
from selfsup.models.heads import DINOHead
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


class DINO(SelfDistillation):
    """Student ``head(backbone(x))`` on every crop, EMA teacher on the two global crops, centred targets."""
    collapse_remedy = ("method.centering=sinkhorn_knopp (DINOv2's targets); a higher method.teacher_temp or its "
                       "warm-up (method.warmup_teacher_temp_epochs); a lower optim.base_lr; a smaller "
                       "method.out_dim")

    Config = DINOConfig

    def __init__(self, cfg, info):
        super().__init__(cfg, info)  # the student backbone
        c = cfg.method
        self.head = DINOHead(self.backbone.num_features, c.out_dim, c.hidden_dim, c.bottleneck_dim, c.head_layers,
                             c.use_bn_in_head, c.norm_last_layer)
        self.teacher_backbone = ema_teacher(self, self.backbone)
        self.teacher_head = ema_teacher(self, self.head)
        self.centres = Centres(self, center=((1, c.out_dim), c.center_momentum))
        self.teacher_temp = c.warmup_teacher_temp if c.warmup_teacher_temp_epochs else c.teacher_temp
        self.post_step_hooks.append(self.teacher_ema)

    def forward_views(self, views):
        c = self.cfg.method
        if len(views) < self.n_global:
            raise UserError(f"DINO needs the 2 global crops of its view plan, got {len(views)} view(s)")
        with torch.no_grad():  # the teacher sees the global crops only, in one call per resolution
            t_feats = encode_views(self.teacher_backbone, views[:self.n_global], per_view_batch_norm=False)
            t_logits = self.teacher_head(torch.cat(t_feats))
        s_feats = encode_views(self.backbone, views, per_view_batch_norm=False)
        s_logits = self.head(torch.cat(s_feats))
        q = self.cls_targets(t_logits, all_reduce_sum)
        loss = dino_cross_entropy(s_logits, q, c.student_temp, self.n_global)
        signs = self.teacher_signs(t_logits, q)
        signs["dino_kl_teacher_student"] = loss.detach() - signs["dino_teacher_entropy"]  # mean KL(q_i || p_v)
        if c.koleo_loss_weight > 0:
            koleo, koleo_signs = self.koleo(s_feats[:self.n_global])
            loss = loss + koleo
            signs.update(koleo_signs)
        if c.centering == "centering":  # C over the global batch, after the loss
            self.centres.update(all_reduce_sum, center=(t_logits.float().sum(0), t_logits.shape[0]))
        return StepOutput(loss, embedding=t_feats[0], embedding2=t_feats[1], instruments=signs)
