"""Distillation of a frozen teacher into any student backbone: LightlyTrain's global distillation (v1).

The teacher is any ``model.weights`` source with its own architecture (``method.teacher.weights``,
``method.teacher.backbone``: ``auto`` reads it from the source); the student is the run's backbone (``model.*``, or
a user's own network through ``selfsup.method``). Per step (lightly-train ``_methods/distillation/distillation.py``,
the facts with file:line in docs/teacher-distillation.md):

    x̃ = λ x + (1 − λ) x[π]                       # mixup of the one view, λ ~ U(0, 1), π a permutation (:273-283)
    t = normalize(teacher(x̃))                    # frozen, eval mode, no gradient (:76-80, :249-256)
    s = normalize(W · student(x̃))                # W: Linear to the teacher's width, trunc-normal .02 (:183-189)
    Q ← [t of every process; Q[:-B]]             # the queue of teacher embeddings, updated before the loss (:220-247)
    loss = KL(softmax(t Qᵀ/τ) ‖ softmax(s Qᵀ/τ))  # τ = 0.07 (:92; losses.global_distillation_loss)

Across processes (LightlyTrain keeps one queue and one permutation per GPU): the queue takes the teacher embeddings
of every process in rank order and the permutation is drawn over the global batch (the views gathered without
gradient), so N processes train as one process on the concatenated batch; with one process it is LightlyTrain's
step. The teacher is a ``methods.frozen.FrozenNetwork``: not a child module, never in a checkpoint, the optimiser
or DDP; its sha256 is written into each checkpoint and checked when a run resumes (the teacher reloaded from its
source). On a GPU it runs in bf16 autocast.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from selfsup.distributed import gather_no_grad, world
from selfsup.errors import UserError
from selfsup.losses import global_distillation_loss
from selfsup.methods.base import SSLMethod
from selfsup.methods.frozen import load_teacher
from selfsup.schedules import step_seed
from selfsup.step import StepOutput


@dataclass
class TeacherConfig:
    """The frozen teacher: any ``model.weights`` source, its architecture read from it (``auto``) or named."""

    # the teacher's source: a selfsup run folder / export, a .safetensors / .pth, a DINOv2 hub file, timm:<name>
    weights: str | None = None
    # auto: the source's own architecture (a selfsup export's metadata, a DINOv2 hub file's shapes, timm:<name>);
    # or a backbone name (vit_*, deit_small, resnet*, bn_cnn_*, timm:<name>) built with ``kwargs``
    backbone: str = "auto"
    kwargs: dict = field(default_factory=dict)  # build_backbone keywords of a named teacher (patch_size, pos_embed)


@dataclass
class DistillConfig:
    """LightlyTrain's distillation v1 defaults (distillation.py:85-105)."""

    # the frozen teacher: its source (weights), its architecture (backbone: auto reads it) and a named one's kwargs
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    temperature: float = 0.07  # τ of both softmaxes (:92)
    # rows of the queue; LightlyTrain's "auto" (:113-133) buckets the dataset size: 8192 from 20,000 images, 4096
    # from 10,000, 2048 from 4,000, 1024 from 2,000, 512 from 1,000, 256 from 500, ... (about 25-50% of the images)
    queue_size: int = 8192
    mixup: bool = True  # the convex combination of the batch with a permutation of itself (:211-212)
    # not LightlyTrain's (0: off, its behaviour): the momentum of a running mean of the teacher's features taken off
    # them before the L2 normalisation (DINO's centre, Adam's bias correction). A teacher whose features share one
    # dominant direction (a small selfsup ViT's, mean cosine 0.9995 between digits) gives near-uniform targets over
    # the queue (entropy log Q) and the student collapses onto them; DINOv2's features do not need it
    teacher_centre: float = 0.0

    def validate(self) -> None:
        if not self.teacher.weights:
            raise UserError("method.teacher.weights is required: a selfsup run folder, a weights file, a DINOv2 hub "
                            "checkpoint or timm:<name>")
        if not self.temperature > 0:
            raise UserError(f"method.temperature={self.temperature} must be > 0 (LightlyTrain: 0.07)")
        if self.queue_size < 1:
            raise UserError(f"method.queue_size={self.queue_size} must be >= 1")
        if not 0 <= self.teacher_centre < 1:
            raise UserError(f"method.teacher_centre={self.teacher_centre} must be in [0, 1) (0: no centring, "
                            "LightlyTrain's; 0.9: DINO's centre momentum)")


class Distill(SSLMethod):
    """The student ``W · backbone(x̃)`` matched to the frozen teacher's embedding through the queue's softmax."""

    Config = DistillConfig
    recipe = "distillation"
    collapse_remedy = "a lower optim.base_lr; a larger method.queue_size"
    loss_embedding = ("projector",)

    def __init__(self, cfg, info):
        super().__init__(cfg, info)
        c = cfg.method
        self.teacher = load_teacher(c.teacher.weights, c.teacher.backbone, dict(c.teacher.kwargs), info)
        self.frozen_networks.append(self.teacher)  # outside the module tree, its sha256 in each checkpoint
        width = int(self.teacher.network.num_features)
        self.projector = nn.Linear(self.backbone.num_features, width)  # distillation.py:183-189
        nn.init.trunc_normal_(self.projector.weight, std=0.02)
        self.register_buffer("queue", torch.zeros(c.queue_size, width))  # :196-205 (zeros; a checkpoint buffer)
        if c.teacher_centre:
            self.register_buffer("centre", torch.zeros(width))  # the running mean's EMA and its step count
            self.register_buffer("centre_updates", torch.zeros(()))

    def trainable(self):
        return {"backbone": self.backbone, "projector": self.projector}

    # ----------------------------------------------------------------- the teacher
    @torch.no_grad()
    def teacher_embedding(self, x: Tensor) -> Tensor:
        """normalize(teacher(x)) in float32: eval mode, no gradient, bf16 autocast on a GPU (centred first with
        ``method.teacher_centre``)."""
        t = self.teacher(x)
        return F.normalize(self.centred(t.flatten(1).float()), dim=-1)

    @torch.no_grad()
    def centred(self, f: Tensor) -> Tensor:
        """f − c / (1 − mⁿ): c the EMA (momentum m = ``method.teacher_centre``) of the global batch's mean feature,
        updated with this batch first, n its updates (Adam's bias correction: the first step subtracts the batch's
        own mean); m = 0: f as it is (LightlyTrain)."""
        m = self.cfg.method.teacher_centre
        if not m:
            return f
        self.centre.mul_(m).add_(gather_no_grad(f.contiguous()).mean(dim=0), alpha=1 - m)
        self.centre_updates.add_(1)
        return f - self.centre / (1 - m ** self.centre_updates)

    # ----------------------------------------------------------------- the step
    def step_draws(self, views: list[Tensor]) -> dict[str, Tensor]:
        """λ ~ U(0, 1) and a permutation of the global batch, drawn alike by every process (a generator seeded by
        the seed and the step, not the rank), so N processes mix as one."""
        x = views[0]
        if not self.cfg.method.mixup:
            return {}
        _, size = world()
        trainer = self._trainer  # None outside fit (Lightning's property raises there)
        g = torch.Generator().manual_seed(step_seed(trainer, self.cfg.trainer.seed, 7_919, 17))
        lam = torch.rand((), generator=g)
        perm = torch.randperm(x.shape[0] * size, generator=g)
        return {"lam": lam.to(x.device, non_blocking=True), "perm": perm.to(x.device, non_blocking=True)}

    def mix(self, x: Tensor, lam: Tensor, perm: Tensor) -> Tensor:
        """λ x + (1 − λ) x_all[π] for this process's rows of the global batch (distillation.py:273-283)."""
        rank, _ = world()
        partners = gather_no_grad(x)[perm[rank * x.shape[0]:(rank + 1) * x.shape[0]]]
        return lam.to(x.dtype) * x + (1 - lam.to(x.dtype)) * partners

    @torch.no_grad()
    def update_queue(self, t: Tensor) -> None:
        """Q ← the teacher embeddings of every process (rank order) first, then the queue's first Q − B rows
        (distillation.py:232-247; a batch larger than the queue fills it with its first rows)."""
        new = gather_no_grad(t.contiguous())
        if new.shape[0] >= self.queue.shape[0]:
            self.queue.copy_(new[:self.queue.shape[0]])
        else:
            self.queue.copy_(torch.cat([new, self.queue[:-new.shape[0]]]))

    def forward_views(self, views: list[Tensor], lam: Tensor | None = None, perm: Tensor | None = None) -> StepOutput:
        x = views[0]  # one view (distillation.py:208-209)
        if lam is not None and perm is not None:
            x = self.mix(x, lam, perm)
        t = self.teacher_embedding(x)
        h = self.backbone(x)
        z = self.projector(h.flatten(1))
        s = F.normalize(z, dim=-1)
        self.update_queue(t)
        loss = global_distillation_loss(s, t, self.queue, self.cfg.method.temperature)
        with torch.no_grad():
            agree = (s.float() * t).sum(dim=-1).mean()
        return StepOutput(loss, embedding=h.detach(), projection=z.detach(), scalars={"teacher_cosine": agree})
