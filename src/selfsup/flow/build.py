"""Building and loading flow runs: backbone metadata, ``load_flow_run``, the REPA encoder.

No trainer import: ``selfsup generate`` and ``selfsup eval`` load a flow run through here.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from selfsup.errors import UserError
from selfsup.models.sit import FLOW_ENCODER
from selfsup.models.sit import SiT

FLOW_METHOD_NAMES = ("flow_matching", "self_flow", "repa")


def flow_backbone_meta(cfg, info) -> dict:
    """The exported ``backbone.safetensors`` of a flow run: the EMA model as a ``FlowEncoder``."""
    from selfsup.methods.flow import sit_kwargs
    from selfsup.methods import method_name

    c = cfg.method
    sit = _sit_only(sit_kwargs(cfg, info))
    return {"backbone": FLOW_ENCODER,
            "kwargs": dict(sit=sit, block=c.eval_block(), t=c.feature_t, fit=c.fit, seed=cfg.trainer.seed),
            "image_size": info.image_size, "in_chans": info.channels, "mean": list(info.mean),
            "std": list(info.std), "dataset": cfg.data.name, "method": method_name(cfg.method),
            "num_classes": sit["num_classes"]}


def _sit_only(kwargs: dict) -> dict:
    """SiT kwargs with the size name resolved to explicit hidden/depth/heads (stable across size tables)."""
    from selfsup.models.sit import SIT_SIZES

    k = dict(kwargs)
    D, L, H = SIT_SIZES[k.pop("size")]
    k["hidden"], k["depth"], k["heads"] = k["hidden"] or D, k["depth"] or L, k["heads"] or H
    return k


def _run_config(run_dir: Path):
    import yaml

    from selfsup.config import resolve

    path = run_dir / "config.yaml"
    if not path.exists():
        raise UserError(f"{run_dir} is not a selfsup run folder (no config.yaml); pass the folder a pretrain run made")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError:
        raise UserError(f"{path} is not valid YAML; restore the run's config.yaml") from None
    name = (raw.get("method") or {}).get("name") if isinstance(raw, dict) else None
    if name not in FLOW_METHOD_NAMES:
        raise UserError(f"{run_dir} is a {name} run, not a flow run; pass a run of "
                        f"{', '.join(FLOW_METHOD_NAMES)} (selfsup pretrain self-flow-fmnist, ...)")
    return resolve(raw)


def load_flow_run(run_dir) -> tuple[SiT, object, dict]:
    """(EMA SiT in eval mode on CPU, the run's RunConfig, info) of a flow run folder.

    Weights: ``backbone.safetensors`` (exported at the end of training), else the ``ema.*`` weights of
    ``checkpoints/last.ckpt``. ``info``: method, dataset, channels, image_size (the model's input size),
    data_size (the dataset's own), fit, num_classes (0: unconditional; the null class is num_classes),
    latents (True for a latent dataset), mean/std (pixel data: x = (image − mean)/std in [−1, 1]), weights.
    """
    from selfsup.export import read_meta, rebuild_backbone

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"{run_dir} is not a run folder; pass the folder a flow pretrain run made")
    cfg = _run_config(run_dir)
    exported, ckpt = run_dir / "backbone.safetensors", run_dir / "checkpoints" / "last.ckpt"
    meta_file = exported if exported.exists() else run_dir / "backbone_init.safetensors"
    if not meta_file.exists():
        raise UserError(f"{run_dir} holds no backbone.safetensors or backbone_init.safetensors; it is not a finished "
                        "or started flow run")
    meta = read_meta(meta_file)
    encoder = rebuild_backbone(meta)
    if exported.exists():
        from safetensors.torch import load_file

        state, source = load_file(str(exported)), exported
    elif ckpt.exists():
        from selfsup.checkpoints import load_checkpoint

        full = load_checkpoint(ckpt, "pass a flow run folder made by selfsup pretrain")["state_dict"]
        state, source = {"model." + k[4:]: v for k, v in full.items() if k.startswith("ema.")}, ckpt
    else:
        raise UserError(f"{run_dir} has neither backbone.safetensors nor checkpoints/last.ckpt; train it first")
    try:
        encoder.load_state_dict(state)
    except RuntimeError as e:
        raise UserError(f"{source}: weights do not fit the run's model ({str(e).splitlines()[0]})") from None
    model = encoder.model.eval().requires_grad_(False)
    info = {"method": meta["method"], "dataset": meta["dataset"], "channels": meta["in_chans"],
            "image_size": model.input_size, "data_size": meta["image_size"], "fit": meta["kwargs"]["fit"],
            "num_classes": model.num_classes, "latents": cfg.data.name == "latents",
            "mean": meta["mean"], "std": meta["std"], "weights": str(source)}
    return model, cfg, info


# --------------------------------------------------------------------------- REPA's frozen encoder


def load_repa_encoder(location: str, channels: int) -> tuple[nn.Module, int, list, list, int]:
    """(frozen ViT, its input size, mean, std, token width) from a selfsup run folder or exported file."""
    from selfsup.eval.source import load_source

    try:
        source = load_source(location)
    except UserError as e:
        raise UserError(f"method.encoder: {e}") from None
    meta, encoder = source.meta, source.backbone
    if meta.get("backbone") == FLOW_ENCODER:
        raise UserError(f"method.encoder={location} is a flow run; REPA needs a joint-embedding ViT (moco_v3, byol, ...)")
    if meta["in_chans"] != channels:
        raise UserError(f"method.encoder={location} takes {meta['in_chans']}-channel images but the data has "
                        f"{channels}; pretrain the encoder on this dataset")
    encoder = encoder.eval().requires_grad_(False)
    size = meta["image_size"]
    try:
        with torch.no_grad():
            probe = encoder.forward_features(torch.zeros(1, channels, size, size))
    except AttributeError:
        probe = None
    if probe is None or probe.ndim != 3 or probe.shape[1] - _prefix_tokens(encoder) < 1:
        raise UserError(f"method.encoder={location} ({meta['backbone']}) gives no patch tokens; use a ViT encoder")
    return encoder, size, list(meta["mean"]), list(meta["std"]), probe.shape[-1]


def _prefix_tokens(encoder: nn.Module) -> int:
    """Class / register tokens before the patch tokens (timm: num_prefix_tokens; selfsup ViT: 1)."""
    return int(getattr(encoder, "num_prefix_tokens", 1))


def patch_tokens(encoder: nn.Module, x: Tensor, grid: int) -> Tensor:
    """(B, grid², D): the encoder's patch tokens, bilinearly resized from its own token grid to ``grid``."""
    tokens = encoder.forward_features(x)[:, _prefix_tokens(encoder):]
    B, N, D = tokens.shape
    g = int(round(N ** 0.5))
    if g * g != N:
        raise UserError(f"the REPA encoder's {N} patch tokens do not form a square grid")
    if g != grid:
        fmap = tokens.transpose(1, 2).reshape(B, D, g, g)
        tokens = F.interpolate(fmap.float(), size=(grid, grid), mode="bilinear", align_corners=False)
        tokens = tokens.flatten(2).transpose(1, 2)
    return tokens
