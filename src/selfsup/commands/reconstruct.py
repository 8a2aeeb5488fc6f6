"""``selfsup eval reconstruct RUN``: the flags → ``ReconstructConfig`` → ``runs.reconstruct.reconstruct`` → one line."""

from __future__ import annotations

from selfsup.eval_configs import ReconstructConfig


def run_reconstruct(args) -> int:
    """``selfsup eval reconstruct``: ``reconstruct`` with the flags' ``ReconstructConfig``, and one line."""
    from selfsup.runs.reconstruct import reconstruct  # an MAE run's model: the methods and Lightning

    cfg = ReconstructConfig(n=args.n, split=args.split, seed=args.seed, mask_ratio=args.mask_ratio, scale=args.scale)
    r = reconstruct(args.run, cfg, args.out)
    print(f"MAE reconstructions of {r['images']} {r['dataset']} {r['split']} images (mask ratio {r['mask_ratio']:g}, "
          f"masked-patch loss {r['masked_patch_loss']:.4f}): {r['png']}")
    return 0


def add_reconstruct_parser(sub) -> None:
    """``selfsup eval reconstruct RUN`` (registered by ``commands.eval``; defaults: ``ReconstructConfig``)."""
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
