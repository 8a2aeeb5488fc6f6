"""MoCo v2 (Chen, Fan, Girshick, He 2020): a query against its momentum key and a queue of past keys.

Follows facebookresearch/moco at 7397dfe (MIT; file:line in docs/contrastive.md), ``main_moco.py --mlp --moco-t 0.2
--aug-plus --cos`` (README.md:51). Per step (moco/builder.py:128-173):

    θ_k ← m θ_k + (1 − m) θ_q                       # the key encoder's EMA, before the keys (builder.py:142-143)
    q = normalize(f_q(x_1)),  k = normalize(f_k(x_2))  # f = backbone + the MLP head 2048 → 2048 → ReLU → 128
    loss = CE([q·k, q·queueᵀ] / τ, 0)                  # one direction: x_1 the query, x_2 the key
    queue ← FIFO(queue, k of every process)           # after the loss (builder.py:65-79, 171)

Shuffle BN (builder.py:81-126): across processes the key images are gathered, permuted by a permutation every
process draws alike (the code's rank-0 broadcast), encoded in slices and put back in order, so a key's BatchNorm
statistics come from other processes' images than its query's; in one process (or a key encoder without
BatchNorm) it changes nothing and is skipped. The queue is a buffer of the checkpoint (the code's too:
``model.state_dict()``), rows (K, D) where the code keeps columns (D, K); K must be a multiple of the global
batch (builder.py:73's assert). The momentum is constant (builder.py:63); ``method.momentum_schedule=cosine`` is
an option (MoCo v3's ramp), as are ``method.mlp=false`` (MoCo v1's linear head) and ``method.hidden_bn=true`` (a
BatchNorm in the MLP, not the code's: the small presets', whose micro ViT's random-init keys are nearly one
direction without it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from selfsup.distributed import gather_no_grad, world
from selfsup.errors import UserError
from selfsup.losses import moco_info_nce
from selfsup.methods.base import SSLMethod, has_batch_statistics
from selfsup.methods.ema import check_momentum
from selfsup.models.heads import mlp
from selfsup.schedules import step_seed
from selfsup.step import StepOutput


@dataclass
class MoCoV2Config:
    """MoCo v2 hyper-parameters; defaults are main_moco.py's with README.md:51's v2 flags."""

    temperature: float = 0.2  # --moco-t 0.2 for v2 (README.md:51); the code's default 0.07 is v1's
    queue_size: int = 65536  # K, --moco-k (main_moco.py:157-161)
    momentum: float = 0.999  # m, --moco-m (main_moco.py:162-167)
    momentum_schedule: str = "constant"  # constant (builder.py:63) | cosine (MoCo v3's ramp to 1, an option)
    dim: int = 128  # --moco-dim (main_moco.py:153-155)
    mlp: bool = True  # --mlp: Linear → ReLU → Linear head (builder.py:34-41); false: one Linear (MoCo v1)
    proj_hidden_dim: int = 0  # the MLP's hidden width; 0: the backbone's width, as the code (builder.py:35)
    shuffle_bn: bool = True  # shuffle the keys' batch across processes (builder.py:145-152)
    hidden_bn: bool = False  # BatchNorm after the MLP's hidden Linear: not the code's (MoCo v3's, SimCLR's)

    def validate(self) -> None:
        if not self.temperature > 0:
            raise UserError(f"method.temperature={self.temperature} must be > 0")
        check_momentum(self)
        for key in ("queue_size", "dim"):
            if getattr(self, key) < 1:
                raise UserError(f"method.{key}={getattr(self, key)} must be >= 1")
        if self.proj_hidden_dim < 0:
            raise UserError(f"method.proj_hidden_dim={self.proj_hidden_dim} must be >= 0 (0: the backbone's width)")


class MoCoV2(SSLMethod):
    """q = projector(backbone(x_1)); k = momentum_projector(momentum_backbone(x_2)); negatives: the queue."""

    Config = MoCoV2Config
    collapse_remedy = ("method.hidden_bn=true (a BatchNorm in the head: keys that start as one direction spread); "
                       "a larger queue (method.queue_size); a lower optim.base_lr")
    recipe = "moco_v2"
    loss_embedding = ("projector",)  # q is normalised by the loss
    uses_momentum = True

    def __init__(self, cfg, info):
        super().__init__(cfg, info)
        c = cfg.method
        if cfg.augment.local_crops_number:
            raise UserError("augment.local_crops_number: MoCo v2 takes two views (a query and a key); set it to 0")
        if c.queue_size % cfg.data.batch_size:
            raise UserError(f"method.queue_size={c.queue_size} must be a multiple of data.batch_size="
                            f"{cfg.data.batch_size} (the queue takes whole batches: moco builder.py:73)")
        width = self.backbone.num_features
        hidden = c.proj_hidden_dim or width
        self.projector = (mlp(width, hidden, c.dim, 2, bias=True, hidden_bn=c.hidden_bn) if c.mlp
                          else mlp(width, hidden, c.dim, 1, bias=True))
        self.momentum_backbone = self.momentum_target(self.backbone)
        self.momentum_projector = self.momentum_target(self.projector)
        self.register_buffer("queue", F.normalize(torch.randn(c.queue_size, c.dim), dim=1))
        self.register_buffer("queue_ptr", torch.zeros((), dtype=torch.long))

    def trainable(self):
        return {"backbone": self.backbone, "projector": self.projector}

    # ----------------------------------------------------------------- shuffle BN
    def shuffles(self) -> bool:
        """Whether the keys' batch is shuffled across processes: only where it changes the keys."""
        return (self.cfg.method.shuffle_bn and world()[1] > 1
                and (has_batch_statistics(self.momentum_backbone) or has_batch_statistics(self.momentum_projector)))

    def step_draws(self, views: list[Tensor]) -> dict[str, Tensor]:
        """The shuffle's permutation of the global batch, alike on every process (the step's seed without the
        rank; the code broadcasts rank 0's, builder.py:94-98)."""
        if not self.shuffles():
            return {}
        t, n = self._trainer, views[1].shape[0] * world()[1]
        g = torch.Generator(device="cpu").manual_seed(step_seed(t, self.cfg.trainer.seed) if t is not None
                                                      else self.cfg.trainer.seed)
        return {"shuffle": torch.randperm(n, generator=g).to(views[1].device)}

    @torch.no_grad()
    def keys(self, x: Tensor, shuffle: Tensor | None = None) -> Tensor:
        """k = f_k(x); with ``shuffle``: the global batch permuted, this process's slice encoded, the keys of every
        process gathered and put back in order (builder.py:81-126)."""
        if shuffle is None:
            return self.momentum_projector(self.momentum_backbone(x))
        rank, size = world()
        mine = shuffle.view(size, -1)[rank]
        k = self.momentum_projector(self.momentum_backbone(gather_no_grad(x)[mine]))
        return gather_no_grad(k)[torch.argsort(shuffle).view(size, -1)[rank]]

    # ----------------------------------------------------------------- the step
    def forward_views(self, views: list[Tensor], shuffle: Tensor | None = None) -> StepOutput:
        self.update_momentum_encoder()  # before the keys, with this step's momentum (builder.py:142-143)
        h = self.backbone(views[0])
        q = self.grad_scale(self.projector(h))
        k = F.normalize(self.keys(views[1], shuffle), dim=1)
        loss = moco_info_nce(q, k, self.queue, self.cfg.method.temperature)
        with torch.no_grad():  # the collapse sign: the keys' mean cosine to the queue (→ 1 when every key is one)
            signs = {"moco_queue_similarity": (k.float() @ self.queue.t()).mean()}
        self.dequeue_and_enqueue(k)
        return StepOutput(loss, embedding=h.detach(), projection=q.detach(), target=k, instruments=signs)

    @torch.no_grad()
    def dequeue_and_enqueue(self, k: Tensor) -> None:
        """queue[ptr : ptr + B] ← the keys of every process in rank order; ptr ← (ptr + B) mod K (builder.py:65-79)."""
        keys = gather_no_grad(k.detach().to(self.queue.dtype).contiguous())
        rows = (self.queue_ptr + torch.arange(keys.shape[0], device=keys.device)) % self.queue.shape[0]
        self.queue.index_copy_(0, rows, keys)
        self.queue_ptr.copy_((self.queue_ptr + keys.shape[0]) % self.queue.shape[0])
