"""Other libraries' weight layouts read into selfsup's names (``weights.py`` reads the files; facts with file:line in
docs/DINOV3.md and docs/pretrained.md):

- DINOv3's hub state dicts (facebookresearch/dinov3 hub/backbones.py): already the names of ``models.dinov3``; their
  architecture is read from the tensors (``dinov3_arch``): width, depth, patch, the head width (4 × the length of
  ``rope_embed.periods``), the FFN kind and width, storage tokens, the masked k bias, untied norms;
- the Hugging Face transformers layouts (a folder, or a ``model.safetensors`` beside its ``config.json``) of DINOv2
  (``Dinov2Model``, ``Dinov2WithRegistersModel``: the selfsup ViT with learned positions), DINOv3's ViT
  (``DINOv3ViTModel``) and DINOv3's ConvNeXt (``DINOv3ConvNextModel``) (``hf_layout``): their keys renamed, q / k /
  v joined into one qkv, the architecture read from ``config.json``.

A joined or computed tensor is a :class:`Derived`, read when it is loaded (the file is never read whole).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path

import torch
from torch import Tensor

from selfsup.architectures import DINOV3_CONVNEXT_SIZES, DINOV3_VIT_SIZES, VIT_SIZES
from selfsup.errors import UserError
from selfsup.models.dinov3 import rope_periods

HF_TYPES = ("dinov2", "dinov2_with_registers", "dinov3_vit", "dinov3_convnext")  # config.json's model_type read here


class Derived:
    """A tensor made from others when read (``load``): ``fn`` of the parts read (a concatenation, a reshape, a
    computed buffer); its ``shape`` and ``dtype`` known beforehand."""

    def __init__(self, parts: tuple, fn: Callable[..., Tensor], shape, dtype: torch.dtype):
        self.parts, self.fn, self.shape, self.dtype = parts, fn, torch.Size(shape), dtype
        self.ndim = len(self.shape)

    def load(self) -> Tensor:
        return self.fn(*(p.load() if hasattr(p, "load") else p for p in self.parts))


def _cat(*parts) -> Derived:
    shape = (sum(p.shape[0] for p in parts), *parts[0].shape[1:])
    return Derived(parts, lambda *ts: torch.cat(ts, dim=0), shape, parts[0].dtype)


def _zeros(n: int, dtype) -> Tensor:
    return torch.zeros(n, dtype=dtype)


# --------------------------------------------------------------------------- DINOv3's hub files

def is_dinov3(state: Mapping[str, object]) -> bool:
    """A DINOv3 ViT (``rope_embed.periods``) or ConvNeXt (``downsample_layers`` and ``stages.<i>.<j>.dwconv``)."""
    return "rope_embed.periods" in state or ("downsample_layers.0.0.weight" in state and
                                             "stages.0.0.dwconv.weight" in state)


def _blocks(state: Mapping[str, object], pattern: str) -> int:
    return len({m.group(1) for k in state if (m := re.match(pattern, k))})


def dinov3_arch(state: Mapping[str, object]) -> tuple[str, dict]:
    """(backbone name, build_backbone kwargs) of a DINOv3 hub state dict: the size of that name where the tensors
    are that size's, else the generic ``dinov3_vit`` / ``dinov3_convnext``; ``arch`` every architecture fact the
    tensors show (the norm's eps is not in the file: the releases' 1e-5, ``layernormbf16``)."""
    if "rope_embed.periods" not in state:
        dims = [int(state[f"downsample_layers.{i}.{0 if i == 0 else 1}.weight"].shape[0]) for i in range(4)]
        depths = [_blocks(state, rf"stages\.{i}\.(\d+)\.") for i in range(4)]
        arch = {"depths": depths, "dims": dims}
        names = [n for n, s in DINOV3_CONVNEXT_SIZES.items() if list(s["dims"]) == dims and list(s["depths"]) == depths]
        return (names[0] if names else "dinov3_convnext"), {"arch": arch}
    w = state["patch_embed.proj.weight"]
    D, head = int(w.shape[0]), 4 * int(state["rope_embed.periods"].shape[0])
    swiglu = "blocks.0.mlp.w1.weight" in state
    hidden = int(state["blocks.0.mlp.w1.weight" if swiglu else "blocks.0.mlp.fc1.weight"].shape[0])
    arch = dict(embed_dim=D, depth=_blocks(state, r"blocks\.(\d+)\."), num_heads=D // head,
                ffn="swiglu" if swiglu else "mlp", ffn_hidden=hidden, qkv_bias="blocks.0.attn.qkv.bias" in state,
                mask_k_bias="blocks.0.attn.qkv.bias_mask" in state,
                layer_scale=1e-5 if "blocks.0.ls1.gamma" in state else 0.0,
                norm="layernormbf16" if "norm.bias" in state else "rmsnorm",
                storage_tokens=int(state["storage_tokens"].shape[1]) if "storage_tokens" in state else 0,
                untie_cls_norm="cls_norm.weight" in state, untie_local_cls_norm="local_cls_norm.weight" in state)
    return _vit_name(arch), {"patch_size": int(w.shape[-1]), "arch": arch}


def _vit_name(arch: dict) -> str:
    """The DINOv3 size whose table entry ``arch`` agrees with (its width, depth, heads, FFN), else ``dinov3_vit``."""
    for name, size in DINOV3_VIT_SIZES.items():
        if all(arch[k] == v for k, v in size.items() if k in ("embed_dim", "depth", "num_heads", "ffn")):
            return name
    return "dinov3_vit"


# --------------------------------------------------------------------------- Hugging Face transformers

def hf_config(path: Path) -> dict | None:
    """The ``config.json`` of a transformers folder, or of the folder of a ``.safetensors`` file, where its
    ``model_type`` is one read here; else None."""
    folder = path if path.is_dir() else path.parent
    if not (folder / "config.json").is_file():
        return None
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) and config.get("model_type") in HF_TYPES else None


def _need(config: dict, what: str, checks: dict) -> None:
    """One line naming each config value selfsup's module does not compute as transformers' does."""
    wrong = [f"{k}={config.get(k)!r} (selfsup's: {v!r})" for k, v in checks.items() if config.get(k, v) != v]
    if wrong:
        raise UserError(f"{what}: its config.json has {', '.join(wrong)}, which selfsup's "
                        f"{config['model_type']} does not build")


HF_DINOV2 = [  # Dinov2Model's saved names (and transformers 5's own) → the selfsup ViT's
    (r"embeddings\.cls_token", "cls_token"), (r"embeddings\.mask_token", "mask_token"),
    (r"embeddings\.position_embeddings", "pos_embed"), (r"embeddings\.register_tokens", "register_tokens"),
    (r"embeddings\.patch_embeddings\.projection\.", "patch_embed.proj."),
    (r"encoder\.layer\.(\d+)\.(norm[12])\.", r"blocks.\1.\2."),
    (r"encoder\.layer\.(\d+)\.attention\.(?:output\.dense|o_proj)\.", r"blocks.\1.attn.proj."),
    (r"encoder\.layer\.(\d+)\.attention\.(?:attention\.)?(query|key|value|q_proj|k_proj|v_proj)\.", r"blocks.\1.\2."),
    (r"encoder\.layer\.(\d+)\.layer_scale([12])\.lambda1", r"blocks.\1.ls\2.gamma"),
    (r"encoder\.layer\.(\d+)\.mlp\.(fc[12])\.", r"blocks.\1.mlp.\2."),
    (r"encoder\.layer\.(\d+)\.mlp\.weights_in\.", r"blocks.\1.mlp.w12."),
    (r"encoder\.layer\.(\d+)\.mlp\.(?:weights_out|down_proj)\.", r"blocks.\1.mlp.w3."),
    (r"encoder\.layer\.(\d+)\.mlp\.(gate_proj|up_proj)\.", r"blocks.\1.\2."), (r"layernorm\.", "norm.")]
HF_DINOV3_VIT = [  # DINOv3ViTModel → models.dinov3's (the official) names
    (r"embeddings\.cls_token", "cls_token"), (r"embeddings\.mask_token", "mask_token"),
    (r"embeddings\.register_tokens", "storage_tokens"), (r"embeddings\.patch_embeddings\.", "patch_embed.proj."),
    (r"layer\.(\d+)\.(norm[12])\.", r"blocks.\1.\2."), (r"layer\.(\d+)\.attention\.o_proj\.", r"blocks.\1.attn.proj."),
    (r"layer\.(\d+)\.attention\.([qkv])_proj\.", r"blocks.\1.\2."),
    (r"layer\.(\d+)\.layer_scale([12])\.lambda1", r"blocks.\1.ls\2.gamma"),
    (r"layer\.(\d+)\.mlp\.(gate_proj|up_proj|down_proj)\.", r"blocks.\1.\2."), (r"norm\.", "norm.")]
HF_DINOV3_CONVNEXT = [  # DINOv3ConvNextModel → models.dinov3's (the official) names
    (r"stages\.(\d+)\.downsample_layers\.(\d)\.", r"downsample_layers.\1.\2."),
    (r"stages\.(\d+)\.layers\.(\d+)\.depthwise_conv\.", r"stages.\1.\2.dwconv."),
    (r"stages\.(\d+)\.layers\.(\d+)\.layer_norm\.", r"stages.\1.\2.norm."),
    (r"stages\.(\d+)\.layers\.(\d+)\.pointwise_conv([12])\.", r"stages.\1.\2.pwconv\3."),
    (r"stages\.(\d+)\.layers\.(\d+)\.gamma", r"stages.\1.\2.gamma"), (r"layer_norm\.", "norm.")]
TABLES = {"dinov2": HF_DINOV2, "dinov2_with_registers": HF_DINOV2, "dinov3_vit": HF_DINOV3_VIT,
          "dinov3_convnext": HF_DINOV3_CONVNEXT}


def _renamed(state: Mapping[str, object], table) -> tuple[dict, list[str]]:
    """(the keys renamed by the first pattern of ``table`` matching the whole key after an optional ``model.``,
    the keys no pattern names)."""
    out, left = {}, []
    for key, t in state.items():
        bare = key[len("model."):] if key.startswith("model.") else key
        for pattern, repl in table:
            if re.fullmatch(pattern + r"(weight|bias)?", bare):
                out[re.sub("^" + pattern, repl, bare)] = t
                break
        else:
            left.append(key)
    return out, left


def _join(state: dict, names: tuple[str, ...], into: str, depth: int, bias: dict[str, Tensor] | None = None) -> None:
    """Each block's ``blocks.<i>.<name>.weight`` / ``.bias`` (in ``names`` order) joined into ``blocks.<i>.<into>``;
    a missing bias is zeros where ``bias`` has a default."""
    for i in range(depth):
        parts = [state.pop(f"blocks.{i}.{n}.weight") for n in names]
        state[f"blocks.{i}.{into}.weight"] = _cat(*parts)
        biases = [state.pop(f"blocks.{i}.{n}.bias", None) for n in names]
        if any(b is not None for b in biases):
            state[f"blocks.{i}.{into}.bias"] = _cat(*(b if b is not None else _zeros(p.shape[0], p.dtype)
                                                     for b, p in zip(biases, parts)))


def hf_layout(state: Mapping[str, object], config: dict, what: str) -> tuple[dict, str, dict, int | None]:
    """(the state in selfsup's names, backbone name, build_backbone kwargs, head count) of a transformers file."""
    kind = config["model_type"]
    out, left = _renamed(state, TABLES[kind])
    if left:
        raise UserError(f"{what}: {len(left)} tensors of this {kind} file have no place in selfsup's module "
                        f"({', '.join(left[:3])}); a transformers {kind} model of another version or head?")
    if kind == "dinov3_convnext":
        _need(config, what, {"hidden_act": "gelu", "layer_norm_eps": 1e-6, "num_channels": 3})
        arch = {"depths": list(config["depths"]), "dims": list(config["hidden_sizes"])}
        names = [n for n, s in DINOV3_CONVNEXT_SIZES.items() if list(s["dims"]) == arch["dims"] and
                 list(s["depths"]) == arch["depths"]]
        return out, (names[0] if names else "dinov3_convnext"), {"arch": arch}, None
    depth, heads, D = int(config["num_hidden_layers"]), int(config["num_attention_heads"]), int(config["hidden_size"])
    return (_hf_dinov3 if kind == "dinov3_vit" else _hf_dinov2)(out, config, what, depth, heads, D)


def _hf_dinov2(out: dict, config: dict, what: str, depth: int, heads: int, D: int):
    """Dinov2Model (transformers models/dinov2/modeling_dinov2.py) and Dinov2WithRegistersModel: the selfsup ViT with
    learned positions, LayerScale, GELU MLP or SwiGLU (gate and up joined as ``w12``), registers after the class
    token."""
    _need(config, what, {"hidden_act": "gelu", "layer_norm_eps": 1e-6, "mlp_ratio": 4, "qkv_bias": True,
                         "num_channels": 3})
    _join(out, ("query", "key", "value") if "blocks.0.query.weight" in out else ("q_proj", "k_proj", "v_proj"),
          "attn.qkv", depth)
    swiglu = bool(config.get("use_swiglu_ffn"))
    if swiglu and "blocks.0.gate_proj.weight" in out:
        _join(out, ("gate_proj", "up_proj"), "mlp.w12", depth)
    names = [n for n, s in VIT_SIZES.items() if (s["embed_dim"], s["depth"], s["num_heads"]) == (D, depth, heads)]
    if not names:
        raise UserError(f"{what}: a DINOv2 of width {D}, depth {depth} and {heads} heads has no selfsup ViT size "
                        f"({', '.join(VIT_SIZES)})")
    kwargs = dict(patch_size=int(config["patch_size"]), pos_embed="learned", init="dinov2", layer_scale=1e-5,
                  ffn="swiglu" if swiglu else "mlp", registers=int(config.get("num_register_tokens", 0)))
    return out, names[0], kwargs, heads


def _hf_dinov3(out: dict, config: dict, what: str, depth: int, heads: int, D: int):
    """DINOv3ViTModel (transformers models/dinov3_vit/modeling_dinov3_vit.py): q / k / v joined (the k bias absent
    in the releases: zeros under the official mask), its periods from ``rope_theta``, its RoPE options kept."""
    gated = bool(config.get("use_gated_mlp"))
    eps = {1e-5: "layernormbf16", 1e-6: "layernorm"}.get(config.get("layer_norm_eps", 1e-5))
    _need(config, what, {"hidden_act": "silu" if gated else "gelu", "proj_bias": True, "mlp_bias": True,
                         "num_channels": 3, **({} if eps else {"layer_norm_eps": 1e-5})})
    q, k, v = (bool(config.get(f"{n}_bias", d)) for n, d in (("query", True), ("key", False), ("value", True)))
    _join(out, ("q", "k", "v"), "attn.qkv", depth)
    for i in range(depth):
        if not k and f"blocks.{i}.attn.qkv.bias" in out:  # the official mask_k_bias: the k third's bias times 0
            out[f"blocks.{i}.attn.qkv.bias_mask"] = Derived((), lambda: _kmask(3 * D), (3 * D,), torch.float32)
        if gated:
            out[f"blocks.{i}.mlp.w1.weight"], out[f"blocks.{i}.mlp.w1.bias"] = (
                out.pop(f"blocks.{i}.gate_proj.weight"), out.pop(f"blocks.{i}.gate_proj.bias"))
            for a, b in (("up_proj", "w2"), ("down_proj", "w3")):
                out[f"blocks.{i}.mlp.{b}.weight"] = out.pop(f"blocks.{i}.{a}.weight")
                out[f"blocks.{i}.mlp.{b}.bias"] = out.pop(f"blocks.{i}.{a}.bias")
        else:
            for a, b in (("up_proj", "fc1"), ("down_proj", "fc2")):
                out[f"blocks.{i}.mlp.{b}.weight"] = out.pop(f"blocks.{i}.{a}.weight")
                out[f"blocks.{i}.mlp.{b}.bias"] = out.pop(f"blocks.{i}.{a}.bias")
    mask = out.pop("mask_token")
    out["mask_token"] = Derived((mask,), lambda t: t.reshape(1, -1), (1, D), mask.dtype)
    if not int(config.get("num_register_tokens", 0)):
        out.pop("storage_tokens", None)
    base = float(config.get("rope_theta", 100.0))
    out["rope_embed.periods"] = Derived((), lambda: rope_periods(D // heads, base), (D // heads // 4,), torch.float32)
    arch = dict(embed_dim=D, depth=depth, num_heads=heads, ffn="swiglu" if gated else "mlp",
                ffn_hidden=int(config["intermediate_size"]), qkv_bias=q or k or v, mask_k_bias=not k and (q or v),
                layer_scale=1e-5, norm=eps or "layernormbf16",
                storage_tokens=int(config.get("num_register_tokens", 0)), rope_base=base,
                rope_shift=config.get("pos_embed_shift"), rope_jitter=config.get("pos_embed_jitter"),
                rope_rescale=config.get("pos_embed_rescale"))
    return out, _vit_name(arch), {"patch_size": int(config["patch_size"]), "arch": arch}, heads


def _kmask(n: int) -> Tensor:
    mask = torch.ones(n)
    mask[n // 3: 2 * n // 3] = 0
    return mask
