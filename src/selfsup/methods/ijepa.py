"""I-JEPA (Assran et al. 2023, "Self-Supervised Learning from Images with a Joint-Embedding Predictive
Architecture"), as facebookresearch/ijepa. Facts with file:line in docs/JEPA.md §1.

One view per image (RandomResizedCrop scale (0.3, 1), no flip, no colour: src/transforms.py:19-53 with the configs'
``use_*: false``). Per batch, the multi-block masks (``data.jepa_masks``: one context block, ``npred`` target
blocks); the target encoder (an EMA of the context encoder, no gradient) sees every patch, its output tokens are
layer-normalised over the features and the target blocks' tokens picked (src/train.py:295-303); the context
encoder sees the context block's patches only (:305-308, ``VisionTransformer.forward_visible``); the narrow
predictor (``models.jepa.JEPAPredictor``) predicts each target block's tokens from the context tokens, mask
tokens and the targets' positions; the loss is the smooth L1 between the two (:310-313,
``losses.ijepa_loss``). The EMA follows the optimiser step (:332-336) with a momentum rising linearly from
``ema[0]`` to ``ema[1]`` over ``ipe · epochs · ipe_scale`` iterations (:227-229). The lr warms up linearly from
``start_lr`` and decays by a cosine to ``final_lr``, the weight decay rises by a cosine from 0.04 to 0.4, both over
``ipe_scale`` times the run (helper.py:107-156, utils/schedulers.py): ``schedule``. The ViT has no class token;
the evaluated features are the target encoder's average-pooled last layer (``model.pool=avg``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from selfsup.data.jepa_masks import draw_multiblock, multiblock_masks, smallest_block
from selfsup.errors import UserError
from selfsup.losses import ijepa_loss
from selfsup.methods.base import SSLMethod
from selfsup.models.jepa import JEPAPredictor, apply_masks, ijepa_init_, repeat_interleave_batch
from selfsup.models.vit import VisionTransformer
from selfsup.schedules import StepValues, scaled_lr, step_seed
from selfsup.step import StepOutput


@dataclass
class IJEPAConfig:
    """I-JEPA hyper-parameters; defaults from configs/in1k_vith14_ep300.yaml (the mask section :18-32, meta
    :33-40, optimization :41-52)."""

    pred_depth: int = 12  # meta.pred_depth (helper.init_model's own default: 6)
    pred_emb_dim: int = 384  # meta.pred_emb_dim
    pred_num_heads: int = 0  # 0: the encoder's (helper.py:84 num_heads=encoder.num_heads)
    enc_mask_scale: tuple[float, float] = (0.85, 1.0)  # the context block's share of the patches
    pred_mask_scale: tuple[float, float] = (0.15, 0.2)  # each target block's share
    aspect_ratio: tuple[float, float] = (0.75, 1.5)  # the target blocks' h / w
    num_enc_masks: int = 1
    num_pred_masks: int = 4
    min_keep: int = 10  # a block must keep more than this many patches
    allow_overlap: bool = False  # the context block may cover the target blocks
    momentum: float = 0.996  # ema[0]: the target encoder's momentum at the first step
    momentum_end: float = 1.0  # ema[1]: at the end of ipe_scale · the run
    start_lr: float = 2e-4  # the warm-up's first lr, scaled to the batch as optim.base_lr (official 0.0002 at 2048)
    final_weight_decay: float = 0.4  # the weight decay's cosine end (start: optim.weight_decay, 0.04)
    ipe_scale: float = 1.0  # the schedules span ipe_scale times the run's iterations
    # code: the encoders' init is the code's (trunc-normal 0.02 everywhere, the patch projection too); backbone: the
    # encoder keeps model.init's (MoCo v3's scales the patch projection to its fan-in: small patches of 4-16 pixels
    # otherwise carry ~1/20 of the position table's magnitude)
    init: str = "code"

    def validate(self) -> None:
        for key in ("enc_mask_scale", "pred_mask_scale", "aspect_ratio"):
            lo, hi = getattr(self, key)
            if not 0 < lo <= hi:
                raise UserError(f"method.{key}={list(getattr(self, key))} must be [low, high] with 0 < low <= high")
        for key in ("pred_depth", "pred_emb_dim", "num_enc_masks", "num_pred_masks"):
            if getattr(self, key) < 1:
                raise UserError(f"method.{key}={getattr(self, key)} must be >= 1")
        if self.min_keep < 0 or self.pred_num_heads < 0:
            raise UserError("method.min_keep and method.pred_num_heads must be >= 0")
        if not 0 <= self.momentum <= self.momentum_end <= 1:
            raise UserError(f"method.momentum={self.momentum} and method.momentum_end={self.momentum_end} must "
                            "satisfy 0 <= momentum <= momentum_end <= 1")
        if self.init not in ("code", "backbone"):
            raise UserError(f"method.init={self.init!r} is not known; use code or backbone")
        if self.ipe_scale < 1:
            raise UserError(f"method.ipe_scale={self.ipe_scale} must be >= 1 (the schedules span the run or more)")


class IJEPA(SSLMethod):
    """s_y = LN(target_encoder(x))[targets]; ŝ_y = predictor(context_encoder(x[context]), targets);
    L = smooth_l1(ŝ_y, s_y); the target encoder an EMA of the context encoder after each optimiser step."""

    Config = IJEPAConfig
    collapse_remedy = ("a higher method.momentum (a slower target encoder), a lower optim.base_lr or a longer "
                       "optim.warmup_epochs; keep method.pred_mask_scale's blocks large enough to be semantic")
    recipe = "ijepa"
    uses_momentum = True
    eval_backbone_name = "target_encoder"  # the target encoder's average-pooled output is evaluated
    # the context length changes from step to step (the code truncates every context block to the batch's shortest,
    # multiblock.py:164-168): a whole-step graph of static shapes would recompile for each length, so
    # trainer.compile compiles the modules one by one (their shapes dynamic after the first change)
    step_forward = None

    def __init__(self, cfg, info):
        super().__init__(cfg, info)
        c, vit = cfg.method, self.backbone
        if not isinstance(vit, VisionTransformer) or vit.cls_token is not None:
            raise UserError(f"method ijepa needs a selfsup ViT without a class token: set model.class_token=false "
                            f"and model.pool=avg (model.backbone={cfg.model.backbone!r})")
        self.grid = (vit.image_size // vit.patch_size,) * 2
        for key, aspect in (("pred_mask_scale", c.aspect_ratio), ("enc_mask_scale", (1.0, 1.0))):
            # a block of min_keep patches or fewer is never accepted (the code's loop never ends); one of a single
            # patch would be, where min_keep is 0, and the code's ``len(mask.squeeze())`` then fails (:105, :147)
            if (n := smallest_block(getattr(c, key), aspect, self.grid)) <= max(c.min_keep, 1):
                raise UserError(f"method.min_keep={c.min_keep}: a block of method.{key}={list(getattr(c, key))} "
                                f"can hold {n} patch(es) of the {self.grid[0]}x{self.grid[1]} grid, which the code "
                                f"never accepts (or fails on, a single one); raise the scale or lower method.min_keep "
                                f"under {n} (at least 1)")
        if c.min_keep < 1:
            raise UserError(f"method.min_keep={c.min_keep} must be >= 1: the code fails on a block of one patch")
        try:
            self.predictor = JEPAPredictor(self.grid[0], vit.embed_dim, c.pred_emb_dim, c.pred_depth,
                                           c.pred_num_heads or vit.blocks[0].attn.num_heads)
        except ValueError as e:
            raise UserError(f"method.pred_emb_dim: {e}") from None
        ijepa_init_(vit, self.predictor, encoder_init=c.init == "code")
        self.target_encoder = self.momentum_target(vit)
        self.post_step_hooks.append(self.target_ema)
        self._mask_generator, self._size_generator = torch.Generator(), torch.Generator()

    def trainable(self):
        """The context encoder and the predictor (helper.py:121-139)."""
        return {"backbone": self.backbone, "predictor": self.predictor}

    # ----------------------------------------------------------------- masks
    def masks(self, batch: int, seed: int, size_seed: int | None = None) -> tuple[Tensor, Tensor]:
        """(context (nenc, B, K_enc), targets (npred, B, K_pred)) patch indices on the host, from a generator seeded
        with ``seed`` (the step's); the two block sizes from one seeded with ``size_seed`` where given (the step's
        without the rank: every process draws the same sizes, as the code's counter-seeded generator)."""
        c = self.cfg.method
        g = self._mask_generator.manual_seed(seed)
        sizes = None if size_seed is None else self._size_generator.manual_seed(size_seed)
        draws = draw_multiblock(batch, self.grid, g, c.pred_mask_scale, c.enc_mask_scale, c.aspect_ratio,
                                c.num_pred_masks, c.num_enc_masks, c.allow_overlap, size_generator=sizes)
        try:
            return multiblock_masks(draws, self.grid, c.pred_mask_scale, c.enc_mask_scale, c.aspect_ratio,
                                    c.min_keep, c.allow_overlap)
        except ValueError as e:
            raise UserError(f"method.min_keep={c.min_keep}: {e} on a {self.grid[0]}x{self.grid[1]} patch grid; "
                            "lower method.min_keep or raise the mask scales") from None

    def step_draws(self, views: list[Tensor]) -> dict[str, Tensor]:
        """The step's masks, drawn on the host from the step's seed (no device read: their lengths set the step's
        shapes) and copied to the device."""
        x = views[0]
        enc, pred = self.masks(x.shape[0], self.rng(x.device).initial_seed(), self.size_seed())
        return {"enc_masks": enc.to(x.device, non_blocking=True), "pred_masks": pred.to(x.device, non_blocking=True)}

    def size_seed(self) -> int:
        """The block sizes' seed: the step's (and micro-batch's) without the rank."""
        return step_seed(self._trainer, self.cfg.trainer.seed, 7919, 1)

    # ----------------------------------------------------------------- the step
    def forward_views(self, views: list[Tensor], enc_masks: Tensor | None = None,
                      pred_masks: Tensor | None = None) -> StepOutput:
        (x,) = views
        if enc_masks is None:
            enc_masks, pred_masks = (m.to(x.device) for m in self.masks(x.shape[0], self.cfg.trainer.seed))
        nenc, b, k = enc_masks.shape
        with torch.no_grad():  # forward_target (train.py:295-303)
            h = self.target_encoder.forward_features(x)
            target = repeat_interleave_batch(apply_masks(h, pred_masks), b, nenc)
        z = self.backbone.forward_visible(x, enc_masks.reshape(nenc * b, k))  # forward_context (:305-308)
        p = self.predictor(z, enc_masks, pred_masks)
        with torch.autocast(x.device.type, enabled=False):
            loss = ijepa_loss(p.float(), target.float())
        return StepOutput(loss, embedding=h.mean(1), instruments=self.collapse_signs(h, p.detach()))

    def collapse_signs(self, h: Tensor, p: Tensor) -> dict[str, Tensor]:
        """The target features' spread (the mean over features of the std over the batch of the pooled target
        tokens; 0 when every image maps to one point), and the predictor outputs' spread over tokens."""
        pooled = h.float().mean(1)
        return {"ijepa_target_std": pooled.std(0).mean(), "ijepa_prediction_std": p.float().flatten(0, 1).std(0).mean()}

    def target_ema(self) -> None:
        """The post-step hook: the target encoder's EMA with this iteration's momentum (train.py:332-336)."""
        self.ema_step(self.momentum)

    # ----------------------------------------------------------------- schedules
    def schedule(self, step: int, epoch: int) -> StepValues:
        """Iteration ``step`` (0-based) of the official schedulers, stepped once before it (train.py:291-292, so
        they are at ``step + 1``): lr ``WarmupCosineSchedule`` (schedulers.py:11-45) from ``start_lr`` to the peak
        over ``int(warmup · ipe)`` iterations, then a cosine to ``final_lr`` (``optim.min_lr``) at
        ``T = int(ipe_scale · epochs · ipe)``; weight decay ``CosineWDSchedule`` (:48-76) from
        ``optim.weight_decay`` to ``final_weight_decay``; the momentum of the EMA after this step
        ``ema0 + step (ema1 − ema0) / (ipe · epochs · ipe_scale)`` (train.py:227-229)."""
        c, o = self.cfg.method, self.cfg.optim
        n = step + 1
        total = self.total_steps * c.ipe_scale
        t_max = int(total)
        warmup = int(o.warmup_epochs * self.steps_per_epoch)
        peak, final = self.peak_lr(), self.final_lr()
        start = scaled_lr(c.start_lr, self.global_batch_size, o.lr_scaling)
        if n < warmup:
            lr = start + n / max(1, warmup) * (peak - start)
        else:
            progress = (n - warmup) / max(1, t_max - warmup)
            lr = max(final, final + (peak - final) * 0.5 * (1.0 + math.cos(math.pi * progress)))
        wd0, wd1 = o.weight_decay, c.final_weight_decay
        wd = wd1 + (wd0 - wd1) * 0.5 * (1.0 + math.cos(math.pi * n / t_max))
        wd = max(wd1, wd) if wd1 <= wd0 else min(wd1, wd)
        momentum = c.momentum + step * (c.momentum_end - c.momentum) / total
        return StepValues(lr, peak, weight_decay=wd, momentum=momentum)
