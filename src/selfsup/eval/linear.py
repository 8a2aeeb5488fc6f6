"""Linear probing, MoCo v3 protocol (main_lincls.py): frozen backbone in eval mode, one Linear classifier.

Classifier init N(0, 0.01) with zero bias; SGD momentum 0.9, weight decay 0; lr = base · batch / 256
with a per-epoch cosine and no warmup; at the end a check that no backbone parameter or buffer moved.
Two paths: ``probe_augmented`` (RandomResizedCrop + flip on the device, backbone forward each step)
and ``probe_features`` (cached features, no augmentation: the fast path for small data and CPUs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from selfsup.data.datasets import ImageDataset
from selfsup.data.views import AugmentConfig, EvalTransform, MultiViewAugment
from selfsup.eval.knn import topk_accuracy


@dataclass
class ProbeConfig:
    """The probe's schedule; ``base_lr`` None picks MoCo v3's (3.0 for ViT, 0.1 otherwise)."""

    epochs: int = 90
    batch_size: int = 256
    base_lr: float | None = None
    momentum: float = 0.9
    weight_decay: float = 0.0
    crop_min: float = 0.08  # augmented path: RandomResizedCrop scale=(crop_min, 1)
    hflip_p: float = 0.5
    seed: int = 0


def default_base_lr(backbone_name: str) -> float:
    """MoCo v3 linear-probe base lr: 3 for ViT, 0.1 for ResNet (lr = base · batch / 256)."""
    return 3.0 if "vit" in backbone_name else 0.1


def make_classifier(dim: int, num_classes: int) -> nn.Linear:
    """Linear(dim, C) with weight ~ N(0, 0.01) and zero bias (main_lincls.py)."""
    fc = nn.Linear(dim, num_classes)
    nn.init.normal_(fc.weight, mean=0.0, std=0.01)
    nn.init.zeros_(fc.bias)
    return fc


def cosine_epoch_lr(lr: float, epoch: int, epochs: int) -> float:
    """main_lincls.py adjust_learning_rate: lr · ½ (1 + cos(π epoch / epochs)), set once per epoch."""
    return lr * 0.5 * (1.0 + math.cos(math.pi * epoch / epochs))


def _sgd(fc: nn.Module, cfg: ProbeConfig, lr: float) -> torch.optim.SGD:
    return torch.optim.SGD(fc.parameters(), lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


def _batches(n: int, batch_size: int, g: torch.Generator):
    order = torch.randperm(n, generator=g)
    return order.split(batch_size)


def snapshot(module: nn.Module) -> dict[str, Tensor]:
    """A copy of every parameter and buffer."""
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def assert_unchanged(module: nn.Module, before: dict[str, Tensor]) -> None:
    """main_lincls.py sanity_check: raise if any backbone parameter or buffer differs from ``before``."""
    for name, value in module.state_dict().items():
        if not torch.equal(value.detach().cpu(), before[name].cpu()):
            raise RuntimeError(f"the frozen backbone changed during linear probing ({name}); this is a bug")


@torch.no_grad()
def _predict_features(fc: nn.Linear, feats: Tensor, batch_size: int = 4096) -> Tensor:
    return torch.cat([fc(feats[i : i + batch_size]) for i in range(0, len(feats), batch_size)])


def probe_features(train_x: Tensor, train_y: Tensor, test_x: Tensor, test_y: Tensor, num_classes: int,
                   cfg: ProbeConfig, lr: float, device: torch.device | str = "cpu") -> dict:
    """The protocol on fixed (cached) features: no augmentation; returns top-1/top-5 (%) on test and train."""
    torch.manual_seed(cfg.seed)
    dev = torch.device(device)
    fc = make_classifier(train_x.shape[1], num_classes).to(dev)
    opt = _sgd(fc, cfg, lr)
    tx, ty = train_x.float().to(dev), train_y.to(dev)
    g = torch.Generator().manual_seed(cfg.seed)
    for epoch in range(cfg.epochs):
        for group in opt.param_groups:
            group["lr"] = cosine_epoch_lr(lr, epoch, cfg.epochs)
        for idx in _batches(len(ty), cfg.batch_size, g):
            idx = idx.to(dev)
            loss = F.cross_entropy(fc(tx[idx]), ty[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    fc.eval()
    return {"test": topk_accuracy(_predict_features(fc, test_x.float().to(dev)), test_y),
            "train": topk_accuracy(_predict_features(fc, tx), ty), "final_loss": float(loss.detach())}


def probe_augmented(backbone: nn.Module, train: ImageDataset, test: ImageDataset, meta: dict, cfg: ProbeConfig,
                    lr: float, device: torch.device | str = "cpu", batch_size_eval: int = 512) -> dict:
    """The protocol with RandomResizedCrop + flip: the backbone (eval mode, no grad) runs every step."""
    from selfsup.data.loader import sequential_loader

    torch.manual_seed(cfg.seed)
    dev = torch.device(device)
    backbone.eval().to(dev)
    for p in backbone.parameters():
        p.requires_grad_(False)
    before = snapshot(backbone)
    branch = AugmentConfig(crop_min=cfg.crop_min, hflip_p=cfg.hflip_p, jitter_p=0.0, grayscale_p=0.0, blur_p=0.0,
                           solarize_p=0.0)
    size, mean, std = meta["image_size"], meta["mean"], meta["std"]
    augment = MultiViewAugment([branch], size, mean, std).to(dev)
    fc = make_classifier(backbone.num_features, train.num_classes).to(dev)
    opt = _sgd(fc, cfg, lr)
    amp = dev.type == "cuda"
    g_order = torch.Generator().manual_seed(cfg.seed)
    g_aug = torch.Generator(device=dev).manual_seed(cfg.seed)
    for epoch in range(cfg.epochs):
        for group in opt.param_groups:
            group["lr"] = cosine_epoch_lr(lr, epoch, cfg.epochs)
        for idx in _batches(len(train), cfg.batch_size, g_order):
            images, labels = train[idx]
            (x,) = augment(images.to(dev, non_blocking=True), g_aug)
            with torch.no_grad(), torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
                feats = backbone(x)
            loss = F.cross_entropy(fc(feats.float()), labels.to(dev))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    assert_unchanged(backbone, before)
    transform = EvalTransform(size, mean, std).to(dev)
    scores, labels = [], []
    with torch.no_grad():
        for images, y in sequential_loader(test, batch_size_eval):
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
                feats = backbone(transform(images.to(dev)))
            scores.append(fc(feats.float()).cpu())
            labels.append(y)
    return {"test": topk_accuracy(torch.cat(scores), torch.cat(labels)), "final_loss": float(loss.detach())}
