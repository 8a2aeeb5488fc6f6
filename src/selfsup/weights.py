"""Start a backbone from given weights (``model.weights``, a distillation teacher's ``method.teacher.weights``).

A source is one of:

- a selfsup run folder (its ``backbone.safetensors``) or an exported backbone ``.safetensors`` (its metadata names
  the architecture, checked against the backbone's);
- a local file: ``.safetensors``, or ``.pth`` / ``.pt`` / ``.bin`` / ``.ckpt`` / ``.pth.tar`` read with
  ``weights_only=True`` (a plain state dict or a checkpoint); the wrappers tried, in order, are the dict keys
  ``WRAPPERS`` and the key prefixes ``PREFIXES``; the (wrapper, prefix) whose keys match the backbone's most is
  taken (ties: the first). The release checkpoints of the methods selfsup implements are read in their own layouts
  (``LAYOUTS``; docs/pretrained.md cites each from its official code): MoCo v3, DINO, iBOT, MAE, I-JEPA, SwAV and
  DINOv2's training checkpoint (its ``block_chunks`` blocks ``blocks.<chunk>.<i>`` read as ``blocks.<i>``);
- DINOv3's hub files (``dinov3_<arch>_pretrain_<weights>-<hash>.pth``, the official module's names, as
  ``models.dinov3``'s) and the Hugging Face transformers folders of DINOv2 and DINOv3 (``config.json`` +
  ``model.safetensors``), read into selfsup's names by ``layouts``, each with its architecture;
- the official DINOv2 torch.hub checkpoints (``dinov2_vit{s,b,l,g}14[_reg4]_pretrain.pth``): LayerScale
  ``ls1/ls2.gamma``, ``register_tokens``, ``mask_token``, SwiGLU ``w12/w3``, a 518-px ``pos_embed``, all named as
  the selfsup ViT's (``models/vit.py``) but the mask token (``masked_embed`` where the backbone has one, dropped
  otherwise); the head count is DINOv2's 64 channels per head (dinov2 models/vision_transformer.py:341-394);
- ``timm`` (a ``timm:<name>`` backbone's own pretrained weights) or ``timm:<name>`` (that timm model's pretrained
  weights): timm fetches them or reads its cache; offline (the Hub silent for 2 s) only the cache is read, and
  uncached is one line at once naming the cache folder.

Loading rules: a position table of another grid is resampled bicubically as its source model does at that size
(``resample_position_table``); a 3-channel first convolution feeding a 1-channel backbone is summed over its
channels (timm's ``adapt_input_conv``); classifier and pretraining heads the backbone lacks (``HEAD_KEYS``) and a
checkpoint's tensors outside the prefix read (a ``dino_head``, a momentum encoder) are dropped and listed; any
other mismatch is one line naming the missing and unexpected keys, the shapes and the wrapper and prefix tried.

Head counts: a ViT's qkv weight does not show its head count, and a wrong one loads and computes another function.
The count is read from the source where it says it (a selfsup export's metadata, a timm model, DINOv2's 64
channels per head, a method's release layout: MoCo v3's 12-head ViT-S, DINO's / iBOT's / MAE's / I-JEPA's sizes,
``RELEASE_HEADS``) and must be the backbone's. A plain state dict does not say it: it is taken at the count the
released ViTs of its width have but MoCo v3's (``RELEASE_HEADS``: 6 at width 384, timm's, DeiT's, DINO's); a
backbone of another count there (selfsup's ``vit_small``, MoCo v3's 12 heads) is refused in one line naming the
backbone of the file's count. What was loaded is described by :class:`StartFacts` (``run.json``'s ``weights``)
with a sha256 of the loaded tensors (``state_sha256``).

Memory: a ``.safetensors`` file is read a few tensors at a time as they are copied into the backbone (straight
from the file, not mapped), and a torch file is mapped (``mmap``) and copied from as it is touched: loading
allocates the backbone and a few tensors, not a second copy of the file; a mapped torch file's pages sit in the
page cache meanwhile. A network built from a file of its own architecture (``build_from_weights``: a DINOv2 or
DINOv3 hub file, a transformers folder) is built on the meta device and takes the file's tensors as its own
(``assign``): a mapped file's stay mapped, nothing is allocated twice (``python -m benchmarks.weights_memory``).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import re
import socket
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import Tensor, nn

from selfsup.checkpoints import EXTRA_SAFE_GLOBALS
from selfsup.errors import UserError
from selfsup.export import FORMAT, read_meta
from selfsup.layouts import Derived, dinov3_arch, hf_config, hf_layout, is_dinov3
from selfsup.models.backbones import TIMM_PREFIX, build_backbone
from selfsup.models.mae import mae_sincos_position_embedding
from selfsup.models.vit import VIT_SIZES, VisionTransformer, build_2d_sincos_position_embedding, \
    interpolate_pos_embed

# checkpoint keys holding the weights: DINO's / iBOT's / DINOv2's teacher first, then I-JEPA's target encoder
WRAPPERS = ("teacher", "target_encoder", "state_dict", "model", "module", "encoder")
PREFIXES = ("", "module.", "backbone.", "module.backbone.", "teacher_backbone.", "encoder.", "module.encoder.",
            "model.", "module.base_encoder.", "base_encoder.")
# keys of heads a backbone has no place for: dropped (and listed) where the backbone lacks them (SwAV's
# projection_head and prototypes, swav src/resnet50.py:201-217)
HEAD_KEYS = ("fc.", "head.", "heads.", "classifier.", "mask_token", "decoder", "pre_logits.", "projection_head.",
             "prototypes.")
METHOD_KEYS = ("masked_embed",)  # a method's own parameters on the backbone: kept as initialised where the file lacks
FILE_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin", ".ckpt", ".tar")  # .tar: MoCo v3's, I-JEPA's .pth.tar
# DINO's, iBOT's and MAE's checkpoints keep their argparse arguments (dino main_dino.py:278-285, mae
# util/misc.py:301-307): a Namespace of plain values, allowed beside torch's weights-only set
SAFE_GLOBALS = (*EXTRA_SAFE_GLOBALS, argparse.Namespace)
# the head count of the released ViTs of a width but MoCo v3's (timm's, DeiT's, DINO's and iBOT's
# vision_transformer.py, MAE's models_mae.py, I-JEPA's vision_transformer.py, DINOv2's 64 channels per head; ViT-H 16
# heads of 80): a plain state dict is taken at this count; MoCo v3's vits.py:115-127 has 12 heads at 384 and 768
# (its layout says so)
RELEASE_HEADS = {192: 3, 384: 6, 768: 12, 1024: 16, 1280: 16, 1408: 16, 1536: 24}
MOCO_V3_HEADS = {384: 12, 768: 12}
WHAT = ("give a selfsup run folder, a .safetensors / .pth / .pt / .pth.tar file (a state dict or checkpoint), timm "
        "(a timm:<name> backbone's own pretrained weights) or timm:<name>")


@dataclass
class StartFacts:
    """What a backbone was started from (``run.json``'s ``weights``)."""

    source: str  # as given
    kind: str  # selfsup | file | dinov2-hub | timm
    path: str | None = None
    wrapper: str | None = None  # the checkpoint key the weights were under
    prefix: str = ""  # the key prefix stripped
    layout: str | None = None  # a method's release layout recognised (moco-v3, dino, ibot, mae, ijepa, dinov2, swav)
    heads: str | None = None  # a ViT's head count and where it was read
    # head keys the backbone has no place for, and the checkpoint's tensors outside the prefix read (by group)
    dropped: list[str] = field(default_factory=list)
    resampled: str | None = None  # the position table, from grid to grid, and how
    adapted: str | None = None  # the first convolution's input channels summed
    kept: list[str] = field(default_factory=list)  # the method's own keys (iBOT's mask token) the file lacks
    sha256: str = ""  # of the loaded tensors (``state_sha256``)
    # of the source's tensors as read (wrapper and prefix taken off), before any conversion: the same whatever the
    # run's image size, channels or precision (a frozen network's identity, checked on resume); "" where not asked
    source_sha256: str = ""
    tensors: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


# safetensors' dtype names (its format: an 8-byte header length, a JSON header of dtype, shape and data offsets)
SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                      "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
                      "BOOL": torch.bool}


class LazyTensor:
    """A tensor of a ``.safetensors`` file not read yet: its shape, read by ``load()`` straight from the file into
    a new tensor (no mapping of the file, so its pages are not held either)."""

    def __init__(self, path: str, key: str, entry: dict, base: int):
        self.path, self.key = path, key
        self.dtype = SAFETENSORS_DTYPES.get(entry["dtype"])
        self.shape = torch.Size(entry["shape"])
        self.ndim = len(self.shape)
        self.start, self.end = base + entry["data_offsets"][0], base + entry["data_offsets"][1]

    def load(self) -> Tensor:
        if self.dtype is None:  # a dtype this reader does not name (e.g. float8): safetensors' own reader
            with safe_open(self.path, framework="pt") as f:
                return f.get_tensor(self.key)
        t = torch.empty(self.shape, dtype=self.dtype)
        if t.numel():
            with open(self.path, "rb") as f:
                f.seek(self.start)
                read = f.readinto(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
            if read != self.end - self.start:
                raise UserError(f"{self.path} is truncated: {self.key} has {read} of {self.end - self.start} bytes")
        return t


def _safetensors_index(path: Path) -> dict[str, LazyTensor]:
    """Every tensor of a ``.safetensors`` file, not read: its header's dtypes, shapes and offsets."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    return {k: LazyTensor(str(path), k, v, 8 + n) for k, v in header.items() if k != "__metadata__"}


def real(t) -> Tensor:
    """``t`` read where it is a :class:`LazyTensor` or a ``layouts.Derived`` (joined or computed when read)."""
    return t.load() if isinstance(t, (LazyTensor, Derived)) else t


@dataclass
class RawWeights:
    """A source read: every candidate mapping of tensors (by wrapper), how it was found, and any selfsup metadata;
    a ``.safetensors`` file's tensors are :class:`LazyTensor` (read as they are loaded). ``heads``: the head count
    the source states (a timm model's), with where it was read."""

    candidates: dict[str | None, Mapping[str, Tensor]]
    kind: str
    path: str | None = None
    meta: dict | None = None
    timm_layout: bool = False
    heads: tuple[int, str] | None = None
    arch: tuple[str, dict] | None = None  # (backbone name, build_backbone kwargs) stated: DINOv3, transformers


def state_sha256(state: Mapping[str, Tensor]) -> str:
    """sha256 over the tensors of ``state`` in key order: each key, dtype, shape and raw bytes."""
    h = hashlib.sha256()
    for key in sorted(state):
        t = real(state[key]).detach().cpu().contiguous()
        h.update(f"{key}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


# --------------------------------------------------------------------------- reading a source

def _tensors(obj) -> dict[str, Tensor] | None:
    """``obj`` as a flat mapping of tensors (non-tensor entries, e.g. BN counters as ints, skipped; DINOv2's
    chunked blocks as ``_unchunked``), or None."""
    if not isinstance(obj, dict):
        return None
    out = {k: v for k, v in obj.items() if isinstance(k, str) and isinstance(v, Tensor)}
    return _unchunked(out) or None


CHUNKED = re.compile(r"(^|\.)blocks\.(\d+)\.(\d+)\.")


def _unchunked(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """A ViT's ``block_chunks`` keys ``blocks.<chunk>.<i>.`` as ``blocks.<i>.`` (dinov2 models/vision_transformer.py:
    154-161: chunk c holds blocks c·k to (c+1)·k − 1 under their own index, so each i is in one chunk only); a
    network whose nested blocks restart their index (timm's EfficientNet ``blocks.<stage>.<i>``) is left as it is."""
    found = [(m.group(2), m.group(3)) for k in state if (m := CHUNKED.search(k))]
    if not found or not any(k.endswith("patch_embed.proj.weight") for k in state):
        return state
    chunks_of: dict[str, set[str]] = {}
    for chunk, i in found:
        chunks_of.setdefault(i, set()).add(chunk)
    if any(len(c) > 1 for c in chunks_of.values()):
        return state
    return {CHUNKED.sub(r"\1blocks.\3.", k, count=1): v for k, v in state.items()}


def _torch_load(path: Path):
    """A torch file mapped (``mmap``: its pages are read as the tensors are copied, not all at once); a file of
    torch's legacy format (before 1.6) cannot be mapped and is read."""
    with torch.serialization.safe_globals(list(SAFE_GLOBALS)):
        try:
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as e:
            if "mmap" not in str(e) and "zip" not in str(e):
                raise
            return torch.load(path, map_location="cpu", weights_only=True)


def read_file_weights(path: Path, what: str) -> RawWeights:
    """The tensors of a local file: a selfsup export (with its metadata), a plain ``.safetensors``, or a torch file."""
    if path.suffix == ".safetensors":
        try:
            with safe_open(str(path), framework="pt") as f:  # checks the header
                raw = (f.metadata() or {}).get("selfsup")
            state = _safetensors_index(path)
        except Exception as e:  # safetensors raises its own error types for a corrupt header
            raise UserError(f"{what}={path} is not a readable safetensors file "
                            f"({' '.join(str(e).split())[:100]}); {WHAT}") from None
        meta = read_meta(path) if raw and FORMAT in raw else None
        if meta is None and (config := hf_config(path)) is not None:
            return hf_weights(path.parent, config, what)
        if meta is None and is_dinov3(state):
            return dinov3_weights(state, str(path))
        return RawWeights({None: state}, "selfsup" if meta else "file", str(path), meta)
    try:
        obj = _torch_load(path)
    except Exception as e:
        foreign = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(e))
        why = (f"it names {foreign.group(1)}, which could run code when loaded; save its state_dict() instead"
               if foreign else f"{type(e).__name__}: not a torch file")
        raise UserError(f"{what}={path} cannot be read as weights ({why}); {WHAT}") from None
    candidates: dict[str | None, dict[str, Tensor]] = {}
    if (flat := _tensors(obj)) is not None:
        candidates[None] = flat
    if isinstance(obj, dict):
        for key in WRAPPERS:
            if (inner := _tensors(obj.get(key))) is not None:
                candidates[key] = inner
    if not candidates:
        raise UserError(f"{what}={path} holds no state dict (no tensors at its top level or under "
                        f"{', '.join(WRAPPERS)}); {WHAT}")
    # DINOv3's hub file (its ViT's rope_embed.periods, its ConvNeXt's stages); DINOv2's: a plain state dict with a
    # class token and a (1, D) mask token (MAE's is (1, 1, D'))
    top = candidates.get(None, {})
    if is_dinov3(top):
        return dinov3_weights(top, str(path))
    hub = "cls_token" in top and getattr(top.get("mask_token"), "ndim", 0) == 2
    return RawWeights(candidates, "dinov2-hub" if hub else "file", str(path))


def dinov3_weights(state: Mapping[str, Tensor], path: str) -> RawWeights:
    """A DINOv3 hub state dict (hub/backbones.py: the official module's own names): its architecture and, for a ViT,
    its head count (the head width is 4 × the length of ``rope_embed.periods``) read from its tensors."""
    name, kwargs = dinov3_arch(state)
    arch = kwargs["arch"]
    heads = (arch["num_heads"], "DINOv3's rope_embed.periods: 4 × its length per head") if "num_heads" in arch \
        else None
    return RawWeights({None: dict(state)}, "dinov3-hub", path, heads=heads, arch=(name, kwargs))


def hf_weights(folder: Path, config: dict, what: str) -> RawWeights:
    """A Hugging Face transformers folder (``config.json`` + ``model.safetensors``, or its shards listed in
    ``model.safetensors.index.json``) of DINOv2 or DINOv3, in selfsup's names (``layouts.hf_layout``)."""
    index = folder / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else \
        ["model.safetensors"]
    state: dict = {}
    for name in files:
        if not (folder / name).is_file():
            raise UserError(f"{what}={folder}: its config.json is a transformers {config['model_type']}'s but "
                            f"{name} is missing beside it; download the model's safetensors weights")
        state.update(_safetensors_index(folder / name))
    state, backbone, kwargs, heads = hf_layout(state, config, f"{what}={folder}")
    return RawWeights({None: state}, f"hf-{config['model_type']}", str(folder),
                      heads=(heads, "its config.json") if heads else None, arch=(backbone, kwargs))


def _timm_heads(model: nn.Module) -> int | None:
    """A timm ViT's head count (its first block's attention), None for a model without one."""
    blocks = getattr(model, "blocks", None)
    try:
        return int(blocks[0].attn.num_heads)
    except (TypeError, AttributeError, IndexError):
        return None


def timm_weights(name: str, module: nn.Module | None, what: str) -> RawWeights:
    """timm's pretrained weights of ``name`` (with the backbone's own timm kwargs where it is that model). Where the
    Hub does not answer within ``HUB_TIMEOUT`` s (no network) only the cache is read: a miss is one line at once,
    not a minute of retried requests."""
    import timm  # lazy: 1.5 s to import, for timm weights only
    from huggingface_hub import constants as hub  # timm's: the Hub's address, cache and offline switch

    base = name.split(".")[0]
    if not timm.is_model(base):
        raise UserError(f"{what}=timm:{name}: {base!r} is not a timm model; {WHAT}")
    recipe = getattr(module, "timm_recipe", None)
    kwargs = dict(recipe["kwargs"]) if recipe and recipe["model"] == base else {"num_classes": 0}
    was = hub.HF_HUB_OFFLINE
    offline = was or not answers(hub.ENDPOINT)
    try:
        hub.HF_HUB_OFFLINE = offline  # read at each request: the cache only, no retries
        model = timm.create_model(name, pretrained=True, **kwargs)
    except Exception as e:  # no network, no cache, a hub error: all the same to the user
        reason = (f"{urlsplit(hub.ENDPOINT).hostname} does not answer within {HUB_TIMEOUT:g} s: no network"
                  if offline and not was else f"{type(e).__name__}: {' '.join(str(e).split())[:90]}")
        raise UserError(f"{what}=timm:{name}: timm could not fetch its pretrained weights ({reason}) and finds "
                        f"none cached in {hub.HF_HUB_CACHE} or "
                        f"{torch.hub.get_dir()}/checkpoints; on a machine with network run "
                        f"timm.create_model('{name}', pretrained=True) once to fill that cache, or give the file: "
                        f"{what}=/path/to/{base}.safetensors") from None
    finally:
        hub.HF_HUB_OFFLINE = was
    heads = _timm_heads(model)
    return RawWeights({None: model.state_dict()}, "timm", f"timm:{name}", timm_layout=True,
                      heads=(heads, f"timm's {base}") if heads else None)


HUB_TIMEOUT = 2.0  # seconds a weights host has to accept a connection before it counts as unreachable


def answers(url: str, timeout: float = HUB_TIMEOUT) -> bool:
    """Whether the host of ``url`` accepts a TCP connection within ``timeout`` seconds."""
    parts = urlsplit(url)
    try:
        socket.create_connection((parts.hostname or "", parts.port or (80 if parts.scheme == "http" else 443)),
                                 timeout=timeout).close()
    except (OSError, ValueError):
        return False
    return True


def read_weights(spec: str, module: nn.Module | None = None, what: str = "model.weights") -> RawWeights:
    """Read the source ``spec`` (see the module docstring) into its candidate state dicts."""
    if spec == "timm" or spec.startswith(TIMM_PREFIX):
        if spec == "timm":
            recipe = getattr(module, "timm_recipe", None)
            if recipe is None:
                raise UserError(f"{what}=timm takes the pretrained weights of a timm:<name> backbone; for this "
                                f"backbone name the timm model: {what}=timm:<name>")
            return timm_weights(recipe["model"], module, what)
        return timm_weights(spec[len(TIMM_PREFIX):], module, what)
    path = Path(spec).expanduser()
    if not path.exists():
        raise UserError(f"{what}={spec} does not exist; {WHAT}")
    if path.is_dir() and (config := hf_config(path)) is not None:
        return hf_weights(path, config, what)
    if path.is_dir():
        if not (path / "backbone.safetensors").exists():
            ckpt = path / "checkpoints" / "last.ckpt"
            hint = f"; its checkpoint is {ckpt}" if ckpt.exists() else ""
            raise UserError(f"{what}={spec} is a folder without backbone.safetensors (not a finished selfsup run or "
                            f"export){hint}; {WHAT}")
        path = path / "backbone.safetensors"
    elif path.suffix not in FILE_SUFFIXES or (path.suffix == ".tar" and not path.name.endswith(".pth.tar")):
        raise UserError(f"{what}={spec} is not a weights file ({', '.join(FILE_SUFFIXES[:-1])}, .pth.tar); {WHAT}")
    return read_file_weights(path, what)


# --------------------------------------------------------------------------- matching and converting

def resample_position_table(pos: Tensor, grid: int, prefix: int, rule: str) -> Tensor:
    """A (1, prefix + G², D) table resampled to a ``grid`` × ``grid`` patch grid, the prefix rows kept, as its source
    model resamples it at that size:

    - ``dino``: scale factor (g + 0.1) / G, bicubic, no antialias (DINO vision_transformer.py:174-194; DINOv2's
      hub models without registers, interpolate_offset 0.1 and interpolate_antialias False, hub/backbones.py:27-28,
      models/vision_transformer.py:194-208; selfsup's own ViT, ``models.vit.interpolate_pos_embed``);
    - ``timm``: output size g × g, bicubic, antialias on, align_corners off (timm layers/pos_embed.py
      ``resample_abs_pos_embed``; DINOv2's ``_reg`` hub models, interpolate_offset 0 and antialias True,
      hub/backbones.py:103-110);
    - ``mae``: output size g × g, bicubic, no antialias, align_corners off (MAE util/pos_embed.py:75-93; I-JEPA's
      scale factor g / G, vision_transformer.py:427-440, is that size)."""
    old = int(round(math.sqrt(pos.shape[1] - prefix)))
    if old == grid:
        return pos
    dtype = pos.dtype
    if rule == "dino" and prefix == 1:
        return interpolate_pos_embed(pos.float(), grid).to(dtype)
    head, table = pos[:, :prefix], pos[:, prefix:].float()
    dim = table.shape[-1]
    if rule == "dino":
        scale = (grid + 0.1) / old
        out = F.interpolate(table.reshape(1, old, old, dim).permute(0, 3, 1, 2), scale_factor=(scale, scale),
                            mode="bicubic")
    else:
        out = F.interpolate(table.reshape(1, old, old, dim).permute(0, 3, 1, 2), size=(grid, grid), mode="bicubic",
                            align_corners=False, antialias=rule == "timm")
    return torch.cat([head, out.permute(0, 2, 3, 1).reshape(1, -1, dim).to(dtype)], dim=1)


def _strip(state: Mapping[str, Tensor], prefix: str) -> dict[str, Tensor]:
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)} if prefix else dict(state)


def choose(raw: RawWeights, target_keys: set[str]) -> tuple[str | None, str, dict[str, Tensor]]:
    """(wrapper, prefix, state) whose keys match ``target_keys`` most (ties: the first wrapper, then prefix)."""
    best, best_score = None, -1
    for wrapper, state in raw.candidates.items():
        for prefix in PREFIXES:
            stripped = _strip(state, prefix)
            score = sum(_renamed(k) in target_keys or k in target_keys for k in stripped)
            if score > best_score:
                best, best_score = (wrapper, prefix, stripped), score
    return best


def _outside(raw: RawWeights, wrapper: str | None, prefix: str) -> list[str]:
    """The chosen mapping's tensors outside ``prefix`` (a DINOv2 teacher's ``dino_head``, MoCo v3's momentum
    encoder), by group: ``dino_head.* (9 tensors)``."""
    if not prefix:
        return []
    depth, groups = prefix.count("."), {}
    for key in raw.candidates[wrapper]:
        if not key.startswith(prefix):
            parts = key.split(".")
            group = ".".join(parts[:depth]) + ".*" if len(parts) > depth else key
            groups[group] = groups.get(group, 0) + 1
    return [f"{g} ({n} tensors)" if g.endswith("*") else g for g, n in sorted(groups.items())]


def _layout(raw: RawWeights, wrapper: str | None, prefix: str) -> str | None:
    """The release layout of a method selfsup implements that the chosen mapping has (docs/pretrained.md cites each
    from its official code), or None."""
    if raw.kind != "file":
        return None
    keys = raw.candidates[wrapper]

    def has(*starts: str) -> bool:
        return any(k.startswith(starts) for k in keys)

    if "base_encoder." in prefix:
        return "moco-v3"
    vit = any(k.endswith("patch_embed.proj.weight") for k in keys)
    if wrapper in ("target_encoder", "encoder") and vit and not any(k.endswith("cls_token") for k in keys):
        return "ijepa"
    if wrapper == "teacher" and has("dino_head.", "module.dino_head."):
        return "dinov2"
    if wrapper == "teacher" and has("head.last_layer2", "module.head.last_layer2", "head.mlp2", "module.head.mlp2"):
        return "ibot"
    if wrapper == "teacher" and has("head.", "module.head."):
        return "dino"
    if wrapper == "model" and has("decoder", "module.decoder"):
        return "mae"
    if has("projection_head.", "module.projection_head.", "prototypes.", "module.prototypes."):
        return "swav"
    return None


def _renamed(key: str) -> str:
    """A source key as the selfsup ViT names it (DINOv2's mask token, timm's register tokens)."""
    return {"mask_token": "masked_embed", "reg_token": "register_tokens"}.get(key, key)


def _is_head(key: str) -> bool:
    return key.startswith(HEAD_KEYS)


def _vit_from_state(state: Mapping[str, Tensor]) -> dict | None:
    """What a ViT state dict shows of its architecture: width, depth, patch, registers, LayerScale, FFN, class
    token."""
    w = state.get("patch_embed.proj.weight")
    blocks = {int(m.group(1)) for k in state if (m := re.match(r"blocks\.(\d+)\.", k))}
    if w is None or w.ndim != 4 or not blocks:
        return None
    reg = state.get("register_tokens", state.get("reg_token"))
    return {"embed_dim": int(w.shape[0]), "depth": len(blocks), "patch_size": int(w.shape[-1]),
            "in_chans": int(w.shape[1]), "registers": 0 if reg is None else int(reg.shape[1]),
            "layer_scale": "blocks.0.ls1.gamma" in state, "class_token": "cls_token" in state,
            "ffn": "swiglu" if "blocks.0.mlp.w12.weight" in state else "mlp"}


def vit_settings(state: Mapping[str, Tensor], hub: bool, module: nn.Module | None = None,
                 heads: int | None = None) -> str:
    """The model.* settings that build a selfsup ViT of this state dict's shape, of ``heads`` heads where known
    (a hub file: DINOv2's 64 channels per head; otherwise every size of that width and depth is named)."""
    found = _vit_from_state(state)
    if found is None:
        return ""
    D, L = found["embed_dim"], found["depth"]
    heads = D // 64 if hub and heads is None else heads
    names = [n for n, s in VIT_SIZES.items() if s["embed_dim"] == D and s["depth"] == L and
             (heads is None or s["num_heads"] == heads)]
    own = getattr(module, "kwargs", {}) if isinstance(module, VisionTransformer) else {}
    name = " or ".join(names) if names else f"(a ViT of width {D}, depth {L})"
    parts = [f"model.backbone={name}",
             f"model.patch_size={found['patch_size']}", "model.pos_embed=learned"]
    if found["layer_scale"]:
        parts.append("model.layer_scale=1e-5")
    elif own.get("layer_scale"):
        parts.append("model.layer_scale=0")
    if found["registers"] or own.get("registers"):
        parts.append(f"model.registers={found['registers']}")
    if found["ffn"] != own.get("ffn", "mlp"):
        parts.append(f"model.ffn={found['ffn']}")
    if not found["class_token"] and own.get("class_token", True):
        parts.append("model.class_token=false model.pool=avg")
    return " ".join(parts)


def _own_heads(module: nn.Module) -> int | None:
    """The backbone's head count: a selfsup ViT's, a timm ViT's; None for a network without attention heads."""
    if isinstance(module, VisionTransformer):
        return int(module.kwargs["num_heads"])
    return _timm_heads(module)


def _stated_heads(raw: RawWeights, layout: str | None, width: int) -> tuple[int | None, str]:
    """The head count the source states or its layout fixes at this width, and where it was read; (None, "") for a
    plain state dict (the caller takes ``RELEASE_HEADS``)."""
    if raw.kind == "selfsup":
        arch = (raw.meta.get("architecture") or {}).get("kwargs") or raw.meta.get("kwargs") or {}
        return (int(arch["num_heads"]) if "num_heads" in arch else None), "its selfsup metadata"
    if raw.heads is not None:
        return raw.heads
    if raw.kind == "dinov2-hub" or layout == "dinov2":  # vision_transformer.py:341-394: ViT-S/B/L/g
        return RELEASE_HEADS.get(width), "DINOv2's 64 channels per head"
    if layout == "moco-v3":
        return MOCO_V3_HEADS.get(width), "MoCo v3's vits.py:115-127"
    if layout is not None:
        return RELEASE_HEADS.get(width), f"{layout}'s released sizes"
    return None, ""


def _file_heads(raw: RawWeights, layout: str | None, state: Mapping[str, Tensor]) -> tuple[int | None, str, bool]:
    """(head count, where it was read, whether taken at ``RELEASE_HEADS`` for a plain state dict) of a ViT file;
    (None, "", False) where the state is not a ViT's."""
    w = state.get("patch_embed.proj.weight")
    if w is None or w.ndim != 4:
        return None, "", False
    width = int(w.shape[0])
    heads, where = _stated_heads(raw, layout, width)
    if where:
        return heads, where, False
    return RELEASE_HEADS.get(width), f"the usual count at width {width}: the file cannot say", True


def _check_heads(raw: RawWeights, layout: str | None, state: Mapping[str, Tensor], module: nn.Module,
                 what: str) -> str | None:
    """The ViT's head count, read from the source (``_stated_heads``) or, for a plain state dict, taken at
    ``RELEASE_HEADS``; one line where it is not the backbone's (a ViT of the same width only: another width is
    a shape mismatch). Its description (``StartFacts.heads``)."""
    own, w = _own_heads(module), state.get("patch_embed.proj.weight")
    mine = module.state_dict().get("patch_embed.proj.weight")
    if own is None or w is None or mine is None or w.ndim != 4 or w.shape[0] != mine.shape[0]:
        return None
    width = int(w.shape[0])
    heads, where, plain = _file_heads(raw, layout, state)
    if heads is None:  # a width no release has, or a selfsup export of a network that names none
        told = "the file cannot say and no release has" if plain else f"none in {where} at"
        return f"{own} (the backbone's: {told} width {width})"
    if heads != own:
        names = [n for n, s in VIT_SIZES.items() if s["embed_dim"] == width and s["num_heads"] == heads]
        fix = (_stated_backbone(raw) or vit_settings(state, False, module, heads) or
               f"model.backbone={' or '.join(names)}" if isinstance(module, VisionTransformer) else
               f"a backbone of {heads} heads")
        if plain:
            raise UserError(
                f"{what}={raw.path}: a plain state dict does not say its head count and is read at {heads} heads, "
                f"the count at width {width} of timm's, DeiT's, DINO's, MAE's and DINOv2's ViTs; the backbone has "
                f"{own}: {fix}; a file of {own} heads (MoCo v3's ViT-S) loads from a source that says so (its "
                "release checkpoint, module.base_encoder.*, or a selfsup export)")
        kind = {"dinov2-hub": "a DINOv2 hub checkpoint", "dinov3-hub": "a DINOv3 hub file"}.get(raw.kind) or (
            f"a {layout} checkpoint" if layout else "a file")
        raise UserError(f"{what}={raw.path} is {kind} with {heads} heads ({where}), the backbone has {own}: {fix}")
    return f"{heads} ({where})"


def _stated_backbone(raw: RawWeights) -> str:
    """The model.* settings of the network a source states (DINOv3's hub files, transformers' folders), or ""."""
    if raw.arch is None:
        return ""
    name, kwargs = raw.arch
    patch = kwargs.get("patch_size")
    generic = name in ("dinov3_vit", "dinov3_convnext")
    return (f"model.backbone={name}" + (f" model.patch_size={patch}" if patch and patch != 16 else "") +
            (" (no released size: selfsup eval and method.teacher.backbone=auto build it)" if generic else "") +
            ("" if name.startswith("dinov3") else " model.pos_embed=learned model.layer_scale=1e-5" +
             (" model.ffn=swiglu" if kwargs.get("ffn") == "swiglu" else "")))


def _fixed_table(module: nn.Module) -> str | None:
    """``sincos`` / ``none`` where the backbone's position table is fixed (a selfsup ViT's), else None."""
    if isinstance(module, VisionTransformer) and not module.learned_pos:
        return "none" if module.no_pos else "sincos"
    return None


def _check_meta(raw: RawWeights, module: nn.Module, what: str) -> None:
    """A selfsup export's architecture against the selfsup ViT it is loaded into: one line naming what differs."""
    if raw.meta is None or not isinstance(module, VisionTransformer):
        return
    arch = (raw.meta.get("architecture") or {}).get("kwargs") or raw.meta.get("kwargs") or {}
    fields = ("embed_dim", "depth", "num_heads", "patch_size", "registers", "ffn", "pool", "pos_embed",
              "final_norm")
    differ = [f"{k} {module.kwargs.get(k)} (file: {arch[k]})" for k in fields
              if k in arch and arch[k] != module.kwargs.get(k)]
    if differ:
        raise UserError(f"{what}={raw.path} holds a {raw.meta.get('backbone')}, not this backbone: "
                        f"{', '.join(differ)}; set model.* to the run's (its config.yaml) or pick its backbone")


def _as_named(state: dict[str, Tensor], keys: set[str]) -> dict[str, Tensor]:
    """The source's own names as the selfsup ViT's: DINOv2's mask token (the student's ``masked_embed`` where it has
    one, dropped otherwise), timm's register layout, timm's packed SwiGLU."""
    if "mask_token" in state and "masked_embed" in keys:
        state["masked_embed"] = state.pop("mask_token")
    # timm's register layout (_convert_dinov2): reg_token, and a table with no class row (the class position was
    # folded into cls_token): the class row is zero here, which computes the same tokens
    if "reg_token" in state and "register_tokens" in keys:
        state["register_tokens"] = state.pop("reg_token")
        pos = real(state["pos_embed"]) if "pos_embed" in state else None
        if pos is not None and pos.ndim == 3 and math.isqrt(pos.shape[1]) ** 2 == pos.shape[1]:
            state["pos_embed"] = torch.cat([pos.new_zeros(1, 1, pos.shape[-1]), pos], dim=1)
    # timm's packed SwiGLU (fc1 = w12, fc2 = w3) into the selfsup ViT's names
    if any(k.endswith("mlp.w12.weight") for k in keys):
        state = {re.sub(r"mlp\.fc1\.", "mlp.w12.", re.sub(r"mlp\.fc2\.", "mlp.w3.", k)): v for k, v in state.items()}
    return state


def convert(raw: RawWeights, module: nn.Module, what: str,
            hash_source: bool = False) -> tuple[dict[str, Tensor], StartFacts]:
    """The source's tensors under the backbone's keys, ready for a strict ``load_state_dict`` (a ``.safetensors``
    file's still :class:`LazyTensor`: ``real``); a one-line UserError naming every mismatch otherwise.
    ``hash_source``: the facts' ``source_sha256`` of the tensors as read (a frozen network's identity)."""
    state, facts, source = _converted(raw, module, what)
    facts.source_sha256 = state_sha256(source) if hash_source else ""
    return state, facts


def _converted(raw: RawWeights, module: nn.Module, what: str) -> tuple[dict[str, Tensor], StartFacts, Mapping]:
    """``convert``'s state and facts, and the source mapping as read (what ``source_sha256`` hashes)."""
    target = module.state_dict()
    keys = set(target)
    wrapper, prefix, state = choose(raw, keys)
    source = dict(state)  # as read: the conversion below replaces entries of ``state`` (the position table)
    layout = _layout(raw, wrapper, prefix)
    facts = StartFacts(source="", kind=raw.kind, path=raw.path, wrapper=wrapper, prefix=prefix, layout=layout,
                       dropped=_outside(raw, wrapper, prefix))
    _check_meta(raw, module, what)
    facts.heads = _check_heads(raw, layout, state, module, what)
    state = _as_named(state, keys)
    for key in sorted(set(state) - keys):
        if _is_head(key):
            facts.dropped.append(key)
            del state[key]
    # the position table: resampled to the backbone's grid as its source model does; a fixed one must be the file's
    if "pos_embed" in state and "pos_embed" in target and state["pos_embed"].ndim == 3:
        pos = real(state["pos_embed"])
        state["pos_embed"], facts.resampled = _position_table(pos, target["pos_embed"], module, raw, layout, what)
        own = state["pos_embed"]
        if _fixed_table(module) and not (pos.shape == own.shape and torch.equal(pos, own)):
            facts.kept.append("pos_embed (the backbone's fixed table; the file's: another grid or sin-cos layout)")
    # a 3-channel first convolution into a 1-channel backbone: summed over the channels (timm adapt_input_conv)
    for key in ("patch_embed.proj.weight", "conv1.weight", "features.0.weight", "stem.conv.weight"):
        if key in state and key in target and state[key].ndim == 4 and state[key].shape[1] == 3 and \
                target[key].shape[1] == 1 and state[key].shape[0] == target[key].shape[0]:
            state[key] = real(state[key]).sum(dim=1, keepdim=True)
            facts.adapted = f"{key}: 3 input channels summed to 1 (timm adapt_input_conv)"
    # iBOT's / DINOv2's mask token belongs to the method's student, not to a backbone file: kept as initialised
    for key in METHOD_KEYS:
        if key in keys and key not in state:
            state[key] = target[key].clone()
            facts.kept.append(key)
    _check_fit(raw, state, target, module, (wrapper, prefix, layout), what)
    return state, facts, source


def _check_fit(raw: RawWeights, state: Mapping[str, Tensor], target: Mapping[str, Tensor], module: nn.Module,
               where: tuple[str | None, str, str | None], what: str) -> None:
    """One line naming the missing and unexpected keys and the shapes, with the settings a ViT file fits."""
    keys = set(target)
    missing = sorted(keys - set(state))
    unexpected = sorted(set(state) - keys)
    shapes = [f"{k} {tuple(state[k].shape)} (backbone {tuple(target[k].shape)})" for k in sorted(set(state) & keys)
              if state[k].shape != target[k].shape]
    if not (missing or unexpected or shapes):
        return

    def few(items):
        return ", ".join(items[:3]) + (f" (+{len(items) - 3})" if len(items) > 3 else "")

    wrapper, prefix, layout = where
    tried = f"wrapper {wrapper!r}, prefix {prefix!r}" if wrapper else f"prefix {prefix!r}"
    parts = ([f"missing {few(missing)}"] if missing else []) + (
        [f"unexpected {few(unexpected)}"] if unexpected else []) + ([f"shapes {few(shapes)}"] if shapes else [])
    heads = _file_heads(raw, layout, state)[0]
    hint = _stated_backbone(raw) or (vit_settings(state, False, module, heads) if isinstance(module, VisionTransformer)
                                     else "")
    fix = f"the file fits {hint}" if hint else "check model.backbone and its model.* settings"
    raise UserError(f"{what}={raw.path}: the weights do not fit this backbone ({tried}: {'; '.join(parts)}); {fix}")


def _fixed_table_is(pos: Tensor, own: Tensor, module: VisionTransformer) -> bool:
    """Whether the file's table ``pos`` is a fixed table, at the file's grid: the backbone's own, zeros for a
    backbone without positions, or a sin-cos table (MoCo v3's layout or MAE's / I-JEPA's, which a method fixes as
    its own: selfsup's MAE and I-JEPA write theirs over the backbone's)."""
    prefix, dim = module.prefix, pos.shape[-1]
    n = pos.shape[1] - prefix
    g = math.isqrt(max(n, 0))
    if g * g != n or pos.shape[0] != 1:
        return False

    def same(a: Tensor, b: Tensor) -> bool:
        return a.shape == b.shape and torch.allclose(a.float(), b.float(), atol=1e-5)

    if same(pos, own):
        return True
    if module.no_pos:
        return same(pos, torch.zeros_like(pos))
    return dim % 4 == 0 and any(same(make(g, dim)[:, 1 - prefix:], pos) for make in
                                (build_2d_sincos_position_embedding, mae_sincos_position_embedding))


def _position_table(pos: Tensor, own: Tensor, module: nn.Module, raw: RawWeights, layout: str | None,
                    what: str) -> tuple[Tensor, str | None]:
    fixed = _fixed_table(module)
    if fixed is not None:  # the backbone computes its table: the file's must be that table at its grid
        if not _fixed_table_is(pos, own, module):
            raise UserError(f"{what}={raw.path}: the file's position table is learned or of another layout, the "
                            f"backbone's is fixed (model.pos_embed={fixed}); set model.pos_embed=learned")
        return own.clone(), None
    if pos.shape == own.shape:
        return pos, None
    n_own, n_file = own.shape[1], pos.shape[1]
    for prefix in range(0, 9):
        g_own, g_file = math.isqrt(max(n_own - prefix, 0)), math.isqrt(max(n_file - prefix, 0))
        if g_own * g_own == n_own - prefix and g_file * g_file == n_file - prefix and g_own and g_file:
            # as the source model resamples: selfsup's ViT, DINO's and iBOT's, and DINOv2's without registers DINO's
            # way; MAE's and I-JEPA's theirs; timm's models and DINOv2's with registers timm's way (a plain file is
            # taken as timm's layout)
            registers = any("register_tokens" in c for c in raw.candidates.values()) or any(
                k.endswith("register_tokens") for c in raw.candidates.values() for k in c)
            dinov2 = raw.kind == "dinov2-hub" or layout == "dinov2"
            # transformers' Dinov2Model: size g × g, bicubic, no antialias (modeling_dinov2.py interpolate_pos_encoding;
            # its Dinov2WithRegistersModel: with antialias, timm's way)
            rule = "dino" if raw.kind == "selfsup" or layout in ("dino", "ibot") or (dinov2 and not registers) \
                else "mae" if layout in ("mae", "ijepa") or raw.kind == "hf-dinov2" else "timm"
            out = resample_position_table(pos, g_own, prefix, rule)
            return out, f"{g_file}x{g_file} -> {g_own}x{g_own} ({rule})"
    return pos, None  # not a square grid: the shape mismatch is reported


def copy_into(module: nn.Module, state: Mapping[str, Tensor], chunk_bytes: int = 16 << 20,
              assign: bool = False) -> None:
    """``state`` (converted and checked: every key of ``module``) copied into ``module`` a few tensors at a time
    (``load_state_dict`` of each group, so a module's own loading hooks run): a ``.safetensors`` file's tensors are
    read as they are copied, and a mapped torch file's pages as they are touched; no second copy of the file.
    ``assign``: the module takes the source's tensors themselves (``load_state_dict(assign=True)``; one of another
    dtype or device is converted first), so its own are freed (a module built on the meta device: nothing allocated
    twice) and a mapped torch file's pages are the network's: one copy in memory, not the module's and the file's
    (a frozen network, never trained or exported)."""
    # the module's dtype and device of each key, not its tensors: held here, they could not be freed
    own = {k: (v.dtype, v.device) for k, v in module.state_dict().items()} if assign else {}
    group, size = {}, 0
    for key in state:
        t = real(state[key])
        if assign:
            dtype, device = own[key]
            device = t.device if device.type == "meta" else device
            if (t.dtype, t.device) != (dtype, device):
                t = t.to(device, dtype)
        group[key], size = t, size + t.numel() * t.element_size()
        if size >= chunk_bytes:
            _load_group(module, group, assign)
            group, size = {}, 0
    _load_group(module, group, assign)


def _load_group(module: nn.Module, group: dict[str, Tensor], assign: bool = False) -> None:
    with torch.no_grad():
        result = module.load_state_dict(group, strict=False, assign=assign)
    if result.unexpected_keys:  # convert checked the keys: a module whose hooks rename them
        raise RuntimeError(f"unexpected keys after conversion: {result.unexpected_keys[:3]}")


def load_weights(module: nn.Module, spec: str, what: str = "model.weights",
                 raw: RawWeights | None = None, hash_source: bool = False, assign: bool = False) -> StartFacts:
    """Load the source ``spec`` into ``module`` (strict: every key of the module, no other); the facts of it.
    ``raw``: the source already read (``read_weights``), so a file is read once; ``hash_source``: see ``convert``,
    hashed once the tensors are in (a mapped file's pages then are the module's, with ``assign``: see
    ``copy_into``; a module on the meta device takes them)."""
    raw = read_weights(spec, module, what) if raw is None else raw
    state, facts, source = _converted(raw, module, what)
    copy_into(module, state, assign=assign)
    del state
    facts.source_sha256 = state_sha256(source) if hash_source else ""
    del source
    loaded = module.state_dict()
    facts.source, facts.tensors = spec, len(loaded)
    facts.sha256 = state_sha256(loaded)
    return facts


# --------------------------------------------------------------------------- a network built from its weights

IMAGENET_NORM = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))  # DINOv2's and timm's usual input normalisation


def _dinov2_backbone(raw: RawWeights) -> dict[str, Tensor] | None:
    """The backbone tensors of a DINOv2 hub file or training checkpoint (its teacher's ``backbone.*``), else None."""
    if raw.kind == "dinov2-hub":
        return raw.candidates[None]
    teacher = raw.candidates.get("teacher") or {}
    if "backbone.cls_token" in teacher and any(k.startswith("dino_head.") for k in teacher):
        return _strip(teacher, "backbone.")
    return None


def file_vit_kwargs(spec: str, what: str) -> dict:
    """The selfsup ViT settings a ViT file's shapes show (patch, LayerScale, registers, FFN, class token), with
    learned positions (any file's table, loaded as it is): what a ViT named for a file (``selfsup eval --backbone
    deit_small``) is built with; its head count is the name's, checked as ``load_weights`` checks it."""
    raw = read_weights(spec, None, what)
    vit_keys = {"patch_embed.proj.weight", "cls_token", "pos_embed", "norm.weight", "norm.bias"} | {
        f"blocks.{i}.{part}" for i in range(48) for part in ("norm1.weight", "attn.qkv.weight")}
    found = _vit_from_state(choose(raw, vit_keys)[2])
    if found is None:
        raise UserError(f"{what} {spec} holds no ViT (no patch_embed.proj.weight and blocks.*): name a backbone "
                        "of its kind (a ResNet's name, timm:<name>)")
    return {"patch_size": found["patch_size"], "pos_embed": "learned",
            "layer_scale": 1e-5 if found["layer_scale"] else 0.0, "registers": found["registers"],
            "ffn": found["ffn"], **({} if found["class_token"] else {"class_token": False, "pool": "avg"})}


def _auto_architecture(spec: str, image_size: int, what: str) -> tuple[RawWeights, str, dict, dict | None]:
    """(the source read, its backbone name, kwargs, its selfsup metadata or None) of a source that says its own
    architecture: a selfsup export's metadata, a DINOv2 hub file's or training checkpoint's shapes (64 channels per
    head, LayerScale, learned positions at ``image_size``); any other: one line naming the fix."""
    raw = read_weights(spec, None, what)
    if raw.kind == "selfsup":
        meta = raw.meta
        return raw, meta["backbone"], {k: v for k, v in meta["kwargs"].items()
                                       if k not in ("in_chans", "image_size")}, meta
    if raw.arch is not None:  # DINOv3's hub files, the transformers layouts: their own architecture
        patch = raw.arch[1].get("patch_size", 1)
        if image_size % patch:
            raise UserError(f"{what}={spec}: its patch is {patch} px and the images are {image_size} px; set "
                            f"data.image_size to a multiple of {patch}")
        return raw, raw.arch[0], dict(raw.arch[1]), None
    state = _dinov2_backbone(raw)
    if state is None:
        fix = ("name it: method.teacher.backbone=<a selfsup backbone or timm:<name>> (and method.teacher.kwargs)"
               if what.startswith("method.teacher") else
               "name it: selfsup eval ... --backbone <a selfsup backbone or timm:<name>>, or load it into a run's "
               "backbone with model.weights (model.backbone and model.* name the architecture) and evaluate that "
               "run's backbone_init.safetensors")
        raise UserError(f"{what} {spec} does not say its architecture (neither a selfsup export, a DINOv2 hub "
                        f"or training checkpoint, a DINOv3 hub file nor a transformers DINOv2 / DINOv3 folder); {fix}")
    found = _vit_from_state(state)
    names = [n for n, s in VIT_SIZES.items() if s["embed_dim"] == found["embed_dim"] and
             s["depth"] == found["depth"] and s["num_heads"] == found["embed_dim"] // 64]
    if not names:
        raise UserError(f"{what}={spec}: a DINOv2 checkpoint of width {found['embed_dim']} and depth "
                        f"{found['depth']} has no selfsup ViT size ({', '.join(VIT_SIZES)})")
    if image_size % found["patch_size"]:
        raise UserError(f"{what}={spec}: the teacher's patch is {found['patch_size']} px and the images "
                        f"are {image_size} px; set data.image_size to a multiple of {found['patch_size']}")
    return raw, names[0], dict(patch_size=found["patch_size"], pos_embed="learned", init="dinov2",
                               layer_scale=1e-5 if found["layer_scale"] else 0.0, registers=found["registers"],
                               ffn=found["ffn"]), None


def build_from_weights(spec: str, backbone: str, kwargs: dict, in_chans: int, image_size: int,
                       what: str, own_channels: bool = False) -> tuple[nn.Module, StartFacts, tuple | None]:
    """A network of its own architecture with the weights ``spec`` (a frozen network: a distillation teacher,
    REPA's encoder, an evaluated checkpoint), in eval mode and frozen: (module, facts, its input normalisation
    (mean, std) where the source states it, else None). The one loader of every frozen network; the file is read
    once.

    ``backbone="auto"``: the source's own architecture, a selfsup export's metadata (at ``image_size``), a DINOv2
    hub file's or training checkpoint's shapes (``_auto_architecture``), or the timm model of ``timm:<name>``; any
    other name is built by ``build_backbone(backbone, **kwargs)``. ``in_chans``: the input channels, or with
    ``own_channels`` those of the source where it states them (a selfsup export's, a DINOv2 file's or a timm
    model's 3: a grey run's teacher sees its image repeated, not a summed stem)."""
    norm, raw = None, None
    if backbone == "auto" and spec.startswith(TIMM_PREFIX):
        backbone, kwargs, in_chans = spec, {}, 3 if own_channels else in_chans
    elif backbone == "auto":
        raw, backbone, kwargs, meta = _auto_architecture(spec, image_size, what)
        if meta is not None:
            norm = (tuple(meta["mean"]), tuple(meta["std"]))
            in_chans = int(meta["in_chans"]) if own_channels else in_chans
        else:
            norm, in_chans = IMAGENET_NORM, 3 if own_channels else in_chans
    # a file of its own architecture but a selfsup export (DINOv2's and DINOv3's, transformers'; an export's fixed
    # position table is the module's own): built on the meta device, the file's tensors then its own (a mapped .pth
    # stays mapped, a .safetensors is read once): about 1x the file, not 2x
    meta = raw is not None and raw.kind != "selfsup"
    try:
        with torch.device("meta") if meta else contextlib.nullcontext():
            module = build_backbone(backbone, in_chans=in_chans, image_size=image_size, **kwargs)
    except (TypeError, ValueError) as e:
        raise UserError(f"{what}: the teacher {backbone} cannot be built ({' '.join(str(e).split())})") from None
    facts = load_weights(module, "timm" if spec.startswith(TIMM_PREFIX) and spec[len(TIMM_PREFIX):] ==
                         getattr(module, "timm_recipe", {}).get("model") else spec, what, raw, hash_source=True,
                         assign=True)  # frozen: the file's tensors are the network's, one copy
    if meta and any(t.is_meta for t in module.state_dict().values()):
        raise RuntimeError(f"{spec}: a tensor of the {backbone} was not in the file (built on the meta device)")
    facts.source = spec
    if norm is None and hasattr(module, "pretrained_cfg") and spec.startswith(TIMM_PREFIX):
        cfg = module.pretrained_cfg or {}
        if "mean" in cfg and "std" in cfg:
            norm = (tuple(cfg["mean"]), tuple(cfg["std"]))
    module.eval().requires_grad_(False)
    return module, facts, norm
