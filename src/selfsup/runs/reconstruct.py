"""``selfsup eval reconstruct RUN`` as a function: what an MAE run learned, as a PNG grid (RUN/eval/reconstruct.png).

The run's MAE is rebuilt from its config and last checkpoint (the decoder is not exported); the rows are
``eval.reconstruct.reconstruction_rows`` over test images and a mask drawn from the config's ``seed``; the
masked-patch loss of these images goes to RUN/eval/reconstruct.json.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
import yaml

from selfsup.checkpoints import load_checkpoint
from selfsup.config import resolve
from selfsup.data.datasets import load_dataset
from selfsup.errors import UserError
from selfsup.eval.reconstruct import ReconstructConfig, reconstruction_rows, save_rows
from selfsup.methods.build import build_method, data_info
from selfsup.methods.mae import MAEConfig


def load_mae_run(run_dir: Path, mask_ratio: float | None = None):
    """(the run's MAE LightningModule with its last checkpoint's weights, in eval mode; its RunConfig)."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        raise UserError(f"{run_dir} is not a selfsup run folder (no config.yaml); pass the folder an MAE pretrain made")
    cfg = resolve(yaml.safe_load(path.read_text()))
    if not isinstance(cfg.method, MAEConfig):
        raise UserError(f"{run_dir} is not an MAE run (method {type(cfg.method).__name__}); reconstruct needs "
                        "method.name=mae (its decoder)")
    if mask_ratio is not None:
        cfg.method = dataclasses.replace(cfg.method, mask_ratio=mask_ratio)
        cfg.method.validate()
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    if not ckpt.is_file():
        raise UserError(f"{run_dir} has no checkpoints/last.ckpt (it holds the decoder); train the run first")
    model = build_method(cfg, data_info(cfg, load_dataset(cfg.data, "train")), load_weights=False)
    state = load_checkpoint(ckpt, "pass the folder an MAE pretrain made")["state_dict"]
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise UserError(f"{ckpt} does not fit the run's model ({str(e).splitlines()[0]})") from None
    return model.eval(), cfg


def reconstruct(run_dir: str | Path, cfg: ReconstructConfig | None = None, out: str | Path | None = None) -> dict:
    """The grid (``out``/reconstruct.png, default RUN/eval) and its record (reconstruct.json), returned."""
    cfg = cfg or ReconstructConfig()
    run_dir = Path(run_dir)
    if cfg.n < 1:
        raise UserError(f"--n {cfg.n} must be >= 1")
    model, run_cfg = load_mae_run(run_dir, cfg.mask_ratio)
    test = load_dataset(run_cfg.data, cfg.split)
    n = min(cfg.n, len(test))
    idx = torch.randperm(len(test), generator=torch.Generator().manual_seed(cfg.seed))[:n].sort().values
    images, _ = test[idx]
    if tuple(images.shape[-2:]) != (model.info.image_size,) * 2:
        raise UserError(f"{run_cfg.data.name} {cfg.split} images are {tuple(images.shape[-2:])}, the model takes "
                        f"{model.info.image_size}x{model.info.image_size}")
    rows, loss = reconstruction_rows(model, images, cfg.seed)
    scale = cfg.scale or max(1, 64 // model.info.image_size)
    out = Path(out) if out else run_dir / "eval"
    png = save_rows(rows, n, out / "reconstruct.png", scale)
    record = {"run": str(run_dir), "split": cfg.split, "images": n, "seed": cfg.seed,
              "mask_ratio": run_cfg.method.mask_ratio, "norm_pix_loss": run_cfg.method.norm_pix_loss,
              "masked_patch_loss": loss, "rows": ["original", "masked", "reconstruction", "reconstruction + visible"],
              "png": str(png)}
    (out / "reconstruct.json").write_text(json.dumps(record, indent=2))
    return {**record, "dataset": run_cfg.data.name}
