"""``selfsup eval reconstruct RUN``: what an MAE run learned, as a PNG grid (RUN/eval/reconstruct.png).

Four rows over the same test images (as the official demo's panels): the originals, the masked inputs
(removed patches grey), the reconstructions, and the reconstructions with the visible patches pasted back.
The mask is drawn from ``--seed``; the masked-patch loss of these images goes to RUN/eval/reconstruct.json.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from selfsup.errors import UserError


def load_mae_run(run_dir: Path, mask_ratio: float | None = None):
    """(the run's MAE LightningModule with its last checkpoint's weights, in eval mode; its RunConfig)."""
    import yaml

    from selfsup.checkpoints import load_checkpoint
    from selfsup.config import resolve
    from selfsup.data.datasets import load_dataset
    from selfsup.methods.build import build_method, data_info
    from selfsup.methods.mae import MAEConfig

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
    model = build_method(cfg, data_info(cfg, load_dataset(cfg.data, "train")))
    state = load_checkpoint(ckpt, "pass the folder an MAE pretrain made")["state_dict"]
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise UserError(f"{ckpt} does not fit the run's model ({str(e).splitlines()[0]})") from None
    return model.eval(), cfg


def _to_unit(x: Tensor, mean, std) -> Tensor:
    """Normalised images back to [0, 1]."""
    m = torch.tensor(mean, dtype=x.dtype).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=x.dtype).view(1, -1, 1, 1)
    return (x * s + m).clamp(0, 1)


def reconstruction_rows(model, images: Tensor, seed: int) -> tuple[Tensor, float]:
    """uint8 (4·N, C, H, W): originals, masked inputs, reconstructions, reconstructions + visible patches;
    and the masked-patch loss of these images (the training objective)."""
    from selfsup.data.views import EvalTransform
    from selfsup.models.mae import unpatchify

    info = model.info
    x = EvalTransform(info.image_size, info.mean, info.std)(images)
    noise = torch.rand(len(x), model.num_patches, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        loss = float(model.forward_mae(x, noise)[0])
        recon, mask = model.reconstruct(x, noise)
    p, c = model.backbone.patch_size, x.shape[1]
    removed = unpatchify(mask[..., None].expand(-1, -1, p * p * c), p, c).bool()  # (N, C, H, W)
    original = _to_unit(x, info.mean, info.std)
    recon = _to_unit(recon, info.mean, info.std)
    rows = [original, torch.where(removed, 0.5, original), recon, torch.where(removed, recon, original)]
    return (torch.cat(rows) * 255).round().to(torch.uint8), loss


def save_rows(images: Tensor, per_row: int, path: Path, scale: int) -> Path:
    """A PNG of ``images`` in rows of ``per_row``, each image enlarged ``scale`` times (nearest)."""
    from PIL import Image
    from torchvision.utils import make_grid

    big = images.repeat_interleave(scale, dim=-2).repeat_interleave(scale, dim=-1)
    grid = make_grid(big, nrow=per_row, padding=2, pad_value=255).permute(1, 2, 0).numpy()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    Image.fromarray(grid[..., 0] if images.shape[1] == 1 else grid[..., :3]).save(tmp, format="PNG")
    tmp.replace(path)
    return path


@dataclass
class ReconstructConfig:
    """``selfsup eval reconstruct``: how many test images (``n``) of which ``split``, the ``seed`` of the images and
    the mask, the mask ratio (None: the run's), and the enlargement of each image (None: to at least 64 px)."""

    n: int = 8
    split: str = "test"
    seed: int = 0
    mask_ratio: float | None = None
    scale: int | None = None


def reconstruct(run_dir: str | Path, cfg: ReconstructConfig | None = None, out: str | Path | None = None) -> dict:
    """The grid (``out``/reconstruct.png, default RUN/eval) and its record (reconstruct.json), returned."""
    from selfsup.data.datasets import load_dataset

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


def run_reconstruct(args) -> int:
    """``selfsup eval reconstruct``: ``reconstruct`` with the flags' ``ReconstructConfig``, and one line."""
    cfg = ReconstructConfig(n=args.n, split=args.split, seed=args.seed, mask_ratio=args.mask_ratio, scale=args.scale)
    r = reconstruct(args.run, cfg, args.out)
    print(f"MAE reconstructions of {r['images']} {r['dataset']} {r['split']} images (mask ratio {r['mask_ratio']:g}, "
          f"masked-patch loss {r['masked_patch_loss']:.4f}): {r['png']}")
    return 0


def add_reconstruct_parser(sub) -> None:
    """``selfsup eval reconstruct RUN`` (registered by selfsup.eval.cli; defaults: ``ReconstructConfig``)."""
    c = ReconstructConfig
    p = sub.add_parser("reconstruct",
                       help="an MAE run's reconstructions: originals, masked inputs, reconstructions (PNG)")
    p.add_argument("run", metavar="RUN", help="an MAE run folder (config.yaml + checkpoints/last.ckpt)")
    p.add_argument("--n", type=int, default=c.n, help=f"images (default {c.n})")
    p.add_argument("--split", choices=("test", "train"), default=c.split)
    p.add_argument("--seed", type=int, default=c.seed, help=f"which images and which mask (default {c.seed})")
    p.add_argument("--mask-ratio", type=float, default=c.mask_ratio,
                   help="share of patches removed (default: the run's)")
    p.add_argument("--scale", type=int, default=c.scale,
                   help="enlarge each image this many times (default: to at least 64 px)")
    p.add_argument("--out", help="folder for reconstruct.png / .json (default: RUN/eval)")
    p.set_defaults(func=run_reconstruct)
