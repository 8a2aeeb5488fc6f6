"""Build a backbone by name: MoCo v3 ViTs, DINOv3's ViTs and ConvNeXts (``dinov3_*``), torchvision ResNets, small
BatchNorm ConvNets (``bn_cnn_*``), a flow run's ``flow_encoder`` (SiT features), or any timm model as
``timm:<name>``."""

from __future__ import annotations

import difflib
from typing import Callable

from torch import nn

from .convnet import CONVNET_SIZES, convnet
from .dinov3 import DINOV3_CONVNEXT_SIZES, DINOV3_VIT_SIZES, DINOv3ConvNeXt, DINOv3ViT
from .resnet import RESNET_NAMES, resnet
from .sit import FLOW_ENCODER, FlowEncoder
from .vit import VIT_SIZES, VisionTransformer

BACKBONE_NAMES = tuple(VIT_SIZES) + tuple(DINOV3_VIT_SIZES) + tuple(DINOV3_CONVNEXT_SIZES) + RESNET_NAMES + \
    tuple(CONVNET_SIZES)
TIMM_PREFIX = "timm:"


def _unknown(name: str, choices, what: str) -> ValueError:
    close = difflib.get_close_matches(name, choices, n=3)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    return ValueError(f"unknown {what} {name!r}.{hint} Known: {', '.join(BACKBONE_NAMES)}, or timm:<model_name>.")


def _timm_backbone(model_name: str, in_chans: int, image_size: int, drop_path_rate: float) -> nn.Module:
    import timm  # lazy: 1.5 s to import, for timm:<name> backbones only

    if not timm.is_model(model_name):
        raise _unknown(model_name, timm.list_models(), "timm model")
    kwargs = dict(num_classes=0, in_chans=in_chans)
    if drop_path_rate > 0:
        kwargs["drop_path_rate"] = drop_path_rate
    try:  # ViT-like models take img_size; CNNs reject it
        model = timm.create_model(model_name, pretrained=False, img_size=image_size, **kwargs)
        kwargs["img_size"] = image_size
    except TypeError:
        model = timm.create_model(model_name, pretrained=False, **kwargs)
    model.timm_recipe = {"model": model_name, "kwargs": kwargs}  # how timm rebuilds it (the export's metadata)
    return model


def _vit(name: str, *, in_chans: int, image_size: int, patch_size: int = 16, drop_path_rate: float = 0.0,
         pool: str = "cls", stop_grad_conv1: bool = False, layer_scale: float = 0.0, pos_embed: str = "sincos",
         init: str = "moco_v3", final_norm: bool = True, registers: int = 0, ffn: str = "mlp",
         drop_path_uniform: bool = False, class_token: bool = True, **_) -> nn.Module:
    return VisionTransformer(image_size=image_size, patch_size=patch_size, in_chans=in_chans,
                             drop_path_rate=drop_path_rate, pool=pool, stop_grad_conv1=stop_grad_conv1,
                             layer_scale=layer_scale, pos_embed=pos_embed, init=init, final_norm=final_norm,
                             registers=registers, ffn=ffn, drop_path_uniform=drop_path_uniform, class_token=class_token,
                             **VIT_SIZES[name])


def _vit_only(name: str, layer_scale: float = 0.0, pos_embed: str = "sincos", init: str = "moco_v3",
              final_norm: bool = True, registers: int = 0, ffn: str = "mlp", drop_path_uniform: bool = False) -> None:
    """LayerScale, the position-embedding kind, the init scheme, dropping the final norm, registers, the SwiGLU
    FFN and a uniform drop path belong to the selfsup ViTs."""
    if registers or ffn != "mlp" or drop_path_uniform:
        raise ValueError(f"model.registers / model.ffn / model.drop_path_uniform apply to the selfsup ViTs "
                         f"({', '.join(VIT_SIZES)}), not to {name}; leave them at 0 / mlp / false")
    if pos_embed != "sincos" or init != "moco_v3" or not final_norm:
        raise ValueError(f"model.pos_embed / model.init / model.final_norm apply to the selfsup ViTs "
                         f"({', '.join(VIT_SIZES)}), not to {name}; leave them at sincos / moco_v3 / true")
    if layer_scale > 0:
        raise ValueError(f"LayerScale (model.layer_scale={layer_scale}) applies to the selfsup ViTs "
                         f"({', '.join(VIT_SIZES)}), not to {name}; set model.layer_scale=0")


def _resnet(name: str, *, in_chans: int, small_stem: bool = False, zero_init_residual: bool = False,
            layer_scale: float = 0.0, pos_embed: str = "sincos", init: str = "moco_v3", final_norm: bool = True,
            registers: int = 0, ffn: str = "mlp", drop_path_uniform: bool = False, **_) -> nn.Module:
    _vit_only(name, layer_scale, pos_embed, init, final_norm, registers, ffn, drop_path_uniform)
    return resnet(name, in_chans=in_chans, small_stem=small_stem, zero_init_residual=zero_init_residual)


def _convnet(name: str, *, in_chans: int, layer_scale: float = 0.0, pos_embed: str = "sincos", init: str = "moco_v3",
             registers: int = 0, ffn: str = "mlp", drop_path_uniform: bool = False, **_) -> nn.Module:
    _vit_only(name, layer_scale, pos_embed, init, True, registers, ffn, drop_path_uniform)
    return convnet(name, in_chans=in_chans)


def _timm(name: str, *, in_chans: int, image_size: int, drop_path_rate: float = 0.0, layer_scale: float = 0.0,
          pos_embed: str = "sincos", init: str = "moco_v3", final_norm: bool = True, registers: int = 0,
          ffn: str = "mlp", drop_path_uniform: bool = False, **_) -> nn.Module:
    _vit_only(name, layer_scale, pos_embed, init, final_norm, registers, ffn, drop_path_uniform)
    return _timm_backbone(name[len(TIMM_PREFIX):], in_chans, image_size, drop_path_rate)


def _fixed(name: str, patch_size: int = 16, pool: str = "cls", layer_scale: float = 0.0, pos_embed: str = "sincos",
           init: str = "moco_v3", final_norm: bool = True, registers: int = 0, ffn: str = "mlp",
           drop_path_uniform: bool = False, class_token: bool = True) -> None:
    """A DINOv3 backbone's architecture is its size's (``arch``: a file's own): the selfsup ViTs' keys are refused
    but the patch size, the pooling and the frozen patch projection of its ViT (a ConvNeXt ignores those, as a ResNet
    does)."""
    _vit_only(name, layer_scale, pos_embed, init, final_norm, registers, ffn, drop_path_uniform)
    if not class_token:
        raise ValueError(f"model.class_token=false applies to the selfsup ViTs, not {name}")


def _dinov3(name: str, *, in_chans: int, image_size: int = 224, drop_path_rate: float = 0.0, small_stem: bool = False,
            zero_init_residual: bool = False, stop_grad_conv1: bool = False, arch: dict | None = None,
            **vit) -> nn.Module:
    """DINOv3's ViTs (``DINOV3_VIT_SIZES``; any patch size, pool cls or avg, MoCo v3's frozen patch projection)
    and ConvNeXts; ``arch``: the architecture a weights file states (its size, FFN width, norms, RoPE), over the
    name's."""
    _fixed(name, **vit)
    if name in DINOV3_CONVNEXT_SIZES or name == DINOV3_ANY[1]:
        return DINOv3ConvNeXt(in_chans=in_chans, drop_path_rate=drop_path_rate,
                              **{**DINOV3_CONVNEXT_SIZES.get(name, {}), **(arch or {})})
    vit_ = DINOv3ViT(image_size=image_size, patch_size=vit.get("patch_size", 16), in_chans=in_chans,
                     drop_path_rate=drop_path_rate, pool=vit.get("pool", "cls"),
                     **{**DINOV3_VIT_SIZES.get(name, {}), **(arch or {})})
    vit_.patch_embed.requires_grad_(not stop_grad_conv1)
    return vit_


def _flow_encoder(name: str, **kwargs) -> nn.Module:
    return FlowEncoder.build(**kwargs)


# name → builder(name, **kwargs); the image backbones read their keys of the run's model section
# (``methods.base.backbone_kwargs``: in_chans, image_size, patch_size, drop_path_rate, pool, ...) and
# ignore the others; ``flow_encoder`` takes ``FlowEncoder.build``'s (sit, block, t, fit, seed).
IMAGE_KEYS = {"in_chans", "image_size", "patch_size", "drop_path_rate", "pool", "stop_grad_conv1", "small_stem",
              "zero_init_residual", "layer_scale", "pos_embed", "init", "final_norm", "registers", "ffn",
              "drop_path_uniform", "class_token", "arch"}
# a DINOv3 network of no released size (a file's own architecture, ``arch``: weights.build_from_weights)
DINOV3_ANY = ("dinov3_vit", "dinov3_convnext")
BUILDERS: dict[str, Callable[..., nn.Module]] = {**{n: _vit for n in VIT_SIZES}, **{n: _resnet for n in RESNET_NAMES},
                                                 **{n: _convnet for n in CONVNET_SIZES}, FLOW_ENCODER: _flow_encoder,
                                                 **{n: _dinov3 for n in (*DINOV3_VIT_SIZES, *DINOV3_CONVNEXT_SIZES,
                                                                         *DINOV3_ANY)}}


def build_backbone(name: str, **kwargs) -> nn.Module:
    """A feature extractor (B, C, S, S) -> (B, num_features) by name (``BUILDERS``, or ``timm:<name>``);
    every result has ``.num_features``. This is how an exported backbone is rebuilt (``export.rebuild_backbone``)."""
    if name != FLOW_ENCODER and set(kwargs) - IMAGE_KEYS:
        raise TypeError(f"build_backbone({name!r}) got unexpected keyword arguments {sorted(set(kwargs) - IMAGE_KEYS)}")
    if name.startswith(TIMM_PREFIX):
        return _timm(name, **kwargs)
    if name not in BUILDERS:
        raise _unknown(name, BACKBONE_NAMES, "backbone")
    return BUILDERS[name](name, **kwargs)
