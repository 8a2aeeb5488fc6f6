"""The exported backbone: one safetensors file whose keys are the plain model's (timm/torchvision).

Its metadata holds ``selfsup`` = JSON of how to rebuild it (backbone name, build_backbone kwargs,
image size, channels, normalisation). Without selfsup: build the same timm VisionTransformer or
torchvision ResNet and ``load_state_dict(safetensors.torch.load_file(path))``.
"""

from __future__ import annotations

import json
from pathlib import Path

from torch import nn

from selfsup.errors import UserError
from selfsup.models.backbones import build_backbone

FORMAT = "selfsup-backbone/1"


def export_backbone(backbone: nn.Module, path: Path, meta: dict) -> Path:
    """Write ``backbone``'s state dict and ``meta`` (JSON in the safetensors metadata) to ``path``."""
    from safetensors.torch import save_file

    state = {k: v.detach().cpu().contiguous() for k, v in backbone.state_dict().items()}
    save_file(state, str(path), metadata={"selfsup": json.dumps({"format": FORMAT, **meta})})
    return path


def read_meta(path: Path) -> dict:
    """The selfsup metadata of an exported backbone file."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            raw = (f.metadata() or {}).get("selfsup")
    except Exception as e:  # safetensors raises its own error types for corrupt headers
        raise UserError(f"{path} is not a readable safetensors file ({' '.join(str(e).split())[:120]})") from None
    if not raw:
        raise UserError(f"{path} is not a selfsup exported backbone (no 'selfsup' metadata); export one with selfsup pretrain")
    meta = json.loads(raw)
    if meta.get("format") != FORMAT:
        raise UserError(f"{path} has backbone format {meta.get('format')!r}; this selfsup reads {FORMAT}")
    return meta


def rebuild_backbone(meta: dict) -> nn.Module:
    """The (randomly initialised) backbone ``meta`` describes, by name (a flow run's is its ``flow_encoder``)."""
    return build_backbone(meta["backbone"], **meta["kwargs"])


def load_exported(path: Path) -> tuple[nn.Module, dict]:
    """Rebuild the backbone of an exported file and load its weights; returns (module, meta)."""
    from safetensors.torch import load_file

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
