"""Projector / predictor MLPs for MoCo v3, BYOL and SimSiam, and the DINO and iBOT heads (the linear predictors
live in ``selfsup.predictors``)."""

from __future__ import annotations

import torch
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


class WeightNormLinear(nn.Module):
    """A bias-free Linear ``W = g · v / ‖v‖`` per output row (``torch.nn.utils.weight_norm``, dim 0), with the
    official parameter names ``weight_g`` (out, 1) and ``weight_v`` (out, in); ``g`` starts at 1."""

    def __init__(self, in_dim: int, out_dim: int, norm_last_layer: bool = True):
        super().__init__()
        self.weight_v = nn.Parameter(nn.Linear(in_dim, out_dim, bias=False).weight.detach().clone())
        self.weight_g = nn.Parameter(torch.ones(out_dim, 1), requires_grad=not norm_last_layer)

    @property
    def weight(self):
        return self.weight_v * (self.weight_g / self.weight_v.norm(dim=1, keepdim=True))

    def forward(self, x):
        return nn.functional.linear(x, self.weight)


class DINOHead(nn.Module):
    """DINO's projection head (vision_transformer.py:257-291): MLP in → hidden (GELU, optional BN) … → bottleneck,
    L2-normalised, then a weight-normalised bias-free Linear to ``out_dim`` prototypes (``last_layer``). The MLP's
    Linears get truncated-normal std .02 weights and zero biases; ``last_layer.weight_v`` keeps PyTorch's
    default Linear init (made after the MLP init, as the official code); ``norm_last_layer`` freezes ``g`` = 1."""

    def __init__(self, in_dim: int, out_dim: int, hidden_dim: int = 2048, bottleneck_dim: int = 256,
                 num_layers: int = 3, use_bn: bool = False, norm_last_layer: bool = True):
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"the DINO head needs at least 1 layer, got {num_layers}")
        layers: list[nn.Module] = []
        d = in_dim
        for _ in range(num_layers - 1):
            layers += [nn.Linear(d, hidden_dim)] + ([nn.BatchNorm1d(hidden_dim)] if use_bn else []) + [nn.GELU()]
            d = hidden_dim
        layers.append(nn.Linear(d, bottleneck_dim))
        self.mlp = nn.Sequential(*layers)
        for m in self.mlp.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)
        self.last_layer = WeightNormLinear(bottleneck_dim, out_dim, norm_last_layer)

    def forward(self, x):
        return self.last_layer(nn.functional.normalize(self.mlp(x), dim=-1, p=2))

    @classmethod
    def from_state_dict(cls, state: dict[str, torch.Tensor]) -> DINOHead:
        """The head whose ``state_dict`` is ``state`` (its shapes give in, hidden, bottleneck and out dims and the
        layer count; without BatchNorm), with those weights: a trained run's head rebuilt from its checkpoint.
        ValueError where ``state`` is no such head's."""
        linears = sorted((int(k.split(".")[1]), v) for k, v in state.items()
                         if k.startswith("mlp.") and k.endswith(".weight") and v.ndim == 2)
        if not linears or "last_layer.weight_v" not in state or any("running_mean" in k for k in state):
            raise ValueError(f"not a DINO head without BatchNorm: keys {sorted(state)[:4]}")
        first, last = linears[0][1], linears[-1][1]
        head = cls(first.shape[1], state["last_layer.weight_v"].shape[0], first.shape[0], last.shape[0],
                   len(linears), use_bn=False)
        try:
            head.load_state_dict(state, strict=True)
        except RuntimeError as e:
            raise ValueError(f"not a DINO head: {' '.join(str(e).split())[:120]}") from None
        return head


class iBOTHead(DINOHead):
    """iBOT's head (ibot models/head.py:145-199): DINO's MLP and L2 normalisation shared by the class and patch
    tokens; the class token through ``last_layer`` (``out_dim``), the patch tokens through ``last_layer2``
    (``patch_out_dim``, weight-normalised like ``last_layer``), or through ``last_layer`` itself when
    ``shared_head`` (then ``patch_out_dim`` is ``out_dim``). On (B, 1+N, D) tokens it returns the class logits
    (B, out_dim) and the patch logits (B, N, patch_out_dim); on (B, D) features, DINO's head (local crops)."""

    def __init__(self, in_dim: int, out_dim: int, patch_out_dim: int, hidden_dim: int = 2048,
                 bottleneck_dim: int = 256, num_layers: int = 3, use_bn: bool = False, norm_last_layer: bool = True,
                 shared_head: bool = False):
        if use_bn:
            raise ValueError("the iBOT head runs its MLP on token sequences: use_bn is not supported")
        super().__init__(in_dim, out_dim, hidden_dim, bottleneck_dim, num_layers, use_bn, norm_last_layer)
        self.last_layer2 = (self.last_layer if shared_head
                            else WeightNormLinear(bottleneck_dim, patch_out_dim, norm_last_layer))

    def forward(self, x, patch_index=None):
        """``patch_index`` (B, k) long: the patch tokens to project (0-based among the N patches), in that order;
        the head is per token, so the others are skipped, not computed and dropped (None: all N)."""
        if x.ndim == 2:
            return super().forward(x)
        if patch_index is not None:
            patches = x[:, 1:].gather(1, patch_index[..., None].expand(-1, -1, x.shape[-1]))
            x = torch.cat([x[:, :1], patches], dim=1)
        z = nn.functional.normalize(self.mlp(x), dim=-1, p=2)
        return self.last_layer(z[:, 0]), self.last_layer2(z[:, 1:])
