"""Distillation of a frozen teacher into any student backbone: LightlyTrain's three distillations (``method.version``).

The teacher is any ``model.weights`` source with its own architecture (``method.teacher.weights``,
``method.teacher.backbone``: ``auto`` reads it from the source); the student is the run's backbone (``model.*``, or
a user's own network through ``selfsup.method``). Per step (lightly-train at 8f5a75c4, ``_methods/distillation*/``;
the facts with file:line in docs/teacher-distillation.md), on one view mixed with a permutation of its batch:

    x̃ = λ x + (1 − λ) x[π]                       # λ ~ U(0, 1), π a permutation (v1 :273-283, v2 :289-299, v3 :364-374)
    v1 (distillation.py; ``distillationv1`` in LightlyTrain today):
      t = normalize(teacher(x̃))                  # the pooled feature ([CLS]), frozen, eval mode, no gradient
      s = normalize(W · student(x̃))              # W: Linear to the teacher's width, trunc-normal .02 (:183-189)
      Q ← [t of every process; Q[:-B]]           # the queue of teacher embeddings, updated before the loss
      loss = KL(softmax(t Qᵀ/τ) ‖ softmax(s Qᵀ/τ))           # τ = 0.07 (losses.global_distillation_loss)
    v2 (distillationv2.py):
      T = [teacher's last n blocks' patch features]          # normed, concatenated: (B, h_t·w_t, n·D) (:224-257)
      S = resize(H(student map(x̃)), h_t × w_t)                # H per position, bilinear (:259-286)
      loss = mean((S − T)²)                                  # no normalisation, no queue (losses.distillation_mse_loss)
    v3 (distillationv3.py; LightlyTrain's default ``distillation``):
      t, T = normalize(teacher [CLS]), normalize(teacher patch features)          (:292-317)
      s = normalize(W_g · student pooled);  S = normalize(resize(W_l · student map, h_t × w_t))   (:319-361)
      Q ← [t; Q[:-B]];  loss = KL_Q(t ‖ s) + w · mean_{b,i} KL(softmax(T_b T_bᵀ/τ_l)_i ‖ softmax(S_b S_bᵀ/τ_l)_i)

Across processes (LightlyTrain keeps one queue and one permutation per GPU): the queue takes the teacher embeddings
of every process in rank order and the permutation is drawn over the global batch (the views gathered without
gradient), so N processes train as one process on the concatenated batch; with one process it is LightlyTrain's
step. The teacher is a ``methods.frozen.FrozenNetwork``: not a child module, never in a checkpoint, the optimiser
or DDP; its sha256 is written into each checkpoint and checked when a run resumes (the teacher reloaded from its
source). On a GPU it runs in bf16 autocast. The feature maps of both networks come from ``models.dense``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from selfsup.distributed import gather_no_grad, world
from selfsup.errors import UserError
from selfsup.losses import distillation_mse_loss, global_distillation_loss, local_distillation_loss
from selfsup.methods.base import SSLMethod
from selfsup.methods.frozen import load_teacher
from selfsup.models.dense import feature_maps, gives_last_blocks, has_feature_maps
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


VERSIONS = ("v1", "v2", "v3")
# the keys of some versions only: key → (default, the versions that read it); another version refuses another value
ONLY = {"n_teacher_blocks": (2, ("v2",)), "projection_layers": (1, ("v2",)), "projection_hidden_dim": (2048, ("v2",)),
        "temperature_local": (0.07, ("v3",)), "local_weight": (1.0, ("v3",)), "teacher_centre": (0.0, ("v1", "v3"))}


@dataclass
class DistillConfig:
    """LightlyTrain's distillation defaults (v1 distillation.py:85-105, v2 :80-103, v3 :83-108)."""

    # the frozen teacher: its source (weights), its architecture (backbone: auto reads it) and a named one's kwargs
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    # which of LightlyTrain's distillations: v1 (its first, ``distillationv1`` today: the [CLS] matched through a
    # queue's softmax), v2 (MSE of the student's projected feature map, resized to the teacher's grid, against the
    # teacher's last blocks' patch features), v3 (its default ``distillation`` today: v1's term plus a local term,
    # each image's patch-to-patch softmaxes matched); method_helpers.py:54-69
    version: str = "v1"
    temperature: float = 0.07  # v1, v3: τ of the global term's softmaxes (v1 :92, v3 temperature_global :92)
    # v1, v3: rows of the queue; LightlyTrain's "auto" (v1 :113-133, v3 :114-144, the same buckets) buckets the
    # dataset size: 8192 from 20,000 images, 4096 from 10,000, 2048 from 4,000, 1024 from 2,000, 512 from 1,000,
    # 256 from 500, ... (about 25-50% of the images)
    queue_size: int = 8192
    mixup: bool = True  # the convex combination of the batch with a permutation of itself (v1 :211-212, v2, v3)
    # not LightlyTrain's (0: off, its behaviour), v1 and v3's global term: the momentum of a running mean of the
    # teacher's features taken off them before the L2 normalisation (DINO's centre, Adam's bias correction). A teacher
    # whose features share one dominant direction (a small selfsup ViT's, mean cosine 0.9995 between digits) gives
    # near-uniform targets over the queue (entropy log Q) and the student collapses onto them; DINOv2's do not need it
    teacher_centre: float = 0.0
    n_teacher_blocks: int = 2  # v2: the teacher's last blocks whose patch features are concatenated (:84; n > 1: ViT)
    # v2: layers of the per-position projection head (:96): 1 a Linear; n > 1 (Linear, LayerNorm, GELU) × (n − 1),
    # then a Linear (:116-152); every Linear trunc-normal .02 with zero bias
    projection_layers: int = 1
    projection_hidden_dim: int = 2048  # v2: the head's hidden width (:99)
    temperature_local: float = 0.07  # v3: τ of the local term's patch-to-patch softmaxes (:93)
    local_weight: float = 1.0  # v3: loss = global + local_weight · local (loss_local_weight, :108, :265)

    def validate(self) -> None:
        if not self.teacher.weights:
            raise UserError("method.teacher.weights is required: a selfsup run folder, a weights file, a DINOv2 hub "
                            "checkpoint or timm:<name>")
        if self.version not in VERSIONS:
            raise UserError(f"method.version={self.version!r} is not known; use v1 (LightlyTrain's first), v2 or "
                            "v3 (its default today)")
        for key, (default, versions) in ONLY.items():
            if self.version not in versions and getattr(self, key) != default:
                raise UserError(f"method.{key} applies to method.version {' or '.join(versions)}, not "
                                f"{self.version}; set method.{key}={default}")
        if not self.temperature > 0 or not self.temperature_local > 0:
            raise UserError(f"method.temperature={self.temperature} and method.temperature_local="
                            f"{self.temperature_local} must be > 0 (LightlyTrain: 0.07)")
        if self.queue_size < 1 or self.n_teacher_blocks < 1 or self.projection_layers < 1:
            raise UserError(f"method.queue_size={self.queue_size}, method.n_teacher_blocks={self.n_teacher_blocks} "
                            f"and method.projection_layers={self.projection_layers} must be >= 1")
        if not 0 <= self.teacher_centre < 1:
            raise UserError(f"method.teacher_centre={self.teacher_centre} must be in [0, 1) (0: no centring, "
                            "LightlyTrain's; 0.9: DINO's centre momentum)")


def trunc_normal_linear(d_in: int, d_out: int, zero_bias: bool = False) -> nn.Linear:
    """A Linear whose weight is trunc-normal, std 0.02 (v1 distillation.py:183-189, v3 :203-214); the bias PyTorch's
    default, or 0 (v2's head, :142-146)."""
    layer = nn.Linear(d_in, d_out)
    nn.init.trunc_normal_(layer.weight, std=0.02)
    if zero_bias:
        nn.init.zeros_(layer.bias)
    return layer


def v2_head(d_in: int, d_out: int, layers: int, hidden: int) -> nn.Module:
    """v2's projection head (distillationv2.py:116-152): a Linear, or (Linear, LayerNorm, GELU) × (layers − 1) and a
    Linear; applied to each position of a channels-last map."""
    if layers == 1:
        return trunc_normal_linear(d_in, d_out, zero_bias=True)
    widths = [d_in] + [hidden] * (layers - 1)
    parts: list[nn.Module] = []
    for a, b in zip(widths[:-1], widths[1:]):
        parts += [trunc_normal_linear(a, b, zero_bias=True), nn.LayerNorm(b), nn.GELU()]
    return nn.Sequential(*parts, trunc_normal_linear(hidden, d_out, zero_bias=True))


def on_grid(fmap: Tensor, head: nn.Module, grid: tuple[int, int]) -> Tensor:
    """(B, h·w, D): ``head`` on each position of the map (B, C, h, w), bilinearly resized to the teacher's ``grid``
    (align_corners False, v2 :268-286, v3 :340-356), flattened row-major."""
    y = head(fmap.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
    y = F.interpolate(y, size=grid, mode="bilinear", align_corners=False)
    return y.flatten(2).transpose(1, 2)


class Distill(SSLMethod):
    """The student matched to the frozen teacher: its projected pooled feature through the queue's softmax (v1),
    its projected feature map on the teacher's grid by MSE (v2), or both terms of v3."""

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
        if c.version != "v2":  # the global term: v1's head (distillation.py:183-189), v3's global head (:203-214)
            self.projector = trunc_normal_linear(self.backbone.num_features, width)
            self.register_buffer("queue", torch.zeros(c.queue_size, width))  # zeros; a checkpoint buffer
        for who, net in (("student", self.backbone), ("teacher", self.teacher.network)):
            if c.version != "v1" and not has_feature_maps(net):
                raise UserError(f"method.version={c.version} reads the {who}'s feature map; a {type(net).__name__} "
                                "returning (B, D) gives none: give one returning its map (B, C, H, W), or use "
                                "method.version=v1")
        if c.version == "v2" and c.n_teacher_blocks > 1 and not gives_last_blocks(self.teacher.network):
            raise UserError(f"method.n_teacher_blocks={c.n_teacher_blocks}: a {type(self.teacher.network).__name__} "
                            "teacher gives its last feature map only (a selfsup ViT, a DINOv2 or DINOv3 ViT file gives "
                            "its last blocks'); set method.n_teacher_blocks=1")
        if c.version == "v2":  # the teacher's last blocks concatenated (distillationv2.py:177-191)
            self.local_projector = v2_head(self.backbone.num_features, c.n_teacher_blocks * width,
                                           c.projection_layers, c.projection_hidden_dim)
        elif c.version == "v3":  # the local head (:207-214)
            self.local_projector = trunc_normal_linear(self.backbone.num_features, width)
        if c.teacher_centre:
            self.register_buffer("centre", torch.zeros(width))  # the running mean's EMA and its step count
            self.register_buffer("centre_updates", torch.zeros(()))

    def trainable(self):
        heads = ("projector", "local_projector")
        return {"backbone": self.backbone, **{h: getattr(self, h) for h in heads if hasattr(self, h)}}

    # ----------------------------------------------------------------- the teacher
    @torch.no_grad()
    def teacher_embedding(self, x: Tensor) -> Tensor:
        """normalize(teacher(x)) in float32: eval mode, no gradient, bf16 autocast on a GPU (centred first with
        ``method.teacher_centre``)."""
        t = self.teacher(x)
        return F.normalize(self.centred(t.flatten(1).float()), dim=-1)

    @torch.no_grad()
    def teacher_maps(self, x: Tensor, n: int = 1) -> tuple[Tensor, Tensor]:
        """(the pooled feature (B, D), the feature maps of the last ``n`` blocks concatenated (B, n·D, h, w): the
        teacher's grid) in float32, from one frozen forward of the teacher (distillationv2.py:224-257,
        distillationv3.py:292-317)."""
        pooled, maps = self.teacher.apply(lambda network, y: feature_maps(network, y, n), x)
        return pooled.flatten(1).float(), torch.cat(maps, dim=1).float()

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
        (distillation.py:232-247, distillationv3.py:275-290; a batch larger than the queue fills it with its first
        rows)."""
        new = gather_no_grad(t.contiguous())
        if new.shape[0] >= self.queue.shape[0]:
            self.queue.copy_(new[:self.queue.shape[0]])
        else:
            self.queue.copy_(torch.cat([new, self.queue[:-new.shape[0]]]))

    def forward_views(self, views: list[Tensor], lam: Tensor | None = None, perm: Tensor | None = None) -> StepOutput:
        x = views[0]  # one view (distillation.py:208-209)
        if lam is not None and perm is not None:
            x = self.mix(x, lam, perm)
        version = self.cfg.method.version
        return self.step_v1(x) if version == "v1" else self.step_v2(x) if version == "v2" else self.step_v3(x)

    def global_term(self, h: Tensor, t: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(the loss over the queue, updated with ``t`` first, the student's projection z, its cosine to ``t``)."""
        z = self.projector(h.flatten(1))
        s = F.normalize(z, dim=-1)
        self.update_queue(t)
        loss = global_distillation_loss(s, t, self.queue, self.cfg.method.temperature)
        with torch.no_grad():
            agree = (s.float() * t).sum(dim=-1).mean()
        return loss, z, agree

    def step_v1(self, x: Tensor) -> StepOutput:
        t = self.teacher_embedding(x)
        h = self.backbone(x)
        loss, z, agree = self.global_term(h, t)
        return StepOutput(loss, embedding=h.detach(), projection=z.detach(), scalars={"teacher_cosine": agree})

    def step_v2(self, x: Tensor) -> StepOutput:
        """MSE of the student's projected map on the teacher's grid against the teacher's last blocks
        (distillationv2.py:197-222)."""
        _, target = self.teacher_maps(x, self.cfg.method.n_teacher_blocks)
        h, (fmap,) = feature_maps(self.backbone, x)
        s = on_grid(fmap, self.local_projector, tuple(target.shape[-2:]))
        loss = distillation_mse_loss(s, target.flatten(2).transpose(1, 2))
        return StepOutput(loss, embedding=h.detach())

    def step_v3(self, x: Tensor) -> StepOutput:
        """The global term over the queue plus ``local_weight`` × the local term (distillationv3.py:235-273)."""
        c = self.cfg.method
        pooled, fmap = self.teacher_maps(x)
        t = F.normalize(self.centred(pooled), dim=-1)
        t_local = F.normalize(fmap.flatten(2).transpose(1, 2), dim=-1)
        h, (s_map,) = feature_maps(self.backbone, x)
        s_local = F.normalize(on_grid(s_map, self.local_projector, tuple(fmap.shape[-2:])), dim=-1)
        global_loss, z, agree = self.global_term(h, t)
        local_loss = local_distillation_loss(s_local, t_local, c.temperature_local)
        return StepOutput(global_loss + c.local_weight * local_loss, embedding=h.detach(), projection=z.detach(),
                          scalars={"teacher_cosine": agree, "global_loss": global_loss.detach(),
                                   "local_loss": local_loss.detach()})
