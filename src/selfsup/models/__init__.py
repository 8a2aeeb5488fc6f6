"""Backbones (MoCo v3 ViT, torchvision ResNet, timm) and projector/predictor heads."""

from .backbones import BACKBONE_NAMES, build_backbone
from .heads import mlp
from .resnet import RESNET_NAMES, resnet
from .vit import VIT_SIZES, DropPath, VisionTransformer, build_2d_sincos_position_embedding

__all__ = [
    "BACKBONE_NAMES",
    "RESNET_NAMES",
    "VIT_SIZES",
    "DropPath",
    "VisionTransformer",
    "build_2d_sincos_position_embedding",
    "build_backbone",
    "mlp",
    "resnet",
]
