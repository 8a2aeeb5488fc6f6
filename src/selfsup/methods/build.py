"""Building a run's method from its config: data info, the seeded LightningModule, backbone metadata.

These live beside the methods (not in the engine), so that evaluation can rebuild a model
without importing the trainer. Each question goes to the run's method class, whatever its family: the config
resolved it once (``RunConfig.method_cls``, ``RunConfig.method_name``).
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch

from selfsup.errors import UserError
from selfsup.interventions import cut_init
from selfsup.methods.base import DataInfo
from selfsup.weights import load_weights as load_backbone_weights


def data_info(cfg, dataset) -> DataInfo:
    """Channels, model input size, normalisation and classes of the run's dataset, as the method sees them."""
    return cfg.method_cls.data_info(cfg, dataset)


def build_method(cfg, info: DataInfo, load_weights: bool = True):
    """The LightningModule of ``cfg.method`` (seeded, so the init is reproducible), cut-initialised if asked, its
    backbone started from ``model.weights`` where given (``load_weights=False``: a resumed run or an evaluation,
    which load a checkpoint next)."""
    pl.seed_everything(cfg.trainer.seed, workers=True, verbose=False)
    try:
        model = cfg.method_cls(cfg, info)
        cut_init(model, cfg.interventions.cut_init, cfg.interventions.cut_init_scope)
    except ValueError as e:  # e.g. image size not divisible by the patch size, or channel mismatch
        raise UserError(f"{' '.join(str(e).split())}") from None
    if cfg.model.weights and load_weights:
        start_from_weights(model, cfg)
    return model


def start_from_weights(model, cfg) -> None:
    """Load ``model.weights`` into the method's backbone after the method is built (so MAE's own init of its encoder
    and every head's init are those of a run from scratch with the same seed), then copy it into each momentum
    target of the backbone (DINO's teacher, BYOL's / MoCo v3's target: they start as the loaded student).
    ``model.start_weights`` keeps the facts (``run.json``'s ``weights``)."""
    if model.family != "joint":
        raise UserError(f"model.weights starts a joint-embedding backbone; method {cfg.method_name} trains its own "
                        "model: drop model.weights")
    if cfg.interventions.cut_init != 1:
        raise UserError("model.weights and interventions.cut_init both set the backbone's start; drop one of them")
    facts = load_backbone_weights(model.backbone, cfg.model.weights, "model.weights")
    for online, target in model.momentum_pairs:
        if online is model.backbone:
            own = online.state_dict()
            with torch.no_grad():
                for name, tensor in target.state_dict().items():
                    tensor.copy_(own[name])
    model.start_weights = facts.as_dict()


def backbone_meta(cfg, info: DataInfo) -> dict:
    """How to rebuild the backbone (stored in the exported file), with the method's registered name."""
    return {**cfg.method_cls.backbone_meta(cfg, info), "method": cfg.method_name}
