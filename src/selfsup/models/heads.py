"""Projector / predictor MLPs for MoCo v3, BYOL and SimSiam (the linear predictors live in ``selfsup.predictors``)."""

from __future__ import annotations

from torch import nn


def mlp(
    in_dim: int,
    hidden_dim: int,
    out_dim: int,
    num_layers: int,
    *,
    last_bn: bool = False,
    last_bn_affine: bool = False,
    bias: bool = False,
    last_bias: bool | None = None,
    hidden_bn: bool = True,
) -> nn.Sequential:
    """[Linear -> BN -> ReLU] x (num_layers-1), then Linear (+ BN(affine=last_bn_affine) if last_bn).

    Settings used by the papers' official code:
      * MoCo v3 (``_build_mlp``): bias=False everywhere. ViT projector 3 layers D->4096->4096->256 with
        last_bn (affine=False); ResNet projector 2 layers with last_bn; predictor 2 layers 256->4096->256,
        last_bn for ViT only.
      * BYOL: Linear(bias) -> BN -> ReLU -> Linear(no bias), hidden 4096, out 256, no last BN
        (``bias=True, last_bias=False``, num_layers=2) for both projector and predictor.
      * SimSiam: projector 3 layers, bias=False, last_bn (affine=False), dim 2048; predictor
        2048->512->2048 with bias=False on the hidden Linear, ``last_bias=True``, no last BN.
    """
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    last_bias = bias if last_bias is None else last_bias
    layers: list[nn.Module] = []
    d = in_dim
    for _ in range(num_layers - 1):
        layers.append(nn.Linear(d, hidden_dim, bias=bias))
        if hidden_bn:
            layers.append(nn.BatchNorm1d(hidden_dim))
        layers.append(nn.ReLU(inplace=True))
        d = hidden_dim
    layers.append(nn.Linear(d, out_dim, bias=last_bias))
    if last_bn:
        layers.append(nn.BatchNorm1d(out_dim, affine=last_bn_affine))
    return nn.Sequential(*layers)

