"""Building a run's method from its config: data info, the seeded LightningModule, backbone metadata.

These live beside the methods (not in the engine), so that evaluation can rebuild a model
without importing the trainer.
"""

from __future__ import annotations

from selfsup.errors import UserError
from selfsup.methods import METHODS, method_name
from selfsup.methods.base import DataInfo, backbone_kwargs


def data_info(cfg, dataset) -> DataInfo:
    """Channels, model input size and normalisation of the run's dataset."""
    image_size = cfg.data.image_size or dataset.image_size
    return DataInfo(dataset.channels, image_size, tuple(dataset.mean), tuple(dataset.std))


def build_method(cfg, info: DataInfo):
    """The LightningModule of ``cfg.method`` (seeded, so the init is reproducible), cut-initialised if asked."""
    import lightning.pytorch as pl

    pl.seed_everything(cfg.trainer.seed, workers=True, verbose=False)
    from selfsup.interventions import cut_init

    try:
        model = METHODS[method_name(cfg.method)](cfg, info)
        cut_init(model, cfg.interventions.cut_init, cfg.interventions.cut_init_scope)
    except ValueError as e:  # e.g. image size not divisible by the patch size, or channel mismatch
        raise UserError(f"{' '.join(str(e).split())}") from None
    return model


def backbone_meta(cfg, info: DataInfo) -> dict:
    """How to rebuild the backbone (stored in the exported file)."""
    return {"backbone": cfg.model.backbone, "kwargs": backbone_kwargs(cfg, info), "image_size": info.image_size,
            "in_chans": info.channels, "mean": list(info.mean), "std": list(info.std), "dataset": cfg.data.name,
            "method": method_name(cfg.method)}
