"""Interventions on the embedding norms (Draganov et al., "On the Importance of Embedding Norms in SSL").

Cosine-based losses give a sample's embedding z a gradient that shrinks as 1/‖z‖, so growing norms
slow learning. Two remedies:

* **cut-initialization**: after the model is built, divide its parameters by c (the public code divides
  every parameter; the paper reports dividing only the final layer as roughly equivalent: ``projector_last``
  divides the layer that sets the projector output's scale, never read in the public code). Parameters
  only: buffers such as BatchNorm running statistics are left as they are. Momentum / EMA targets are
  re-synchronised with their online networks afterwards. Under Adam(W) a global gradient scale cancels, so
  GradScale's global factor has no effect there; the paper's code uses SGD.
* **GradScale**: an identity whose backward multiplies each sample's gradient by ‖z‖^p (p = 0: unchanged),
  undoing the 1/‖z‖ of the normalisation for p = 1. Where each method applies it (before any
  normalisation): SimCLR the projector outputs of both views (contrastive: the paper's place); MoCo v3
  the queries, i.e. the predictor outputs (its keys carry no gradient); BYOL and SimSiam the predictor
  outputs (the paper's place for them).
"""

from __future__ import annotations

import warnings

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


def scale_layer(module: nn.Module) -> nn.Module:
    """The layer that sets the scale of ``module``'s output: its last Linear / Conv, or the BatchNorm after it
    (whose affine γ, β then set the output's scale; a BatchNorm without affine cannot be scaled)."""
    layers = [m for m in module.modules() if isinstance(m, (nn.Linear, nn.Conv2d, nn.modules.batchnorm._BatchNorm))]
    if not layers:
        raise ValueError(f"{type(module).__name__} has no Linear layer")
    last = layers[-1]
    if isinstance(last, nn.modules.batchnorm._BatchNorm) and not last.affine:
        raise ValueError("cut_init_scope=projector_last cannot act: the projector ends in a BatchNorm without "
                         "affine, which pins its output scale; use a head whose last BN is affine (SimSiam "
                         "method.proj_last_affine=true) or none (SimCLR method.proj_bn=false), or cut_init_scope=all")
    return last


def changes_function(model: nn.Module) -> list[str]:
    """Names of the layer kinds of ``model`` for which dividing every parameter by c is not a rescaling of the
    output (LayerNorm / GroupNorm, attention)."""
    kinds = set()
    for m in model.modules():
        if isinstance(m, (nn.LayerNorm, nn.GroupNorm)):
            kinds.add(type(m).__name__)
        elif isinstance(m, nn.MultiheadAttention) or "Attention" in type(m).__name__:
            kinds.add("attention")
    return sorted(kinds)


@torch.no_grad()
def cut_init(model: nn.Module, c: float, scope: str = "all") -> None:
    """Divide ``model``'s parameters by ``c``: every one (``scope="all"``, the public code ``cut_weights``), or those
    of the layer that sets the scale of ``model.projector``'s output (``"projector_last"``: the affine γ, β of a final
    BatchNorm, else the last Linear's weight and bias); then copy each online network into its EMA target.

    In a network whose every conv / Linear is followed by BatchNorm (the paper's ResNets, ``bn_cnn_*``) the cut of
    every parameter divides each BN output by c and leaves the output's direction unchanged; with LayerNorm or
    attention it computes another function (the audit measured feature cos 0.58 on ``vit_micro``): a warning."""
    if c == 1:
        return
    if scope == "all":
        params = list(model.parameters())
        kinds = changes_function(model)
        if kinds:
            warnings.warn(f"cut-init (interventions.cut_init={c:g}) on a model with {', '.join(kinds)} changes the "
                          "network's function, not only its scale (the paper's cut acts on BatchNorm networks, e.g. "
                          "model.backbone=bn_cnn_micro or a ResNet)", UserWarning, stacklevel=2)
    elif scope == "projector_last":
        projector = getattr(model, "projector", None)
        if not isinstance(projector, nn.Module):
            raise ValueError(f"cut_init_scope=projector_last needs a method with a projector; "
                             f"{type(model).__name__} has none")
        params = list(scale_layer(projector).parameters())
    else:
        raise ValueError(f"unknown cut_init scope {scope!r}; use all or projector_last")
    for p in params:
        p.div_(c)
    for online, target in getattr(model, "momentum_pairs", []):  # by name: iBOT's / DINOv2's student has a mask token
        shadow = dict(target.named_parameters())
        for name, po in online.named_parameters():
            if name in shadow:
                shadow[name].copy_(po)
