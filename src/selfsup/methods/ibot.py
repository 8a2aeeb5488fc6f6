"""iBOT (Zhou et al. 2022, "Image BERT Pre-Training with Online Tokenizer"), as bytedance/ibot main_ibot.py.

DINO (``methods.dino``; the shared teacher, centres and schedules in ``methods.teacher``) with a
masked-image-modelling term; per step (main_ibot.py:403-413, :478-572):

    m_1, m_2 = block masks of the two global crops              # half the crops unmasked in the recipe
    t_cls, t_patch = teacher_head(teacher_backbone(x_global))    # unmasked, no gradient
    s_cls, s_patch = head(backbone(x_global, mask=m))            # masked patches → the learned mask token
    s_local = head(backbone(x_local))                            # class token only, no mask
    L_cls   = mean over pairs (q, v), v ≠ q, of H(softmax((t_cls,q − C) / τt), softmax(s_cls,v / τs))
    L_patch = mean over the global crops q and their images of
              Σ_masked H(softmax((t_patch,q − C2) / τt2), softmax(s_patch,q / τs)) / max(#masked, 1)
    loss = λ1 L_cls + λ2 L_patch
    C  ← m C  + (1 − m) mean(t_cls);   C2 ← m2 C2 + (1 − m2) mean over images of (mean over patches of t_patch)

Official behaviour reproduced (file:line in docs NEW-METHODS §2 iBOT): the mask token ``masked_embed``
(zero-initialised, student only) replaces masked patch embeddings before the class token and positions
(``VisionTransformer.forward(x, mask, return_all_tokens=True)``); the head (``models.heads.iBOTHead``) shares DINO's MLP
between the class and patch tokens, the patch tokens get their own weight-normalised ``last_layer2`` unless
``shared_head``; the student and the teacher choose that separately (``shared_head`` False,
``shared_head_teacher`` True by default; the patch dimension is ``out_dim`` when either is shared, :270-273).
With the default asymmetric heads the teacher starts from the student's ``state_dict`` loaded non-strictly (its
one projection then holds the student's ``last_layer2``, loaded last) and the EMA runs over the parameter names
both share (:263, :380-390), so the teacher's projection follows the student's ``last_layer``; the README recipe
uses ``shared_head true``. The block-wise masks (``data.masks``) are drawn for the global crops from the step's
generator after the augmentation. Schedules, per-tensor clipping, the frozen last layers (``last_layer2`` too)
and the evaluated teacher are DINO's; τt2 warms up per epoch like τt (shifted by ``pred_start_epoch``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from selfsup.data.masks import default_max_blocks, ibot_masks, max_masked_patches
from selfsup.distributed import all_reduce_sum
from selfsup.errors import UserError
from selfsup.losses import dino_cross_entropy, ibot_patch_cross_entropy, ibot_patch_loss
from selfsup.methods.base import encode_views
from selfsup.methods.dino import DINOConfig
from selfsup.methods.teacher import (Centres, SelfDistillation, StepScalar, add_mask_token, ema_teacher,
                                     require_cls_vit, teacher_targets)
from selfsup.models.heads import iBOTHead
from selfsup.schedules import StepValues, teacher_temperature
from selfsup.step import StepOutput


@dataclass
class iBOTConfig(DINOConfig):
    """iBOT hyper-parameters; defaults are main_ibot.py's argument defaults (:48-94, :167-176)."""

    out_dim: int = 8192  # K of the [CLS] head
    patch_out_dim: int = 8192  # K of the patch head (out_dim when either head is shared)
    shared_head: bool = False  # the student projects the patch tokens with last_layer (the README recipe: true)
    shared_head_teacher: bool = True  # the same for the teacher
    warmup_teacher_temp_epochs: int = 30  # iBOT's code default (DINO's is 0); τt and τt2 both
    warmup_teacher_patch_temp: float = 0.04
    teacher_patch_temp: float = 0.07  # τt2 after warm-up
    center_momentum2: float = 0.9  # of the patch centre C2
    lambda1: float = 1.0  # weight of the [CLS] term
    lambda2: float = 1.0  # weight of the masked-patch term
    use_masked_im_modeling: bool = True  # false: the student sees the global crops unmasked
    pred_ratio: tuple[float, ...] = (0.3,)  # masking ratio(s) of a global crop; one entry chosen per crop
    pred_ratio_var: tuple[float, ...] = (0.0,)  # ± half-width of each ratio's uniform draw (one value: for all)
    pred_aspect_ratio: tuple[float, float] = (0.3, 1 / 0.3)  # block aspect-ratio range (log-uniform)
    pred_shape: str = "block"  # block (BEiT) | rand (uniform patches)
    pred_start_epoch: int = 0  # no masking before this epoch (50 for Swin)
    pred_max_blocks: int = 0  # rounds of the block loop; 0: ceil(max ratio · H · W), the official loop exactly

    def validate(self) -> None:
        super().validate()
        if self.patch_out_dim < 1:
            raise UserError(f"method.patch_out_dim={self.patch_out_dim} must be >= 1")
        if self.centering not in ("centering", "sinkhorn_knopp"):
            raise UserError(f"method.centering={self.centering}: iBOT centres with its EMA centres C and C2 "
                            "(main_ibot.py, method.centering=centering) or takes DINOv2's Sinkhorn-Knopp targets "
                            "(method.centering=sinkhorn_knopp)")
        for key in ("warmup_teacher_patch_temp", "teacher_patch_temp"):
            if not getattr(self, key) > 0:
                raise UserError(f"method.{key}={getattr(self, key)} must be > 0")
        if not 0 <= self.center_momentum2 < 1:
            raise UserError(f"method.center_momentum2={self.center_momentum2} must be in [0, 1)")
        if self.use_bn_in_head:
            raise UserError("method.use_bn_in_head=true: the iBOT head runs on token sequences; set it to false")
        if self.pred_shape not in ("block", "rand"):
            raise UserError(f"method.pred_shape={self.pred_shape!r}; use block or rand")
        if len(self.pred_ratio_var) == 1 and len(self.pred_ratio) > 1:
            self.pred_ratio_var = self.pred_ratio_var * len(self.pred_ratio)  # loader.py:27-28
        if not self.pred_ratio or len(self.pred_ratio_var) != len(self.pred_ratio):
            raise UserError(f"method.pred_ratio_var={list(self.pred_ratio_var)} needs one value or one per "
                            f"method.pred_ratio={list(self.pred_ratio)}")
        for r, v in zip(self.pred_ratio, self.pred_ratio_var):
            if not 0 <= v <= r or r + v >= 1:
                raise UserError(f"method.pred_ratio {r} ± {v} must satisfy 0 <= var <= ratio and ratio + var < 1")
        lo, hi = self.pred_aspect_ratio
        if not 0 < lo <= hi:
            raise UserError(f"method.pred_aspect_ratio={list(self.pred_aspect_ratio)} must be 0 < low <= high")
        for key in ("pred_start_epoch", "pred_max_blocks"):
            if getattr(self, key) < 0:
                raise UserError(f"method.{key}={getattr(self, key)} must be >= 0")


class iBOT(SelfDistillation):
    """DINO's student / teacher on the [CLS] token plus self-distillation of masked patch tokens."""
    collapse_remedy = ("a higher method.teacher_temp / method.teacher_patch_temp or their warm-up; a lower "
                       "optim.base_lr; a smaller method.out_dim / method.patch_out_dim")

    Config = iBOTConfig
    schedule_extras = ("teacher_temp", "teacher_patch_temp")
    teacher_patch_temp = StepScalar()  # this epoch's patch temperature τt2; step_teacher_patch_temp on the device

    def __init__(self, cfg, info):
        super().__init__(cfg, info)  # the student backbone
        c = cfg.method
        require_cls_vit("ibot", cfg, self.backbone)
        self.patch_dim = c.out_dim if (c.shared_head or c.shared_head_teacher) else c.patch_out_dim  # :270-273
        self.head = self.make_head(c, c.shared_head)
        self.teacher_backbone = ema_teacher(self, self.backbone)
        self.teacher_head = ema_teacher(self, self.head, like=None if c.shared_head == c.shared_head_teacher
                                        else self.make_head(c, c.shared_head_teacher))
        self.grid = add_mask_token(self.backbone, self.teacher_backbone)
        self.centres = Centres(self, center=((1, c.out_dim), c.center_momentum),
                               center2=((1, 1, self.patch_dim), c.center_momentum2))
        self.teacher_temp = c.warmup_teacher_temp if c.warmup_teacher_temp_epochs else c.teacher_temp
        self.teacher_patch_temp = (c.warmup_teacher_patch_temp if c.warmup_teacher_temp_epochs or c.pred_start_epoch
                                   else c.teacher_patch_temp)
        self.post_step_hooks.append(self.teacher_ema)
        self.max_blocks = c.pred_max_blocks or default_max_blocks(self.grid, c.pred_ratio, c.pred_ratio_var)
        self.max_masked = max_masked_patches(self.grid, c.pred_ratio, c.pred_ratio_var)

    def make_head(self, c, shared: bool) -> iBOTHead:
        """An iBOT head; ``shared``: the patch tokens through the [CLS] head's ``last_layer``. The student's follows
        ``shared_head``; the teacher's ``shared_head_teacher``: with another value than the student's it is a head
        of that kind that starts from the student's weights (``ema_teacher`` ``like``, main_ibot.py:263)."""
        return iBOTHead(self.backbone.num_features, c.out_dim, self.patch_dim, c.hidden_dim, c.bottleneck_dim,
                        c.head_layers, False, c.norm_last_layer, shared)

    # ----------------------------------------------------------------- the step
    def draw_masks(self, n: int, device) -> torch.Tensor:
        """(n, N) bool masks of ``n`` global crops (True = masked) from the step's generator, after the
        augmentation's draws (a resumed run masks as the uninterrupted one); none before ``pred_start_epoch``."""
        c = self.cfg.method
        masking = self.current_epoch >= c.pred_start_epoch
        ratio = c.pred_ratio if masking else (0.0,)
        var = c.pred_ratio_var if masking else (0.0,)
        masks = ibot_masks(n, self.grid, self.rng(device), ratio, var, tuple(c.pred_aspect_ratio), c.pred_shape,
                           self.max_blocks, device)
        return masks.flatten(1)

    def step_draws(self, views) -> dict[str, torch.Tensor]:
        """The global crops' masks, drawn before the (compiled) step."""
        return {"masks": self.draw_masks(sum(v.shape[0] for v in views[:self.n_global]), views[0].device)}

    def forward_views(self, views, masks: torch.Tensor | None = None):
        """The loss of a view plan (2 global crops, then any local crops); ``masks`` (2B, N) bool of the global
        crops (default: ``draw_masks``)."""
        c, n = self.cfg.method, self.n_global
        if len(views) < n:
            raise UserError(f"iBOT needs the 2 global crops of its view plan, got {len(views)} view(s)")
        x = torch.cat(views[:n])  # the global crops in one call
        if masks is None:
            masks = self.draw_masks(x.shape[0], x.device)
        with torch.no_grad():
            t_tokens = self.teacher_backbone(x, return_all_tokens=True)
            t_cls, t_patch = self.teacher_head(t_tokens)
        s_tokens = self.backbone(x, masks if c.use_masked_im_modeling else None, return_all_tokens=True)
        index = self.loss_patches(masks)
        s_cls, s_patch = self.head(s_tokens, patch_index=index)
        if index is not None:  # the teacher's targets and the masks at the same patches
            t_patch_loss = t_patch.gather(1, index[..., None].expand(-1, -1, t_patch.shape[-1]))
            masks_loss = masks.gather(1, index)
        else:
            t_patch_loss, masks_loss = t_patch, masks
        if len(views) > n:  # the local crops: class token only, unmasked (main_ibot.py:410-412)
            s_cls = torch.cat([s_cls, self.head(torch.cat(encode_views(self.backbone, views[n:], False)))])
        q_cls = self.cls_targets(t_cls, all_reduce_sum)  # DINO's centred targets, or Sinkhorn-Knopp's
        loss_cls = dino_cross_entropy(s_cls, q_cls, c.student_temp, n) * c.lambda1
        if c.centering == "sinkhorn_knopp":  # DINOv2's patch targets: Sinkhorn-Knopp over the masked patches
            q_patch = self.patch_codes(t_patch_loss, masks_loss)
            loss_patch = ibot_patch_cross_entropy(s_patch, q_patch, masks_loss, c.student_temp) * c.lambda2
        else:
            loss_patch = ibot_patch_loss(s_patch, t_patch_loss, self.center2, masks_loss, c.student_temp,
                                         self.step_teacher_patch_temp) * c.lambda2
        # DINO's collapse signs on the [CLS] term, the share of masked patches
        signs = {**self.teacher_signs(t_cls, q_cls),
                 "ibot_center2_norm": self.center2.norm(), "ibot_masked_share": masks.float().mean()}
        if c.centering == "centering":
            self.update_centers(t_cls, t_patch)
        b = views[0].shape[0]
        return StepOutput(loss_cls + loss_patch, embedding=t_tokens[:b, 0], embedding2=t_tokens[b:2 * b, 0],
                          scalars={"loss_cls": loss_cls.detach(), "loss_patch": loss_patch.detach()},
                          instruments=signs)

    @torch.no_grad()
    def patch_codes(self, t_patch: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
        """``method.centering=sinkhorn_knopp``: the patch targets as DINOv2 makes them (ibot_patch_loss.py
        ``sinkhorn_knopp_teacher``): Sinkhorn-Knopp at ε = τt2 over the masked patches of the global batch (the
        other rows get zero codes and weigh nothing), (n·B, k, K)."""
        flat = t_patch.reshape(-1, t_patch.shape[-1])
        codes = teacher_targets(flat, "sinkhorn_knopp", self.center2, self.step_teacher_patch_temp,
                                self.cfg.method.sinkhorn_iterations, all_reduce_sum, valid=masks.reshape(-1))
        return codes.view_as(t_patch)

    def loss_patches(self, masks: torch.Tensor) -> torch.Tensor | None:
        """(2B, k) the patches the student's patch head projects: every masked patch of each crop first (in patch
        order), then unmasked ones, k = ``max_masked_patches`` (the most a mask can hold; None when that is all N).
        The patch term weighs only masked patches, and the head is per token, so the loss and its gradients are
        the official head's on all N (main_ibot.py runs it on every token); the static k keeps the step free of
        host reads and data-dependent shapes. The teacher's head still sees every patch: C2 is their mean."""
        if self.max_masked >= masks.shape[1]:
            return None
        return masks.to(torch.uint8).argsort(dim=1, descending=True, stable=True)[:, :self.max_masked]

    def update_centers(self, t_cls: torch.Tensor, t_patch: torch.Tensor) -> None:
        """C ← m C + (1 − m) Σ t_cls / (2B · world); C2 ← m2 C2 + (1 − m2) Σ_images mean_patches t_patch / (2B ·
        world); both sums all-reduced in one call (main_ibot.py:559-572)."""
        n = t_cls.shape[0]
        self.centres.update(all_reduce_sum, center=(t_cls.float().sum(0), n),
                            center2=(t_patch.float().mean(1).sum(0), n))

    # ----------------------------------------------------------------- schedules
    def schedule(self, step: int, epoch: int) -> StepValues:
        """DINO's schedules, and τt2 per epoch: its warm-up starts at ``pred_start_epoch`` (main_ibot.py:498-512;
        logged as ``train/teacher_patch_temp``)."""
        values, c = super().schedule(step, epoch), self.cfg.method
        e = epoch - c.pred_start_epoch
        temp = c.warmup_teacher_patch_temp if e < 0 else teacher_temperature(
            e, c.warmup_teacher_patch_temp, c.teacher_patch_temp, c.warmup_teacher_temp_epochs)
        return replace(values, extras={**values.extras, "teacher_patch_temp": temp})
