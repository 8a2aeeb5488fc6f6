"""Interventions on the embedding norms (Draganov et al., "On the Importance of Embedding Norms in SSL").

Cosine-based losses give a sample's embedding z a gradient that shrinks as 1/‖z‖, so growing norms
slow learning. Two remedies:

* **cut-initialization**: after the model is built, divide its parameters by c (the public code divides
  every parameter; the paper reports dividing only the final layer as roughly equivalent). Parameters
  only: buffers such as BatchNorm running statistics are left as they are. Momentum / EMA targets are
  re-synchronised with their online networks afterwards.
* **GradScale**: an identity whose backward multiplies each sample's gradient by ‖z‖^p (p = 0: unchanged),
  undoing the 1/‖z‖ of the normalisation for p = 1. Where each method applies it (before any
  normalisation): SimCLR the projector outputs of both views (contrastive: the paper's place); MoCo v3
  the queries, i.e. the predictor outputs (its keys carry no gradient); BYOL and SimSiam the predictor
  outputs (the paper's place for them).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class GradScaleFn(torch.autograd.Function):
    """forward: z; backward: grad · ‖z_i‖^p for each sample i (the norm taken as a constant)."""

    @staticmethod
    def forward(ctx, z: Tensor, p: float) -> Tensor:
        ctx.save_for_backward(z)
        ctx.p = p
        return z.view_as(z)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (z,) = ctx.saved_tensors
        scale = z.detach().float().flatten(1).norm(dim=1).pow(ctx.p).to(grad.dtype)
        return grad * scale.view(-1, *([1] * (grad.ndim - 1))), None


def grad_scale(z: Tensor, p: float) -> Tensor:
    """GradScale of ``z`` (N, ...) with power ``p``; the identity (no autograd node) when p = 0."""
    if p == 0:
        return z
    return GradScaleFn.apply(z, p)


def last_linear(module: nn.Module) -> nn.Module:
    """The last Linear / Conv layer of ``module`` (the projector's final layer)."""
    layers = [m for m in module.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    if not layers:
        raise ValueError(f"{type(module).__name__} has no Linear layer")
    return layers[-1]


@torch.no_grad()
def cut_init(model: nn.Module, c: float, scope: str = "all") -> None:
    """Divide ``model``'s parameters by ``c``: every one (``scope="all"``) or those of the last layer of
    ``model.projector`` (``"projector_last"``); then copy each online network into its EMA target."""
    if c == 1:
        return
    if scope == "all":
        params = list(model.parameters())
    elif scope == "projector_last":
        projector = getattr(model, "projector", None)
        if not isinstance(projector, nn.Module):
            raise ValueError(f"cut_init_scope=projector_last needs a method with a projector; "
                             f"{type(model).__name__} has none")
        params = list(last_linear(projector).parameters())
    else:
        raise ValueError(f"unknown cut_init scope {scope!r}; use all or projector_last")
    for p in params:
        p.div_(c)
    for online, target in getattr(model, "momentum_pairs", []):
        for po, pt in zip(online.parameters(), target.parameters()):
            pt.copy_(po)
