"""Start a backbone from given weights (``model.weights``, a distillation teacher's ``method.teacher.weights``).

A source is one of:

- a selfsup run folder (its ``backbone.safetensors``) or an exported backbone ``.safetensors`` (its metadata names
  the architecture, checked against the backbone's);
- a local file: ``.safetensors``, or ``.pth`` / ``.pt`` / ``.bin`` / ``.ckpt`` read with ``weights_only=True`` (a
  plain state dict or a checkpoint); the wrappers tried, in order, are the dict keys ``WRAPPERS`` and the key
  prefixes ``PREFIXES``; the (wrapper, prefix) whose keys match the backbone's most is taken (ties: the first);
- the official DINOv2 torch.hub checkpoints (``dinov2_vit{s,b,l,g}14[_reg4]_pretrain.pth``): LayerScale
  ``ls1/ls2.gamma``, ``register_tokens``, ``mask_token``, SwiGLU ``w12/w3``, a 518-px ``pos_embed``, all named as
  the selfsup ViT's (``models/vit.py``) but the mask token (``masked_embed`` where the backbone has one, dropped
  otherwise); the head count is DINOv2's 64 channels per head (dinov2 models/vision_transformer.py:341-394);
- ``timm`` (a ``timm:<name>`` backbone's own pretrained weights) or ``timm:<name>`` (that timm model's pretrained
  weights): timm fetches them or reads its cache; offline and uncached, one line names the cache folder.

Loading rules: a position table of another grid is resampled bicubically as its source model does at that size
(``resample_position_table``); a 3-channel first convolution feeding a 1-channel backbone is summed over its
channels (timm's ``adapt_input_conv``); classifier and pretraining heads the backbone lacks (``HEAD_KEYS``) are
dropped and listed; any other mismatch is one line naming the missing and unexpected keys, the shapes and the
wrapper and prefix tried. What was loaded is described by :class:`StartFacts` (``run.json``'s ``weights``) with a
sha256 of the loaded tensors (``state_sha256``).
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file
from torch import Tensor, nn

from selfsup.checkpoints import EXTRA_SAFE_GLOBALS
from selfsup.errors import UserError
from selfsup.export import FORMAT, read_meta
from selfsup.models.backbones import TIMM_PREFIX, build_backbone
from selfsup.models.vit import VIT_SIZES, VisionTransformer, build_2d_sincos_position_embedding, \
    interpolate_pos_embed

WRAPPERS = ("teacher", "state_dict", "model", "module")  # checkpoint keys holding the weights (DINO's teacher first)
PREFIXES = ("", "module.", "backbone.", "module.backbone.", "teacher_backbone.", "encoder.", "module.encoder.",
            "model.", "module.base_encoder.", "base_encoder.")
# keys of heads a backbone has no place for: dropped (and listed) where the backbone lacks them
HEAD_KEYS = ("fc.", "head.", "heads.", "classifier.", "mask_token", "decoder", "pre_logits.")
METHOD_KEYS = ("masked_embed",)  # a method's own parameters on the backbone: kept as initialised where the file lacks
FILE_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin", ".ckpt")
WHAT = ("give a selfsup run folder, a .safetensors / .pth / .pt file (a state dict or checkpoint), timm (a timm:<name> "
        "backbone's own pretrained weights) or timm:<name>")


@dataclass
class StartFacts:
    """What a backbone was started from (``run.json``'s ``weights``)."""

    source: str  # as given
    kind: str  # selfsup | file | dinov2-hub | timm
    path: str | None = None
    wrapper: str | None = None  # the checkpoint key the weights were under
    prefix: str = ""  # the key prefix stripped
    dropped: list[str] = field(default_factory=list)  # head keys the backbone has no place for
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


@dataclass
class RawWeights:
    """A source read: every candidate mapping of tensors (by wrapper), how it was found, and any selfsup metadata."""

    candidates: dict[str | None, dict[str, Tensor]]
    kind: str
    path: str | None = None
    meta: dict | None = None
    timm_layout: bool = False


def state_sha256(state: dict[str, Tensor]) -> str:
    """sha256 over the tensors of ``state`` in key order: each key, dtype, shape and raw bytes."""
    h = hashlib.sha256()
    for key in sorted(state):
        t = state[key].detach().cpu().contiguous()
        h.update(f"{key}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


# --------------------------------------------------------------------------- reading a source

def _tensors(obj) -> dict[str, Tensor] | None:
    """``obj`` as a flat mapping of tensors (non-tensor entries, e.g. BN counters as ints, skipped), or None."""
    if not isinstance(obj, dict):
        return None
    out = {k: v for k, v in obj.items() if isinstance(k, str) and isinstance(v, Tensor)}
    return out or None


def read_file_weights(path: Path, what: str) -> RawWeights:
    """The tensors of a local file: a selfsup export (with its metadata), a plain ``.safetensors``, or a torch file."""
    if path.suffix == ".safetensors":
        try:
            with safe_open(str(path), framework="pt") as f:
                raw = (f.metadata() or {}).get("selfsup")
            state = load_file(str(path))
        except Exception as e:  # safetensors raises its own error types for a corrupt header
            raise UserError(f"{what}={path} is not a readable safetensors file "
                            f"({' '.join(str(e).split())[:100]}); {WHAT}") from None
        meta = read_meta(path) if raw and FORMAT in raw else None
        return RawWeights({None: state}, "selfsup" if meta else "file", str(path), meta)
    try:
        with torch.serialization.safe_globals(EXTRA_SAFE_GLOBALS):
            obj = torch.load(path, map_location="cpu", weights_only=True)
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
    hub = any("mask_token" in c and "cls_token" in c for c in candidates.values())
    return RawWeights(candidates, "dinov2-hub" if hub else "file", str(path))


def timm_weights(name: str, module: nn.Module | None, what: str) -> RawWeights:
    """timm's pretrained weights of ``name`` (with the backbone's own timm kwargs where it is that model)."""
    import timm  # lazy: 1.5 s to import, for timm weights only

    base = name.split(".")[0]
    if not timm.is_model(base):
        raise UserError(f"{what}=timm:{name}: {base!r} is not a timm model; {WHAT}")
    recipe = getattr(module, "timm_recipe", None)
    kwargs = dict(recipe["kwargs"]) if recipe and recipe["model"] == base else {"num_classes": 0}
    try:
        model = timm.create_model(name, pretrained=True, **kwargs)
    except Exception as e:  # no network, no cache, a hub error: all the same to the user
        from huggingface_hub.constants import HF_HUB_CACHE

        reason = " ".join(str(e).split())[:90] or type(e).__name__
        raise UserError(f"{what}=timm:{name}: timm could not fetch its pretrained weights and finds none cached in "
                        f"{HF_HUB_CACHE} or {torch.hub.get_dir()}/checkpoints ({type(e).__name__}: {reason}); on a "
                        f"machine with network run timm.create_model('{name}', pretrained=True) once to fill that "
                        f"cache, or give the file: {what}=/path/to/{base}.safetensors") from None
    return RawWeights({None: model.state_dict()}, "timm", f"timm:{name}", timm_layout=True)


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
    if path.is_dir():
        if not (path / "backbone.safetensors").exists():
            ckpt = path / "checkpoints" / "last.ckpt"
            hint = f"; its checkpoint is {ckpt}" if ckpt.exists() else ""
            raise UserError(f"{what}={spec} is a folder without backbone.safetensors (not a finished selfsup run or "
                            f"export){hint}; {WHAT}")
        path = path / "backbone.safetensors"
    elif path.suffix not in FILE_SUFFIXES:
        raise UserError(f"{what}={spec} is not a weights file ({', '.join(FILE_SUFFIXES)}); {WHAT}")
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
      hub/backbones.py:103-110)."""
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
                            antialias=True)
    return torch.cat([head, out.permute(0, 2, 3, 1).reshape(1, -1, dim).to(dtype)], dim=1)


def _strip(state: dict[str, Tensor], prefix: str) -> dict[str, Tensor]:
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


def _renamed(key: str) -> str:
    """A source key as the selfsup ViT names it (DINOv2's mask token, timm's register tokens)."""
    return {"mask_token": "masked_embed", "reg_token": "register_tokens"}.get(key, key)


def _is_head(key: str) -> bool:
    return key.startswith(HEAD_KEYS)


def _vit_from_state(state: dict[str, Tensor]) -> dict | None:
    """What a ViT state dict shows of its architecture: width, depth, patch, registers, LayerScale, FFN."""
    w = state.get("patch_embed.proj.weight")
    if w is None or w.ndim != 4 or "cls_token" not in state:
        return None
    blocks = {int(m.group(1)) for k in state if (m := re.match(r"blocks\.(\d+)\.", k))}
    reg = state.get("register_tokens", state.get("reg_token"))
    return {"embed_dim": int(w.shape[0]), "depth": len(blocks), "patch_size": int(w.shape[-1]),
            "in_chans": int(w.shape[1]), "registers": 0 if reg is None else int(reg.shape[1]),
            "layer_scale": "blocks.0.ls1.gamma" in state,
            "ffn": "swiglu" if "blocks.0.mlp.w12.weight" in state else "mlp"}


def vit_settings(state: dict[str, Tensor], hub: bool, module: nn.Module | None = None) -> str:
    """The model.* settings that build a selfsup ViT of this state dict's shape (a hub file: DINOv2's 64 channels
    per head; another file cannot tell the head count: every size of that width and depth is named)."""
    found = _vit_from_state(state)
    if found is None:
        return ""
    D, L = found["embed_dim"], found["depth"]
    names = [n for n, s in VIT_SIZES.items() if s["embed_dim"] == D and s["depth"] == L and
             (not hub or s["num_heads"] == D // 64)]
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
    return " ".join(parts)


def _fixed_table(module: nn.Module) -> str | None:
    """``sincos`` / ``none`` where the backbone's position table is fixed (a selfsup ViT's), else None."""
    if isinstance(module, VisionTransformer) and not module.learned_pos:
        return "none" if module.no_pos else "sincos"
    return None


def convert(raw: RawWeights, module: nn.Module, what: str,
            hash_source: bool = False) -> tuple[dict[str, Tensor], StartFacts]:
    """The source's tensors under the backbone's keys, ready for a strict ``load_state_dict``; a one-line
    UserError naming every mismatch otherwise. ``hash_source``: the facts' ``source_sha256`` of the tensors as read."""
    target = module.state_dict()
    keys = set(target)
    wrapper, prefix, state = choose(raw, keys)
    facts = StartFacts(source="", kind=raw.kind, path=raw.path, wrapper=wrapper, prefix=prefix,
                       source_sha256=state_sha256(state) if hash_source else "")
    hub = raw.kind == "dinov2-hub"
    state = dict(state)
    if raw.meta is not None and isinstance(module, VisionTransformer):
        arch = (raw.meta.get("architecture") or {}).get("kwargs") or raw.meta.get("kwargs") or {}
        fields = ("embed_dim", "depth", "num_heads", "patch_size", "registers", "ffn", "pool", "pos_embed",
                  "final_norm")
        differ = [f"{k} {module.kwargs.get(k)} (file: {arch[k]})" for k in fields
                  if k in arch and arch[k] != module.kwargs.get(k)]
        if differ:
            raise UserError(f"{what}={raw.path} holds a {raw.meta.get('backbone')}, not this backbone: "
                            f"{', '.join(differ)}; set model.* to the run's (its config.yaml) or pick its backbone")
    if hub and isinstance(module, VisionTransformer):
        heads = module.kwargs["embed_dim"] // 64
        if module.kwargs["num_heads"] != heads:
            raise UserError(f"{what}={raw.path} is a DINOv2 hub checkpoint with {heads} heads (64 channels each), "
                            f"the backbone has {module.kwargs['num_heads']}: {vit_settings(state, True, module)}")
    # DINOv2's mask token: the student's masked_embed where it has one (iBOT / DINOv2), dropped otherwise
    if "mask_token" in state and "masked_embed" in keys:
        state["masked_embed"] = state.pop("mask_token")
    # timm's register layout (_convert_dinov2): reg_token, and a table with no class row (the class position was
    # folded into cls_token): the class row is zero here, which computes the same tokens
    if "reg_token" in state and "register_tokens" in keys:
        state["register_tokens"] = state.pop("reg_token")
        pos = state.get("pos_embed")
        if pos is not None and pos.ndim == 3 and math.isqrt(pos.shape[1]) ** 2 == pos.shape[1]:
            state["pos_embed"] = torch.cat([pos.new_zeros(1, 1, pos.shape[-1]), pos], dim=1)
    # timm's packed SwiGLU (fc1 = w12, fc2 = w3) into the selfsup ViT's names
    if any(k.endswith("mlp.w12.weight") for k in keys):
        state = {re.sub(r"mlp\.fc1\.", "mlp.w12.", re.sub(r"mlp\.fc2\.", "mlp.w3.", k)): v for k, v in state.items()}
    for key in sorted(set(state) - keys):
        if _is_head(key):
            facts.dropped.append(key)
            del state[key]
    # the position table: resampled to the backbone's grid as its source model does; a fixed one must be the file's
    if "pos_embed" in state and "pos_embed" in target and state["pos_embed"].ndim == 3:
        state["pos_embed"], facts.resampled = _position_table(state["pos_embed"], target["pos_embed"], module, raw,
                                                              what)
    # a 3-channel first convolution into a 1-channel backbone: summed over the channels (timm adapt_input_conv)
    for key in ("patch_embed.proj.weight", "conv1.weight", "features.0.weight", "stem.conv.weight"):
        if key in state and key in target and state[key].ndim == 4 and state[key].shape[1] == 3 and \
                target[key].shape[1] == 1 and state[key].shape[0] == target[key].shape[0]:
            state[key] = state[key].sum(dim=1, keepdim=True)
            facts.adapted = f"{key}: 3 input channels summed to 1 (timm adapt_input_conv)"
    # iBOT's / DINOv2's mask token belongs to the method's student, not to a backbone file: kept as initialised
    for key in METHOD_KEYS:
        if key in keys and key not in state:
            state[key] = target[key].clone()
            facts.kept.append(key)
    missing = sorted(keys - set(state))
    unexpected = sorted(set(state) - keys)
    shapes = [f"{k} {tuple(state[k].shape)} (backbone {tuple(target[k].shape)})" for k in sorted(set(state) & keys)
              if state[k].shape != target[k].shape]
    if missing or unexpected or shapes:
        def few(items):
            return ", ".join(items[:3]) + (f" (+{len(items) - 3})" if len(items) > 3 else "")
        where = f"wrapper {wrapper!r}, prefix {prefix!r}" if wrapper else f"prefix {prefix!r}"
        parts = ([f"missing {few(missing)}"] if missing else []) + (
            [f"unexpected {few(unexpected)}"] if unexpected else []) + ([f"shapes {few(shapes)}"] if shapes else [])
        hint = vit_settings(state, hub, module) if isinstance(module, VisionTransformer) else ""
        fix = f"the file fits {hint}" if hint else "check model.backbone and its model.* settings"
        raise UserError(f"{what}={raw.path}: the weights do not fit this backbone ({where}: {'; '.join(parts)}); "
                        f"{fix}")
    return state, facts


def _position_table(pos: Tensor, own: Tensor, module: nn.Module, raw: RawWeights,
                    what: str) -> tuple[Tensor, str | None]:
    fixed = _fixed_table(module)
    if fixed is not None:  # the backbone computes its table: the file's must be that table at its grid
        n = pos.shape[1] - 1
        g = math.isqrt(n)
        expect = (torch.zeros_like(pos) if fixed == "none" else
                  build_2d_sincos_position_embedding(g, pos.shape[-1]).to(pos.dtype)) if g * g == n else None
        if expect is None or expect.shape != pos.shape or not torch.allclose(pos.float(), expect.float(), atol=1e-5):
            raise UserError(f"{what}={raw.path}: the file's position table is learned, the backbone's is fixed "
                            f"(model.pos_embed={fixed}); set model.pos_embed=learned")
        return own.clone(), None
    if pos.shape == own.shape:
        return pos, None
    n_own, n_file = own.shape[1], pos.shape[1]
    for prefix in range(0, 9):
        g_own, g_file = math.isqrt(max(n_own - prefix, 0)), math.isqrt(max(n_file - prefix, 0))
        if g_own * g_own == n_own - prefix and g_file * g_file == n_file - prefix and g_own and g_file:
            # as the source model resamples: selfsup's ViT and DINOv2's hub models without registers DINO's way,
            # timm's models and DINOv2's _reg ones timm's way (a plain file is taken as timm's layout)
            hub_reg = raw.kind == "dinov2-hub" and any("register_tokens" in c for c in raw.candidates.values())
            rule = "dino" if raw.kind == "selfsup" or (raw.kind == "dinov2-hub" and not hub_reg) else "timm"
            out = resample_position_table(pos, g_own, prefix, rule)
            return out, f"{g_file}x{g_file} -> {g_own}x{g_own} ({rule})"
    return pos, None  # not a square grid: the shape mismatch is reported


def load_weights(module: nn.Module, spec: str, what: str = "model.weights",
                 raw: RawWeights | None = None, hash_source: bool = False) -> StartFacts:
    """Load the source ``spec`` into ``module`` (strict: every key of the module, no other); the facts of it.
    ``raw``: the source already read (``read_weights``), so a file is read once; ``hash_source``: see ``convert``."""
    raw = read_weights(spec, module, what) if raw is None else raw
    state, facts = convert(raw, module, what, hash_source)
    with torch.no_grad():
        module.load_state_dict(state, strict=True)
    loaded = module.state_dict()
    facts.source, facts.tensors = spec, len(loaded)
    facts.sha256 = state_sha256(loaded)
    return facts


# --------------------------------------------------------------------------- a network built from its weights

IMAGENET_NORM = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))  # DINOv2's and timm's usual input normalisation


def build_from_weights(spec: str, backbone: str, kwargs: dict, in_chans: int, image_size: int,
                       what: str, own_channels: bool = False) -> tuple[nn.Module, StartFacts, tuple | None]:
    """A network of its own architecture with the weights ``spec`` (a frozen network: a distillation teacher,
    REPA's encoder, an evaluated checkpoint), in eval mode and frozen: (module, facts, its input normalisation
    (mean, std) where the source states it, else None). The one loader of every frozen network; the file is read
    once.

    ``backbone="auto"``: the source's own architecture, a selfsup export's metadata (at ``image_size``), a DINOv2
    hub file's shapes (DINOv2's 64 channels per head, LayerScale, learned positions at ``image_size``), or the timm
    model of ``timm:<name>``; any other name is built by ``build_backbone(backbone, **kwargs)``. ``in_chans``: the
    input channels, or with ``own_channels`` those of the source where it states them (a selfsup export's, a
    DINOv2 hub file's or a timm model's 3: a grey run's teacher sees its image repeated, not a summed stem)."""
    norm, raw = None, None
    if backbone == "auto":
        if spec.startswith(TIMM_PREFIX):
            backbone = spec
            kwargs = {}
            in_chans = 3 if own_channels else in_chans
        else:
            raw = read_weights(spec, None, what)
            if raw.kind == "selfsup":
                meta = raw.meta
                backbone, kwargs = meta["backbone"], {k: v for k, v in meta["kwargs"].items()
                                                      if k not in ("in_chans", "image_size")}
                norm = (tuple(meta["mean"]), tuple(meta["std"]))
                in_chans = int(meta["in_chans"]) if own_channels else in_chans
            elif raw.kind == "dinov2-hub":
                state = next(iter(raw.candidates.values()))
                found = _vit_from_state(state)
                names = [n for n, s in VIT_SIZES.items() if s["embed_dim"] == found["embed_dim"] and
                         s["depth"] == found["depth"] and s["num_heads"] == found["embed_dim"] // 64]
                if not names:
                    raise UserError(f"{what}={spec}: a DINOv2 hub checkpoint of width {found['embed_dim']} and depth "
                                    f"{found['depth']} has no selfsup ViT size ({', '.join(VIT_SIZES)})")
                backbone = names[0]
                kwargs = dict(patch_size=found["patch_size"], pos_embed="learned", init="dinov2",
                              layer_scale=1e-5 if found["layer_scale"] else 0.0, registers=found["registers"],
                              ffn=found["ffn"])
                norm = IMAGENET_NORM
                in_chans = 3 if own_channels else in_chans
                if image_size % found["patch_size"]:
                    raise UserError(f"{what}={spec}: the teacher's patch is {found['patch_size']} px and the images "
                                    f"are {image_size} px; set data.image_size to a multiple of {found['patch_size']}")
            else:
                fix = ("name it: method.teacher.backbone=<a selfsup backbone or timm:<name>> (and "
                       "method.teacher.kwargs)" if what.startswith("method.teacher") else
                       "load it into a run's backbone with model.weights (model.backbone and model.* name the "
                       "architecture) and evaluate that run's backbone_init.safetensors")
                raise UserError(f"{what} {spec} does not say its architecture (neither a selfsup export nor a DINOv2 "
                                f"hub checkpoint); {fix}")
    try:
        module = build_backbone(backbone, in_chans=in_chans, image_size=image_size, **kwargs)
    except (TypeError, ValueError) as e:
        raise UserError(f"{what}: the teacher {backbone} cannot be built ({' '.join(str(e).split())})") from None
    facts = load_weights(module, "timm" if spec.startswith(TIMM_PREFIX) and spec[len(TIMM_PREFIX):] ==
                         getattr(module, "timm_recipe", {}).get("model") else spec, what, raw, hash_source=True)
    facts.source = spec
    if norm is None and hasattr(module, "pretrained_cfg") and spec.startswith(TIMM_PREFIX):
        cfg = module.pretrained_cfg or {}
        if "mean" in cfg and "std" in cfg:
            norm = (tuple(cfg["mean"]), tuple(cfg["std"]))
    module.eval().requires_grad_(False)
    return module, facts, norm
