"""torchvision ResNets without the classifier, with an optional CIFAR-style stem for small images."""

from __future__ import annotations

import torchvision
from torch import nn

RESNET_NAMES = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152")


def resnet(name: str, in_chans: int = 3, small_stem: bool = False, zero_init_residual: bool = False) -> nn.Module:
    """torchvision ``<name>(weights=None)`` with fc = Identity; small_stem: 3x3 stride-1 conv1, no maxpool.

    ``zero_init_residual``: the last BN scale of every residual block (bn3 of a Bottleneck, bn2 of a
    BasicBlock) starts at 0, so each block starts as the identity, as in the official MoCo v3, SimSiam,
    SimCLR and BYOL codes.
    """
    if name not in RESNET_NAMES:
        raise ValueError(f"unknown ResNet {name!r}; choose one of {', '.join(RESNET_NAMES)}")
    model = getattr(torchvision.models, name)(weights=None, zero_init_residual=zero_init_residual)
    if small_stem:
        model.conv1 = nn.Conv2d(in_chans, 64, kernel_size=3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
    elif in_chans != 3:
        model.conv1 = nn.Conv2d(in_chans, 64, kernel_size=7, stride=2, padding=3, bias=False)
    if small_stem or in_chans != 3:  # torchvision's init for the replaced conv
        nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
    model.num_features = model.fc.in_features
    model.kwargs = dict(name=name, in_chans=in_chans, small_stem=small_stem, zero_init_residual=zero_init_residual)
    model.fc = nn.Identity()
    return model
