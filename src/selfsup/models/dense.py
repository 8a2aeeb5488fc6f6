"""A network's feature map beside its pooled feature, from one forward: what a per-position loss reads of any
backbone (LightlyTrain's ``forward_features`` + ``forward_pool``, the distillation v2 / v3 of ``methods/distill.py``).

``feature_maps(network, x, n)`` → (the pooled feature (B, C), exactly the network's own output; the maps
(B, C, h, w) of its last ``n`` blocks). A network that defines ``feature_maps(x, n)`` answers for itself (the
selfsup ViT and the DINOv3 ViT: the final-norm patch tokens of its last n blocks, as a grid; the DINOv3 ConvNeXt: its
last stage's map through its final norm, pooled by the mean as LightlyTrain pools it, not its own [CLS]); the others
have one map (n = 1): a
torchvision ResNet's ``layer4`` output before its average pool (lightly-train ``_models/torchvision/resnet.py:28-41``),
the BatchNorm ConvNet's last stage, a timm model's ``forward_features`` (a grid of patch tokens for a ViT) pooled by
its ``forward_head(pre_logits=True)``, a user's network that returns a map (``own.GlobalPool``).
"""

from __future__ import annotations

from torch import Tensor, nn
from torchvision.models import ResNet

from selfsup.errors import UserError

from .convnet import ConvNet
from .own import GlobalPool


def _resnet(net: ResNet, x: Tensor) -> tuple[Tensor, Tensor]:
    x = net.maxpool(net.relu(net.bn1(net.conv1(x))))
    fmap = net.layer4(net.layer3(net.layer2(net.layer1(x))))
    return net.fc(net.avgpool(fmap).flatten(1)), fmap


def _timm(net: nn.Module, x: Tensor) -> tuple[Tensor, Tensor]:
    out = net.forward_features(x)
    pooled = net.forward_head(out, pre_logits=True)
    if out.dim() == 3:  # a ViT's tokens: the patches after its prefix tokens, as a grid
        patches = out[:, int(getattr(net, "num_prefix_tokens", 1)):]
        side = int(round(patches.shape[1] ** 0.5))
        if side * side != patches.shape[1]:
            raise UserError(f"the network's {patches.shape[1]} patch tokens do not form a square grid")
        out = patches.transpose(1, 2).reshape(x.shape[0], -1, side, side)
    return pooled, out


def has_feature_maps(network: nn.Module) -> bool:
    """Whether :func:`feature_maps` reads ``network`` (its kinds above; the others are one line there)."""
    return (hasattr(network, "feature_maps") or isinstance(network, (ResNet, ConvNet, GlobalPool))
            or (hasattr(network, "forward_features") and hasattr(network, "forward_head")))


def gives_last_blocks(network: nn.Module) -> bool:
    """Whether :func:`feature_maps` gives the last n > 1 blocks' maps of ``network`` (a ViT's), not one map only."""
    return hasattr(network, "feature_maps") and hasattr(network, "blocks")


def feature_maps(network: nn.Module, x: Tensor, n: int = 1) -> tuple[Tensor, list[Tensor]]:
    """(pooled (B, C), [maps (B, C, h, w) of the last ``n`` blocks]) of ``network`` on ``x`` in one forward."""
    if hasattr(network, "feature_maps"):
        return network.feature_maps(x, n)
    if n != 1:
        raise UserError(f"a {type(network).__name__} gives one feature map, not its last {n} blocks'; "
                        "set method.n_teacher_blocks=1 or use a ViT")
    if isinstance(network, ResNet):
        pooled, fmap = _resnet(network, x)
    elif isinstance(network, ConvNet):
        fmap = network.features(x)
        pooled = network.pool(fmap).flatten(1)
    elif isinstance(network, GlobalPool):
        fmap = network.net(x)
        pooled = fmap.mean(dim=(2, 3))
    elif hasattr(network, "forward_features") and hasattr(network, "forward_head"):
        pooled, fmap = _timm(network, x)
    else:
        raise UserError(f"a {type(network).__name__} gives no feature map; method.version v2 and v3 need a "
                        "ViT, a ResNet, a ConvNet, a timm model or a network that returns (B, C, H, W)")
    return pooled, [fmap]
