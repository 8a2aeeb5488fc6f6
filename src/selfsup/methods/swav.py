"""SwAV (Caron et al. 2020): swapped prediction of Sinkhorn codes, as facebookresearch/swav main_swav.py.

Per step (main_swav.py:268-329; file:line in docs/reference SWAV-WMSE-NNCLR.md, section 1):

    C ← C / ‖C‖ row by row                              # no gradient, before the forward pass
    z = normalize(projector(backbone(x_v)))              # every crop; one backbone call per resolution
    s_v = z_v Cᵀ                                         # prototype scores (bias-free Linear)
    for s in crops_for_assign (the 2 global crops), no gradient:
        q_s = sinkhorn([queue_s Cᵀ; s_s])[-B:]           # ε 0.05, 3 iterations over the global batch
        queue_s ← [z_s; queue_s][:L]                     # after the scores: the batch is not in them twice
    loss = mean_s  Σ_{v≠s} mean_b −Σ_k q_s log softmax(s_v / τ)  / (V − 1)
    the prototypes get grad = None for the first ``freeze_prototypes_niters`` iterations

Official behaviour reproduced: the head Linear → BN → ReLU → Linear (biases kept) runs once on every crop's
features (its BatchNorm sees all crops), z is L2-normalised before the prototypes; the codes come from the
two global crops only and predict every other crop (the other global one and the local ones) at τ = 0.1;
Sinkhorn-Knopp (``losses.sinkhorn_knopp``) in float32 with the total and the row sums all-reduced over the
processes and B = local rows · world size; the queue holds normalised z (not scores, which are recomputed
with the current prototypes), starts at epoch ``epoch_queue_starts``, is used for the codes only and only
once full, and is a buffer of the checkpoint. The queue here is the whole run's (the gathered batches, the
same on every process, so the checkpoint written by rank 0 resumes every rank); each process prepends its
own rows of it (the official per-rank queue, ``queue_length / world`` rows each: the same Sinkhorn problem).
lr: ``utils.cosine_scheduler``'s array (linear warm-up from ``start_warmup_lr``, cosine to ``optim.min_lr``
per iteration); LARC over every parameter is ``optim.name: larc``.
"""

from __future__ import annotations

import math

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from selfsup.distributed import all_reduce_sum, gather_no_grad, world
from selfsup.errors import UserError
from selfsup.losses import sinkhorn_knopp, swav_loss
from selfsup.methods.base import SSLMethod, encode_views
from selfsup.models.heads import mlp
from selfsup.schedules import StepValues, dino_cosine
from selfsup.step import StepOutput


@dataclass
class SwAVConfig:
    """SwAV hyper-parameters; defaults are main_swav.py's argument defaults (:45-88)."""

    hidden_mlp: int = 2048  # 0: the projection head is a single Linear
    feat_dim: int = 128
    nmb_prototypes: int = 3000
    temperature: float = 0.1
    epsilon: float = 0.05
    sinkhorn_iterations: int = 3
    crops_for_assign: tuple[int, ...] = (0, 1)
    queue_length: int = 0  # 0: no queue (rounded down to a multiple of the global batch)
    epoch_queue_starts: int = 15
    freeze_prototypes_niters: int = 313
    start_warmup_lr: float = 0.0  # the lr at iteration 0 (absolute, as --start_warmup; not scaled by the batch)

    def validate(self) -> None:
        for key in ("feat_dim", "nmb_prototypes", "sinkhorn_iterations"):
            if getattr(self, key) < 1:
                raise UserError(f"method.{key}={getattr(self, key)} must be >= 1")
        for key in ("temperature", "epsilon"):
            if not getattr(self, key) > 0:
                raise UserError(f"method.{key}={getattr(self, key)} must be > 0")
        for key in ("hidden_mlp", "queue_length", "epoch_queue_starts", "freeze_prototypes_niters", "start_warmup_lr"):
            if getattr(self, key) < 0:
                raise UserError(f"method.{key}={getattr(self, key)} must be >= 0")
        if not self.crops_for_assign or len(set(self.crops_for_assign)) < len(self.crops_for_assign) or min(
                self.crops_for_assign) < 0:
            raise UserError(f"method.crops_for_assign={list(self.crops_for_assign)} must list distinct crop "
                            "indices >= 0, e.g. [0, 1] (the two global crops)")


class SwAV(SSLMethod):
    """Codes of the global crops by Sinkhorn-Knopp, predicted from every other crop through the prototypes."""

    Config = SwAVConfig
    collapse_remedy = ("sharper codes: method.epsilon=0.025 with method.temperature=0.2; fewer prototypes "
                       "(method.nmb_prototypes); a longer method.freeze_prototypes_niters")
    recipe = "simclr"  # multicropdataset.py: RRC, flip, jitter (0.8, 0.8, 0.8, 0.2) p 0.8, grey 0.2, blur 0.5
    loss_embedding = ("projector",)  # z is L2-normalised with a gradient before the prototypes

    def __init__(self, cfg, info):
        super().__init__(cfg, info)
        c = cfg.method
        n_views = len(self.augment.sizes)
        if max(c.crops_for_assign) >= n_views:
            raise UserError(f"method.crops_for_assign={list(c.crops_for_assign)} names a crop the view plan lacks "
                            f"({n_views} crops); use [0, 1]")
        if n_views < 2:
            raise UserError(f"SwAV needs at least 2 crops, its view plan has {n_views}; use a two-branch "
                            "augment.recipe (e.g. simclr)")
        d = self.backbone.num_features
        self.projector = (mlp(d, c.hidden_mlp, c.feat_dim, 2, bias=True) if c.hidden_mlp
                          else nn.Linear(d, c.feat_dim))
        self.prototypes = nn.Linear(c.feat_dim, c.nmb_prototypes, bias=False)
        length = c.queue_length - c.queue_length % cfg.data.batch_size  # main_swav.py:213 (global batch)
        if c.queue_length and not length:
            raise UserError(f"method.queue_length={c.queue_length} is below the global batch data.batch_size="
                            f"{cfg.data.batch_size}; use a multiple of it (or 0: no queue)")
        self.register_buffer("queue", torch.zeros(len(c.crops_for_assign), length, c.feat_dim))
        self.register_buffer("queue_rows", torch.zeros((), dtype=torch.long))  # rows written so far
        self._queue_rows: int | None = None  # host copy of queue_rows (read once after a load)

    def trainable(self):
        return {"backbone": self.backbone, "projector": self.projector, "prototypes": self.prototypes}

    # ----------------------------------------------------------------- the step
    @torch.no_grad()
    def normalize_prototypes(self) -> None:
        """Each prototype row back on the unit sphere (main_swav.py:277-281), in place, before the forward."""
        w = self.prototypes.weight
        w.copy_(F.normalize(w, dim=1, p=2))

    def forward_views(self, views):
        c = self.cfg.method
        self.normalize_prototypes()
        feats = encode_views(self.backbone, views, per_view_batch_norm=False)  # one call per resolution
        z = F.normalize(self.grad_scale(self.projector(torch.cat(feats))), dim=1)
        scores = self.prototypes(z).split([v.shape[0] for v in views])
        embedding = z.detach().split([v.shape[0] for v in views])
        codes = [self.codes(i, scores[s].detach(), embedding[s]) for i, s in enumerate(c.crops_for_assign)]
        loss = swav_loss(list(scores), codes, tuple(c.crops_for_assign), c.temperature)
        with torch.no_grad():  # collapse signs: per-sample code entropy, prototypes that win a sample
            q = codes[0]
            entropy = -(q * q.clamp_min(1e-12).log()).sum(dim=1).mean()
            used = torch.zeros(q.shape[1], device=q.device).index_fill_(0, q.argmax(dim=1), 1.0).mean()
            log_k = math.log(q.shape[1])
            signs = {"swav_code_entropy": entropy, "swav_code_entropy_over_log_k": entropy / log_k,
                     "swav_prototype_usage": used, "swav_loss_over_log_k": loss.detach() / log_k}
        return StepOutput(loss, embedding=feats[0].detach(), embedding2=feats[1].detach(), projection=embedding[0],
                          instruments=signs)

    @torch.no_grad()
    def codes(self, i: int, scores: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """The Sinkhorn codes of assigned crop ``i`` (main_swav.py:290-307): its queue's scores with the current
        prototypes prepended once the queue is full, then the queue shifted and this crop's z (all processes')
        written at its front; the batch's rows of the codes."""
        c, (rank, size) = self.cfg.method, world()
        queue = self.queue[i]
        if queue.shape[0] and self.current_epoch >= c.epoch_queue_starts:
            if self.queue_filled() >= queue.shape[0]:
                own = queue.view(-1, size, z.shape[0], z.shape[1])[:, rank].reshape(-1, z.shape[1])
                scores = torch.cat([own @ self.prototypes.weight.t(), scores])
            new = gather_no_grad(z.contiguous())
            queue.copy_(torch.cat([new, queue[:-new.shape[0]]]))
            if i == len(c.crops_for_assign) - 1:  # every assigned crop's queue has taken the batch
                filled = self.queue_filled()
                self.queue_rows.add_(new.shape[0])
                self._queue_rows = filled + new.shape[0]
        q = sinkhorn_knopp(scores, c.epsilon, c.sinkhorn_iterations, world_size=size, all_reduce=all_reduce_sum)
        return q[-z.shape[0]:]

    def queue_filled(self) -> int:
        """Rows written to the queue so far (the official test: its last row is no longer zero)."""
        if self._queue_rows is None:
            self._queue_rows = int(self.queue_rows)
        return self._queue_rows

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        self._queue_rows = None  # re-read from the loaded buffer

    # ----------------------------------------------------------------- schedules and the frozen prototypes
    def schedule(self, step: int, epoch: int) -> StepValues:
        """lr per iteration: ``linspace(start_warmup_lr, peak, warm-up iterations)`` then the cosine to
        ``optim.min_lr`` scaled as the peak (``final_lr``; main_swav.py:171-182, the same array as DINO's
        ``cosine_scheduler``)."""
        peak = self.peak_lr()
        return StepValues(dino_cosine(step, self.total_steps, self.warmup_steps(), peak, self.final_lr(),
                                      self.cfg.method.start_warmup_lr), peak)

    def on_before_optimizer_step(self, optimizer) -> None:
        """The prototypes get ``grad = None`` (not zero: no update, decay or momentum) for the first
        ``freeze_prototypes_niters`` iterations (main_swav.py:318-329)."""
        if self.trainer.global_step < self.cfg.method.freeze_prototypes_niters:
            for p in self.prototypes.parameters():
                p.grad = None
