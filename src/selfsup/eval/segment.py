"""Dense evaluation of frozen patch features (``selfsup eval segment``), pure: a backbone's patch feature map, the
two protocols on it and the mIoU.

- Patches: a selfsup ViT's patch tokens after the final norm (the class token and registers dropped) on its
  g × g grid; a ConvNet's or ResNet's last feature map; a timm model's ``forward_features`` (a map, or tokens after
  its ``num_prefix_tokens``).
- Linear: DINOv2's "linear" head, ``BNHead`` (dinov2 eval/segmentation/models/decode_heads/linear_head.py:14-21,
  86-90): BatchNorm on the patch features, then a 1×1 linear layer to the class logits (its weight normal std 0.01,
  bias 0: the head's init_cfg, notebooks/semantic_segmentation.ipynb's log); logits upsampled bilinearly
  (align_corners False) to the label size; cross-entropy with 255 ignored, averaged over every pixel (mmseg's
  ``avg_non_ignore=False``, the same log). ``head_bn=False``: the linear layer alone. Trained on the cached features
  with AdamW, a linear warm-up and a linear decay to 0, per step, seeded.
- kNN: each test patch's class scores by a weighted (DINO's exp(sim/T)) or majority vote of its k nearest training
  patches (cosine), searched among a seeded subset of them; a training patch's label is the majority label of its
  pixels (ignored pixels left out; ties to the lower class; a patch of ignored pixels only is left out); the score
  maps are upsampled to the label size as the linear head's logits, the arg max is the prediction.
- mIoU: the confusion matrix summed over every scored pixel of the test split (mmsegmentation's
  ``total_intersect_and_union``), IoU = TP / (TP + FP + FN) per class, averaged over the classes that occur in the
  labels or the predictions (mmseg's nan-mean: a class with an empty union is left out), the background class
  included; ``miou_fg`` leaves class 0 out (a canvas's background).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import torchvision
from torch import Tensor, nn

from selfsup.data.dense import IGNORE
from selfsup.errors import UserError
from selfsup.eval.knn import knn_predict_scores
from selfsup.eval_configs import SegmentConfig as SegmentConfig  # the config, declared without torch
from selfsup.models.convnet import ConvNet
from selfsup.models.vit import VisionTransformer


def patch_map(backbone: nn.Module, x: Tensor) -> Tensor:
    """The (B, D, h, w) patch features of normalised images ``x`` (see the module's list)."""
    if isinstance(backbone, VisionTransformer):
        tokens = backbone.forward_features(x)[:, backbone.prefix:]
        g = x.shape[-1] // backbone.patch_size
        return tokens.transpose(1, 2).reshape(x.shape[0], -1, g, g)
    if isinstance(backbone, ConvNet):
        return backbone.features(x)
    if isinstance(backbone, torchvision.models.ResNet):
        stem = [backbone.conv1, backbone.bn1, backbone.relu, backbone.maxpool]
        return nn.Sequential(*stem, backbone.layer1, backbone.layer2, backbone.layer3, backbone.layer4)(x)
    if hasattr(backbone, "forward_features") and hasattr(backbone, "num_prefix_tokens"):  # a timm ViT
        tokens = backbone.forward_features(x)[:, backbone.num_prefix_tokens:]
        g = math.isqrt(tokens.shape[1])
        return tokens.transpose(1, 2).reshape(x.shape[0], -1, g, tokens.shape[1] // g)
    if hasattr(backbone, "forward_features"):  # a timm ConvNet: (B, D, h, w)
        out = backbone.forward_features(x)
        if out.ndim == 4:
            return out
    raise UserError(f"eval segment reads patch features of a ViT, a ConvNet or a ResNet; a {type(backbone).__name__} "
                    "gives none (a flow run's encoder, --last-blocks or an --embedding with heads)")


@torch.no_grad()
def patch_maps(backbone: nn.Module, images: Tensor, mean, std, batch_size: int, device: torch.device) -> Tensor:
    """(N, D, h, w) float32 patch features on the CPU of uint8 ``images`` (N, C, S, S), normalised with the
    backbone's ``mean`` / ``std``, at their own size, in eval mode."""
    was_training = backbone.training
    backbone.eval().to(device)
    m = torch.tensor(mean, device=device).view(1, -1, 1, 1)
    s = torch.tensor(std, device=device).view(1, -1, 1, 1)
    out = []
    try:
        for i in range(0, len(images), batch_size):
            x = (images[i:i + batch_size].to(device).float() / 255 - m) / s
            try:
                out.append(patch_map(backbone, x).float().cpu())
            except (ValueError, RuntimeError) as e:
                raise UserError(f"the backbone does not take the task's {images.shape[-1]}x{images.shape[-1]} "
                                f"images ({str(e).splitlines()[0]}); choose another --size or task") from None
    finally:
        backbone.train(was_training)
    return torch.cat(out)


def patch_labels(masks: Tensor, grid: tuple[int, int], num_classes: int, chunk: int = 64) -> Tensor:
    """(N, h, w) long: the majority label of each patch's pixels (adaptive cells where the grid does not divide the
    label size), ignored pixels left out, ties to the lower class; ``IGNORE`` where a patch has no scored pixel."""
    out = []
    for i in range(0, len(masks), chunk):
        m = masks[i:i + chunk].long()
        scored = m != IGNORE
        onehot = F.one_hot(torch.where(scored, m, num_classes), num_classes + 1)[..., :num_classes]
        share = F.adaptive_avg_pool2d(onehot.permute(0, 3, 1, 2).float(), grid)
        label = share.argmax(1)
        out.append(torch.where(share.sum(1) > 0, label, IGNORE))
    return torch.cat(out)


def confusion(pred: Tensor, target: Tensor, num_classes: int) -> Tensor:
    """(C, C) int64 counts, rows the label, columns the prediction, over the pixels whose label is not ``IGNORE``."""
    keep = target != IGNORE
    index = target[keep].long() * num_classes + pred[keep].long()
    return torch.bincount(index, minlength=num_classes * num_classes).reshape(num_classes, num_classes)


def miou(conf: Tensor, classes: tuple[str, ...]) -> dict:
    """mIoU (%) of a confusion matrix (the module's convention), the foreground mIoU without class 0, the pixel
    accuracy, and each class's IoU (None where its union is empty)."""
    conf = conf.double()
    tp = conf.diag()
    union = conf.sum(0) + conf.sum(1) - tp
    iou = torch.where(union > 0, tp / union.clamp(min=1), torch.nan)
    present = ~iou.isnan()
    fg = present.clone()
    fg[0] = False
    return {"miou": 100 * iou[present].mean().item(),
            "miou_fg": 100 * iou[fg].mean().item() if fg.any() else None,
            "pixel_acc": 100 * (tp.sum() / conf.sum().clamp(min=1)).item(),
            "iou": {name: (None if v != v else round(100 * v, 3)) for name, v in zip(classes, iou.tolist())}}


def upsampled_argmax(scores: Tensor, size: tuple[int, int]) -> Tensor:
    """Class scores (B, C, h, w) upsampled bilinearly (align_corners False) to ``size``, arg max over classes."""
    return F.interpolate(scores, size=size, mode="bilinear", align_corners=False).argmax(1)


class LinearSegHead(nn.Module):
    """DINOv2's ``BNHead``: BatchNorm2d (affine, as its SyncBatchNorm) then a 1×1 linear layer; ``bn=False``: the
    linear layer alone. The weight normal std 0.01, the bias 0, drawn from ``generator``."""

    def __init__(self, dim: int, num_classes: int, bn: bool, generator: torch.Generator):
        super().__init__()
        self.bn = nn.BatchNorm2d(dim) if bn else nn.Identity()
        self.conv_seg = nn.Conv2d(dim, num_classes, 1)
        nn.init.normal_(self.conv_seg.weight, std=0.01, generator=generator)
        nn.init.zeros_(self.conv_seg.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv_seg(self.bn(x))


def segment_loss(logits: Tensor, target: Tensor) -> Tensor:
    """Cross-entropy of logits (B, C, h, w) upsampled to the labels (B, S, S), averaged over every pixel, the
    ignored ones counted as 0 (mmseg's ``avg_non_ignore=False``)."""
    up = F.interpolate(logits, size=target.shape[-2:], mode="bilinear", align_corners=False)
    return F.cross_entropy(up, target.long(), ignore_index=IGNORE, reduction="none").mean()


def step_lr(step: int, steps: int, warmup: int, lr: float) -> float:
    """Linear warm-up from 0 over ``warmup`` steps, then linear decay to 0 at ``steps`` (mmseg's poly, power 1)."""
    if step < warmup:
        return lr * (step + 1) / warmup
    return lr * (1 - (step - warmup) / max(1, steps - warmup))


def train_linear(features: Tensor, masks: Tensor, num_classes: int, cfg: SegmentConfig,
                 device: torch.device) -> LinearSegHead:
    """The linear head trained on cached patch features (N, D, h, w) against the label maps (N, S, S)."""
    g = torch.Generator().manual_seed(cfg.seed)
    head = LinearSegHead(features.shape[1], num_classes, cfg.head_bn, g).to(device)
    opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    per_epoch = math.ceil(len(features) / cfg.batch_size)
    steps = cfg.epochs * per_epoch
    warmup = int(cfg.warmup * steps)
    head.train()
    for step in range(steps):
        if step % per_epoch == 0:
            order = torch.randperm(len(features), generator=g)
        idx = order[(step % per_epoch) * cfg.batch_size:][:cfg.batch_size]
        for group in opt.param_groups:
            group["lr"] = step_lr(step, steps, warmup, cfg.lr)
        loss = segment_loss(head(features[idx].to(device)), masks[idx].to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return head.eval()


@torch.no_grad()
def linear_segment(ftr: Tensor, mtr: Tensor, fte: Tensor, mte: Tensor, classes: tuple[str, ...],
                   cfg: SegmentConfig, device: torch.device) -> dict:
    """The linear protocol: the head trained on (ftr, mtr), its mIoU on (fte, mte), with its final training loss."""
    with torch.enable_grad():
        head = train_linear(ftr, mtr, len(classes), cfg, device)
    conf = torch.zeros(len(classes), len(classes), dtype=torch.long)
    for i in range(0, len(fte), cfg.batch_size):
        pred = upsampled_argmax(head(fte[i:i + cfg.batch_size].to(device)), tuple(mte.shape[-2:]))
        conf += confusion(pred.cpu(), mte[i:i + cfg.batch_size], len(classes))
    return {**miou(conf, classes), "epochs": cfg.epochs, "batch_size": cfg.batch_size, "lr": cfg.lr,
            "weight_decay": cfg.weight_decay, "warmup": cfg.warmup, "head_bn": cfg.head_bn}


def flat_patches(features: Tensor) -> Tensor:
    """(N, D, h, w) → (N·h·w, D), patch-major within each image."""
    return features.permute(0, 2, 3, 1).reshape(-1, features.shape[1])


@torch.no_grad()
def knn_segment(ftr: Tensor, mtr: Tensor, fte: Tensor, mte: Tensor, classes: tuple[str, ...],
                cfg: SegmentConfig, device: torch.device) -> dict:
    """The patch kNN protocol (the module's description); its mIoU on (fte, mte)."""
    C, grid = len(classes), tuple(ftr.shape[-2:])
    labels = patch_labels(mtr, grid, C).reshape(-1)
    train = flat_patches(ftr)
    keep = (labels != IGNORE).nonzero().squeeze(1)
    if cfg.max_train_patches and len(keep) > cfg.max_train_patches:
        pick = torch.randperm(len(keep), generator=torch.Generator().manual_seed(cfg.seed))[:cfg.max_train_patches]
        keep = keep[pick.sort().values]
    k = min(cfg.k, len(keep))
    bank, bank_labels = train[keep].to(device), labels[keep].to(device)
    conf = torch.zeros(C, C, dtype=torch.long)
    per = max(1, 4096 // (grid[0] * grid[1]))  # test images per search
    for i in range(0, len(fte), per):
        f = fte[i:i + per]
        scores = knn_predict_scores(bank, bank_labels, flat_patches(f).to(device), k, cfg.temperature, C)
        scores = scores.reshape(len(f), *grid, C).permute(0, 3, 1, 2)
        conf += confusion(upsampled_argmax(scores, tuple(mte.shape[-2:])).cpu(), mte[i:i + per], C)
    return {**miou(conf, classes), "k": k, "temperature": cfg.temperature, "train_patches": len(keep),
            "label_rule": "majority of the patch's pixels"}
