"""The exported backbone: one safetensors file whose keys are the plain model's (timm/torchvision).

Its metadata holds ``selfsup`` = JSON of how to rebuild it (backbone name, build_backbone kwargs,
image size, channels, normalisation). Without selfsup: build the same timm VisionTransformer or
torchvision ResNet and ``load_state_dict(safetensors.torch.load_file(path))``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from selfsup.errors import UserError

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
    """The (randomly initialised) backbone ``meta`` describes; a flow run's is its ``FlowEncoder``."""
    from selfsup.flow.encoder import FLOW_ENCODER
    from selfsup.models.backbones import build_backbone

    if meta["backbone"] == FLOW_ENCODER:
        from selfsup.flow.build import rebuild_encoder

        return rebuild_encoder(meta)
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
