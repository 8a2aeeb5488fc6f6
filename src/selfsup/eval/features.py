"""Frozen-backbone feature extraction: eval mode, batched, no gradient, mixed precision on GPU."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from selfsup.data.datasets import ImageDataset
from selfsup.data.loader import sequential_loader
from selfsup.data.views import EvalTransform
from selfsup.eval_configs import FEATURE_BATCH as FEATURE_BATCH  # declared without torch (selfsup eval's flags)


@torch.no_grad()
def extract_features(backbone: nn.Module, dataset: ImageDataset, image_size: int, mean, std,
                     batch_size: int = 512, device: torch.device | str | None = None) -> tuple[Tensor, Tensor]:
    """(features float32 N×D on CPU, labels N) of ``dataset`` through ``backbone`` in eval mode."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    was_training = backbone.training
    backbone.eval().to(device)
    transform = EvalTransform(image_size, mean, std).to(device)
    feats, labels = [], []
    amp = device.type == "cuda"
    try:
        for images, y in sequential_loader(dataset, batch_size, pin_memory=amp):
            x = transform(images.to(device, non_blocking=True))
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
                f = backbone(x)
            feats.append(f.float().cpu())
            labels.append(y)
    finally:
        backbone.train(was_training)  # a monitor calls this mid-training
    return torch.cat(feats), torch.cat(labels)
