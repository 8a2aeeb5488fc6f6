"""The exported backbone: one safetensors file whose keys are the plain model's (timm/torchvision).

Its metadata holds ``selfsup`` = JSON of how to rebuild it: the backbone name and ``build_backbone``
kwargs, image size, channels, normalisation, ``architecture`` (every constructor argument of the module
and its fixed parts: class token, position embedding, norm layers, stem) and, where one exists, the
plain library's recipe: ``timm`` (ViTs and ``timm:<name>``: ``{"model", "kwargs"}`` for
``timm.create_model``) or ``torchvision`` (ResNets: model function, kwargs, stem). The README's
``rebuild`` function builds the model from that recipe alone, without selfsup, and loads the file with
``strict=True``. ``load_timm`` is selfsup's own loader through a timm name: it refuses a name whose
architecture differs from the file's (e.g. timm's 6-head ``vit_small_*`` for selfsup's 12-head ``vit_small``,
which would load without error and compute other features).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import load_file, save
from torch import nn
from torchvision.models import ResNet

from selfsup.diskspace import atomic_write, tensor_bytes
from selfsup.errors import UserError
from selfsup.models.backbones import build_backbone
from selfsup.models.dinov3 import DINOv3ConvNeXt, DINOv3ViT
from selfsup.models.vit import VisionTransformer

FORMAT = "selfsup-backbone/1"


def export_backbone(backbone: nn.Module, path: Path, meta: dict) -> Path:
    """Write ``backbone``'s state dict and ``meta`` (JSON in the safetensors metadata) to ``path``, with the
    module's ``architecture`` and its timm / torchvision recipe (``describe``) in place of any stale ones."""
    state = {k: v.detach().cpu().contiguous() for k, v in backbone.state_dict().items()}
    meta = {k: v for k, v in meta.items() if k not in ("format", "architecture", "timm", "torchvision")}
    meta = {"format": FORMAT, **meta, **describe(backbone)}
    write_safetensors(state, {"selfsup": json.dumps(meta)}, path, "the exported backbone")
    return path


def write_safetensors(state: dict, metadata: dict, path: Path, what: str) -> None:
    """``state`` as safetensors at ``path``, atomically (a killed or out-of-space write leaves the old file)."""
    atomic_write(Path(path), lambda f: f.write(save(state, metadata=metadata)), what, tensor_bytes(state))


# --------------------------------------------------------------------------- architecture and plain recipes

# timm registers ViTs by (width, depth) size and patch; the recipe's kwargs state every argument, so the name
# only picks timm's VisionTransformer class and a familiar label (selfsup's vit_small has 12 heads, timm's 6).
TIMM_VIT_SIZES = {(192, 12): "tiny", (384, 12): "small", (768, 12): "base", (1024, 24): "large"}
TIMM_VIT_PATCHES = {"tiny": (16,), "small": (8, 16, 32), "base": (8, 16, 32), "large": (16, 32)}


def architecture(backbone: nn.Module) -> dict:
    """Every constructor argument of ``backbone`` and the fixed parts a plain rebuild must match."""
    cls = type(backbone)
    if isinstance(backbone, (DINOv3ViT, DINOv3ConvNeXt)):  # the official DINOv3 code rebuilds it (docs/DINOV3.md)
        return {"family": "dinov3", "class": f"{cls.__module__}.{cls.__qualname__}", "kwargs": dict(backbone.kwargs),
                "num_features": backbone.num_features}
    if isinstance(backbone, VisionTransformer):
        k = backbone.kwargs
        return {"family": "vit", "class": f"{cls.__module__}.{cls.__qualname__}", "kwargs": dict(k),
                "class_token": k.get("class_token", True),
                "pos_embed": {"learned": "learned", "none": "none"}.get(k["pos_embed"], "sincos_2d"),
                "pos_embed_trainable": k["pos_embed"] == "learned",
                # the class token (if any) and any register tokens
                "num_prefix_tokens": int(k.get("class_token", True)) + k.get("registers", 0),
                "mlp_hidden": (backbone.blocks[0].mlp.w3.in_features if k.get("ffn", "mlp") == "swiglu"
                               else int(k["embed_dim"] * k["mlp_ratio"])),
                "act_layer": "SwiGLU" if k.get("ffn", "mlp") == "swiglu" else "GELU",
                "norm_layer": "LayerNorm", "pre_norm": False, "num_features": backbone.num_features,
                **({"norm_eps": backbone.fc_norm.eps, "final_norm": "fc_norm"} if k["pool"] == "global" else
                   {"norm_eps": backbone.blocks[0].norm1.eps,
                    "final_norm": "norm" if k.get("final_norm", True) else None})}
    if isinstance(backbone, ResNet):
        c = backbone.conv1
        return {"family": "resnet", "class": "torchvision.models.ResNet", "kwargs": dict(backbone.kwargs),
                "block": type(backbone.layer1[0]).__name__,
                "layers": [len(getattr(backbone, f"layer{i}")) for i in range(1, 5)],
                "groups": backbone.groups, "width_per_group": backbone.base_width,
                "conv1": {"in_channels": c.in_channels, "out_channels": c.out_channels,
                          "kernel_size": c.kernel_size[0], "stride": c.stride[0], "padding": c.padding[0],
                          "bias": c.bias is not None},
                "maxpool": not isinstance(backbone.maxpool, nn.Identity), "num_features": backbone.num_features}
    if hasattr(backbone, "timm_recipe"):
        return {"family": "timm", "class": f"{cls.__module__}.{cls.__qualname__}", **backbone.timm_recipe,
                "num_features": backbone.num_features}
    if hasattr(backbone, "kwargs"):  # e.g. a flow run's FlowEncoder
        return {"family": "selfsup", "class": f"{cls.__module__}.{cls.__qualname__}", "kwargs": backbone.kwargs,
                "num_features": backbone.num_features}
    return {"family": "unknown", "class": f"{cls.__module__}.{cls.__qualname__}"}


def timm_recipe(arch: dict) -> dict | None:
    """``{"model", "kwargs"}`` with which ``timm.create_model(model, pretrained=False, **kwargs)`` builds this
    architecture exactly (None: no timm equivalent). A ViT's fixed sin-cos table loads into timm's learned
    ``pos_embed`` (the same values, zeros for ``none``; timm would train it if fine-tuned); ``pool=avg`` is timm's
    ``global_pool='avg'`` over the final-norm tokens, hence ``fc_norm=False``; ``pool=global`` (MAE's) is
    ``global_pool='avg', fc_norm=True``; ``final_norm=False`` is timm's. Register tokens and the SwiGLU FFN have no
    recipe here (the selfsup ViT rebuilds them)."""
    if arch["family"] == "timm":
        return {"model": arch["model"], "kwargs": dict(arch["kwargs"])}
    if arch["family"] != "vit":
        return None
    k = arch["kwargs"]
    if k.get("registers") or k.get("ffn", "mlp") != "mlp":  # timm orders and names these otherwise: no recipe
        return None
    D, L, p = k["embed_dim"], k["depth"], k["patch_size"]
    size = TIMM_VIT_SIZES.get((D, L)) or min(TIMM_VIT_SIZES.items(), key=lambda kv: abs(kv[0][0] - D))[1]
    patch = p if p in TIMM_VIT_PATCHES[size] else 16
    kwargs = dict(img_size=k["image_size"], patch_size=p, in_chans=k["in_chans"], embed_dim=D, depth=L,
                  num_heads=k["num_heads"], mlp_ratio=k["mlp_ratio"], qkv_bias=k["qkv_bias"], num_classes=0,
                  global_pool="token" if k["pool"] == "cls" else "avg", fc_norm=k["pool"] == "global",
                  class_token=k.get("class_token", True),
                  no_embed_class=False, pre_norm=False, init_values=k["layer_scale"] or None,
                  drop_path_rate=k["drop_path_rate"], **({} if k.get("final_norm", True) else {"final_norm": False}))
    return {"model": f"vit_{size}_patch{patch}_224", "kwargs": kwargs}


def torchvision_recipe(arch: dict) -> dict | None:
    """``{"model", "kwargs", "conv1", "maxpool"}``: ``torchvision.models.<model>(**kwargs)`` with ``conv1`` replaced
    by ``nn.Conv2d(**conv1)``, the max-pool by ``nn.Identity()`` unless ``maxpool``, and ``fc`` by ``nn.Identity()``
    (None: not a torchvision ResNet)."""
    if arch["family"] != "resnet":
        return None
    k = arch["kwargs"]
    return {"model": k["name"], "kwargs": {"weights": None, "zero_init_residual": k["zero_init_residual"]},
            "conv1": dict(arch["conv1"]), "maxpool": arch["maxpool"], "fc": "Identity"}


def describe(backbone: nn.Module) -> dict:
    """The metadata entries ``architecture`` and, where one exists, ``timm`` or ``torchvision``."""
    arch = architecture(backbone)
    out = {"architecture": arch}
    if (t := timm_recipe(arch)) is not None:
        out["timm"] = t
    if (tv := torchvision_recipe(arch)) is not None:
        out["torchvision"] = tv
    return out


# --------------------------------------------------------------------------- timm's own layout (a hub folder)

# timm's ResNet names whose blocks and keys are torchvision's (conv1 / bn1 / layerN.i.* / downsample.0-1)
TIMM_RESNETS = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152")
# the timm class label of a SwiGLU ViT: its registered arguments make the FFN timm's packed SwiGLU (fc1 = DINOv2's
# w12, fc2 = w3, SiLU on the first half; timm vision_transformer.py, vit_giant_patch14_dinov2); every size is a kwarg
TIMM_SWIGLU = {False: "vit_giant_patch14_dinov2", True: "vit_giant_patch14_reg4_dinov2"}


def hub_recipe(arch: dict) -> tuple[dict | None, str]:
    """(``{"model", "kwargs"}`` with which ``timm.create_model(model, **kwargs)`` builds the network that
    ``timm_state`` fills, or None; why not, in words). Beyond ``timm_recipe``: a ViT's register tokens (timm's
    ``reg_tokens`` with ``no_embed_class``: DINOv2's layout as timm converts it), its SwiGLU FFN and a torchvision
    ResNet with the ImageNet stem (timm's ResNet has torchvision's keys)."""
    if arch["family"] == "timm":
        return timm_recipe(arch), ""
    if arch["family"] == "resnet":
        k = arch["kwargs"]
        if k.get("small_stem") or not arch["maxpool"] or arch["conv1"]["kernel_size"] != 7:
            return None, "its small stem (a 3x3 stride-1 conv, no max-pool) has no timm ResNet argument"
        if k["name"] not in TIMM_RESNETS:
            return None, f"timm has no ResNet named {k['name']}"
        return {"model": k["name"], "kwargs": {"in_chans": k["in_chans"], "num_classes": 0}}, ""
    if arch["family"] != "vit":
        return None, f"timm has no {arch['class'].rsplit('.', 1)[-1]} (a {arch['family']} backbone)"
    k = arch["kwargs"]
    registers, swiglu = k.get("registers", 0), k.get("ffn", "mlp") == "swiglu"
    if not registers and not swiglu:
        return timm_recipe(arch), ""
    recipe = timm_recipe({**arch, "kwargs": {**k, "registers": 0, "ffn": "mlp"}})
    kwargs = recipe["kwargs"]
    if registers:
        kwargs.update(reg_tokens=registers, no_embed_class=True)
    if swiglu:
        ratio = 2 * arch["mlp_hidden"] / k["embed_dim"]  # timm's packed fc1 is 2 x hidden wide
        if int(k["embed_dim"] * ratio) != 2 * arch["mlp_hidden"]:
            return None, f"its SwiGLU width {arch['mlp_hidden']} is no timm mlp_ratio of width {k['embed_dim']}"
        # init_values 0 (no LayerScale) in place of the recipe's None, which timm's create_model drops unread
        kwargs.update(mlp_ratio=ratio, reg_tokens=registers, no_embed_class=bool(registers),
                      init_values=k["layer_scale"])
        recipe["model"] = TIMM_SWIGLU[bool(registers)]
    return recipe, ""


def timm_state(backbone: nn.Module, arch: dict) -> dict:
    """``backbone``'s state dict under the keys of ``hub_recipe``'s timm model, the same features: a ViT's
    ``register_tokens`` as ``reg_token``, its class position folded into ``cls_token`` and cut from ``pos_embed``
    (timm adds no position to the prefix tokens with ``no_embed_class``: the same sum), SwiGLU's ``w12`` / ``w3`` as
    ``fc1`` / ``fc2``; any other backbone's keys as they are."""
    state = {k: v.detach().cpu().contiguous() for k, v in backbone.state_dict().items()}
    if arch["family"] != "vit":
        return state
    if "register_tokens" in state:
        state["reg_token"] = state.pop("register_tokens")
        prefix = int(arch["class_token"])
        if prefix:
            state["cls_token"] = (state["cls_token"] + state["pos_embed"][:, :1]).contiguous()
        state["pos_embed"] = state["pos_embed"][:, prefix:].contiguous()
    return {re.sub(r"\.mlp\.w12\.", ".mlp.fc1.", re.sub(r"\.mlp\.w3\.", ".mlp.fc2.", key)): v
            for key, v in state.items()}


def timm_module():
    """timm, imported on the paths that build a timm model (1.5 s to import)."""
    import timm  # lazy: 1.5 s to import, for timm backbones and hub folders only

    return timm


def hub_model(recipe: dict, state: dict) -> nn.Module:
    """timm's model of ``recipe`` with ``state`` loaded strictly, in eval mode (what a hub folder's user builds)."""
    model = timm_module().create_model(recipe["model"], pretrained=False, **recipe["kwargs"])
    model.load_state_dict(state, strict=True)
    return model.eval()


def timm_vit_architecture(model: nn.Module) -> dict:
    """A timm VisionTransformer's architecture, in the terms of ``vit_mismatch``."""
    block = model.blocks[0]
    pe = model.patch_embed
    norm = model.norm if not isinstance(model.norm, nn.Identity) else model.fc_norm
    pool = {"token": "cls", "avg": "avg"}.get(model.global_pool, model.global_pool)
    return {"image_size": tuple(pe.img_size), "patch_size": tuple(pe.patch_size), "in_chans": pe.proj.in_channels,
            "embed_dim": model.embed_dim, "depth": len(model.blocks), "num_heads": block.attn.num_heads,
            "mlp_hidden": block.mlp.fc1.out_features, "qkv_bias": block.attn.qkv.bias is not None,
            "pool": pool, "fc_norm": not isinstance(model.fc_norm, nn.Identity),
            "class_token": model.cls_token is not None, "num_prefix_tokens": model.num_prefix_tokens,
            "layer_scale": not isinstance(block.ls1, nn.Identity),
            "qk_norm": not isinstance(getattr(block.attn, "q_norm", nn.Identity()), nn.Identity),
            "pre_norm": not isinstance(model.norm_pre, nn.Identity),
            "norm_eps": getattr(norm, "eps", None), "num_classes": model.num_classes}


def vit_mismatch(arch: dict, model: nn.Module) -> list[str]:
    """Where timm's ``model`` differs from the file's ViT ``arch`` ("num_heads 6 (file: 12)", ...)."""
    k = arch["kwargs"]
    want = {"image_size": (k["image_size"],) * 2, "patch_size": (k["patch_size"],) * 2, "in_chans": k["in_chans"],
            "embed_dim": k["embed_dim"], "depth": k["depth"], "num_heads": k["num_heads"],
            "mlp_hidden": arch["mlp_hidden"], "qkv_bias": k["qkv_bias"],
            "pool": "avg" if k["pool"] == "global" else k["pool"], "fc_norm": k["pool"] == "global",
            "class_token": arch["class_token"], "num_prefix_tokens": arch["num_prefix_tokens"],
            "layer_scale": k["layer_scale"] > 0, "qk_norm": False, "pre_norm": arch["pre_norm"],
            "norm_eps": arch["norm_eps"] if arch.get("final_norm", "norm") else None, "num_classes": 0}
    got = timm_vit_architecture(model)
    return [f"{key} {got[key]} (file: {value})" for key, value in want.items() if got[key] != value]


def load_timm(path: Path, name: str | None = None, **kwargs) -> nn.Module:
    """The file's backbone as a timm model, in eval mode: built by its own recipe, or by
    ``timm.create_model(name, pretrained=False, num_classes=0, **kwargs)``, refused (one line) where that name's
    architecture is not the file's."""
    timm = timm_module()
    path = Path(path)
    meta = read_meta(path)
    recipe = meta.get("timm")
    if recipe is None:
        arch = meta.get("architecture") or architecture(rebuild_backbone(meta))
        recipe = timm_recipe(arch)
    else:
        arch = meta["architecture"]
    if recipe is None:
        other = " (its torchvision recipe is in the metadata)" if arch["family"] == "resnet" else ""
        raise UserError(f"{path} holds a {meta['backbone']}, which has no timm equivalent{other}; "
                        "load it with selfsup.export.load_exported")
    if name is None:
        name, kwargs = recipe["model"], recipe["kwargs"]
    else:
        kwargs = {"num_classes": 0, **kwargs}
    if not timm.is_model(name):
        raise UserError(f"{name!r} is not a timm model; the file's own is {recipe['model']!r} with its kwargs "
                        "(selfsup.export.load_timm(path) without a name)")
    model = timm.create_model(name, pretrained=False, **kwargs)
    fix = ("call selfsup.export.load_timm(path) without a name, "
           "or timm.create_model(meta['timm']['model'], **meta['timm']['kwargs'])")
    if arch["family"] == "vit":
        if not hasattr(model, "blocks") or not hasattr(model, "patch_embed"):
            raise UserError(f"{path}: timm's {name} is not a VisionTransformer, "
                            f"the file holds a {meta['backbone']}; {fix}")
        differ = vit_mismatch(arch, model)
        if differ:
            raise UserError(f"{path}: timm's {name} is not the file's {meta['backbone']}: {', '.join(differ)}; {fix}")
    try:
        model.load_state_dict(load_file(str(path)), strict=True)
    except RuntimeError as e:
        raise UserError(f"{path}: weights do not fit timm's {name} ({_first_problem(e)}); {fix}") from None
    return model.eval()


def _first_problem(e: RuntimeError) -> str:
    """The first concrete line of a ``load_state_dict`` error (missing / unexpected keys or a shape)."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return (lines[1] if len(lines) > 1 else lines[0])[:200]


def read_meta(path: Path) -> dict:
    """The selfsup metadata of an exported backbone file."""
    try:
        with safe_open(str(path), framework="pt") as f:
            raw = (f.metadata() or {}).get("selfsup")
    except Exception as e:  # safetensors raises its own error types for corrupt headers
        raise UserError(f"{path} is not a readable safetensors file ({' '.join(str(e).split())[:120]})") from None
    if not raw:
        raise UserError(f"{path} is not a selfsup exported backbone (no 'selfsup' metadata); "
                        "export one with selfsup pretrain")
    meta = json.loads(raw)
    if meta.get("format") != FORMAT:
        raise UserError(f"{path} has backbone format {meta.get('format')!r}; this selfsup reads {FORMAT}")
    return meta


def rebuild_backbone(meta: dict) -> nn.Module:
    """The (randomly initialised) backbone ``meta`` describes, by name (a flow run's is its ``flow_encoder``)."""
    return build_backbone(meta["backbone"], **meta["kwargs"])


def load_exported(path: Path) -> tuple[nn.Module, dict]:
    """Rebuild the backbone of an exported file and load its weights; returns (module, meta)."""
    meta = read_meta(path)
    backbone = rebuild_backbone(meta)
    try:
        backbone.load_state_dict(load_file(str(path)))
    except RuntimeError as e:
        raise UserError(f"{path}: weights do not fit {meta['backbone']} ({str(e).splitlines()[0]})") from None
    return backbone, meta


def load_backbone(location: str | Path) -> tuple[nn.Module, dict]:
    """(backbone, meta) of an exported backbone: a run folder's ``backbone.safetensors``, or a ``.safetensors`` file."""
    path = Path(location)
    what = "pass a finished selfsup run folder (its backbone.safetensors) or an exported backbone .safetensors"
    if path.is_dir():
        path = path / "backbone.safetensors"
        if not path.exists():
            raise UserError(f"{location} holds no backbone.safetensors (the run has not finished); {what}")
    elif not path.exists():
        raise UserError(f"{path} does not exist; {what}")
    elif path.suffix != ".safetensors":
        raise UserError(f"{path} is not a .safetensors file; {what}")
    return load_exported(path)


# --------------------------------------------------------------------------- the projection heads

HEADS_FILE = "heads.safetensors"  # beside backbone.safetensors in a run folder, written with it
HEADS_FORMAT = "selfsup-heads/1"
HEAD_NAMES = ("projector", "predictor")


def head_spec(module: nn.Module) -> dict | None:
    """How to rebuild ``module`` from its constructor arguments: a Sequential of Linear / BatchNorm1d / ReLU /
    GELU / Identity (the ``models.heads.mlp`` heads, the embedding-norm code's); None for any other kind
    (a tracked linear predictor, DINO's head): such a head is not exported."""
    if isinstance(module, nn.Sequential):
        children = [head_spec(m) for m in module]
        return None if any(c is None for c in children) else {"type": "Sequential", "children": children}
    if isinstance(module, nn.Linear):
        return {"type": "Linear", "in_features": module.in_features, "out_features": module.out_features,
                "bias": module.bias is not None}
    if type(module) is nn.BatchNorm1d:
        return {"type": "BatchNorm1d", "num_features": module.num_features, "eps": module.eps,
                "momentum": module.momentum, "affine": module.affine,
                "track_running_stats": module.track_running_stats}
    if type(module) is nn.ReLU:
        return {"type": "ReLU", "inplace": module.inplace}
    if type(module) is nn.GELU:
        return {"type": "GELU", "approximate": module.approximate}
    if type(module) is nn.Identity:
        return {"type": "Identity"}
    return None


def build_head(spec: dict) -> nn.Module:
    """The module of a ``head_spec``, freshly initialised (load its weights next)."""
    kind, args = spec["type"], {k: v for k, v in spec.items() if k != "type"}
    if kind == "Sequential":
        return nn.Sequential(*(build_head(c) for c in args["children"]))
    return {"Linear": nn.Linear, "BatchNorm1d": nn.BatchNorm1d, "ReLU": nn.ReLU, "GELU": nn.GELU,
            "Identity": nn.Identity}[kind](**args)


def export_heads(model: nn.Module, path: Path) -> Path | None:
    """Write the method's ``projector`` / ``predictor`` (those ``head_spec`` can describe) to ``path``: their state
    dicts under ``<name>.`` and, in the metadata, their specs; None (nothing written) where the method has none."""
    heads = {name: getattr(model, name) for name in HEAD_NAMES if isinstance(getattr(model, name, None), nn.Module)}
    specs = {name: spec for name, head in heads.items() if (spec := head_spec(head)) is not None}
    if not specs:
        return None
    state = {f"{name}.{k}": v.detach().cpu().contiguous() for name in specs
             for k, v in heads[name].state_dict().items()}
    write_safetensors(state, {"selfsup": json.dumps({"format": HEADS_FORMAT, "heads": specs})}, path,
                      "the projection heads")
    return path


def load_heads(path: Path) -> dict[str, nn.Module]:
    """The heads of an ``export_heads`` file, with their weights, in eval mode: {name: module}."""
    with safe_open(str(path), framework="pt") as f:
        meta = json.loads((f.metadata() or {}).get("selfsup") or "{}")
    if meta.get("format") != HEADS_FORMAT:
        raise UserError(f"{path} has heads format {meta.get('format')!r}; this selfsup reads {HEADS_FORMAT}")
    state = load_file(str(path))
    heads = {}
    for name, spec in meta["heads"].items():
        head = build_head(spec)
        head.load_state_dict({k[len(name) + 1:]: v for k, v in state.items() if k.startswith(f"{name}.")})
        heads[name] = head.eval()
    return heads
