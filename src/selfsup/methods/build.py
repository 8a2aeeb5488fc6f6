"""Building a run's method from its config: data info, the seeded LightningModule, backbone metadata.

These live beside the methods (not in the engine), so that evaluation can rebuild a model
without importing the trainer. Each question goes to the run's method class, whatever its family: the config
resolved it once (``RunConfig.method_cls``, ``RunConfig.method_name``).
"""

from __future__ import annotations

import lightning.pytorch as pl

from selfsup.errors import UserError
from selfsup.interventions import cut_init
from selfsup.methods.base import DataInfo


def data_info(cfg, dataset) -> DataInfo:
    """Channels, model input size, normalisation and classes of the run's dataset, as the method sees them."""
    return cfg.method_cls.data_info(cfg, dataset)


def build_method(cfg, info: DataInfo):
    """The LightningModule of ``cfg.method`` (seeded, so the init is reproducible), cut-initialised if asked."""
    pl.seed_everything(cfg.trainer.seed, workers=True, verbose=False)
    try:
        model = cfg.method_cls(cfg, info)
        cut_init(model, cfg.interventions.cut_init, cfg.interventions.cut_init_scope)
    except ValueError as e:  # e.g. image size not divisible by the patch size, or channel mismatch
        raise UserError(f"{' '.join(str(e).split())}") from None
    return model


def backbone_meta(cfg, info: DataInfo) -> dict:
    """How to rebuild the backbone (stored in the exported file), with the method's registered name."""
    return {**cfg.method_cls.backbone_meta(cfg, info), "method": cfg.method_name}
