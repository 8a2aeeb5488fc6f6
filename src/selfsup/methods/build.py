"""Building a run's method from its config: data info, the seeded LightningModule, backbone metadata.

These live beside the methods (not in the engine), so that evaluation can rebuild a model
without importing the trainer. Each question goes to the registered method class, whatever its family.
"""

from __future__ import annotations

from selfsup.errors import UserError
from selfsup.methods import METHODS, method_name
from selfsup.methods.base import DataInfo


def method_class(cfg) -> type:
    """The registered class of ``cfg.method``."""
    return METHODS[method_name(cfg.method)]


def data_info(cfg, dataset) -> DataInfo:
    """Channels, model input size, normalisation and classes of the run's dataset, as the method sees them."""
    return method_class(cfg).data_info(cfg, dataset)


def build_method(cfg, info: DataInfo):
    """The LightningModule of ``cfg.method`` (seeded, so the init is reproducible), cut-initialised if asked."""
    import lightning.pytorch as pl

    pl.seed_everything(cfg.trainer.seed, workers=True, verbose=False)
    from selfsup.interventions import cut_init

    try:
        model = method_class(cfg)(cfg, info)
        cut_init(model, cfg.interventions.cut_init, cfg.interventions.cut_init_scope)
    except ValueError as e:  # e.g. image size not divisible by the patch size, or channel mismatch
        raise UserError(f"{' '.join(str(e).split())}") from None
    return model


def backbone_meta(cfg, info: DataInfo) -> dict:
    """How to rebuild the backbone (stored in the exported file), with the method's registered name."""
    return {**method_class(cfg).backbone_meta(cfg, info), "method": method_name(cfg.method)}
