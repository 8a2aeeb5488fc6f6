"""DINOv3's training (Siméoni et al. 2025), as facebookresearch/dinov3 ``dinov3/train/ssl_meta_arch.py`` and
``train/train.py`` (file:line of the official code throughout; docs/DINOV3.md lists them): DINOv2's objective
(``methods.dinov2``: Sinkhorn-Knopp targets, a separate iBOT head, KoLeo, its per-iteration schedules, as
``configs/train/vitl_im1k_lin834.yaml`` sets them) plus **Gram anchoring**, per step:

    loss = DINOv2's loss (ssl_meta_arch.py:588-650)
         + w_gram(it) · GramLoss(student patch tokens of the global crops, the Gram teacher's)  # :652-666, gram_loss.py
    before iteration it_load_ema_teacher: Gram teacher ← EMA teacher backbone; the Gram term from there on
                                                                                            # train.py:471-473
    optimiser step; teacher ← EMA of the student                                            # train.py:531-532
    after iteration it, if it + 1 ≥ it_first_update, (it + 1) % update_frequency = 0 and fewer than max_updates
    refreshes so far: Gram teacher ← EMA teacher                                            # train.py:534-544

The Gram teacher is a frozen copy of the EMA teacher's backbone (``gram_teacher``, ssl_meta_arch.py:55-59,
177-184; a child module, so every checkpoint holds it and a resumed run is bit-identical), never trained, never
an EMA target; its patch tokens of the same global crops (or of the crops resized to ``gram_teacher_crop_size``,
its tokens resized back to the student's grid, :476-512) are the targets. The student's are those of its masked
forward (``patch_pre_head``, :530-582). The loss weight is constant or the code's ``linear_warmup_cosine_decay``
(:186-203). One run holds both phases: the official 7B recipe's Gram phase restarts from a checkpoint
(``gram.ckpt``); here the Gram teacher is the run's own EMA teacher at ``gram_it_load_ema_teacher``. Under
``trainer.compile`` the step compiles twice, before and in the Gram phase (``gram_on``, a host bool); under DDP the
Gram term is each process's own (per image, or per local batch: the code's "local batch level").

The high-resolution adaptation phase (``dinov3_vit7b16_high_res_adapt.yaml``) is options of the same method:
larger global and local crops (``data.image_size``, ``augment.local_crops_size``), a Gram teacher at a higher
resolution (``gram_teacher_crop_size``), no refresh (``gram_rep_update: false``) and a constant weight 1.5.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from selfsup.errors import UserError
from selfsup.losses import gram_loss
from selfsup.methods.dinov2 import DINOv2, DINOv2Config
from selfsup.methods.ema import frozen_copy
from selfsup.methods.teacher import StepScalar
from selfsup.schedules import StepValues, gram_refresh_after, linear_warmup_cosine_decay

GRAM_TOKENS = ("all", "masked", "unmasked")


@dataclass
class DINOv3Config(DINOv2Config):
    """DINOv3 hyper-parameters: dinov3/configs/ssl_default_config.yaml's defaults, with vitl_im1k_lin834.yaml's
    where it sets DINOv2's keys, and the Gram term on (file:line in docs/DINOV3.md). Iteration counts of the code
    are given here in schedule epochs (``epoch_length`` iterations each, the code's ``OFFICIAL_EPOCH_LENGTH``)."""

    centering: str = "sinkhorn_knopp"  # train.centering (asserted by ssl_meta_arch.py:40)
    ibot_separate_head: bool = True  # ibot.separate_head (asserted by ssl_meta_arch.py:39)
    gram_use_loss: bool = True  # gram.use_loss (the code's default false: DINOv2's objective alone)
    gram_loss_weight: float = 1.0  # gram.loss_weight: the weight without a schedule
    # gram.loss_weight_schedule: (start, peak, end, warmup_epochs[, cosine_epochs]) of linear_warmup_cosine_decay
    # over the run (no cosine_epochs: the rest of the run); (): the constant gram_loss_weight
    gram_loss_weight_schedule: tuple[float, ...] = ()
    gram_ema_teacher: bool = False  # gram.ema_teacher: the EMA teacher's own patch tokens are the targets
    # gram.it_load_ema_teacher in schedule epochs: the Gram teacher is the EMA teacher from this iteration on and the
    # Gram term starts there (the code's -1 reads gram.ckpt, a checkpoint of an earlier run)
    gram_it_load_ema_teacher: float = 0.0
    gram_rep_update: bool = True  # gram.rep_update: refresh the Gram teacher from the EMA teacher
    gram_update_frequency: float = 40.0  # gram.update_frequency 50000 iterations = 40 epochs of 1250
    gram_it_first_update: float = 0.0  # gram.it_first_update in schedule epochs
    gram_max_updates: int = -1  # gram.max_updates (null: no limit, -1 here)
    gram_normalized: bool = True  # gram.normalized: L2-normalised patch features
    gram_img_level: bool = False  # gram.img_level: one Gram matrix per image (the 7B configs: true), else per batch
    gram_remove_neg: bool = False  # gram.remove_neg
    gram_remove_only_teacher_neg: bool = False  # gram.remove_only_teacher_neg
    gram_tokens_used: str = "all"  # gram.tokens_used: all | masked | unmasked (the last two need img_level false)
    # crops.gram_teacher_crops_size: the Gram teacher sees the global crops resized to this size (0: the crops as
    # the student sees them), its patch tokens resized back to the student's grid
    gram_teacher_crop_size: int = 0
    gram_teacher_resize_method: str = "bicubic"  # gram.global_teacher_resize_method
    gram_teacher_resize_antialias: bool = False  # gram.global_teacher_resize_antialias

    def validate(self) -> None:
        super().validate()
        if self.gram_remove_neg and self.gram_remove_only_teacher_neg:
            raise UserError("method.gram_remove_neg and method.gram_remove_only_teacher_neg exclude each other "
                            "(gram_loss.py:31-32); set one to false")
        if self.gram_tokens_used not in GRAM_TOKENS:
            raise UserError(f"method.gram_tokens_used={self.gram_tokens_used!r} must be one of {list(GRAM_TOKENS)}")
        if self.gram_tokens_used != "all" and self.gram_img_level:
            raise UserError(f"method.gram_tokens_used={self.gram_tokens_used} needs method.gram_img_level=false "
                            "(ssl_meta_arch.py:230-231)")
        if self.gram_ema_teacher and (self.gram_rep_update or self.gram_teacher_crop_size):
            raise UserError("method.gram_ema_teacher=true uses the EMA teacher's own tokens: set method.gram_rep_update"
                            "=false and method.gram_teacher_crop_size=0 (ssl_meta_arch.py:227, 250)")
        if len(self.gram_loss_weight_schedule) not in (0, 4, 5):
            raise UserError(f"method.gram_loss_weight_schedule={list(self.gram_loss_weight_schedule)}: give "
                            "[start, peak, end, warmup_epochs] or [..., cosine_epochs], or [] for gram_loss_weight")
        if self.gram_update_frequency <= 0 or self.gram_it_load_ema_teacher < 0 or self.gram_it_first_update < 0:
            raise UserError("method.gram_update_frequency must be > 0 and method.gram_it_load_ema_teacher / "
                            "gram_it_first_update >= 0 (schedule epochs)")
        if self.gram_teacher_crop_size < 0 or self.gram_max_updates < -1:
            raise UserError("method.gram_teacher_crop_size must be >= 0 and method.gram_max_updates >= -1")


class DINOv3(DINOv2):
    """DINOv2's objective + Gram anchoring: the student's patch similarities held to a frozen Gram teacher's."""
    collapse_remedy = DINOv2.collapse_remedy
    schedule_extras = ("teacher_temp", "gram_weight")

    Config = DINOv3Config

    gram_weight = StepScalar()  # this iteration's Gram weight (0 before the Gram phase); step_gram_weight

    def __init__(self, cfg, info):
        super().__init__(cfg, info)  # DINOv2: student, heads, EMA teacher, mask token, centres
        c = cfg.method
        if c.gram_use_loss and not c.gram_ema_teacher:
            self.gram_teacher = frozen_copy(self.teacher_backbone)  # ssl_meta_arch.py:55-59, 177-184
        self.gram_weight = 0.0
        self.gram_on = False  # whether this step is in the Gram phase (set with the schedule)
        self._iteration = 0

    # ----------------------------------------------------------------- the Gram phase's iterations
    def iterations(self, epochs: float) -> int:
        """Schedule epochs → iterations (the code's ``OFFICIAL_EPOCH_LENGTH`` · epochs)."""
        return int(round(epochs * self.epoch_steps))

    def gram_start(self) -> int:
        """The iteration the Gram teacher is loaded from the EMA teacher and the Gram term starts."""
        return self.iterations(self.cfg.method.gram_it_load_ema_teacher)

    def gram_loss_weight(self, step: int) -> float:
        """The Gram term's weight at iteration ``step``: ``gram_loss_weight``, or its schedule over the whole run
        (ssl_meta_arch.py:186-203, cosine_lr_scheduler.py:54-85); 0 before the Gram phase."""
        c = self.cfg.method
        if not c.gram_use_loss or step < self.gram_start():
            return 0.0
        sched = c.gram_loss_weight_schedule
        if not sched:
            return c.gram_loss_weight
        cosine = self.iterations(sched[4]) if len(sched) == 5 else None
        return linear_warmup_cosine_decay(step, sched[0], sched[1], sched[2], self.iterations(sched[3]),
                                          self.total_steps, cosine)

    def gram_refresh_after(self, it: int) -> bool:
        """Whether the Gram teacher is refreshed after iteration ``it`` (train.py:534-544)."""
        c = self.cfg.method
        return (c.gram_use_loss and not c.gram_ema_teacher and c.gram_rep_update
                and gram_refresh_after(it, self.iterations(c.gram_it_first_update),
                                       max(self.iterations(c.gram_update_frequency), 1), c.gram_max_updates))

    def schedule(self, step: int, epoch: int) -> StepValues:
        """DINOv2's per-iteration schedule, and the Gram weight."""
        v = super().schedule(step, epoch)
        v.extras["gram_weight"] = self.gram_loss_weight(step)
        return v

    @torch.no_grad()
    def load_gram_teacher(self) -> None:
        """Gram teacher ← the EMA teacher's backbone (``gram_load_ema_teacher`` / ``update_gram`` with m = 0,
        ssl_meta_arch.py:686-699, 728-745)."""
        torch._foreach_copy_(list(self.gram_teacher.parameters()), list(self.teacher_backbone.parameters()))

    def on_fit_start(self) -> None:
        """The base's; then one line where the Gram phase starts past the run's end (no Gram term at all)."""
        super().on_fit_start()
        c = self.cfg.method
        if c.gram_use_loss and self.gram_start() >= self.total_steps and self.trainer.is_global_zero:
            print(f"selfsup: method.gram_it_load_ema_teacher={c.gram_it_load_ema_teacher:g} epochs starts the Gram "
                  f"phase at iteration {self.gram_start()}, past this run's {self.total_steps}: no Gram term; set "
                  "it inside the run")

    def on_train_batch_start(self, batch, batch_idx: int) -> None:
        """The schedule; then, at the Gram phase's first iteration, the Gram teacher loaded before the step
        (train.py:471-473). A run resumed later in the phase has it from the checkpoint."""
        super().on_train_batch_start(batch, batch_idx)
        self._iteration = it = self.trainer.global_step
        c = self.cfg.method
        self.gram_on = c.gram_use_loss and it >= self.gram_start()
        if self.gram_on and not c.gram_ema_teacher and it == self.gram_start():
            self.load_gram_teacher()

    def teacher_ema(self) -> None:
        """The post-step hook: the teacher's EMA, then the Gram teacher's refresh where due (train.py:531-544)."""
        super().teacher_ema()
        if self.gram_refresh_after(self._iteration):
            self.load_gram_teacher()

    def step_modules(self):
        modules = super().step_modules()
        return {**modules, "gram_teacher": self.gram_teacher} if hasattr(self, "gram_teacher") else modules

    # ----------------------------------------------------------------- the step
    def gram_targets(self, x: torch.Tensor, t_patches: torch.Tensor, grid: int) -> torch.Tensor:
        """The Gram teacher's patch tokens (2B, N, D) of the global crops ``x`` (ssl_meta_arch.py:476-512): the
        EMA teacher's own (``gram_ema_teacher``), or the Gram teacher's, of the crops resized to
        ``gram_teacher_crop_size`` and their token grid resized back to the student's ``grid`` × ``grid``."""
        c = self.cfg.method
        if c.gram_ema_teacher:
            return t_patches
        if c.gram_teacher_crop_size and c.gram_teacher_crop_size != x.shape[-1]:
            x = F.interpolate(x, size=(c.gram_teacher_crop_size,) * 2, mode="bicubic", align_corners=False)
        with torch.no_grad():
            patches = self.gram_teacher(x, return_all_tokens=True)[:, 1:]
            side = int(round(patches.shape[1] ** 0.5))
            if side != grid:
                hw = patches.transpose(-2, -1).unflatten(-1, (side, side))
                hw = F.interpolate(hw.float(), size=(grid, grid), mode=c.gram_teacher_resize_method,
                                   align_corners=False, antialias=c.gram_teacher_resize_antialias)
                patches = hw.flatten(-2, -1).transpose(-2, -1)
        return patches

    def gram_term(self, s_patches: torch.Tensor, g_patches: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
        """GramLoss on the tokens ``gram_tokens_used`` selects (ssl_meta_arch.py:513-520, 652-657)."""
        c = self.cfg.method
        if c.gram_tokens_used != "all":
            keep = masks if c.gram_tokens_used == "masked" else ~masks
            s_patches, g_patches = s_patches[keep], g_patches[keep]
        return gram_loss(s_patches, g_patches, normalized=c.gram_normalized, img_level=c.gram_img_level,
                         remove_neg=c.gram_remove_neg, remove_only_teacher_neg=c.gram_remove_only_teacher_neg)

    def forward_views(self, views, masks: torch.Tensor | None = None):
        """DINOv2's step (``DINOv2.dinov2_terms``), plus ``step_gram_weight`` · GramLoss in the Gram phase
        (ssl_meta_arch.py:402-420, 652-666)."""
        terms = self.dinov2_terms(views, masks)
        if self.gram_on:
            s_patches = terms.s_tokens[:, 1:]
            g_patches = self.gram_targets(terms.x, terms.t_tokens[:, 1:], int(round(s_patches.shape[1] ** 0.5)))
            loss_gram = self.gram_term(s_patches, g_patches, terms.masks)
            terms.loss = terms.loss + self.step_gram_weight * loss_gram
            terms.scalars["loss_gram"] = loss_gram.detach()
        return self.step_output(terms)
