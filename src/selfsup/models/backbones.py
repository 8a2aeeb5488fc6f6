"""Build a backbone by name: MoCo v3 ViTs, torchvision ResNets, or any timm model as ``timm:<name>``."""

from __future__ import annotations

import difflib

from torch import nn

from .resnet import RESNET_NAMES, resnet
from .vit import VIT_SIZES, VisionTransformer

BACKBONE_NAMES = tuple(VIT_SIZES) + RESNET_NAMES
TIMM_PREFIX = "timm:"


def _unknown(name: str, choices, what: str) -> ValueError:
    close = difflib.get_close_matches(name, choices, n=3)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    return ValueError(f"unknown {what} {name!r}.{hint} Known: {', '.join(BACKBONE_NAMES)}, or timm:<model_name>.")


def _timm_backbone(model_name: str, in_chans: int, image_size: int, drop_path_rate: float) -> nn.Module:
    import timm

    if not timm.is_model(model_name):
        raise _unknown(model_name, timm.list_models(), "timm model")
    kwargs = dict(pretrained=False, num_classes=0, in_chans=in_chans)
    if drop_path_rate > 0:
        kwargs["drop_path_rate"] = drop_path_rate
    try:  # ViT-like models take img_size; CNNs reject it
        return timm.create_model(model_name, img_size=image_size, **kwargs)
    except TypeError:
        return timm.create_model(model_name, **kwargs)


def build_backbone(
    name: str,
    *,
    in_chans: int,
    image_size: int,
    patch_size: int = 16,
    drop_path_rate: float = 0.0,
    pool: str = "cls",
    stop_grad_conv1: bool = False,
    small_stem: bool = False,
    zero_init_residual: bool = False,
    layer_scale: float = 0.0,
    pos_embed: str = "sincos",
    init: str = "moco_v3",
) -> nn.Module:
    """A feature extractor (B, C, S, S) -> (B, num_features); every result has ``.num_features``."""
    if name in VIT_SIZES:
        return VisionTransformer(
            image_size=image_size,
            patch_size=patch_size,
            in_chans=in_chans,
            drop_path_rate=drop_path_rate,
            pool=pool,
            stop_grad_conv1=stop_grad_conv1,
            layer_scale=layer_scale,
            pos_embed=pos_embed,
            init=init,
            **VIT_SIZES[name],
        )
    if pos_embed != "sincos" or init != "moco_v3":
        raise ValueError(f"model.pos_embed / model.init apply to the selfsup ViTs ({', '.join(VIT_SIZES)}), not to "
                         f"{name}; leave them at sincos / moco_v3")
    if layer_scale > 0:
        raise ValueError(f"LayerScale (model.layer_scale={layer_scale}) applies to the selfsup ViTs "
                         f"({', '.join(VIT_SIZES)}), not to {name}; set model.layer_scale=0")
    if name in RESNET_NAMES:
        return resnet(name, in_chans=in_chans, small_stem=small_stem, zero_init_residual=zero_init_residual)
    if name.startswith(TIMM_PREFIX):
        return _timm_backbone(name[len(TIMM_PREFIX):], in_chans, image_size, drop_path_rate)
    raise _unknown(name, BACKBONE_NAMES, "backbone")
