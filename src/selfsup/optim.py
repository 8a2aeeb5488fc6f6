"""Optimisers and parameter groups: LARS (MoCo v3 / BYOL), LARC (SwAV), AdamW, Adam (W-MSE), SGD; predictor lr
and wd."""

from __future__ import annotations

import torch
from torch import nn

from selfsup.choices import OptimConfig


class LARS(torch.optim.Optimizer):
    """LARS as in moco-v3 ``optimizer.py``: parameters with ``ndim <= 1``, and every parameter of a group with
    ``exclude=True`` (``param_groups``' exempt group: LightlyTrain's no-decay group, which lightly's LARS steps
    as plain SGD, lightly/utils/lars.py ``step``: no scaling where weight_decay is 0), get neither weight decay
    nor adaptation; for the rest ``dp = g + wd·p``, trust ``q = η‖p‖/‖dp‖`` (1 where a norm is 0),
    ``μ ← m·μ + q·dp``, ``p ← p − lr·μ``."""

    def __init__(self, params, lr: float = 0.0, weight_decay: float = 0.0, momentum: float = 0.9,
                 trust_coefficient: float = 0.001, exclude: bool = False):
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, trust_coefficient=trust_coefficient,
                        exclude=exclude)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            exclude = group.get("exclude", False)  # .get: a group loaded from an older checkpoint lacks the key
            for p in group["params"]:
                if p.grad is None:
                    continue
                dp = p.grad
                if p.ndim > 1 and not exclude:
                    dp = dp.add(p, alpha=group["weight_decay"])
                    param_norm, update_norm = torch.norm(p), torch.norm(dp)
                    one = torch.ones_like(param_norm)
                    q = torch.where(param_norm > 0.0,
                                    torch.where(update_norm > 0,
                                                group["trust_coefficient"] * param_norm / update_norm, one),
                                    one)
                    dp = dp.mul(q)
                state = self.state[p]
                if "mu" not in state:
                    state["mu"] = torch.zeros_like(p)
                mu = state["mu"]
                mu.mul_(group["momentum"]).add_(dp)
                p.add_(mu, alpha=-group["lr"])
        return loss


class LARC(torch.optim.Optimizer):
    """apex ``LARC(SGD(momentum, weight_decay), trust_coefficient, clip=False)`` as SwAV uses it (main_swav.py:171-182;
    apex/parallel/LARC.py ``step``): every parameter (biases and norms too) with ‖p‖ ≠ 0 and ‖g‖ ≠ 0 gets
    ``g ← (g + wd·p) · η‖p‖ / (‖g‖ + wd‖p‖ + 1e-8)``; otherwise the raw gradient (no decay, no scaling); then SGD
    without weight decay: ``μ ← m·μ + g``, ``p ← p − lr·μ``. Computed on the device (no host read)."""

    def __init__(self, params, lr: float = 0.0, weight_decay: float = 0.0, momentum: float = 0.9,
                 trust_coefficient: float = 0.001, eps: float = 1e-8):
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, trust_coefficient=trust_coefficient,
                        eps=eps)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            wd, trust = group["weight_decay"], group["trust_coefficient"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                param_norm, grad_norm = torch.norm(p), torch.norm(p.grad)
                adaptive = trust * param_norm / (grad_norm + param_norm * wd + group["eps"])
                scaled = p.grad.add(p, alpha=wd).mul_(adaptive)
                dp = torch.where((param_norm != 0) & (grad_norm != 0), scaled, p.grad)
                state = self.state[p]
                if "mu" not in state:
                    state["mu"] = torch.zeros_like(p)
                mu = state["mu"]
                mu.mul_(group["momentum"]).add_(dp)
                p.add_(mu, alpha=-group["lr"])
        return loss


# LightlyTrain's no-decay group (lightly_train/_optim/optimizer_helpers.py:83-207, get_weight_decay_parameters, by
# the parameter's name relative to its trainable module): besides norm layers, embedding layers and ndim <= 1,
# names holding one of these anywhere (tokens, queries, position tables; selfsup's mask token is ``masked_embed``)
_LARS_EXEMPT_ANYWHERE = ("cls_token", "mask_token", "masked_embed", "storage_token", "register_token", "queries",
                         "query", "pos_embed", "position_embedding", "positional_embedding", "relative_position",
                         "relative_pos", "rel_pos", "rpb", "bias_table")
# ... or one of these as a whole dotted component (biases, logit scales, LayerScale's ``gamma``)
_LARS_EXEMPT_WORDS = frozenset(("bias", "bias_v", "bias_k", "logit_scale", "temperature", "tau", "layer_scale",
                                "layerscale", "res_scale", "rezero", "gamma"))
_NORMS = (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm, nn.LocalResponseNorm, nn.CrossMapLRN2d)


def lars_exempt(module: nn.Module) -> set[int]:
    """The ids of ``module``'s parameters in LightlyTrain's no-decay group, which its LARS (lightly/utils/lars.py:
    124-145) steps without weight decay or trust ratio: biases, norm layers (a class with ``Norm`` in its name too),
    embedding layers, ndim ≤ 1, tokens, position tables, LayerScale, logit scales. On a ResNet and an MLP head
    these are exactly the ``ndim ≤ 1`` parameters the official BYOL / SimCLR / Barlow Twins / VICReg / MoCo v3
    LARS exclude; on a ViT they add ``cls_token``, ``pos_embed`` and ``register_tokens``."""
    owner = {id(p): m for m in module.modules() for p in m.parameters(recurse=False)}
    exempt = set()
    for name, p in module.named_parameters():
        m = owner[id(p)]
        if (isinstance(m, (*_NORMS, nn.Embedding, nn.EmbeddingBag)) or "Norm" in type(m).__name__ or p.ndim <= 1
                or any(key in name for key in _LARS_EXEMPT_ANYWHERE)
                or not _LARS_EXEMPT_WORDS.isdisjoint(name.split("."))):
            exempt.add(id(p))
    return exempt


def param_groups(modules: dict[str, nn.Module], cfg: OptimConfig) -> list[dict]:
    """One group per (predictor or not) × (decayed or not); each carries ``lr_scale`` and ``fixed_lr``.

    ``modules`` maps a name to a sub-module; the one named ``predictor`` gets the predictor lr
    multiplier and weight decay. Frozen parameters (e.g. MoCo v3's random patch projection) are left out.
    ``lr_1d_mult`` ≠ 1 puts the biases and norm weights (ndim ≤ 1) in a group of their own at that multiple
    of the lr (Barlow Twins main.py:90-97, :167-168; LARS exempts them from decay and adaptation anyway).
    LARS: the exempt group (``exclude=True``, weight decay 0) holds ``lars_exempt``'s parameters: LightlyTrain's
    no-decay group. Its ``ndim ≤ 1`` members stay in their module's group unless ``lr_1d_mult`` splits them off
    (LARS exempts them by shape, as moco-v3's optimizer.py does), so a ResNet run keeps its groups.
    """
    groups, lars = [], cfg.name == "lars"
    for name, module in modules.items():
        is_pred = name == "predictor"
        wd = cfg.predictor_weight_decay if (is_pred and cfg.predictor_weight_decay is not None) else cfg.weight_decay
        params = [p for p in module.parameters() if p.requires_grad]
        split = not (cfg.decay_1d or lars) or cfg.lr_1d_mult != 1.0
        if lars:
            exempt = lars_exempt(module)
            one_d = [p for p in params if id(p) in exempt and (split or p.ndim > 1)]
        else:
            one_d = [p for p in params if split and p.ndim <= 1]
        decay = [p for p in params if all(p is not q for q in one_d)]
        common = dict(lr_scale=cfg.predictor_lr_mult if is_pred else 1.0, fixed_lr=is_pred and cfg.fix_predictor_lr,
                      name=name)
        if decay:
            groups.append(dict(params=decay, weight_decay=wd, **common))
        if one_d:
            extra = dict(weight_decay=0.0, exclude=True) if lars else dict(weight_decay=wd if cfg.decay_1d else 0.0)
            groups.append(dict(params=one_d, **extra, **{**common, "lr_scale": common["lr_scale"] * cfg.lr_1d_mult}))
    return groups


def build_optimizer(groups: list[dict], cfg: OptimConfig) -> torch.optim.Optimizer:
    """The optimiser named by ``cfg.name`` over ``groups`` (lr is set each step by the schedule)."""
    if cfg.name == "lars":
        return LARS(groups, lr=0.0, momentum=cfg.momentum, trust_coefficient=cfg.trust_coefficient)
    if cfg.name == "larc":
        return LARC(groups, lr=0.0, momentum=cfg.momentum, trust_coefficient=cfg.trust_coefficient)
    if cfg.name == "adam":  # weight decay as an L2 term in the gradient (W-MSE train.py:39)
        return torch.optim.Adam(groups, lr=0.0, betas=tuple(cfg.betas))
    if cfg.name == "sgd":
        return torch.optim.SGD(groups, lr=0.0, momentum=cfg.momentum)
    return torch.optim.AdamW(groups, lr=0.0, betas=tuple(cfg.betas), fused=cfg.fused or None)
