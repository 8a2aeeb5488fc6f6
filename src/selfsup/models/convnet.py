"""A small BatchNorm ConvNet for CPU-scale embedding-norm experiments (8×8 digits, 28×28 Fashion-MNIST).

The embedding-norm paper's backbones are BN ResNets (SSLEmbeddingNorms ``CLA/training/models.py:9-27``). What its
cut-initialisation relies on is that every conv is followed by BatchNorm: dividing every parameter by c then only
divides each BN output (γ, β) by c, so the network's output direction is unchanged and its scale falls by c per
BN-ReLU stage that it passes through up to the last one (an exact rescale; a LayerNorm / attention network is a
different function after the cut). This net keeps that property at a CPU's budget: ``[conv3×3 (no bias) → BN →
ReLU]`` per stage, then global average pooling. ``bn_cnn_micro``: widths 32-64-128-128, strides 1-2-2-1 (the audit's
``shared/design/review-embedding-norms.md`` §3.3 net, 0.3–0.9 s per batch-256 step on 8×8 here).
"""

from __future__ import annotations

from torch import nn

CONVNET_SIZES = {
    "bn_cnn_micro": dict(widths=(32, 64, 128, 128), strides=(1, 2, 2, 1)),
    "bn_cnn_tiny": dict(widths=(16, 32, 64, 64), strides=(1, 2, 2, 1)),
}


class ConvNet(nn.Module):
    """``[Conv3×3(bias=False) → BatchNorm2d → ReLU]`` × stages, global average pool; ``num_features`` = last width.
    Convs get torchvision's ResNet init (Kaiming normal, fan-out), BN γ = 1 and β = 0."""

    def __init__(self, in_chans: int = 1, widths=(32, 64, 128, 128), strides=(1, 2, 2, 1)):
        super().__init__()
        if len(widths) != len(strides) or not widths:
            raise ValueError(f"ConvNet needs one stride per width, got widths {widths} and strides {strides}")
        layers: list[nn.Module] = []
        d = in_chans
        for w, s in zip(widths, strides):
            layers += [nn.Conv2d(d, w, 3, stride=s, padding=1, bias=False), nn.BatchNorm2d(w), nn.ReLU(inplace=True)]
            d = w
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        self.num_features = d
        self.kwargs = dict(in_chans=in_chans, widths=list(widths), strides=list(strides))

    def forward(self, x):
        return self.pool(self.features(x)).flatten(1)


def convnet(name: str, in_chans: int = 1) -> ConvNet:
    if name not in CONVNET_SIZES:
        raise ValueError(f"unknown ConvNet {name!r}; choose one of {', '.join(CONVNET_SIZES)}")
    model = ConvNet(in_chans, **CONVNET_SIZES[name])
    model.kwargs = dict(name=name, in_chans=in_chans)
    return model
