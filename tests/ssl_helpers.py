"""Tiny configurations and models for the method and DDP tests (shared; importable from spawned workers)."""

from __future__ import annotations

import torch

from selfsup.config import resolve

METHOD_NAMES = ("moco_v3", "byol", "simsiam", "simclr")

HEADS = {
    "moco_v3": dict(proj_hidden_dim=64, dim=32, pred_hidden_dim=64, temperature=0.2),
    "byol": dict(proj_hidden_dim=64, dim=32, pred_hidden_dim=64),
    "simsiam": dict(proj_hidden_dim=64, dim=32, pred_hidden_dim=32),
    "simclr": dict(proj_hidden_dim=64, dim=32, temperature=0.2),
    "mae": dict(decoder_embed_dim=32, decoder_depth=1, decoder_num_heads=2),
}


def tiny_config(method: str, method_extra: dict | None = None, **sections):
    """A resolved RunConfig: micro ViT (8×8, patch 2, frozen patch projection), narrow heads, digits."""
    data = {
        "method": {"name": method, **HEADS[method], **(method_extra or {})},
        "data": {"name": "digits", "batch_size": 16},
        "model": {"backbone": "vit_micro", "patch_size": 2, "stop_grad_conv1": True},
        "optim": {"name": "adamw", "base_lr": 1e-3, "weight_decay": 0.05, "warmup_epochs": 0},
        "trainer": {"accelerator": "cpu", "devices": 1, "progress_bar": False, "max_epochs": 1},
    }
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return resolve(data)


def tiny_method(method: str, method_extra: dict | None = None, **sections):
    from selfsup.methods.build import build_method
    from selfsup.methods import DataInfo

    return build_method(tiny_config(method, method_extra, **sections), DataInfo(1, 8, (0.5,), (0.25,)))


def random_views(batch: int = 8, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, 1, 8, 8, generator=g), torch.randn(batch, 1, 8, 8, generator=g)]
