"""NNCLR (Dwibedi et al. 2021): the nearest neighbour in a support set of past embeddings as the positive.

The authors released no code. This follows the paper (its eq. 2 and §3-4) and was compared, fact by fact, with
two public re-implementations, lightly (lightly-ai/lightly: NNCLRProjectionHead / NNCLRPredictionHead,
NNMemoryBankModule, NTXentLoss) and solo-learn (vturrisi/solo-learn: solo/methods/nnclr.py,
solo/losses/nnclr.py); docs/reference SWAV-WMSE-NNCLR.md section 3 has the file:line of each. Per step:

    z_v = projector(backbone(x_v)),  p_v = predictor(z_v)          # v = 1, 2
    NN(z_v) = argmax_{q ∈ Q} cos(z_v, q)                          # no gradient; Q searched before the update
    loss = ½ [ InfoNCE(NN(z_1) → p_2) + InfoNCE(NN(z_2) → p_1) ]  # anchors NN(z), candidates the other view's p
    Q ← FIFO(Q, normalize(z_1) of every process)                  # after the loss

Choices where the two differ (each the paper's where it says, else solo-learn's): the loss is eq. 2, the
neighbour of one view against the predictions of the other view of the global batch (gathered with gradient),
as solo-learn's one-way InfoNCE, symmetrised; lightly's NT-Xent adds NN–NN and p–p negatives (not the paper's
objective). The support set is global: view 1's normalised z of every process is all-gathered before the
enqueue, so every process holds the same FIFO (solo-learn; lightly keeps one bank per process); it wraps
around instead of dropping rows (lightly drops the overflow), starts as random unit vectors (both), and is a
buffer of the checkpoint (solo-learn; lightly's is not persistent), so a resumed run is exact. Heads: the
paper's projection MLP 3 × [2048, 2048, d] with BN after every FC and ReLU after all but the last, and its
prediction MLP [4096, d] with BN and ReLU on the hidden layer only, d = 256; Linears followed by BN have no
bias (lightly; solo-learn keeps them: no difference after a BN). A label FIFO beside the support set gives the
neighbour's label agreement (solo-learn's nn accuracy) where the data has labels.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from selfsup.distributed import gather_no_grad, gather_with_grad, world
from selfsup.errors import UserError
from selfsup.losses import nearest_neighbour, nnclr_loss
from selfsup.methods.base import SSLMethod, encode_views
from selfsup.models.heads import mlp
from selfsup.step import StepOutput


@dataclass
class NNCLRConfig:
    """NNCLR hyper-parameters; defaults are the paper's heads, and its support set and τ as recalled (unverified
    here; see the ImageNet preset)."""

    temperature: float = 0.1
    queue_size: int = 98304  # the support set's rows
    proj_hidden_dim: int = 2048
    proj_layers: int = 3
    dim: int = 256
    pred_hidden_dim: int = 4096

    def validate(self) -> None:
        if not self.temperature > 0:
            raise UserError(f"method.temperature={self.temperature} must be > 0")
        for key in ("queue_size", "proj_hidden_dim", "proj_layers", "dim", "pred_hidden_dim"):
            if getattr(self, key) < 1:
                raise UserError(f"method.{key}={getattr(self, key)} must be >= 1")


class NNCLR(SSLMethod):
    """z = projector(backbone(x)), p = predictor(z); InfoNCE between NN(z) of one view and p of the other."""

    Config = NNCLRConfig
    collapse_remedy = "a lower optim.base_lr; a smaller support set (method.queue_size) early on"
    recipe = "byol"  # BYOL's augmentations, as the paper is recalled (not verified here)
    loss_embedding = ("projector", "predictor")  # p is normalised by the loss with a gradient
    reads_labels = True  # the support set keeps them: the neighbours' label agreement (a collapse sign)

    def __init__(self, cfg, info):
        super().__init__(cfg, info)
        c = cfg.method
        if c.queue_size < cfg.data.batch_size:
            raise UserError(f"method.queue_size={c.queue_size} must be >= data.batch_size={cfg.data.batch_size} "
                            "(the support set takes a whole global batch each step)")
        self.projector = mlp(self.backbone.num_features, c.proj_hidden_dim, c.dim, c.proj_layers, last_bn=True,
                             last_bn_affine=True)
        self.predictor = mlp(c.dim, c.pred_hidden_dim, c.dim, 2, last_bias=True)
        self.register_buffer("support", F.normalize(torch.randn(c.queue_size, c.dim), dim=1))
        self.register_buffer("support_labels", torch.full((c.queue_size,), -1, dtype=torch.long))
        self.register_buffer("support_ptr", torch.zeros((), dtype=torch.long))

    def trainable(self):
        return {"backbone": self.backbone, "projector": self.projector, "predictor": self.predictor}

    def forward_views(self, views, labels=None):
        c, (rank, _) = self.cfg.method, world()
        h = encode_views(self.backbone, views[:2])
        z = [self.projector(x) for x in h]
        p = [self.grad_scale(self.predictor(x)) for x in z]
        (nn1, idx1), (nn2, _) = (nearest_neighbour(x, self.support) for x in z)  # before the update
        loss = 0.5 * (nnclr_loss(nn1, p[1], c.temperature, all_p=gather_with_grad(p[1]), rank=rank)
                      + nnclr_loss(nn2, p[0], c.temperature, all_p=gather_with_grad(p[0]), rank=rank))
        with torch.no_grad():
            signs = {"nnclr_nn_similarity": F.cosine_similarity(z[0], nn1, dim=1).mean()}
            if labels is not None:  # the neighbour's label agreement, over neighbours whose label is known
                nn_labels = self.support_labels[idx1]
                known = (nn_labels >= 0) & (labels >= 0)
                signs["nnclr_nn_label_agreement"] = ((nn_labels == labels) & known).sum() / known.sum().clamp_min(1)
        self.update_support(z[0], labels)
        return StepOutput(loss, embedding=h[0].detach(), embedding2=h[1].detach(), projection=z[0].detach(),
                          prediction=p[0].detach(), instruments=signs)

    @torch.no_grad()
    def update_support(self, z: torch.Tensor, labels: torch.Tensor | None) -> None:
        """Q ← FIFO(Q, normalised z of every process, in rank order), wrapping around; the labels beside it."""
        new = gather_no_grad(F.normalize(z.detach().float(), dim=1).contiguous())
        rows = (self.support_ptr + torch.arange(new.shape[0], device=new.device)) % self.support.shape[0]
        self.support.index_copy_(0, rows, new)
        if labels is not None:
            self.support_labels.index_copy_(0, rows, gather_no_grad(labels.to(self.support_labels).contiguous()))
        self.support_ptr.copy_((self.support_ptr + new.shape[0]) % self.support.shape[0])
