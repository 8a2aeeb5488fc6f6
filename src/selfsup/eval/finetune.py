"""End-to-end fine-tuning (BEiT / MAE recipe): layer-wise lr decay, drop path, AdamW, warmup + cosine per step.

Layer decay: a ViT parameter of depth ``layer_id`` (VisionTransformer.layer_id: 0 embeddings, i+1 block i,
depth+1 the rest and the head) gets lr · decay^(depth + 1 − layer_id); other backbones get no decay.
Biases, norms and 1-d parameters (and the class token and position table) have no weight decay. The fixed
sin-cos position table stays frozen unless ``train_pos_embed`` (MAE: timm's ``pos_embed`` is a learned
parameter that the fine-tuning trains, in layer 0 without weight decay, lr_decay.py:15-76); everything
else, the patch projection included, is trained. As MAE's main_finetune.py, the head's weight starts
trunc-normal with std 2e-5 (zero bias) and ``min_lr`` is an absolute lr (only ``base_lr`` is scaled by
batch / 256).

``pool="global"`` is MAE's default fine-tuning feature (models_vit.py:23-53): the mean of the last block's
patch tokens through a new LayerNorm ``fc_norm``; the pretrained final ``norm`` is dropped and ``fc_norm``
starts at weight 1, bias 0 (main_finetune.py loads with ``strict=False`` and asserts that exactly the head
and ``fc_norm`` are missing). ``load_pretrained`` does that load.

``recipe`` (an :class:`~selfsup.eval.mae_recipe.MAERecipe`) switches the data side to MAE's: per-image
timm RandAugment and random erasing in DataLoader workers, then Mixup / CutMix on the batch with soft
targets; without it, the batched on-device crop + flip and cross-entropy with label smoothing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from selfsup.data.datasets import ImageDataset
from selfsup.data.loader import sequential_loader
from selfsup.data.views import AugmentConfig, EvalTransform, MultiViewAugment
from selfsup.eval.knn import topk_accuracy
from selfsup.eval.mae_recipe import mixup_fn, soft_target_loss, train_loader
from selfsup.eval_configs import FinetuneConfig
from selfsup.schedules import scaled_lr, warmup_cosine


class Classifier(nn.Module):
    """Backbone + linear head."""

    def __init__(self, backbone: nn.Module, num_classes: int, head_init_std: float = 2e-5):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(backbone.num_features, num_classes)
        nn.init.trunc_normal_(self.head.weight, std=head_init_std)
        nn.init.zeros_(self.head.bias)

    def forward(self, x):
        return self.head(self.backbone(x))


def load_pretrained(backbone: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load a pretrained ``state`` into ``backbone``, rebuilt perhaps with another ViT pool: between
    ``global`` and ``cls`` / ``avg`` the final norm changes place (``norm`` ↔ ``fc_norm``), so the
    pretrained one is dropped and the new one keeps its fresh init (LayerNorm 1 / 0), as MAE's main_finetune.py;
    any other difference is an error."""
    own = backbone.state_dict()
    fresh = {k for k in own if k not in state}
    dropped = {k for k in state if k not in own}
    if not fresh <= {"fc_norm.weight", "fc_norm.bias", "norm.weight", "norm.bias"} or \
            not dropped <= {"fc_norm.weight", "fc_norm.bias", "norm.weight", "norm.bias"}:
        raise ValueError(f"pretrained weights do not fit the rebuilt backbone: missing {sorted(fresh)}, "
                         f"unexpected {sorted(dropped)}")
    backbone.load_state_dict({k: v for k, v in state.items() if k in own}, strict=False)


def layer_scales(model: Classifier, decay: float) -> dict[str, float]:
    """lr multiplier per parameter name: decay^(depth + 1 − layer_id) for a selfsup ViT, 1 otherwise."""
    backbone = model.backbone
    has_layers = hasattr(backbone, "layer_id") and hasattr(backbone, "depth")
    out = {}
    for name, _ in model.named_parameters():
        if has_layers and name.startswith("backbone."):
            out[name] = decay ** (backbone.depth + 1 - backbone.layer_id(name[len("backbone."):]))
        else:
            out[name] = 1.0
    return out


def param_groups(model: Classifier, weight_decay: float, decay: float) -> list[dict]:
    """One AdamW group per (lr scale, weight decay or not)."""
    scales = layer_scales(model, decay)
    groups: dict[tuple[float, bool], dict] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        no_wd = p.ndim <= 1 or name.endswith(("cls_token", "pos_embed"))
        key = (scales[name], no_wd)
        groups.setdefault(key, {"params": [], "lr_scale": scales[name], "weight_decay": 0.0 if no_wd else weight_decay})
        groups[key]["params"].append(p)
    return list(groups.values())


def finetune(backbone: nn.Module, train: ImageDataset, test: ImageDataset, meta: dict, cfg: FinetuneConfig,
             device: torch.device | str = "cpu") -> dict:
    """Fine-tune ``backbone`` (already rebuilt with drop path) + a linear head; top-1/top-5 (%) on test."""
    torch.manual_seed(cfg.seed)
    dev = torch.device(device)
    for name, p in backbone.named_parameters():
        p.requires_grad_(cfg.train_pos_embed or not name.endswith("pos_embed"))
    model = Classifier(backbone, train.num_classes, cfg.head_init_std).to(dev)
    groups = param_groups(model, cfg.weight_decay, cfg.layer_decay)
    opt = torch.optim.AdamW(groups, lr=0.0, betas=(0.9, 0.999))
    size, mean, std = meta["image_size"], meta["mean"], meta["std"]
    branch = AugmentConfig(crop_min=cfg.crop_min, hflip_p=cfg.hflip_p, jitter_p=0.0, grayscale_p=0.0, blur_p=0.0,
                           solarize_p=0.0)
    augment = MultiViewAugment([branch], size, mean, std).to(dev)
    batch = min(cfg.batch_size, len(train))
    steps_per_epoch = max(len(train) // batch, 1)
    total, warmup = cfg.epochs * steps_per_epoch, int(round(cfg.warmup_epochs * steps_per_epoch))
    peak, final = scaled_lr(cfg.base_lr, batch), cfg.min_lr  # MAE: min_lr is absolute
    amp = dev.type == "cuda"
    g_order = torch.Generator().manual_seed(cfg.seed)
    g_aug = torch.Generator(device=dev).manual_seed(cfg.seed)
    model.train()
    step, losses = 0, []
    recipe = cfg.recipe
    mix = mixup_fn(recipe, train.num_classes) if recipe else None
    if recipe:
        loader = train_loader(train, size, mean, std, recipe, batch, cfg.num_workers, cfg.seed)
        smoothing = recipe.smoothing
    else:
        smoothing = cfg.label_smoothing

    def batches():
        if recipe:  # augmented per image in the workers (timm), already normalised and erased
            for x, labels in loader:
                yield x.to(dev, non_blocking=True), labels.to(dev, non_blocking=True)
            return
        order = torch.randperm(len(train), generator=g_order)[: steps_per_epoch * batch]
        for idx in order.split(batch):
            images, labels = train[idx]
            (x,) = augment(images.to(dev, non_blocking=True), g_aug)
            yield x, labels.to(dev)

    for _ in range(cfg.epochs):
        for x, labels in batches():
            lr = warmup_cosine(step, total, warmup, peak, final)
            for group in opt.param_groups:
                group["lr"] = lr * group["lr_scale"]
            if mix is not None:
                x, target = mix(x, labels)  # soft targets with the label smoothing folded in
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
                logits = model(x)
            if mix is not None:
                loss = soft_target_loss(logits.float(), target)
            else:
                loss = F.cross_entropy(logits.float(), labels, label_smoothing=smoothing)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
            step += 1
    model.eval()
    transform = EvalTransform(size, mean, std).to(dev)
    scores, labels = [], []
    with torch.no_grad():
        for images, y in sequential_loader(test, 512):
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
                scores.append(model(transform(images.to(dev))).float().cpu())
            labels.append(y)
    return {"test": topk_accuracy(torch.cat(scores), torch.cat(labels)), "steps": step,
            "first_loss": losses[0], "final_loss": losses[-1], "peak_lr": peak,
            "final_lr": final}
