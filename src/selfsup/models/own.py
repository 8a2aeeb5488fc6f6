"""A user's own backbone (``selfsup.method``): its feature width found by one forward of a dummy batch, not read from
an attribute (torchvision's models have no ``num_features``); a backbone that returns a feature map (B, C, H, W) is
wrapped in a global average pool; any other output is one line naming the fix."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from selfsup.errors import UserError


class GlobalPool(nn.Module):
    """``net``'s feature map (B, C, H, W) averaged over H and W: (B, C) features (``net`` is trained in place)."""

    def __init__(self, net: nn.Module, num_features: int):
        super().__init__()
        self.net, self.num_features = net, int(num_features)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x).mean(dim=(2, 3))


def own_backbone(backbone: nn.Module, channels: int, image_size: int,
                 num_features: int | None = None) -> nn.Module:
    """``backbone`` with ``num_features`` set to the width of its output on a (2, ``channels``, ``image_size``,
    ``image_size``) batch of zeros (run once, in eval mode, without gradients), or wrapped in :class:`GlobalPool`
    where that output is a feature map. ``num_features``, where given, must agree with the measured width."""
    where = next(iter(backbone.parameters()), None)
    device = where.device if where is not None else torch.device("cpu")
    shape = (2, channels, image_size, image_size)
    training = backbone.training
    backbone.eval()
    try:
        with torch.no_grad():
            out = backbone(torch.zeros(shape, device=device))
    except Exception as e:  # a user's network: whatever it raises, in one line
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UserError(f"selfsup.method: the backbone fails on a {shape} batch ({type(e).__name__}: {first}); give "
                        "the channels= and image_size= it takes") from None
    finally:
        backbone.train(training)
    if not isinstance(out, Tensor):
        raise UserError(f"selfsup.method: the backbone returns a {type(out).__name__}; it must return one tensor of "
                        "features (B, D) (wrap it to return the features only)")
    if out.dim() == 4:
        width, module = out.shape[1], GlobalPool(backbone, out.shape[1])
    elif out.dim() == 2:
        width, module = out.shape[1], backbone
    else:
        hint = "; return its [CLS] token or the mean over tokens" if out.dim() == 3 else ""
        raise UserError(f"selfsup.method: the backbone returns shape {tuple(out.shape)} on a {shape} batch; it must "
                        f"return features (B, D) or a feature map (B, C, H, W){hint}")
    declared = getattr(backbone, "num_features", None)
    if module is backbone and isinstance(declared, int) and declared != width:
        raise UserError(f"selfsup.method: the backbone returns {width} features but its num_features is {declared}: "
                        "it still ends in a classifier; remove it (timm: num_classes=0, torchvision: "
                        "model.fc = nn.Identity())")
    if num_features is not None and num_features != width:
        raise UserError(f"selfsup.method: num_features={num_features}, but the backbone returns {width} features"
                        + (" (its feature map, pooled)" if module is not backbone else "")
                        + f"; pass num_features={width} or leave it out")
    if module is backbone:
        backbone.num_features = width  # what every selfsup backbone declares, read by the method's heads
    return module
