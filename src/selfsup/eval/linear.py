"""Linear probing, MoCo v3 protocol (main_lincls.py): frozen backbone in eval mode, one Linear classifier.

Classifier init N(0, 0.01) with zero bias; SGD momentum 0.9, weight decay 0; lr = base · batch / 256
with a per-epoch cosine and no warmup; at the end a check that no backbone parameter or buffer moved.
Two paths: ``probe_augmented`` (RandomResizedCrop scale (0.08, 1) + flip on the device, backbone
forward each step; main_lincls.py's crop whatever the pretraining crop was) and ``probe_features``
(cached features, no augmentation: the fast path for small data and CPUs).

A single fixed lr under-reports a representation whose features are scaled differently, so both paths
train a grid of (lr, weight decay) points at once, as DINO's eval_linear does: one Linear head per
point (``GridLinear``, one batched matmul), all fed the same frozen features of each batch. The point
is chosen by top-1 on a validation split carved from the training set (``val_fraction``), and the test
accuracy is reported at that point.

``protocol="mae"`` (``ProbeConfig.for_protocol("mae")``) is MAE's probe (main_linprobe.py): BatchNorm1d(affine=False,
eps 1e-6) before each head, the head trunc-normal std 0.01 with zero bias, LARS (``optim.LARS``: trust
0.001, momentum 0.9, no decay or adaptation of 1-d tensors; util/lars.py:14-47) with weight decay 0 and
lr = 0.1 · batch / 256, 10 warm-up epochs then a half-cycle cosine to 0, set every iteration on the
fractional epoch (util/lr_sched.py:9-21), 90 epochs; no validation split for its single lr. Each grid
point is a head of its own tensors (``LarsHeads``) so that LARS's trust ratio is that head's. The feature
is the backbone's (the class token after the final norm for the MAE presets: the official ``--cls_token``).
Left out: the official reports the best test top-1 over epochs (here the last epoch's) and, on the
augmented path, crops with its TF-style RandomResizedCrop (here the library's).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from selfsup.data.datasets import FolderImages, ImageDataset
from selfsup.data.views import AugmentConfig, EvalTransform, MultiViewAugment
from selfsup.eval.knn import topk_accuracy
from selfsup.eval.splits import val_split
from selfsup.eval_configs import MAE_BASE_LR as MAE_BASE_LR  # the config and its protocols, declared without torch
from selfsup.eval_configs import PROTOCOL_DEFAULTS as PROTOCOL_DEFAULTS
from selfsup.eval_configs import PROTOCOLS as PROTOCOLS
from selfsup.eval_configs import ProbeConfig
from selfsup.optim import LARS
from selfsup.schedules import scaled_lr, warmup_cosine


def mae_probe_config(**overrides) -> ProbeConfig:
    """MAE's linear probe: ``ProbeConfig.for_protocol("mae", **overrides)``."""
    return ProbeConfig.for_protocol("mae", **overrides)


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
def _predict_features(fc: nn.Module, feats: Tensor, batch_size: int = 4096) -> Tensor:
    return torch.cat([fc(feats[i : i + batch_size]) for i in range(0, len(feats), batch_size)], dim=-2)


class GridLinear(nn.Module):
    """G independent Linear(dim, C) heads evaluated with one batched matmul: (B, dim) → (G, B, C).

    Each head is initialised as ``make_classifier`` (weight N(0, 0.01), zero bias) and trained by
    ``GridSGD`` with its own lr and weight decay; the heads share nothing but their input.
    """

    def __init__(self, dim: int, num_classes: int, heads: int, feature_bn: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(heads, dim, num_classes) * 0.01)
        self.bias = nn.Parameter(torch.zeros(heads, 1, num_classes))
        # MAE main_linprobe.py: BatchNorm1d(affine=False, eps=1e-6) before the head (no parameters of its own)
        self.norm = nn.BatchNorm1d(dim, affine=False, eps=1e-6) if feature_bn else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        x = self.norm(x)
        return torch.baddbmm(self.bias, x.unsqueeze(0).expand(self.weight.shape[0], -1, -1), self.weight)

    def loss(self, x: Tensor, y: Tensor) -> Tensor:
        """The sum over heads of each head's mean cross-entropy: every head gets its own gradient."""
        return grid_loss(self(x), y)


def grid_loss(logits: Tensor, y: Tensor) -> Tensor:
    """Σ over heads of each head's mean cross-entropy, from (G, B, C) logits."""
    g, b, c = logits.shape
    return F.cross_entropy(logits.reshape(g * b, c), y.repeat(g), reduction="sum") / b


class LarsHeads(nn.Module):
    """MAE's probe head per grid point (main_linprobe.py): BatchNorm1d(dim, affine=False, eps 1e-6), which has
    no parameters and so is shared, then G Linear(dim, C) of their own tensors, weight trunc-normal std 0.01
    and zero bias: (B, dim) → (G, B, C)."""

    def __init__(self, dim: int, num_classes: int, heads: int, feature_bn: bool = True):
        super().__init__()
        self.norm = nn.BatchNorm1d(dim, affine=False, eps=1e-6) if feature_bn else nn.Identity()
        self.heads = nn.ModuleList(nn.Linear(dim, num_classes) for _ in range(heads))
        for head in self.heads:
            nn.init.trunc_normal_(head.weight, std=0.01)
            nn.init.zeros_(head.bias)

    def forward(self, x: Tensor) -> Tensor:
        x = self.norm(x)
        return torch.stack([head(x) for head in self.heads])

    def loss(self, x: Tensor, y: Tensor) -> Tensor:
        return grid_loss(self(x), y)


class GridSGD:
    """torch.optim.SGD (momentum, no dampening, coupled weight decay) with a per-head lr and weight decay."""

    def __init__(self, params, lrs: Tensor, wds: Tensor, momentum: float):
        self.params, self.momentum = list(params), momentum
        self.lrs, self.wds = lrs, wds
        self.buffers = [torch.zeros_like(p) for p in self.params]
        self.scale = 1.0  # the epoch's cosine factor

    @torch.no_grad()
    def step(self) -> None:
        for p, buf in zip(self.params, self.buffers):
            shape = (-1,) + (1,) * (p.ndim - 1)
            d_p = p.grad + self.wds.view(shape) * p
            buf.mul_(self.momentum).add_(d_p)
            p.sub_(self.lrs.view(shape) * self.scale * buf)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None


def grid_points(cfg: ProbeConfig, base_lr: float, batch_size: int) -> list[tuple[float, float, float]]:
    """(base lr, lr = base · batch / 256, weight decay) for every point of the grid."""
    lrs = cfg.lr_grid or (base_lr,)
    wds = cfg.wd_grid or (cfg.weight_decay,)
    return [(b, scaled_lr(b, batch_size), wd) for wd in wds for b in lrs]


def _choose(points, val_scores: Tensor | None, val_y: Tensor | None, test_scores: Tensor, test_y: Tensor) -> dict:
    """The grid with each point's val and test top-1; the point with the best val top-1 (ties: the first)."""
    grid = []
    for i, (base, lr, wd) in enumerate(points):
        row = {"base_lr": base, "lr": lr, "weight_decay": wd,
               "test_top1": topk_accuracy(test_scores[i], test_y)["top1"]}
        if val_scores is not None:
            row["val_top1"] = topk_accuracy(val_scores[i], val_y)["top1"]
        grid.append(row)
    key = "val_top1" if val_scores is not None else "test_top1"
    best = max(range(len(grid)), key=lambda i: (grid[i][key], -i))
    return {"grid": grid, "chosen": grid[best], "best": best}


def train_grid(dim: int, num_classes: int, points, cfg: ProbeConfig, batches, dev,
               steps_per_epoch: int = 1) -> tuple[nn.Module, float]:
    """Train one head per grid point over ``batches(epoch)`` → iterable of (features, labels): MoCo v3's SGD
    with a cosine per epoch, or MAE's LARS (``train_lars``)."""
    if cfg.protocol == "mae":
        return train_lars(dim, num_classes, points, cfg, batches, dev, steps_per_epoch)
    fc = GridLinear(dim, num_classes, len(points), cfg.feature_bn).to(dev).train()
    opt = GridSGD(fc.parameters(), torch.tensor([p[1] for p in points], device=dev),
                  torch.tensor([p[2] for p in points], device=dev), cfg.momentum)
    loss = torch.zeros(())
    for epoch in range(cfg.epochs):
        opt.scale = cosine_epoch_lr(1.0, epoch, cfg.epochs)
        for feats, labels in batches(epoch):
            loss = fc.loss(feats.float(), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return fc, float(loss.detach()) / len(points)


def mae_lr(peak: float, epoch: float, cfg: ProbeConfig) -> float:
    """util/lr_sched.py: ``peak · epoch / warmup`` during the warm-up, then a half-cycle cosine to ``min_lr``, on
    the fractional epoch."""
    return warmup_cosine(epoch, cfg.epochs, cfg.warmup_epochs, peak, cfg.min_lr)


def train_lars(dim: int, num_classes: int, points, cfg: ProbeConfig, batches, dev,
               steps_per_epoch: int) -> tuple[LarsHeads, float]:
    """MAE's probe: ``LarsHeads`` trained by ``optim.LARS``, one parameter group per head at that point's lr and
    weight decay, the lr set before every step on the fractional epoch ``epoch + i / steps_per_epoch``."""
    fc = LarsHeads(dim, num_classes, len(points), cfg.feature_bn).to(dev).train()
    opt = LARS([{"params": list(head.parameters()), "peak": lr, "weight_decay": wd}
                for head, (_, lr, wd) in zip(fc.heads, points)], momentum=cfg.momentum)
    loss = torch.zeros(())
    for epoch in range(cfg.epochs):
        for i, (feats, labels) in enumerate(batches(epoch)):
            for group in opt.param_groups:
                group["lr"] = mae_lr(group["peak"], epoch + i / steps_per_epoch, cfg)
            loss = fc.loss(feats.float(), labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return fc, float(loss.detach()) / len(points)


def probe_features(train_x: Tensor, train_y: Tensor, test_x: Tensor, test_y: Tensor, num_classes: int,
                   cfg: ProbeConfig, base_lr: float, device: torch.device | str = "cpu") -> dict:
    """The protocol on fixed (cached) features, no augmentation, over the (lr, wd) grid: top-1/top-5 (%)
    on test (and train) at the point chosen on the validation split, and the whole grid."""
    torch.manual_seed(cfg.seed)
    dev = torch.device(device)
    fit_idx, val_idx = val_split(len(train_y), cfg.val_fraction, cfg.seed)
    tx, ty = train_x[fit_idx].float().to(dev), train_y[fit_idx].to(dev)
    points = grid_points(cfg, base_lr, min(cfg.batch_size, len(ty)))
    g = torch.Generator().manual_seed(cfg.seed)

    def batches(epoch):
        for idx in _batches(len(ty), cfg.batch_size, g):
            idx = idx.to(dev)
            yield tx[idx], ty[idx]

    fc, final_loss = train_grid(tx.shape[1], num_classes, points, cfg, batches, dev,
                                math.ceil(len(ty) / cfg.batch_size))
    fc.eval()
    val = _predict_features(fc, train_x[val_idx].float().to(dev)).cpu() if len(val_idx) else None
    out = _choose(points, val, train_y[val_idx], _predict_features(fc, test_x.float().to(dev)).cpu(), test_y)
    best = out.pop("best")
    return {"test": topk_accuracy(_predict_features(fc, test_x.float().to(dev))[best].cpu(), test_y),
            "train": topk_accuracy(_predict_features(fc, tx)[best].cpu(), ty.cpu()), **out,
            "val_size": len(val_idx), "final_loss": final_loss}


def probe_augmented(backbone: nn.Module, train: ImageDataset, test: ImageDataset, meta: dict, cfg: ProbeConfig,
                    base_lr: float, device: torch.device | str = "cpu", batch_size_eval: int = 512) -> dict:
    """The protocol with RandomResizedCrop + flip over the (lr, wd) grid: the backbone (eval mode, no grad)
    runs once per batch and every head trains on its features. An image folder is cropped from the whole
    file at decode time (``FolderCrops``), per (seed, epoch, index)."""
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
    fit_idx, val_idx = val_split(len(train), cfg.val_fraction, cfg.seed)  # indices: a folder stays lazy
    points = grid_points(cfg, base_lr, min(cfg.batch_size, len(fit_idx)))
    amp = dev.type == "cuda"
    g_order = torch.Generator().manual_seed(cfg.seed)
    g_aug = torch.Generator(device=dev).manual_seed(cfg.seed)

    folder = isinstance(train.images, FolderImages)  # crop the whole file at decode time, not the centre square
    crops = train.images.train_crops([(cfg.crop_min, 1.0)], cfg.seed) if folder else None

    def batches(epoch):
        for idx in _batches(len(fit_idx), cfg.batch_size, g_order):
            index = fit_idx[idx]
            images, labels = (crops.crops(index, epoch), train.labels[index]) if folder else train[index]
            (x,) = augment(images.to(dev, non_blocking=True), g_aug)
            with torch.no_grad(), torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
                feats = backbone(x)
            yield feats, labels.to(dev)

    fc, final_loss = train_grid(backbone.num_features, train.num_classes, points, cfg, batches, dev,
                                math.ceil(len(fit_idx) / cfg.batch_size))
    assert_unchanged(backbone, before)
    fc.eval()  # the feature BN scores with its running statistics
    transform = EvalTransform(size, mean, std).to(dev)

    @torch.no_grad()
    def scores(dataset, index):
        out, labels = [], []
        for chunk in index.split(batch_size_eval):
            images, y = dataset[chunk]
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
                feats = backbone(transform(images.to(dev)))
            out.append(fc(feats.float()).cpu())
            labels.append(y)
        return torch.cat(out, dim=1), torch.cat(labels)

    val_scores, val_y = scores(train, val_idx) if len(val_idx) else (None, None)
    test_scores, test_y = scores(test, torch.arange(len(test)))
    out = _choose(points, val_scores, val_y, test_scores, test_y)
    best = out.pop("best")
    return {"test": topk_accuracy(test_scores[best], test_y), **out, "val_size": len(val_idx),
            "final_loss": final_loss}
