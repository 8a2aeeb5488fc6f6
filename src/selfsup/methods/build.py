"""Building a run's method from its config: data info, the seeded LightningModule, backbone metadata.

These live beside the methods (not in the engine), so that evaluation can rebuild a model
without importing the trainer.
"""

from __future__ import annotations

import torch

from selfsup.errors import UserError
from selfsup.methods import METHODS, method_name
from selfsup.methods.base import DataInfo, backbone_kwargs


def data_info(cfg, dataset) -> DataInfo:
    """Channels, model input size, normalisation and classes of the run's dataset.

    Flow methods see their data at its own size, scaled to [−1, 1] (mean = std = 0.5; latents as they are);
    their model size (data.image_size) is the method's business (``models.sit.fit_images``).
    """
    if getattr(METHODS[method_name(cfg.method)], "family", "joint") == "flow":
        c = dataset.channels
        latents = dataset.images.dtype != torch.uint8
        mean, std = ((0.0,) * c, (1.0,) * c) if latents else ((0.5,) * c, (0.5,) * c)
        return DataInfo(c, dataset.image_size, mean, std, dataset.num_classes)
    image_size = cfg.data.image_size or dataset.image_size
    return DataInfo(dataset.channels, image_size, tuple(dataset.mean), tuple(dataset.std), dataset.num_classes)


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
    if getattr(METHODS[method_name(cfg.method)], "family", "joint") == "flow":
        from selfsup.flow.build import flow_backbone_meta

        return flow_backbone_meta(cfg, info)
    return {"backbone": cfg.model.backbone, "kwargs": backbone_kwargs(cfg, info), "image_size": info.image_size,
            "in_chans": info.channels, "mean": list(info.mean), "std": list(info.std), "dataset": cfg.data.name,
            "method": method_name(cfg.method)}
